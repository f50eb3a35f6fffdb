#include "shardlm/model/param_layout.hpp"

#include <cmath>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

class UnitBuilder {
 public:
  explicit UnitBuilder(std::string name) { unit_.name = std::move(name); }
  ParamInfo& add(std::string name, std::vector<int64_t> shape, std::string init,
                 float init_std = 0.0f) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (auto d : p.shape) p.numel *= d;
    p.offset = round_up(unit_.numel, ParamLayout::kParamAlignment);
    p.weight_decay = p.shape.size() == 2;
    p.init = std::move(init);
    p.init_std = init_std;
    unit_.numel = p.offset + p.numel;
    unit_.params.push_back(std::move(p));
    return unit_.params.back();
  }
  UnitLayout finish() { return std::move(unit_); }

 private:
  UnitLayout unit_;
};

}  // namespace

std::string gpt2_param_name(int layer, const std::string& suffix) {
  return "transformer.h." + std::to_string(layer) + "." + suffix;
}

const ParamInfo& UnitLayout::param(const std::string& param_name) const {
  for (const auto& p : params)
    if (p.name == param_name) return p;
  throw Error("unit '" + name + "' has no parameter '" + param_name + "'");
}

ParamLayout ParamLayout::build(const ModelConfig& config, int world_size, int64_t min_unit_params) {
  config.validate();
  SHARDLM_CHECK(world_size > 0, "world size must be positive, got {}", world_size);
  SHARDLM_CHECK(min_unit_params >= 0, "--min-unit-params must be >= 0, got {}", min_unit_params);
  const int64_t C = config.n_embd;
  const int64_t V = config.padded_vocab_size();
  const float std = config.init_std;
  const float residual_std = std / std::sqrt(2.0f * static_cast<float>(config.n_layer));

  // The model units, each laid out from offset 0.
  std::vector<UnitLayout> model_units;
  UnitBuilder embeddings("embeddings");
  embeddings.add("transformer.wte.weight", {V, C}, "normal", std).valid_rows = config.vocab_size;
  embeddings.add("transformer.wpe.weight", {config.max_seq_len, C}, "normal", std);
  model_units.push_back(embeddings.finish());

  for (int l = 0; l < config.n_layer; ++l) {
    UnitBuilder block("h." + std::to_string(l));
    // Weights are stored [in, out] as Hugging Face's Conv1D does: y = x W + b.
    block.add(gpt2_param_name(l, "ln_1.weight"), {C}, "ones");
    block.add(gpt2_param_name(l, "ln_1.bias"), {C}, "zeros");
    block.add(gpt2_param_name(l, "attn.c_attn.weight"), {C, 3 * C}, "normal", std);
    block.add(gpt2_param_name(l, "attn.c_attn.bias"), {3 * C}, "zeros");
    block.add(gpt2_param_name(l, "attn.c_proj.weight"), {C, C}, "normal", residual_std);
    block.add(gpt2_param_name(l, "attn.c_proj.bias"), {C}, "zeros");
    block.add(gpt2_param_name(l, "ln_2.weight"), {C}, "ones");
    block.add(gpt2_param_name(l, "ln_2.bias"), {C}, "zeros");
    block.add(gpt2_param_name(l, "mlp.c_fc.weight"), {C, 4 * C}, "normal", std);
    block.add(gpt2_param_name(l, "mlp.c_fc.bias"), {4 * C}, "zeros");
    block.add(gpt2_param_name(l, "mlp.c_proj.weight"), {4 * C, C}, "normal", residual_std);
    block.add(gpt2_param_name(l, "mlp.c_proj.bias"), {C}, "zeros");
    model_units.push_back(block.finish());
  }

  UnitBuilder final_unit("final");
  final_unit.add("transformer.ln_f.weight", {C}, "ones");
  final_unit.add("transformer.ln_f.bias", {C}, "zeros");
  if (!config.tie_embeddings)
    final_unit.add("lm_head.weight", {V, C}, "normal", std).valid_rows = config.vocab_size;
  model_units.push_back(final_unit.finish());

  // Group consecutive model units until a group reaches min_unit_params; a small
  // last group joins the one before it.
  std::vector<std::vector<int>> groups;
  int64_t group_numel = 0;
  for (int m = 0; m < static_cast<int>(model_units.size()); ++m) {
    if (groups.empty() || group_numel >= min_unit_params) {
      groups.emplace_back();
      group_numel = 0;
    }
    groups.back().push_back(m);
    group_numel += model_units[static_cast<size_t>(m)].numel;
  }
  if (groups.size() > 1 && group_numel < min_unit_params) {
    auto last = groups.back();
    groups.pop_back();
    groups.back().insert(groups.back().end(), last.begin(), last.end());
  }

  ParamLayout layout;
  layout.world_size = world_size;
  layout.model_units.resize(model_units.size());
  for (const auto& group : groups) {
    UnitLayout unit;
    for (int m : group) {
      const UnitLayout& part = model_units[static_cast<size_t>(m)];
      const int64_t base = round_up(unit.numel, kParamAlignment);
      layout.model_units[static_cast<size_t>(m)] = {static_cast<int>(layout.units.size()), base};
      unit.name += (unit.name.empty() ? "" : "+") + part.name;
      for (ParamInfo p : part.params) {
        p.offset += base;
        unit.params.push_back(std::move(p));
      }
      unit.numel = base + part.numel;
    }
    unit.padded_numel = round_up(unit.numel, kParamAlignment * world_size);
    layout.units.push_back(std::move(unit));
  }
  return layout;
}

int64_t ParamLayout::offset_in_model_unit(int model_unit, const std::string& name) const {
  SHARDLM_ASSERT(model_unit >= 0 && model_unit < num_model_units());
  const ModelUnitPlacement& place = model_units[static_cast<size_t>(model_unit)];
  const ParamInfo& p = units[static_cast<size_t>(place.unit)].param(name);
  return p.offset - place.base;
}

int64_t ParamLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units)
    for (const auto& p : u.params) n += p.numel;
  return n;
}

int64_t ParamLayout::total_padded_numel() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.padded_numel;
  return n;
}

std::vector<const ParamInfo*> ParamLayout::all_params() const {
  std::vector<const ParamInfo*> out;
  for (const auto& u : units)
    for (const auto& p : u.params) out.push_back(&p);
  return out;
}

std::pair<int, const ParamInfo*> ParamLayout::find(const std::string& name) const {
  for (int i = 0; i < num_units(); ++i)
    for (const auto& p : units[i].params)
      if (p.name == name) return {i, &p};
  throw Error(fmt::format("no parameter named '{}' in the model", name));
}

}  // namespace shardlm
