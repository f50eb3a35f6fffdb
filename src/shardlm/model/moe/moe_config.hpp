// MoeConfig (model/config.hpp) checked, written and read: in shardlm's own config
// JSON and in Hugging Face config.json (qwen3_moe's, qwen2_moe's and mixtral's field names).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/model/config.hpp"
#include "shardlm/model/hf_config_fields.hpp"

namespace shardlm {

// Throws Error naming the field; family is "qwen3_moe", "qwen2_moe" or "mixtral".
void validate_moe(const ModelConfig& config, const std::string& family);

nlohmann::json moe_to_json(const MoeConfig& moe);
MoeConfig moe_from_json(const nlohmann::json& j);

// From config.json: every routing field honoured or refused by name. Mixtral's
// experts are intermediate_size wide, and every layer is sparse.
MoeConfig moe_from_hf(HfConfigFields& fields, const std::string& family, int intermediate_size);
// The fields moe_from_hf reads, into config.json.
void moe_to_hf(const ModelConfig& config, nlohmann::json& j);

}  // namespace shardlm
