#include "shardlm/ckpt/hf_import.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/finite.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

nlohmann::json read_json(const fs::path& path) {
  try {
    return nlohmann::json::parse(read_text_file(path.string()));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()));
  }
}

fs::path config_path_of(const std::string& path) {
  const fs::path p(path);
  return fs::is_directory(p) ? p / "config.json" : p;
}

// Shapes as Hugging Face stores them: vocabulary matrices without shardlm's padding rows.
std::vector<int64_t> hf_shape(const ParamInfo& p) {
  std::vector<int64_t> shape = p.piece.full_shape(p.shape);  // a tensor-parallel piece's tensor
  if (p.valid_rows >= 0) shape[0] = p.valid_rows;
  return shape;
}

// A tensor-parallel piece's values (row-major in the piece) out of the full tensor's.
std::vector<float> piece_values(const ParamInfo& p, const std::vector<float>& full) {
  std::vector<float> values(static_cast<size_t>(p.logical_numel()));
  p.piece.for_each_run(p.shape, 0, p.logical_numel(), [&](int64_t from, int64_t local, int64_t n) {
    std::copy_n(full.begin() + from, n, values.begin() + local);
  });
  return values;
}

// Where each stored tensor lives: one file, or the shards of an index.
struct WeightFiles {
  std::map<std::string, std::unique_ptr<safetensors::Reader>> readers;  // by file path
  std::map<std::string, safetensors::Reader*> by_tensor;                // stored name -> reader
  std::string description;                                              // for errors
};

WeightFiles open_weights(const std::string& path) {
  WeightFiles w;
  fs::path p(path);
  std::vector<fs::path> files;
  if (fs::is_directory(p)) {
    const fs::path single = p / "model.safetensors", index = p / "model.safetensors.index.json";
    if (fs::exists(index)) {
      const nlohmann::json j = read_json(index);
      SHARDLM_CHECK(j.contains("weight_map") && j.at("weight_map").is_object(),
                    "'{}' has no weight_map object", index.string());
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
        const fs::path file = p / it.value().get<std::string>();
        auto& reader = w.readers[file.string()];
        if (!reader) {
          SHARDLM_CHECK(fs::exists(file), "'{}' names shard '{}', which does not exist",
                        index.string(), file.string());
          reader = std::make_unique<safetensors::Reader>(file.string());
        }
        SHARDLM_CHECK(reader->entries().count(it.key()),
                      "'{}' says tensor '{}' is in '{}', which does not hold it", index.string(),
                      it.key(), file.string());
        w.by_tensor[it.key()] = reader.get();
      }
      w.description = index.string();
      return w;
    }
    SHARDLM_CHECK(fs::exists(single),
                  "--init-from: '{}' holds neither model.safetensors nor "
                  "model.safetensors.index.json",
                  path);
    p = single;
  }
  SHARDLM_CHECK(fs::exists(p), "--init-from: '{}' not found (expected a .safetensors file or a "
                "directory holding model.safetensors)", p.string());
  auto reader = std::make_unique<safetensors::Reader>(p.string());
  for (const auto& [name, entry] : reader->entries()) w.by_tensor[name] = reader.get();
  w.readers[p.string()] = std::move(reader);
  w.description = p.string();
  return w;
}

// The run's model against the one config.json describes; the first field that differs,
// with the flag that sets it.
// Every field that differs is named (with the flag that sets it), and both shapes.
void check_same_model(const ModelConfig& run, const ModelConfig& stored, const fs::path& where) {
  static const std::map<std::string, std::string> flags = {
      {"n_layer", "--n-layer"}, {"n_head", "--n-head"}, {"n_embd", "--n-embd"},
      {"vocab_size", "--vocab-size"}, {"max_seq_len", "--context-len"}, {"family", "--model"}};
  const nlohmann::json a = run.to_json(), b = stored.to_json();
  std::vector<std::string> differences, to_set;
  for (auto it = a.begin(); it != a.end(); ++it) {
    // Init does not matter to imported weights; adapters and the base's quantization
    // (QLoRA quantizes the weights on load) are the run's, not the base's.
    if (it.key() == "init_std" || it.key() == "lora" || it.key() == "quantize_base") continue;
    const nlohmann::json other = b.value(it.key(), nlohmann::json());
    if (other == it.value()) continue;
    differences.push_back(fmt::format("{}={} there, {} here", it.key(), other.dump(), it.value().dump()));
    const auto flag = flags.find(it.key());
    if (flag != flags.end() && it.key() != "family")
      to_set.push_back(fmt::format("{} {}", flag->second, other.is_string() ? other.get<std::string>() : other.dump()));
  }
  if (differences.empty()) return;
  throw Error(fmt::format(
      "'{}' describes another model than the one being trained ({}): it is {}; the run's (--model "
      "and its flags) is {}; train it with --model {} (its own shape){}",
      where.string(), fmt::join(differences, "; "), stored.shape_description(),
      run.shape_description(), where.parent_path().string(),
      to_set.empty() ? "" : fmt::format(", or set {}", fmt::join(to_set, " "))));
}

}  // namespace

bool is_hf_model_path(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p)) return fs::exists(p / "config.json");
  return p.filename() == "config.json" && fs::exists(p);
}

ModelConfig read_hf_model_config(const std::string& path) {
  const fs::path config_path = config_path_of(path);
  SHARDLM_CHECK(fs::exists(config_path), "'{}' not found (expected a Hugging Face config.json)",
                config_path.string());
  const nlohmann::json hf = read_json(config_path);
  SHARDLM_CHECK(hf.is_object() && hf.contains("model_type") && hf.at("model_type").is_string(),
                "'{}' has no model_type (expected gpt2, llama, qwen2 or qwen3)",
                config_path.string());
  try {
    return model_family_for_hf(hf.at("model_type").get<std::string>()).config_from_hf(hf);
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': {}", config_path.string(), e.what()));
  }
}

namespace {

// The stored tensors the model reads, checked against the layout from the files'
// headers alone: every stored tensor is one the model has, every tensor the model
// imports is there once, with its Hugging Face shape and a dtype the import reads.
struct MatchedWeights {
  WeightFiles files;
  std::map<std::string, std::string> stored_name;  // shardlm name -> stored name
};

// A LoRA run takes its base from the files; its adapters (the trainable units) are the
// caller's to initialise.
bool imported(const ModelConfig& config, const UnitLayout& unit) {
  return !(config.lora.enabled() && unit.trainable);
}

MatchedWeights match_weights(const std::string& path, const ModelConfig& config,
                             const ParamLayout& layout) {
  const ModelFamily& family = model_family(config.family);
  MatchedWeights m{open_weights(path), {}};
  WeightFiles& files = m.files;
  std::map<std::string, std::string>& stored_name = m.stored_name;
  for (const auto& [name, reader] : files.by_tensor) {
    const std::string canonical = family.hf_name(name);
    if (canonical.empty()) continue;  // not a weight (old GPT-2 mask buffers)
    if (canonical == "lm_head.weight" && config.tie_embeddings) continue;  // HF ties it too
    bool known = false;
    for (const auto* p : layout.all_params()) known = known || p->name == canonical;
    SHARDLM_CHECK(known, "'{}' holds tensor '{}', which the model being trained ({}) does not have",
                  files.description, name, config.shape_description());
    SHARDLM_CHECK(!stored_name.count(canonical), "'{}' holds tensor '{}' twice ('{}' and '{}')",
                  files.description, canonical, stored_name[canonical], name);
    stored_name[canonical] = name;
  }
  for (const auto& unit : layout.units) {
    if (!imported(config, unit)) continue;
    for (const auto& p : unit.params) {
      SHARDLM_CHECK(stored_name.count(p.name),
                    "'{}' has no tensor '{}', which the model being trained ({}) needs",
                    files.description, p.name, config.shape_description());
      const std::string& stored = stored_name.at(p.name);
      const safetensors::Reader& reader = *files.by_tensor.at(stored);
      const auto& entry = reader.entry(stored);
      const auto want = hf_shape(p);
      SHARDLM_CHECK(entry.shape == want,
                    "'{}' tensor '{}' has shape [{}], expected [{}] for the model being trained ({})",
                    reader.path(), stored, fmt::join(entry.shape, ", "), fmt::join(want, ", "),
                    config.shape_description());
      using safetensors::DType;
      SHARDLM_CHECK(entry.dtype == DType::F32 || entry.dtype == DType::BF16 ||
                        entry.dtype == DType::F16 || entry.dtype == DType::F64,
                    "'{}' tensor '{}' has dtype {}, expected F32, BF16, F16 or F64", reader.path(),
                    stored, safetensors::dtype_name(entry.dtype));
    }
  }
  return m;
}

}  // namespace

void check_hf_model_matches(const std::string& path, const ModelConfig& config) {
  SHARDLM_CHECK(fs::exists(path), "--init-from: '{}' not found (expected a .safetensors file or a "
                "directory holding model.safetensors)", path);
  const fs::path base = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (fs::exists(base / "config.json"))
    check_same_model(config, read_hf_model_config(base.string()), base / "config.json");
  // Names, shapes and dtypes do not depend on the world size.
  match_weights(path, config, ParamLayout::build(config, 1));
}

void import_hugging_face(const std::string& path, const ModelConfig& config,
                         const ParamLayout& layout, OwnedState& state) {
  const ModelFamily& family = model_family(config.family);
  check_hf_model_matches(path, config);
  MatchedWeights matched = match_weights(path, config, layout);
  WeightFiles& files = matched.files;
  const std::map<std::string, std::string>& stored_name = matched.stored_name;
  // A tied model reads its head from the embedding: a stored head that differs from it
  // belongs to another (untied) model and would be dropped silently.
  if (config.tie_embeddings) {
    const std::string embedding = layout.all_params().front()->name;
    for (const auto& [name, reader] : files.by_tensor)
      if (family.hf_name(name) == "lm_head.weight")
        SHARDLM_CHECK(reader->read(name).to_f32() ==
                          files.by_tensor.at(stored_name.at(embedding))->read(stored_name.at(embedding)).to_f32(),
                      "'{}' holds an lm_head.weight that differs from the token embedding (an "
                      "untied head), but the model being trained ties them; importing would drop it",
                      files.description);
  }

  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice s = state.owned(u);
    const bool load = imported(config, layout.units[static_cast<size_t>(u)]);
    if (load) zero_owned_params(s);
    for (float* state : {s.adam_m, s.adam_v})
      if (state != nullptr) std::memset(state, 0, static_cast<size_t>(s.size()) * sizeof(float));
    if (!load) continue;
    for (const auto& p : layout.units[static_cast<size_t>(u)].params) {
      const std::string& stored = stored_name.at(p.name);
      safetensors::Reader& reader = *files.by_tensor.at(stored);
      const int64_t lo = std::max(s.begin, p.offset);
      // A QLoRA base weight is quantized on load; its elements are the NF4 words.
      const int64_t numel =
          p.quantized() || !p.piece.whole() ? p.numel : safetensors::shape_numel(hf_shape(p));
      const int64_t hi = std::min(s.end, p.offset + numel);
      if (lo >= hi) continue;
      std::vector<float> values = reader.read(stored).to_f32();
      SHARDLM_CHECK(all_finite(values.data(), static_cast<int64_t>(values.size())),
                    "'{}' tensor '{}' holds non-finite values (NaN or infinity)", reader.path(),
                    stored);
      if (p.storage == ParamStorage::nf4) {
        // A tensor-parallel piece is quantized from its own values, as the run's init is.
        if (!p.piece.whole()) values = piece_values(p, values);
        std::vector<float> words(static_cast<size_t>(p.numel));
        cpu::nf4_quantize(values.data(), static_cast<int64_t>(values.size()), words.data());
        values = std::move(words);
      } else if (!p.piece.whole()) {
        // A tensor-parallel piece: its rows or columns of the logical tensor. A
        // vocabulary piece's rows past the stored ones are padding (left zero).
        const int64_t stored_numel = static_cast<int64_t>(values.size());
        p.piece.for_each_run(p.shape, lo - p.offset, hi - p.offset, [&](int64_t full, int64_t local, int64_t n) {
          const int64_t count = std::clamp<int64_t>(stored_numel - full, 0, n);
          if (count > 0) write_owned_params(s, p.offset + local, count, values.data() + full);
        });
        continue;
      }
      write_owned_params(s, lo, hi - lo, values.data() + (lo - p.offset));
    }
  }
  state.after_load();
}

}  // namespace shardlm
