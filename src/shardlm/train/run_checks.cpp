#include "shardlm/train/run_checks.hpp"

#include <algorithm>
#include <cstdlib>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

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
  // A field only the checkpoint has (quantize_base of a QLoRA run resumed without it).
  for (auto it = saved_model.begin(); it != saved_model.end(); ++it)
    SHARDLM_CHECK(wanted_model.contains(it.key()),
                  "checkpoint '{}' was trained with model {}={}, but this run asks for none "
                  "(use another --out, or the same model flags)",
                  ckpt.dir(), it.key(), it.value().dump());
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

}  // namespace shardlm
