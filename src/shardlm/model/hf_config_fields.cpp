#include "shardlm/model/hf_config_fields.hpp"

#include <cmath>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

// Fields of every Hugging Face config that do not change the forward or backward
// computation: bookkeeping, token ids (the tokenizer's business), inference caching
// and generation defaults, storage dtype (import converts whatever is stored).
const char* const kNonComputational[] = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype",
    "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "tokenizer_class", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "is_encoder_decoder", "is_decoder", "task_specific_params",
    "prefix", "problem_type", "id2label", "label2id", "finetuning_task", "chunk_size_feed_forward",
    "tie_encoder_decoder", "use_bfloat16", "pruned_heads", "cross_attention_hidden_size",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "initializer_range"};

bool is_number(const nlohmann::json& v) { return v.is_number(); }

}  // namespace

HfConfigFields::HfConfigFields(const nlohmann::json& config, std::string family)
    : config_(config), family_(std::move(family)) {
  SHARDLM_CHECK(config.is_object(), "config.json ({}) must be a JSON object", family_);
  for (const char* f : kNonComputational) seen_.insert(f);
}

void HfConfigFields::fail(const std::string& field, const std::string& expected) const {
  throw Error(fmt::format("config.json ({}) has {}={}, but shardlm computes only {}", family_,
                          field, config_.at(field).dump(), expected));
}

const nlohmann::json& HfConfigFields::optional(const std::string& field) {
  seen_.insert(field);
  static const nlohmann::json null_value;
  return config_.contains(field) ? config_.at(field) : null_value;
}

int HfConfigFields::require_int(const std::string& field) {
  SHARDLM_CHECK(config_.contains(field), "config.json ({}) lacks '{}', which shardlm needs",
                family_, field);
  const auto& v = optional(field);
  if (!v.is_number_integer()) fail(field, "an integer");
  return v.get<int>();
}

int HfConfigFields::optional_int(const std::string& field, int fallback) {
  const auto& v = optional(field);
  if (v.is_null()) return fallback;
  if (!v.is_number_integer()) fail(field, "an integer");
  return v.get<int>();
}

double HfConfigFields::optional_number(const std::string& field, double fallback) {
  const auto& v = optional(field);
  if (v.is_null()) return fallback;
  if (!is_number(v) || !std::isfinite(v.get<double>())) fail(field, "a finite number");
  return v.get<double>();
}

bool HfConfigFields::optional_bool(const std::string& field, bool fallback) {
  const auto& v = optional(field);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) fail(field, "true or false");
  return v.get<bool>();
}

void HfConfigFields::expect_bool(const std::string& field, bool computed) {
  const auto& v = optional(field);
  if (!v.is_null() && v != nlohmann::json(computed)) fail(field, computed ? "true" : "false");
}

void HfConfigFields::expect_number(const std::string& field, double computed) {
  const auto& v = optional(field);
  if (!v.is_null() && (!is_number(v) || v.get<double>() != computed))
    fail(field, fmt::format("{}", computed));
}

void HfConfigFields::expect_int_or_null(const std::string& field, int computed) {
  const auto& v = optional(field);
  if (!v.is_null() && (!v.is_number_integer() || v.get<int>() != computed))
    fail(field, fmt::format("{} (or null)", computed));
}

void HfConfigFields::expect_string(const std::string& field,
                                   const std::vector<std::string>& computed) {
  const auto& v = optional(field);
  if (v.is_null()) return;
  for (const auto& c : computed)
    if (v.is_string() && v.get<std::string>() == c) return;
  std::string list;
  for (const auto& c : computed) list += (list.empty() ? "\"" : " or \"") + c + "\"";
  fail(field, list);
}

void HfConfigFields::expect_no_dropout(const std::string& field) {
  const auto& v = optional(field);
  if (!v.is_null() && (!is_number(v) || v.get<double>() != 0.0))
    throw Error(fmt::format("config.json ({}) has {}={}: shardlm does not implement dropout; set "
                            "it to 0.0 in config.json to train without it",
                            family_, field, v.dump()));
}

void HfConfigFields::ignore(std::initializer_list<const char*> fields) {
  for (const char* f : fields) seen_.insert(f);
}

void HfConfigFields::finish() const {
  for (auto it = config_.begin(); it != config_.end(); ++it)
    if (!seen_.count(it.key()))
      throw Error(fmt::format("config.json ({}) has field '{}'={}, which shardlm does not know; "
                              "it may change the computation, so the model is refused",
                              family_, it.key(), it.value().dump()));
}

}  // namespace shardlm
