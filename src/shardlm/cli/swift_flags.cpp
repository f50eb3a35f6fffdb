#include "shardlm/cli/swift_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <string_view>

#include "shardlm/core/error.hpp"
#include "shardlm/model/config.hpp"

namespace shardlm::cli {

namespace {

// What one ms-swift flag becomes: shardlm flag and value (value empty: a shardlm
// switch such as --activation-checkpointing), or nothing (accepted, no effect).
struct Rewritten {
  std::string flag;
  std::optional<std::string> value;
};
using Mapping = std::function<std::optional<Rewritten>(const std::string& swift_flag, const std::string& value)>;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool truth(const std::string& flag, const std::string& value) {
  const std::string v = lower(value);
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  throw Error(fmt::format("ms-swift's --{} takes true or false, got '{}'", flag, value));
}

Mapping same_value(std::string shardlm_flag) {
  return [shardlm_flag](const std::string&, const std::string& value) {
    return Rewritten{shardlm_flag, value};
  };
}

Mapping switch_when_true(std::string shardlm_flag) {
  return [shardlm_flag](const std::string& flag, const std::string& value) -> std::optional<Rewritten> {
    if (!truth(flag, value)) return std::nullopt;
    return Rewritten{shardlm_flag, std::nullopt};
  };
}

Mapping choice(std::string shardlm_flag, std::map<std::string, std::string> values) {
  return [shardlm_flag, values](const std::string& flag, const std::string& value) {
    // FSDP's option strings may carry more words ('full_shard auto_wrap'): the first decides.
    const std::string first = lower(value.substr(0, value.find(' ')));
    const auto it = values.find(first);
    if (it == values.end()) {
      std::string expected;
      for (const auto& [k, v] : values) expected += (expected.empty() ? "" : ", ") + k;
      throw Error(fmt::format("ms-swift's --{} {}: shardlm sft maps {} (expected one of them)",
                              flag, value, expected));
    }
    return Rewritten{shardlm_flag, it->second};
  };
}

std::optional<Rewritten> model_type(const std::string&, const std::string& value) {
  std::string preset = lower(value);
  std::replace(preset.begin(), preset.end(), '_', '-');
  const auto names = model_preset_names();
  SHARDLM_CHECK(std::find(names.begin(), names.end(), preset) != names.end(),
                "--model_type '{}' is no shardlm preset; the nearest is {} (presets: {})", value,
                nearest_preset(preset), fmt::join(names, ", "));
  return Rewritten{"--model", preset};
}

// ms-swift's `--train_type` / `--tuner_type`: lora (ms-swift's default rank 8 unless
// --lora_rank says otherwise) or full.
std::optional<Rewritten> tuner_type(const std::string& flag, const std::string& value) {
  const std::string v = lower(value);
  if (v == "full") return Rewritten{"--lora-rank", "0"};
  if (v == "lora") return Rewritten{"--lora-rank", "8"};  // a later --lora_rank wins
  throw Error(fmt::format("ms-swift's --{} {} is not implemented by shardlm sft (it trains lora "
                          "or full; QLoRA is --quant_bits 4 with lora)",
                          flag, value));
}

std::optional<Rewritten> quant_bits(const std::string& flag, const std::string& value) {
  if (value == "4") return Rewritten{"--quantize-base", "nf4"};
  throw Error(fmt::format("ms-swift's --{} {} is not implemented by shardlm sft (4-bit NF4 only)",
                          flag, value));
}

std::optional<Rewritten> accepted(const std::string&, const std::string&) { return std::nullopt; }

const std::map<std::string, std::string> kDtypes = {
    {"bfloat16", "bf16"}, {"bf16", "bf16"}, {"float16", "fp16"}, {"fp16", "fp16"},
    {"float32", "fp32"}, {"fp32", "fp32"},  {"no", "fp32"}};

// The table: ms-swift flag -> shardlm flag. Keep docs/sft.md's side-by-side table in step.
const std::map<std::string, Mapping>& table() {
  static const std::map<std::string, Mapping> t = {
      {"model_type", model_type},
      {"train_type", tuner_type},
      {"tuner_type", tuner_type},
      {"fsdp", choice("--strategy", {{"full_shard", "zero3"}, {"shard_grad_op", "zero2"},
                                     {"hybrid_shard", "hybrid"}, {"no_shard", "ddp"}})},
      {"deepspeed", choice("--strategy", {{"zero1", "zero1"}, {"zero2", "zero2"},
                                          {"zero3", "zero3"}, {"default-zero2", "zero2"},
                                          {"default-zero3", "zero3"}})},
      {"gradient_checkpointing", switch_when_true("--activation-checkpointing")},
      // shardlm's attention is always the flash-style kernel: true or false, same result.
      {"use_flash_attn", [](const std::string& f, const std::string& v) { truth(f, v); return accepted(f, v); }},
      {"sequence_length", same_value("--max-len")},
      {"max_length", same_value("--max-len")},
      {"lora_rank", same_value("--lora-rank")},
      {"lora_alpha", same_value("--lora-alpha")},
      {"target_modules", same_value("--lora-targets")},
      {"quant_bits", quant_bits},
      {"num_train_epochs", same_value("--epochs")},
      {"max_steps", same_value("--steps")},
      {"per_device_train_batch_size", same_value("--micro-batch")},
      {"gradient_accumulation_steps", same_value("--grad-accum")},
      {"learning_rate", same_value("--lr")},
      {"weight_decay", same_value("--weight-decay")},
      {"warmup_steps", same_value("--warmup")},
      {"max_grad_norm", same_value("--grad-clip")},
      {"adam_beta1", same_value("--beta1")},
      {"adam_beta2", same_value("--beta2")},
      {"torch_dtype", choice("--precision", kDtypes)},
      {"mixed_precision", choice("--precision", kDtypes)},
      {"output_dir", same_value("--out")},
      {"val_dataset", same_value("--val-dataset")},
      {"split_dataset_ratio", same_value("--val-fraction")},
      {"packing", switch_when_true("--packing")},
      {"save_steps", same_value("--save-every")},
      {"save_total_limit", same_value("--keep")},
      {"eval_steps", same_value("--eval-every")},
      {"logging_steps", same_value("--log-every")},
  };
  return t;
}

// ms-swift flags of `swift sft` that shardlm does not implement: named in a one-line
// error instead of CLI11's "unexpected argument".
const char* const kNotImplemented[] = {
    "lora_dropout", "lora_dtype", "lora_bias", "use_rslora", "use_dora", "init_weights",
    "warmup_ratio", "lr_scheduler_type", "adam_epsilon", "optim", "report_to",
    "dataloader_num_workers", "dataset_num_proc", "streaming", "lazy_tokenize",
    "save_only_model", "save_strategy", "eval_strategy", "per_device_eval_batch_size",
    "metric_for_best_model", "load_best_model_at_end", "resume_from_checkpoint",
    "add_version", "neftune_noise_alpha", "use_liger_kernel", "attn_impl",
    "sequence_parallel_size", "quant_method", "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "freeze_vit", "freeze_llm",
    "freeze_aligner", "max_pixels", "system", "loss_scale", "truncation_strategy",
    "padding_side", "model_revision", "use_hf", "hub_token", "push_to_hub", "ddp_backend",
    "ddp_timeout", "fsdp_config", "deepspeed_config", "torch_compile", "ignore_args_error",
    "seed_data", "data_seed", "model_name", "model_author", "check_model", "rope_scaling",
    "max_new_tokens", "temperature", "gradient_checkpointing_kwargs", "logging_dir",
    "eval_limit", "eval_datasets", "external_plugins", "custom_register_path",
    "channels", "zero_hpz_partition_size", "deepspeed_autotp_size",
};

bool is_not_implemented(std::string_view name) {
  return std::any_of(std::begin(kNotImplemented), std::end(kNotImplemented),
                     [&](const char* n) { return name == n; });
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string nearest_preset(const std::string& name) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const auto& preset : model_preset_names()) {
    const size_t d = edit_distance(name, preset);
    if (d < best_distance) {
      best = preset;
      best_distance = d;
    }
  }
  return best;
}

std::vector<std::string> rewrite_swift_flags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  // Per shardlm flag: who set it (the flag itself, or an ms-swift flag) and the value.
  std::map<std::string, std::pair<std::string, std::optional<std::string>>> set_by;
  std::vector<std::pair<std::string, Rewritten>> pending;  // (ms-swift flag, what it becomes)
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() <= 2) {
      out.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const auto it = table().find(name);
    if (it == table().end()) {
      SHARDLM_CHECK(!is_not_implemented(name),
                    "ms-swift's --{} is not implemented by shardlm sft (docs/sft.md lists the "
                    "ms-swift flags it reads)",
                    name);
      // A shardlm flag: remembered so that an ms-swift spelling cannot contradict it.
      if (eq != std::string::npos)
        set_by[arg.substr(0, eq)] = {arg.substr(0, eq), arg.substr(eq + 1)};
      else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
        set_by[arg] = {arg, args[i + 1]};
      else
        set_by[arg] = {arg, std::nullopt};
      out.push_back(arg);
      continue;
    }
    const bool value_follows = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    // shardlm's own --packing is a switch; ms-swift's is `--packing true|false`. Without a
    // value it is shardlm's.
    if (name == "packing" && eq == std::string::npos && !value_follows) {
      set_by[arg] = {arg, std::nullopt};
      out.push_back(arg);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      SHARDLM_CHECK(i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0,
                    "ms-swift's --{} needs a value", name);
      value = args[++i];
    }
    if (auto r = it->second(name, value)) pending.emplace_back("--" + name, *r);
  }
  auto is_tuner = [](const std::string& flag) { return flag == "--train_type" || flag == "--tuner_type"; };
  for (const auto& [from, r] : pending) {
    const auto it = set_by.find(r.flag);
    if (it == set_by.end()) {
      set_by[r.flag] = {from, r.value};
      continue;
    }
    // --train_type lora brings ms-swift's default rank (8); a rank given in either
    // spelling decides. --train_type full with a rank is a contradiction.
    if (r.flag == "--lora-rank" && (is_tuner(from) || is_tuner(it->second.first))) {
      const bool full = (is_tuner(from) ? r.value : it->second.second) == std::optional<std::string>("0");
      const auto& rank = is_tuner(from) ? it->second.second : r.value;
      SHARDLM_CHECK(!full || rank == std::optional<std::string>("0"),
                    "--train_type full trains every weight; a LoRA rank ({}) contradicts it",
                    rank.value_or(""));
      if (is_tuner(it->second.first)) it->second = {from, r.value};
      continue;
    }
    SHARDLM_CHECK(it->second.second == r.value,
                  "{} and {} both set {} ('{}' and '{}'): give one of them", it->second.first,
                  from, r.flag, it->second.second.value_or("true"), r.value.value_or("true"));
  }
  for (const auto& [flag, source] : set_by) {
    if (source.first == flag) continue;  // shardlm's own spelling: already in `out`
    out.push_back(flag);
    if (source.second) out.push_back(*source.second);
  }
  return out;
}

}  // namespace shardlm::cli
