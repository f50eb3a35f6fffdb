#include "shardlm/cli/plan_flags.hpp"

#include <fmt/format.h>

namespace shardlm::cli {

void add_profile_flags(CLI::App& cmd, ProfileOptions& flags) {
  cmd.add_option("--profile", flags.profile,
                 fmt::format("Hardware profile for step times: a file from `shardlm calibrate` "
                             "or one of {} (default: {} if it exists)",
                             fmt::join(builtin_profile_names(), ", "), default_profile_path()));
  cmd.add_option("--nodes", flags.nodes,
                 "Machines the ranks are spread over (ranks / nodes on each, placed in order)")
      ->capture_default_str();
  cmd.add_option("--link", flags.link,
                 fmt::format("Link between nodes, replacing the profile's: {}",
                             fmt::join(link_names(), ", ")));
}

}  // namespace shardlm::cli
