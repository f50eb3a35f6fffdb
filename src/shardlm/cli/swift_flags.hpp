// ms-swift's spellings of `shardlm sft`'s flags (`swift sft --model_type ... --deepspeed
// zero2 --learning_rate 1e-4`), from one table (swift_flags.cpp; docs/sft.md shows it
// side by side): sft's arguments are rewritten into shardlm's before CLI11 parses them.
// A known ms-swift flag that shardlm does not implement is a one-line error naming it;
// two spellings of one setting that disagree are an error too.
#pragma once

#include <string>
#include <vector>

namespace shardlm::cli {

// args: what follows `sft` on the command line. Returns them with every ms-swift flag
// replaced by shardlm's (shardlm's own flags pass through). Error (one line) for an
// ms-swift flag shardlm does not implement, a value the table cannot map, or a
// --model_type that is no preset (naming the nearest one).
std::vector<std::string> rewrite_swift_flags(const std::vector<std::string>& args);

// The preset nearest to `name` by edit distance (ties: the first in preset order).
std::string nearest_preset(const std::string& name);

}  // namespace shardlm::cli
