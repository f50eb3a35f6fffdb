#include "shardlm/ckpt/hf_export.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/finite.hpp"
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
  const fs::path config_path = dir / "config.json";
  for (const fs::path& target : {weights, config_path})
    SHARDLM_CHECK(!fs::exists(target), "'{}' already exists (export never overwrites; choose "
                  "another --out)", target.string());

  // Everything is read and checked before the output directory is touched.
  std::vector<std::vector<float>> storage;
  std::vector<safetensors::TensorView> views;
  storage.reserve(checkpoint.tensors().size());
  for (const auto& [name, shape] : checkpoint.tensors()) {
    const auto hf_shape = hugging_face_shape(name, shape, config);
    const int64_t numel = safetensors::shape_numel(hf_shape);
    storage.emplace_back(static_cast<size_t>(numel));
    // Padded vocabulary rows come last, so the real rows are a prefix.
    checkpoint.read(name, StateKind::master, 0, numel, storage.back().data());
    SHARDLM_CHECK(all_finite(storage.back().data(), numel),
                  "checkpoint '{}' tensor '{}' holds non-finite values (NaN or infinity); "
                  "refusing to export it",
                  checkpoint.dir(), name);
    views.push_back({name, safetensors::DType::F32, hf_shape, storage.back().data()});
  }
  const std::vector<std::string> created = create_directories_reporting(out_dir);
  const fs::path tmp = dir / "model.safetensors.tmp";
  try {
    AtomicFileWriter config_file(config_path.string());
    const std::string config_text = hugging_face_config_json(config);
    config_file.write(config_text.data(), config_text.size());
    config_file.finish();
    safetensors::write_file(tmp.string(), views, {{"format", "pt"}});
    SHARDLM_CHECK(std::rename(tmp.c_str(), weights.c_str()) == 0, "cannot rename '{}' to '{}': {}",
                  tmp.string(), weights.string(), std::strerror(errno));
    config_file.commit();
  } catch (...) {
    // Nothing half-written stays behind, nor a directory this export made.
    std::error_code ec;
    fs::remove(tmp, ec);
    if (!fs::exists(config_path, ec)) fs::remove(weights, ec);
    remove_created_directories(created);
    throw;
  }
}

namespace {

// The config.json beside imported weights must describe the model being trained.
// The family reads it (ModelFamily::config_from_hf: every field that changes the
// computation is honoured or refused by name); then every field that defines the
// model must equal the run's.
void check_imported_config(const fs::path& config_path, const ModelConfig& config) {
  nlohmann::json hf;
  try {
    hf = nlohmann::json::parse(read_text_file(config_path.string()));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", config_path.string(), e.what()));
  }
  ModelConfig imported;
  try {
    const ModelFamily& family = hf.contains("model_type") && hf.at("model_type").is_string()
                                    ? model_family_for_hf(hf.at("model_type").get<std::string>())
                                    : model_family(config.family);
    imported = family.config_from_hf(hf);
  } catch (const Error& e) {
    throw Error(fmt::format("--init-from '{}': {}", config_path.string(), e.what()));
  }
  // Flags that set each field, for the message.
  const std::map<std::string, std::string> flags = {
      {"n_layer", "--n-layer"}, {"n_head", "--n-head"}, {"n_embd", "--n-embd"},
      {"vocab_size", "--vocab-size"}, {"max_seq_len", "--context-len"}};
  nlohmann::json theirs = imported.to_json();
  nlohmann::json ours = config.to_json();
  theirs.erase("init_std");  // init only: no effect on imported weights
  ours.erase("init_std");
  for (auto it = ours.begin(); it != ours.end(); ++it) {
    const nlohmann::json value = theirs.value(it.key(), nlohmann::json());
    if (value == it.value()) continue;
    const auto flag = flags.find(it.key());
    throw Error(fmt::format("'{}' describes another model: {}={} there, {} in the model being "
                            "trained{}",
                            config_path.string(), it.key(), value.dump(), it.value().dump(),
                            flag == flags.end() ? "" : " (set " + flag->second + ")"));
  }
}

}  // namespace

void import_hugging_face(const std::string& path, const ModelConfig& config,
                         const ParamLayout& layout, Strategy& strategy) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "model.safetensors";
  SHARDLM_CHECK(fs::exists(file), "--init-from: '{}' not found (expected a .safetensors file or a "
                "directory holding model.safetensors)", file.string());
  const fs::path config_path = file.parent_path() / "config.json";
  if (fs::exists(config_path)) check_imported_config(config_path, config);
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
  // A tied model reads its head from the embedding: a stored head that differs from it
  // belongs to another (untied) model and would be dropped silently.
  if (config.tie_embeddings && reader.entries().count("lm_head.weight"))
    SHARDLM_CHECK(reader.read("lm_head.weight").to_f32() ==
                      reader.read(resolve("transformer.wte.weight")).to_f32(),
                  "'{}' holds an lm_head.weight that differs from the token embedding (an untied "
                  "head), but the model being trained ties them; importing would drop it",
                  file.string());
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
      SHARDLM_CHECK(all_finite(values.data(), static_cast<int64_t>(values.size())),
                    "'{}' tensor '{}' holds non-finite values (NaN or infinity)", file.string(),
                    stored);
      std::memcpy(s.master + (lo - s.begin), values.data() + (lo - p.offset),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
  strategy.after_load();
}

}  // namespace shardlm
