// Rank 0's records of a run in its directory: config.json (and config.toml, the flags
// as given), metrics.jsonl (one record per step) and, with --tensorboard, TensorBoard
// event files of the same records; and every rank's peak memory, memory_by_rank.json.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/device.hpp"
#include "shardlm/train/metrics.hpp"
#include "shardlm/train/run_directory.hpp"
#include "shardlm/train/tensorboard_writer.hpp"
#include "shardlm/train/train_options.hpp"

namespace shardlm {

class RunRecords {
 public:
  // Writes RUN/config.json (run_config, with the command and its flags when recorded)
  // and RUN/config.toml, cuts metrics.jsonl back to the steps before start_step (a
  // resumed run writes them again; `warn` says how many cut lines were dropped) and
  // opens it for appending; each path noted in `claim` before it is written.
  RunRecords(const TrainOptions& o, nlohmann::json run_config, int64_t start_step,
             RunDirectoryClaim& claim, const std::function<void(const std::string&)>& warn);
  void write(const nlohmann::json& record);

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // with --tensorboard
};

// Collective: RUN/memory_by_rank.json (written by rank 0, noted in its `claim`), every
// rank's peak bytes by category on `device` (the summary and metrics.jsonl carry rank
// 0's), for the report.
void write_memory_by_rank(Communicator& comm, Device device, const std::string& out_dir,
                          RunDirectoryClaim* claim);

}  // namespace shardlm
