// `--config FILE` of train, sft, plan and bench: a TOML file whose keys are the
// command's flags without their dashes (`lr = 3e-4`, `lora-rank = 8` or `lora_rank = 8`,
// `dataset = ["a.jsonl", "b.jsonl"]`, a bare `resume` or `resume = true` for a flag).
// CLI11 reads the file (its TOML reader, through the top app's set_config: CLI11 2.1
// processes config files on the top app only, so the subcommand's --config hands the
// path up and the file's keys are routed into the subcommand); a flag on the command
// line overrides the file's value. An unknown key, a key set twice or a [section] is an
// error naming the file, the line and the key.
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

#include "shardlm/train/command_record.hpp"

namespace shardlm::cli {

// On the top app, before the subcommands are added.
void enable_config_files(CLI::App& app);

// --config FILE on a subcommand (after enable_config_files on its parent).
void add_config_flag(CLI::App& cmd);

// Every flag of `cmd` with its value after parsing (given: by the command line or a
// --config file; else its default), for RUN/config.toml and RUN/config.json.
std::vector<CommandFlag> command_flags(const CLI::App& cmd);

}  // namespace shardlm::cli
