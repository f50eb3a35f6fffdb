#include "shardlm/train/run_checks.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

void validate_options(const TrainOptions& o, const ModelConfig& config) {
  SHARDLM_CHECK(o.steps >= 0, "--steps must be >= 0, got {}", o.steps);
  SHARDLM_CHECK(o.micro_batch > 0, "--micro-batch must be positive, got {}", o.micro_batch);
  SHARDLM_CHECK(o.seq_len > 0, "--seq-len must be positive, got {}", o.seq_len);
  SHARDLM_CHECK(o.seq_len <= config.max_seq_len,
                "--seq-len {} is longer than the model's context ({} positions)", o.seq_len,
                config.max_seq_len);
  SHARDLM_CHECK(o.global_batch >= 0, "--global-batch must be positive, got {}", o.global_batch);
  SHARDLM_CHECK(o.lr > 0.0f, "--lr must be positive, got {}", o.lr);
  SHARDLM_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  SHARDLM_CHECK(o.eval_batches >= 0, "--eval-batches must be >= 0, got {}", o.eval_batches);
  SHARDLM_CHECK(o.threads >= 0, "--threads must be >= 0, got {}", o.threads);
  SHARDLM_CHECK(o.comm_timeout > 0, "--comm-timeout must be positive, got {}", o.comm_timeout);
  SHARDLM_CHECK(!o.out_dir.empty(), "--out is required (the run directory)");
  parse_dtype(o.precision, "--precision");
  SHARDLM_CHECK(o.reduce_dtype == "fp32" || o.reduce_dtype == "bf16",
                "--reduce-dtype must be fp32 or bf16, got '{}'", o.reduce_dtype);
  SHARDLM_CHECK(o.loss_scale > 0, "--loss-scale must be positive, got {}", o.loss_scale);
  SHARDLM_CHECK(o.loss_scale_growth_interval > 0,
                "--loss-scale-growth-interval must be positive, got {}",
                o.loss_scale_growth_interval);
}

void check_resume_compatible(const CheckpointReader& ckpt, const ModelConfig& config,
                             const nlohmann::json& wanted, const std::string& tokenizer) {
  const auto& saved = ckpt.info();
  auto saved_model = saved.model.to_json();
  auto wanted_model = config.to_json();
  for (auto it = wanted_model.begin(); it != wanted_model.end(); ++it)
    SHARDLM_CHECK(saved_model.value(it.key(), nlohmann::json()) == it.value(),
                  "checkpoint '{}' was trained with model {}={}, but this run asks for {} "
                  "(use another --out, or the same model flags)",
                  ckpt.dir(), it.key(), saved_model.value(it.key(), nlohmann::json()).dump(),
                  it.value().dump());
  SHARDLM_CHECK(saved.tokenizer == tokenizer,
                "checkpoint '{}' was trained with tokenizer '{}', the data uses '{}'", ckpt.dir(),
                saved.tokenizer, tokenizer);
  const auto& saved_train = saved.train.at("options");
  // A key the checkpoint lacks was written before that option existed: it ran with
  // the option's default.
  const nlohmann::json defaults = TrainOptions{}.trajectory_json();
  for (auto it = wanted.begin(); it != wanted.end(); ++it) {
    const nlohmann::json saved_value =
        saved_train.contains(it.key()) ? saved_train.at(it.key()) : defaults.value(it.key(), nlohmann::json());
    SHARDLM_CHECK(saved_value == it.value(),
                  "checkpoint '{}' was trained with {}={}, but this run asks for {} (resume "
                  "needs the same value)",
                  ckpt.dir(), it.key(), saved_value.dump(), it.value().dump());
  }
}

void check_ranks_agree(Communicator& comm, const nlohmann::json& mine) {
  std::string text = mine.dump();
  comm.broadcast_string(text, 0, "start-up agreement");
  const nlohmann::json root = nlohmann::json::parse(text);
  const auto flat_root = root.flatten();
  const auto flat_mine = mine.flatten();
  for (auto it = flat_root.begin(); it != flat_root.end(); ++it) {
    auto other = flat_mine.value(it.key(), nlohmann::json());
    SHARDLM_CHECK(other == it.value(),
                  "rank {} disagrees with rank 0 on {}: {} here, {} on rank 0 (all ranks must "
                  "run the same command on the same data)",
                  comm.rank(), it.key(), other.dump(), it.value().dump());
  }
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return 1;
}

int local_ranks(int world_size) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(s));
  return world_size;
}

}  // namespace shardlm
