#include "shardlm/ckpt/hf_export.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/model/family.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

// Tensors stored with padded vocabulary rows in shardlm, unpadded in Hugging Face.
bool is_vocabulary_matrix(const std::string& name) {
  return name == "transformer.wte.weight" || name == "lm_head.weight";
}

std::vector<int64_t> hugging_face_shape(const std::string& name, std::vector<int64_t> shape,
                                        const ModelConfig& config) {
  if (is_vocabulary_matrix(name)) shape[0] = config.vocab_size;
  return shape;
}

// Old transformers versions store these causal-mask buffers; they are not weights.
bool is_mask_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("attn.bias") || ends_with("attn.masked_bias");
}

}  // namespace

std::string hugging_face_config_json(const ModelConfig& c) {
  return model_family(c.family).hf_config(c).dump(2) + "\n";
}

void export_hugging_face(const CheckpointReader& checkpoint, const std::string& out_dir) {
  const ModelConfig& config = checkpoint.info().model;
  const fs::path dir(out_dir);
  const fs::path weights = dir / "model.safetensors";
  SHARDLM_CHECK(!fs::exists(weights), "'{}' already exists (export never overwrites; choose "
                "another --out)", weights.string());
  std::error_code ec;
  fs::create_directories(dir, ec);
  SHARDLM_CHECK(!ec, "cannot create '{}': {}", out_dir, ec.message());

  std::vector<std::vector<float>> storage;
  std::vector<safetensors::TensorView> views;
  storage.reserve(checkpoint.tensors().size());
  for (const auto& [name, shape] : checkpoint.tensors()) {
    const auto hf_shape = hugging_face_shape(name, shape, config);
    const int64_t numel = safetensors::shape_numel(hf_shape);
    storage.emplace_back(static_cast<size_t>(numel));
    // Padded vocabulary rows come last, so the real rows are a prefix.
    checkpoint.read(name, StateKind::master, 0, numel, storage.back().data());
    views.push_back({name, safetensors::DType::F32, hf_shape, storage.back().data()});
  }
  const fs::path tmp = dir / "model.safetensors.tmp";
  safetensors::write_file(tmp.string(), views, {{"format", "pt"}});
  SHARDLM_CHECK(std::rename(tmp.c_str(), weights.c_str()) == 0, "cannot rename '{}' to '{}': {}",
                tmp.string(), weights.string(), std::strerror(errno));
  write_file_atomic((dir / "config.json").string(), hugging_face_config_json(config));
}

void import_hugging_face(const std::string& path, const ModelConfig& config,
                         const ParamLayout& layout, Strategy& strategy) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "model.safetensors";
  SHARDLM_CHECK(fs::exists(file), "--init-from: '{}' not found (expected a .safetensors file or a "
                "directory holding model.safetensors)", file.string());
  const fs::path config_path = file.parent_path() / "config.json";
  if (fs::exists(config_path)) {
    nlohmann::json hf;
    try {
      hf = nlohmann::json::parse(read_text_file(config_path.string()));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("'{}' is not valid JSON: {}", config_path.string(), e.what()));
    }
    const std::pair<const char*, int> fields[] = {{"n_layer", config.n_layer},
                                                  {"n_head", config.n_head},
                                                  {"n_embd", config.n_embd},
                                                  {"vocab_size", config.vocab_size},
                                                  {"n_positions", config.max_seq_len}};
    for (const auto& [field, want] : fields)
      SHARDLM_CHECK(!hf.contains(field) || hf.at(field).get<int>() == want,
                    "'{}' has {}={}, but the model being trained has {}", config_path.string(),
                    field, hf.at(field).dump(), want);
  }
  safetensors::Reader reader(file.string());
  auto resolve = [&](const std::string& name) -> std::string {
    if (reader.entries().count(name)) return name;
    const std::string bare = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (reader.entries().count(bare)) return bare;
    throw Error(fmt::format("'{}' has no tensor '{}' (or '{}') that the model needs",
                            file.string(), name, bare));
  };
  for (const auto& [name, entry] : reader.entries()) {
    const std::string full = name.rfind("transformer.", 0) == 0 || name == "lm_head.weight"
                                 ? name
                                 : "transformer." + name;
    bool known = is_mask_buffer(name) || (name == "lm_head.weight" && config.tie_embeddings);
    for (const auto* p : layout.all_params()) known = known || p->name == full;
    SHARDLM_CHECK(known, "'{}' holds tensor '{}', which a GPT-2 of this shape does not have",
                  file.string(), name);
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice s = strategy.owned(u);
    for (float* state : {s.master, s.adam_m, s.adam_v})
      std::memset(state, 0, static_cast<size_t>(s.size()) * sizeof(float));
    for (const auto& p : layout.units[static_cast<size_t>(u)].params) {
      const std::string stored = resolve(p.name);
      const auto& entry = reader.entry(stored);
      const auto want = hugging_face_shape(p.name, p.shape, config);
      SHARDLM_CHECK(entry.shape == want, "'{}' tensor '{}' has shape [{}], expected [{}]",
                    file.string(), stored, fmt::join(entry.shape, ", "), fmt::join(want, ", "));
      SHARDLM_CHECK(entry.dtype == safetensors::DType::F32 || entry.dtype == safetensors::DType::BF16 ||
                        entry.dtype == safetensors::DType::F16 || entry.dtype == safetensors::DType::F64,
                    "'{}' tensor '{}' has dtype {}, expected a floating-point type", file.string(),
                    stored, safetensors::dtype_name(entry.dtype));
      const int64_t lo = std::max(s.begin, p.offset);
      const int64_t numel = safetensors::shape_numel(want);
      const int64_t hi = std::min(s.end, p.offset + numel);
      if (lo >= hi) continue;
      const std::vector<float> values = reader.read(stored).to_f32();
      std::memcpy(s.master + (lo - s.begin), values.data() + (lo - p.offset),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
  strategy.after_load();
}

}  // namespace shardlm
