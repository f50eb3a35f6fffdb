#include "shardlm/model/family.hpp"

#include <algorithm>
#include <vector>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/gpt2/gpt2_family.hpp"
#include "shardlm/model/llama/llama_family.hpp"

namespace shardlm {

namespace {

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// FNV-1a, 64-bit: a stable string hash (std::hash is not specified across
// platforms), so init depends on the parameter name and nothing else.
uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct Registered {
  const char* name;
  const char* hf_model_type;
  const ModelFamily& (*family)();
};

const Registered kFamilies[] = {
    {"gpt2", "gpt2", gpt2_family},
    {"llama", "llama", [] () -> const ModelFamily& { return llama_family(LlamaVariant::llama); }},
    {"qwen2", "qwen2", [] () -> const ModelFamily& { return llama_family(LlamaVariant::qwen2); }},
    {"qwen3", "qwen3", [] () -> const ModelFamily& { return llama_family(LlamaVariant::qwen3); }},
    {"qwen3_moe", "qwen3_moe", [] () -> const ModelFamily& { return llama_family(LlamaVariant::qwen3_moe); }},
    {"qwen2_moe", "qwen2_moe", [] () -> const ModelFamily& { return llama_family(LlamaVariant::qwen2_moe); }},
    {"mixtral", "mixtral", [] () -> const ModelFamily& { return llama_family(LlamaVariant::mixtral); }},
};

std::string known_list(const char* Registered::*field) {
  std::string out;
  for (const auto& f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f.*field);
  return out;
}

}  // namespace

const ModelFamily& model_family(const std::string& family) {
  for (const auto& f : kFamilies)
    if (family == f.name) return f.family();
  throw Error(fmt::format("model family '{}' is not supported (expected one of: {})", family,
                          known_list(&Registered::name)));
}

const ModelFamily& model_family_for_hf(const std::string& model_type) {
  for (const auto& f : kFamilies)
    if (model_type == f.hf_model_type) return f.family();
  throw Error(fmt::format("config.json model_type '{}' is not supported (expected one of: {})",
                          model_type, known_list(&Registered::hf_model_type)));
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> out;
  for (const auto& f : kFamilies) out.emplace_back(f.name);
  return out;
}

ParamInfo& UnitBuilder::add(std::string name, std::vector<int64_t> shape, ParamInit init,
                            float init_std, bool pack_with_previous) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (auto d : p.shape) p.numel *= d;
  p.offset = pack_with_previous ? unit_.numel : round_up(unit_.numel, ParamLayout::kParamAlignment);
  p.packed_with_previous = pack_with_previous;
  p.weight_decay = p.shape.size() == 2;
  p.init = init;
  p.init_std = init_std;
  unit_.numel = p.offset + p.numel;
  unit_.params.push_back(std::move(p));
  return unit_.params.back();
}

ParamInfo& UnitBuilder::add_nf4(std::string name, std::vector<int64_t> shape, ParamInit init,
                                float init_std) {
  ParamInfo& p = add(std::move(name), std::move(shape), init, init_std);
  p.storage = ParamStorage::nf4;
  p.numel = cpu::nf4_storage_words(p.logical_numel());
  p.weight_decay = false;
  unit_.numel = p.offset + p.numel;
  unit_.raw = true;
  return p;
}

namespace {

// Element i of p's fp32 init for i in [first, last) into out[i - first] (out zeroed).
// A tensor-parallel piece draws the full tensor's stream and keeps its own elements, so
// every rank's piece is the unsplit run's values there.
void init_values(const ParamInfo& p, uint64_t seed, int64_t first, int64_t last, float* out) {
  if (p.init == ParamInit::ones) {
    std::fill(out, out + (last - first), 1.0f);
  } else if (p.init == ParamInit::normal || p.init == ParamInit::uniform) {
    const std::vector<int64_t> full_shape = p.piece.full_shape(p.shape);
    int64_t n = 1;
    for (auto d : full_shape) n *= d;
    const int64_t count = p.valid_rows < 0 ? n : p.valid_rows * (n / std::max<int64_t>(full_shape[0], 1));
    const bool normal = p.init == ParamInit::normal;
    // The stream is sequential: draw up to the range's end, keep what falls in it.
    Rng rng(splitmix64(seed ^ fnv1a64(p.name)));
    if (p.piece.whole()) {
      for (int64_t i = 0; i < std::min(count, last); ++i) {
        const double r = normal ? rng.normal() : 2.0 * rng.uniform() - 1.0;
        const float value = static_cast<float>(r) * p.init_std;
        if (i >= first) out[i - first] = value;
      }
      return;
    }
    // Full-tensor indices of the range's elements increase with the local index.
    const int64_t stop = std::min(count, p.piece.full_index(p.shape, last - 1) + 1);
    int64_t next = first;  // the next local element to fill
    int64_t next_full = p.piece.full_index(p.shape, next);
    for (int64_t i = 0; i < stop && next < last; ++i) {
      const double r = normal ? rng.normal() : 2.0 * rng.uniform() - 1.0;
      if (i != next_full) continue;
      out[next - first] = static_cast<float>(r) * p.init_std;
      if (++next < last) next_full = p.piece.full_index(p.shape, next);
    }
  }  // zeros: out is zeroed already
}

}  // namespace

void init_param_range(const UnitLayout& u, uint64_t seed, int64_t begin, int64_t end,
                      float* out) {
  SHARDLM_CHECK(0 <= begin && begin <= end && end <= u.padded_numel,
                "model: init range [{}, {}) is outside unit {} of {} elements", begin, end,
                u.name, u.padded_numel);
  std::fill(out, out + (end - begin), 0.0f);
  for (const ParamInfo& p : u.params) {
    // The part of the parameter inside [begin, end), in parameter-local indices.
    const int64_t first = std::max<int64_t>(begin - p.offset, 0);
    const int64_t last = std::min<int64_t>(end - p.offset, p.numel);
    if (first >= last) continue;
    const int64_t shift = p.offset - begin;  // out[shift + i] is element i of the parameter
    if (p.storage == ParamStorage::nf4) {
      // The whole tensor's values, quantized; the words in range kept.
      std::vector<float> values(static_cast<size_t>(p.logical_numel()), 0.0f);
      init_values(p, seed, 0, p.logical_numel(), values.data());
      std::vector<float> words(static_cast<size_t>(p.numel));
      cpu::nf4_quantize(values.data(), p.logical_numel(), words.data());
      std::copy(words.begin() + first, words.begin() + last, out + shift + first);
    } else {
      init_values(p, seed, first, last, out + shift + first);
    }
  }
}

// Model's non-virtual conveniences.

namespace {
std::vector<ConstTypedPtr> typed(UnitPointers params) {
  return std::vector<ConstTypedPtr>(params.begin(), params.end());
}
}  // namespace

void Model::forward_unit(int unit, UnitPointers params, UnitPointers grads,
                         const MicroBatch& batch, bool training, float grad_scale) {
  const auto p = typed(params);
  forward_unit(unit, ParamPointers(p), grads, batch, training, grad_scale);
}

void Model::backward_unit(int unit, UnitPointers params, UnitPointers grads,
                          const MicroBatch& batch) {
  const auto p = typed(params);
  backward_unit(unit, ParamPointers(p), grads, batch);
}

void Model::logits_at(UnitPointers params, int t, float* out) const {
  const auto p = typed(params);
  logits_at(ParamPointers(p), t, out);
}

void Model::forward_unit_cached(int unit, UnitPointers params, KvCache& cache,
                                const MicroBatch& batch) {
  const auto p = typed(params);
  forward_unit_cached(unit, ParamPointers(p), cache, batch);
}

void Model::init_unit(int unit, uint64_t seed, float* unit_params) const {
  SHARDLM_CHECK(unit >= 0 && unit < layout().num_units(), "model: layout unit {} out of range [0, {})",
                unit, layout().num_units());
  init_range(unit, seed, 0, layout().units[static_cast<size_t>(unit)].padded_numel, unit_params);
}

void Model::init_range(int unit, uint64_t seed, int64_t begin, int64_t end, float* out) const {
  SHARDLM_CHECK(unit >= 0 && unit < layout().num_units(), "model: layout unit {} out of range [0, {})",
                unit, layout().num_units());
  init_param_range(layout().units[static_cast<size_t>(unit)], seed, begin, end, out);
}

std::vector<std::vector<int>> Model::unit_needs() const {
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < num_units(); ++m) needs.push_back(units_needed_for(m));
  return needs;
}

}  // namespace shardlm
