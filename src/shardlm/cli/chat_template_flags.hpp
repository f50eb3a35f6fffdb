// The chat-template flags sft and prepare --sft share: --template,
// --enable-thinking, --template-date (docs/sft.md).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace shardlm::cli {

void add_chat_template_flags(CLI::App& cmd, std::string& chat_template, std::string& enable_thinking,
                             std::string& template_date);

// "" -> unset, "true"/"false" -> the value; Error otherwise.
std::optional<bool> parse_enable_thinking(const std::string& value);

}  // namespace shardlm::cli
