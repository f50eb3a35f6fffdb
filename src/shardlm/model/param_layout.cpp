#include "shardlm/model/param_layout.hpp"

#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

namespace {

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

}  // namespace

int64_t ParamInfo::logical_numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const ParamInfo& UnitLayout::param(const std::string& param_name) const {
  for (const auto& p : params)
    if (p.name == param_name) return p;
  throw Error("unit '" + name + "' has no parameter '" + param_name + "'");
}

ParamLayout ParamLayout::build(const ModelConfig& config, int world_size, int64_t min_unit_params,
                               TensorSplit tensor) {
  config.validate();
  SHARDLM_CHECK(world_size > 0, "world size must be positive, got {}", world_size);
  SHARDLM_CHECK(min_unit_params >= 0, "--min-unit-params must be >= 0, got {}", min_unit_params);
  SHARDLM_CHECK(tensor.size >= 1 && tensor.rank >= 0 && tensor.rank < tensor.size,
                "tensor rank {} is outside a tensor dimension of {}", tensor.rank, tensor.size);
  // The model units, each laid out from offset 0, as this tensor rank holds them.
  const std::vector<UnitLayout> model_units =
      split_for_tensor_rank(model_family(config.family).model_units(config), config, tensor);

  // Group consecutive model units of the same trainability until a group reaches
  // min_unit_params; a small last group joins the one before it when it can.
  std::vector<std::vector<int>> groups;
  int64_t group_numel = 0;
  // Units of different trainability or storage never share a flat unit.
  auto kind = [&](int m) {
    const UnitLayout& u = model_units[static_cast<size_t>(m)];
    return std::pair<bool, bool>(u.trainable, u.raw);
  };
  // An expert is a flat unit of its own (expert parallelism places it alone).
  auto expert = [&](int m) { return model_units[static_cast<size_t>(m)].expert >= 0; };
  for (int m = 0; m < static_cast<int>(model_units.size()); ++m) {
    if (groups.empty() || group_numel >= min_unit_params ||
        kind(groups.back().back()) != kind(m) || expert(m) || expert(groups.back().back())) {
      groups.emplace_back();
      group_numel = 0;
    }
    groups.back().push_back(m);
    group_numel += model_units[static_cast<size_t>(m)].numel;
  }
  if (groups.size() > 1 && group_numel < min_unit_params &&
      kind(groups.back().front()) == kind(groups[groups.size() - 2].front()) &&
      !expert(groups.back().front()) && !expert(groups[groups.size() - 2].back())) {
    auto last = groups.back();
    groups.pop_back();
    groups.back().insert(groups.back().end(), last.begin(), last.end());
  }

  ParamLayout layout;
  layout.world_size = world_size;
  layout.tensor = tensor;
  layout.model_units.resize(model_units.size());
  for (const auto& group : groups) {
    UnitLayout unit;
    unit.trainable = model_units[static_cast<size_t>(group.front())].trainable;
    unit.raw = model_units[static_cast<size_t>(group.front())].raw;
    unit.expert = model_units[static_cast<size_t>(group.front())].expert;
    unit.experts = model_units[static_cast<size_t>(group.front())].experts;
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
    for (const auto& p : u.params) n += p.logical_numel();
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
