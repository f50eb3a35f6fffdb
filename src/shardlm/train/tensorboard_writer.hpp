// `--tensorboard DIR`: TensorBoard event files of a run's scalars (rank 0 only), beside
// metrics.jsonl (which stays as it is). A file is TFRecord framing of Event protobufs
// (train/proto/tensorboard_event.proto): each record is the data's length (uint64,
// little-endian), the masked CRC-32C of those 8 bytes, the data, and its masked CRC-32C.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

// One framed record holding `data`.
std::string tensorboard_record(const std::string& data);

// The scalars of a metrics.jsonl step record, tag -> value, as the writer logs them:
// train/loss, val/loss, train/lr, train/grad_norm, perf/tokens_per_s, perf/step_ms,
// perf/exposed_comm_ms, memory/<category> (peak bytes so far, by category) and
// device_memory/<category> on a device. Fields the record lacks (val_loss off eval
// steps, a null grad_norm) are left out.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record);

class TensorBoardWriter {
 public:
  // Creates DIR and a new events.out.tfevents.<seconds>.<host>.<pid>.shardlm in it,
  // starting with the file_version event. Error naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event with every scalar of the step record (tensorboard_scalars), flushed.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace shardlm
