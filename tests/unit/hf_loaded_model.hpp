// A model, its single-process strategy and a runner, loaded from a Hugging Face
// directory: what the interchange tests of every family compare logits and weights with.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/train/model_runner.hpp"

namespace shardlm::testing_support {

struct HfLoadedModel {
  ModelConfig config;
  ParamLayout layout;
  std::unique_ptr<Model> model;
  SingleProcessCommunicator comm;
  std::unique_ptr<FlatUnitStrategy> strategy;

  HfLoadedModel(const std::string& dir, int T)
      : config(read_hf_model_config(dir)), layout(ParamLayout::build(config, 1)) {
    model = model_family(config.family).make_model(config, layout, 1, T, {}, MemoryTracker::global());
    strategy = std::make_unique<FlatUnitStrategy>(layout, model->unit_needs(), comm, StrategyOptions{});
    import_hugging_face(dir, config, layout, *strategy);
  }
  std::vector<float> logits(const std::vector<int32_t>& tokens) {
    ModelRunner runner(*model, *strategy);
    const int T = static_cast<int>(tokens.size());
    runner.forward(MicroBatch{tokens.data(), nullptr, 1, T}, false, 1.0f);
    std::vector<float> all, row(static_cast<size_t>(config.vocab_size));
    for (int t = 0; t < T; ++t) {
      model->logits_at(strategy->params(), t, row.data());
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  }
  std::vector<float> master(int unit) const {
    OwnedSlice s = strategy->owned(unit);
    return std::vector<float>(s.master, s.master + s.size());
  }
};

}  // namespace shardlm::testing_support
