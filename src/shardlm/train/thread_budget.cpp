#include "shardlm/train/thread_budget.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace shardlm {

namespace {

// What each rank tells the others: its host (hashed) and its affinity mask.
struct HostAndMask {
  uint64_t host = 0;
  cpu_set_t mask;
};

}  // namespace

uint64_t host_hash() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const char* c = name; *c != '\0'; ++c)
    hash = (hash ^ static_cast<unsigned char>(*c)) * 0x100000001b3ull;
  return hash;
}

ThreadBudget plan_threads(Communicator& comm, std::optional<int> requested) {
  HostAndMask mine{};
  mine.host = host_hash();
  if (sched_getaffinity(0, sizeof(mine.mask), &mine.mask) != 0) {
    CPU_ZERO(&mine.mask);
    CPU_SET(0, &mine.mask);
  }
  std::vector<HostAndMask> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&mine, all.data(), sizeof(HostAndMask), "host and affinity mask").wait();
  cpu_set_t host_mask;
  CPU_ZERO(&host_mask);
  ThreadBudget budget;
  budget.ranks_on_host = 0;
  for (const auto& other : all) {
    if (other.host != mine.host) continue;
    ++budget.ranks_on_host;
    CPU_OR(&host_mask, &host_mask, &other.mask);
  }
  budget.own_cores = std::max(1, CPU_COUNT(&mine.mask));
  budget.host_cores = std::max(1, CPU_COUNT(&host_mask));
  budget.threads = requested.value_or(
      std::max(1, std::min(budget.own_cores, budget.host_cores / budget.ranks_on_host)));
  return budget;
}

std::string ThreadBudget::oversubscription_warning() const {
  // More busy threads than cores makes OpenMP barriers wait for descheduled threads
  // (GEMMs and kernels are split evenly across threads, so the slowest sets the pace).
  if (ranks_on_host * threads > host_cores)
    return fmt::format(
        "warning: {} rank(s) on this host x {} threads = {} threads on {} cores; expect slower "
        "steps (use --threads {} or fewer ranks)\n",
        ranks_on_host, threads, ranks_on_host * threads, host_cores,
        std::max(1, host_cores / ranks_on_host));
  if (threads > own_cores)
    return fmt::format(
        "warning: {} threads on a rank bound to {} core(s) (its affinity mask); expect slower "
        "steps (use --threads {})\n",
        threads, own_cores, own_cores);
  return "";
}

}  // namespace shardlm
