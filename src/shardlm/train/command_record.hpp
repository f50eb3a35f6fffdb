// The flags a run was started with, recorded in RUN/config.json ("flags") and as
// RUN/config.toml, a file `--config` reads back (cli/config_file.hpp), so that
// `shardlm train --config RUN/config.toml --out RUN2` runs the same job again.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

struct CommandFlag {
  std::string name;                 // the long flag without its dashes: "lora-rank"
  std::vector<std::string> values;  // as given (one for most flags; several for lists)
  bool given = false;               // set by the command line or a --config file
  bool list = false;                // a flag that takes several values (TOML array)
};

// TOML for `--config`: the given flags as keys (lists as arrays), the rest as comments
// with their defaults; a value TOML cannot carry as --config reads it (a newline, a '#'
// or both quote characters) becomes a comment saying so. `command` names the
// subcommand in the header comment.
std::string command_flags_toml(const std::string& command, const std::vector<CommandFlag>& flags);

// {"lr": "3e-3", "dataset": ["a.jsonl", "b.jsonl"], ...}: the given flags only.
nlohmann::json command_flags_json(const std::vector<CommandFlag>& flags);

}  // namespace shardlm
