#include "shardlm/train/run_records.hpp"

#include <array>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "shardlm/core/file_util.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/train/command_record.hpp"

namespace fs = std::filesystem;

namespace shardlm {

RunRecords::RunRecords(const TrainOptions& o, nlohmann::json run_config, int64_t start_step,
                       RunDirectoryClaim& claim, const std::function<void(const std::string&)>& warn) {
  const fs::path run = o.out_dir;
  if (!o.command.empty()) {
    run_config["command"] = o.command;
    run_config["flags"] = command_flags_json(o.command_flags);
    claim.wrote((run / "config.toml").string());
    write_file_atomic((run / "config.toml").string(), command_flags_toml(o.command, o.command_flags));
  }
  claim.wrote((run / "config.json").string());
  write_file_atomic((run / "config.json").string(), run_config.dump(2) + "\n");
  // (Kept only with a committed checkpoint, which a fresh start's lines never precede.)
  claim.wrote((run / "metrics.jsonl").string());
  if (const int cut = truncate_metrics_after((run / "metrics.jsonl").string(), start_step))
    warn(fmt::format("metrics.jsonl: dropped {} cut or unreadable line(s) left by an interrupted "
                     "job (their records are lost)",
                     cut));
  metrics_ = std::make_unique<MetricsWriter>((run / "metrics.jsonl").string());
  if (!o.tensorboard_dir.empty()) {
    if (!fs::exists(o.tensorboard_dir)) claim.wrote(o.tensorboard_dir);
    tensorboard_ = std::make_unique<TensorBoardWriter>(o.tensorboard_dir);
  }
}

void RunRecords::write(const nlohmann::json& record) {
  metrics_->write(record);
  if (tensorboard_) tensorboard_->write(record);
}

void write_memory_by_rank(Communicator& comm, Device device, const std::string& out_dir,
                          RunDirectoryClaim* claim) {
  constexpr int kCategories = MemoryTracker::kNumCategories;
  const MemoryTracker& tracker = MemoryTracker::for_device(device);
  std::array<uint64_t, kCategories> mine{};
  for (int c = 0; c < kCategories; ++c) mine[c] = tracker.peak(static_cast<MemCategory>(c));
  const int world = comm.size();
  std::vector<uint64_t> all(static_cast<size_t>(kCategories) * world);
  comm.all_gather_bytes(mine.data(), all.data(), sizeof(mine), "peak memory by rank").wait();
  if (comm.rank() != 0) return;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    nlohmann::json peak = nlohmann::json::object();
    for (int c = 0; c < kCategories; ++c)
      peak[std::string(to_string(static_cast<MemCategory>(c)))] = all[static_cast<size_t>(r) * kCategories + c];
    ranks.push_back({{"rank", r}, {"peak", peak}});
  }
  claim->wrote((fs::path(out_dir) / "memory_by_rank.json").string());
  write_file_atomic((fs::path(out_dir) / "memory_by_rank.json").string(),
                    nlohmann::json{{"device", to_string(device)}, {"ranks", ranks}}.dump(1) + "\n");
}

}  // namespace shardlm
