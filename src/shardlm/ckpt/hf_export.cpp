#include "shardlm/ckpt/hf_export.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/ckpt/checkpoint_values.hpp"
#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"
#include "shardlm/core/run_directory_lock.hpp"
#include "shardlm/core/finite.hpp"
#include "shardlm/data/tokenizer.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/moe/moe_expert_lora.hpp"

namespace fs = std::filesystem;

namespace shardlm {

namespace {

// Tokenizer files a Hugging Face model directory may hold, copied as they are.
const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                       "special_tokens_map.json", "vocab.json", "merges.txt",
                                       "tokenizer.model", "added_tokens.json", "chat_template.jinja"};

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::fp16: return "float16";
  }
  return "float32";
}

safetensors::DType safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::fp32: return safetensors::DType::F32;
    case DType::bf16: return safetensors::DType::BF16;
    case DType::fp16: return safetensors::DType::F16;
  }
  return safetensors::DType::F32;
}

// The Hugging Face directory the run started from (--init-from), or the one its data's
// tokenizer came from ("hf:DIR" specs); empty when neither exists any more.
fs::path source_directory(const CheckpointInfo& info) {
  // A train record without options (a checkpoint written by a tool, not a run) names no
  // --init-from directory.
  const bool has_options = info.train.is_object() && info.train.contains("options") &&
                           info.train.at("options").is_object();
  const std::string init_from =
      has_options ? info.train.at("options").value("init_from", std::string()) : std::string();
  if (!init_from.empty()) {
    const fs::path p = fs::is_directory(init_from) ? fs::path(init_from) : fs::path(init_from).parent_path();
    if (fs::exists(p / "config.json")) return p;
  }
  const TokenizerSpec spec = parse_tokenizer_spec(info.tokenizer);
  if (spec.kind == "hf" && fs::is_directory(spec.path)) return spec.path;
  return {};
}

// A tensor converted to the export dtype and its name, shape and bytes.
struct ExportTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

ExportTensor export_tensor(const std::string& name, std::vector<int64_t> shape,
                           const std::vector<float>& values, DType dtype) {
  const int64_t numel = safetensors::shape_numel(shape);
  ExportTensor t{name, std::move(shape), std::vector<std::byte>(static_cast<size_t>(numel) * dtype_bytes(dtype))};
  cpu::convert(TypedPtr(t.bytes.data(), dtype), values.data(), numel);
  return t;
}

// The tensor as the run computes with it (ckpt/checkpoint_values.hpp), in dtype.
ExportTensor read_tensor(const CheckpointReader& ckpt, const ParamInfo& param, DType dtype) {
  std::vector<int64_t> shape = param.shape;
  if (param.valid_rows >= 0) shape[0] = param.valid_rows;
  const std::vector<float> values = read_tensor_values(ckpt, param);
  SHARDLM_CHECK(all_finite(values.data(), static_cast<int64_t>(values.size())),
                "checkpoint '{}' tensor '{}' holds non-finite values (NaN or infinity); refusing "
                "to export it",
                ckpt.dir(), param.name);
  return export_tensor(param.name, shape, values, dtype);
}

class TempDirectory {
 public:
  explicit TempDirectory(fs::path path) : path_(std::move(path)) {
    std::error_code ec;
    fs::create_directories(path_, ec);
    SHARDLM_CHECK(!ec, "cannot create '{}': {}", path_.string(), ec.message());
  }
  ~TempDirectory() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

namespace {

// Writes `tensors` as one safetensors file, or as shards of at most max_shard_bytes with
// an index (file names as transformers' save_pretrained gives them).
void write_weights(const fs::path& dir, const std::vector<ExportTensor>& tensors, DType dtype,
                   int64_t max_shard_bytes, const std::string& single_file) {
  std::vector<std::vector<const ExportTensor*>> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& t : tensors) {
    const auto bytes = static_cast<int64_t>(t.bytes.size());
    if (shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += bytes;
    total_bytes += bytes;
    shards.back().push_back(&t);
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? single_file
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<safetensors::TensorView> views;
    for (const ExportTensor* t : shards[s]) {
      views.push_back({t->name, safetensors_dtype(dtype), t->shape, t->bytes.data()});
      weight_map[t->name] = file;
    }
    safetensors::write_file((dir / file).string(), views, {{"format", "pt"}});
  }
  if (shards.size() > 1)
    write_file_atomic((dir / "model.safetensors.index.json").string(),
                      nlohmann::json{{"metadata", {{"total_size", total_bytes}}},
                                     {"weight_map", weight_map}}
                              .dump(2) + "\n");
}

// The adapter whose delta lands in a base weight: A [r, in], B's rows from b_row_offset.
struct MergeSource {
  std::string a, b;
  int64_t b_row_offset = 0;
};

// The base weights with scale * B A added where LoRA adapted them (fp32): the layers'
// modules, and each routed expert's weights (moe_expert_lora.hpp: expert_lora_merges).
std::vector<ExportTensor> merged_tensors(const CheckpointReader& ckpt, const ParamLayout& layout,
                                         DType dtype) {
  const ModelConfig& config = ckpt.info().model;
  std::map<std::string, MergeSource> merges;
  for (const LoraPair& pair : model_family(config.family).lora_pairs(config))
    merges[pair.weight] = {pair.a, pair.b, 0};
  for (const ExpertLoraMerge& m : expert_lora_merges(config)) merges[m.weight] = {m.a, m.b, m.b_row_offset};
  std::set<std::string> adapters;
  for (const auto& [weight, source] : merges) adapters.insert({source.a, source.b});
  std::vector<ExportTensor> out;
  for (const auto& [name, shape] : ckpt.tensors()) {
    if (adapters.count(name)) continue;
    const ParamInfo& param = *layout.find(name).second;
    auto it = merges.find(name);
    if (it == merges.end()) {
      out.push_back(read_tensor(ckpt, param, dtype));
      continue;
    }
    // W [rows, in] += (alpha / r) B[offset .. offset + rows) [rows, r] A [r, in], in fp32,
    // then stored in dtype.
    const ParamInfo& a = *layout.find(it->second.a).second;
    const ParamInfo& b = *layout.find(it->second.b).second;
    ExportTensor w = read_tensor(ckpt, param, DType::fp32);
    const ExportTensor av = read_tensor(ckpt, a, DType::fp32), bv = read_tensor(ckpt, b, DType::fp32);
    const int rows = static_cast<int>(param.shape[0]), cols = static_cast<int>(param.shape[1]);
    const int r = static_cast<int>(a.shape[0]);
    SHARDLM_CHECK(a.shape[1] == cols && b.shape[1] == r && it->second.b_row_offset + rows <= b.shape[0],
                  "--merge-lora: adapter '{}' does not fit weight '{}'", it->second.b, name);
    const float* b_rows = reinterpret_cast<const float*>(bv.bytes.data()) + it->second.b_row_offset * r;
    cpu::gemm(false, false, rows, cols, r, config.lora.scale(), ConstTypedPtr(b_rows), r,
              ConstTypedPtr(reinterpret_cast<const float*>(av.bytes.data())), cols, 1.0f,
              reinterpret_cast<float*>(w.bytes.data()), cols);
    if (dtype != DType::fp32) {
      std::vector<std::byte> rounded(static_cast<size_t>(rows) * cols * dtype_bytes(dtype));
      cpu::convert(TypedPtr(rounded.data(), dtype), reinterpret_cast<const float*>(w.bytes.data()),
                   static_cast<int64_t>(rows) * cols);
      w.bytes = std::move(rounded);
    }
    out.push_back(std::move(w));
  }
  return out;
}

// PEFT's adapter directory: the adapters under PEFT's names and its adapter_config.json.
void write_peft_adapter(const CheckpointReader& ckpt, const ParamLayout& layout,
                        const HfExportOptions& options, const fs::path& dir,
                        const fs::path& source) {
  const ModelConfig& config = ckpt.info().model;
  // The experts' adapters go out fused, as PEFT holds transformers' fused experts.
  const std::vector<PeftExpertTensor> fused = peft_expert_adapters(config);
  std::set<std::string> per_expert;
  for (const auto& t : fused) per_expert.insert(t.sources.begin(), t.sources.end());
  std::vector<ExportTensor> tensors;
  for (const auto& [name, shape] : ckpt.tensors()) {
    if (layout.units[static_cast<size_t>(layout.find(name).first)].trainable && !per_expert.count(name)) {
      tensors.push_back(read_tensor(ckpt, *layout.find(name).second, options.dtype));
      tensors.back().name = "base_model.model." + name;
    }
  }
  for (const auto& t : fused) {
    std::vector<std::vector<float>> experts;
    for (const auto& source : t.sources) {
      const ExportTensor e = read_tensor(ckpt, *layout.find(source).second, DType::fp32);
      experts.emplace_back(e.bytes.size() / sizeof(float));
      std::memcpy(experts.back().data(), e.bytes.data(), e.bytes.size());
    }
    std::vector<float> values;
    fuse_expert_adapter(t, experts, values);
    tensors.push_back(export_tensor(t.name, t.shape, values, options.dtype));
  }
  // PEFT's target_modules are modules; the experts are its target_parameters.
  std::vector<std::string> modules;
  for (const auto& target : config.lora.targets)
    if (target.rfind("experts.", 0) != 0) modules.push_back(target);
  write_weights(dir, tensors, options.dtype, std::numeric_limits<int64_t>::max(),
                "adapter_model.safetensors");
  const nlohmann::json adapter = {{"peft_type", "LORA"},
                                  {"task_type", "CAUSAL_LM"},
                                  {"base_model_name_or_path", source.empty() ? "" : source.string()},
                                  {"r", config.lora.rank},
                                  {"lora_alpha", config.lora.alpha},
                                  {"lora_dropout", 0.0},
                                  {"target_modules", modules},
                                  {"bias", "none"},
                                  {"fan_in_fan_out", false},
                                  {"use_rslora", false},
                                  {"use_dora", false},
                                  {"init_lora_weights", true},
                                  {"inference_mode", true},
                                  {"modules_to_save", nullptr}};
  nlohmann::json with_parameters = adapter;
  const std::vector<std::string> parameters = peft_target_parameters(config);
  if (!parameters.empty()) with_parameters["target_parameters"] = parameters;
  write_file_atomic((dir / "adapter_config.json").string(), with_parameters.dump(2) + "\n");
}

void write_export(const CheckpointReader& checkpoint, const HfExportOptions& options,
                  const fs::path& out) {
  const CheckpointInfo& info = checkpoint.info();
  const ModelConfig& config = info.model;
  const ModelFamily& family = model_family(config.family);
  std::error_code ec;
  const TempDirectory tmp(out / fmt::format(".export-tmp-{}", ::getpid()));
  const fs::path source = source_directory(info);
  const ParamLayout layout = ParamLayout::build(config, 1);
  for (const auto& [name, shape] : checkpoint.tensors())
    SHARDLM_CHECK(layout.find(name).second->shape == shape,
                  "checkpoint '{}' tensor '{}' does not have the shape its model config gives it",
                  checkpoint.dir(), name);

  const bool adapter_only = config.lora.enabled() && (options.lora == LoraExport::automatic ||
                                                      options.lora == LoraExport::adapter_only);
  if (adapter_only) {
    write_peft_adapter(checkpoint, layout, options, tmp.path(), source);
  } else {
    std::vector<ExportTensor> tensors;
    if (options.lora == LoraExport::merge) {
      tensors = merged_tensors(checkpoint, layout, options.dtype);
    } else if (options.lora == LoraExport::base_only) {
      // The frozen base as the run computes with it (a QLoRA base dequantized).
      for (const auto& [name, shape] : checkpoint.tensors())
        if (!layout.units[static_cast<size_t>(layout.find(name).first)].trainable)
          tensors.push_back(read_tensor(checkpoint, *layout.find(name).second, options.dtype));
    } else {
      for (const auto& [name, shape] : checkpoint.tensors())
        tensors.push_back(read_tensor(checkpoint, *layout.find(name).second, options.dtype));
    }
    write_weights(tmp.path(), tensors, options.dtype, options.max_shard_bytes, "model.safetensors");
  }

  // config.json and generation_config.json (of the base model, without its adapters);
  // token ids from the source model's config.
  ModelConfig base_config = config;
  base_config.lora = LoraConfig{};
  nlohmann::json hf = family.hf_config(base_config);
  hf["torch_dtype"] = torch_dtype_name(options.dtype);
  nlohmann::json generation = {{"_from_model_config", true}};
  if (!source.empty() && fs::exists(source / "config.json")) {
    const auto src = nlohmann::json::parse(read_text_file((source / "config.json").string()));
    for (const char* id : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (src.contains(id) && !src.at(id).is_null()) hf[id] = generation[id] = src.at(id);
  }
  if (!adapter_only) {
    write_file_atomic((tmp.path() / "config.json").string(), hf.dump(2) + "\n");
    if (!source.empty() && fs::exists(source / "generation_config.json"))
      fs::copy_file(source / "generation_config.json", tmp.path() / "generation_config.json");
    else
      write_file_atomic((tmp.path() / "generation_config.json").string(), generation.dump(2) + "\n");
  }
  if (!source.empty())
    for (const char* name : kTokenizerFiles)
      if (fs::exists(source / name) && !fs::exists(out / name))
        fs::copy_file(source / name, tmp.path() / name);

  // Everything is complete: move it into place.
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    fs::rename(entry.path(), out / entry.path().filename(), ec);
    SHARDLM_CHECK(!ec, "cannot move '{}' into '{}': {}", entry.path().string(), out.string(),
                  ec.message());
  }
}

}  // namespace

void export_hugging_face(const CheckpointReader& checkpoint, const HfExportOptions& options) {
  const fs::path out(options.out_dir);
  SHARDLM_CHECK(options.lora == LoraExport::automatic || checkpoint.info().model.lora.enabled(),
                "--{} needs a LoRA run; checkpoint '{}' trained every weight (export it without "
                "the flag)",
                options.lora == LoraExport::merge       ? "merge-lora"
                : options.lora == LoraExport::base_only ? "base-only"
                                                        : "adapter-only",
                checkpoint.dir());
  SHARDLM_CHECK(options.max_shard_bytes > 0, "--max-shard-size must be positive");
  // The export must not write into the checkpoint it reads (it would change a committed one).
  const fs::path checkpoint_dir = fs::weakly_canonical(checkpoint.dir());
  const fs::path out_resolved = fs::weakly_canonical(fs::absolute(out));
  const bool inside = std::mismatch(checkpoint_dir.begin(), checkpoint_dir.end(), out_resolved.begin(),
                                    out_resolved.end())
                          .first == checkpoint_dir.end();
  SHARDLM_CHECK(!inside,
                "--out '{}' is inside the checkpoint being exported ('{}'): choose a directory outside it",
                out.string(), checkpoint.dir());
  const bool adapter_only = checkpoint.info().model.lora.enabled() &&
                            (options.lora == LoraExport::automatic || options.lora == LoraExport::adapter_only);
  if (!adapter_only) {  // a shard holds whole tensors: each must fit in one
    std::string largest;
    int64_t largest_bytes = 0;
    for (const auto& [name, shape] : checkpoint.tensors()) {
      int64_t bytes = dtype_bytes(options.dtype);
      for (const int64_t d : shape) bytes *= d;
      if (bytes > largest_bytes) largest_bytes = bytes, largest = name;
    }
    SHARDLM_CHECK(largest_bytes <= options.max_shard_bytes,
                  "--max-shard-size {} bytes is smaller than tensor '{}' ({} bytes in {}): a shard holds "
                  "whole tensors; give at least {:.3g} (GB)",
                  options.max_shard_bytes, largest, largest_bytes, dtype_name(options.dtype),
                  static_cast<double>(largest_bytes) / 1e9);
  }
  if (fs::exists(out))
    SHARDLM_CHECK(fs::is_directory(out), "--out '{}' exists and is not a directory", out.string());
  // One export at a time into OUT; what is there is checked under the lock, so a second
  // export into the same OUT either waits for nothing (refused as busy) or finds the
  // first one's files (refused as existing).
  const auto lock = RunDirectoryLock::acquire_for(out.string(), ".export.lock", "export");
  for (const std::string& stale : remove_temporaries_of_dead_processes(out.string()))
    std::fprintf(stderr, "export: removed '%s' (left by an export that did not finish)\n", stale.c_str());
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "config.json" || name == "generation_config.json" ||
                      name == "adapter_config.json" || name == "adapter_model.safetensors" ||
                      (name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos);
    SHARDLM_CHECK(!ours, "'{}' already exists (export never overwrites; choose another --out)",
                  entry.path().string());
  }
  write_export(checkpoint, options, out);  // on failure the lock removes the directories it made
}

}  // namespace shardlm
