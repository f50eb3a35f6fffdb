#include "shardlm/parallel/host_placement.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

constexpr size_t kHostNameBytes = 256;  // POSIX HOST_NAME_MAX is 255 on Linux

}  // namespace

std::vector<std::string> rank_hosts(Communicator& world) {
  std::array<char, kHostNameBytes> mine{};
  SHARDLM_CHECK(gethostname(mine.data(), mine.size() - 1) == 0,
                "gethostname failed: {} (needed to tell which ranks share a host)",
                std::strerror(errno));
  std::vector<char> all(kHostNameBytes * static_cast<size_t>(world.size()));
  world.all_gather_bytes(mine.data(), all.data(), kHostNameBytes, "host names").wait();
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    const char* name = all.data() + kHostNameBytes * static_cast<size_t>(r);
    hosts.emplace_back(name, strnlen(name, kHostNameBytes));
  }
  return hosts;
}

std::string tensor_groups_across_hosts_warning(const MeshShape& mesh,
                                               const std::vector<std::string>& hosts) {
  const int T = mesh.size(MeshDim::tensor);
  SHARDLM_CHECK(static_cast<int>(hosts.size()) == mesh.world_size(),
                "internal: {} host names for a mesh of {} ranks", hosts.size(), mesh.world_size());
  if (T == 1) return "";
  for (int first = 0; first < mesh.world_size(); first += T) {
    const std::vector<int> group = mesh.group_ranks(first, {MeshDim::tensor});
    std::vector<std::string> spanned;
    for (int r : group)
      if (std::find(spanned.begin(), spanned.end(), hosts[static_cast<size_t>(r)]) == spanned.end())
        spanned.push_back(hosts[static_cast<size_t>(r)]);
    if (spanned.size() > 1)
      return fmt::format(
          "--tensor-parallel {}: the tensor group of ranks {}..{} spans the hosts {}; its "
          "exchanges (several per layer, each way) cross the network, which is slow: keep T "
          "within the ranks of one host (consecutive ranks share a tensor group)",
          T, group.front(), group.back(), fmt::join(spanned, ", "));
  }
  return "";
}

}  // namespace shardlm
