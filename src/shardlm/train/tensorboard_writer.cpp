#include "shardlm/train/tensorboard_writer.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardlm/core/crc32c.hpp"
#include "shardlm/core/error.hpp"
#include "tensorboard_event.pb.h"

namespace fs = std::filesystem;

namespace shardlm {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFFu);
}

}  // namespace

std::string tensorboard_record(const std::string& data) {
  std::string header;
  const uint64_t length = data.size();
  for (int i = 0; i < 8; ++i) header += static_cast<char>((length >> (8 * i)) & 0xFFu);
  std::string out = header;
  put_le32(out, masked_crc32c(header.data(), header.size()));
  out += data;
  put_le32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  const auto add = [&](const char* tag, const char* field) {
    if (record.contains(field) && record[field].is_number()) out.emplace_back(tag, record[field].get<double>());
  };
  add("train/loss", "loss");
  add("val/loss", "val_loss");
  add("train/lr", "lr");
  add("train/grad_norm", "grad_norm");
  add("perf/tokens_per_s", "tokens_per_s");
  add("perf/step_ms", "step_ms");
  add("perf/exposed_comm_ms", "exposed_comm_ms");
  for (const auto& [prefix, field] : {std::pair{"memory/", "mem"}, std::pair{"device_memory/", "device_mem"}}) {
    if (!record.contains(field) || !record[field].contains("peak")) continue;
    for (const auto& [category, bytes] : record[field]["peak"].items())
      if (bytes.is_number()) out.emplace_back(prefix + category, bytes.get<double>());
  }
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  SHARDLM_CHECK(!ec, "--tensorboard {}: cannot create the directory ({})", dir, ec.message());
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.shardlm",
                                       static_cast<int64_t>(now_seconds()), host, getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  SHARDLM_CHECK(file_ != nullptr, "--tensorboard: cannot write {} ({})", path_, std::strerror(errno));
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_file_version("brain.Event:2");
  append(event.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  tensorboard::Event event;
  event.set_wall_time(now_seconds());
  event.set_step(record.value("step", int64_t{0}));
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : tensorboard_scalars(record)) {
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  append(event.SerializeAsString());
}

void TensorBoardWriter::append(const std::string& event_bytes) {
  const std::string record = tensorboard_record(event_bytes);
  SHARDLM_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0,
                "--tensorboard: writing {} failed ({})", path_, std::strerror(errno));
}

}  // namespace shardlm
