// How many compute threads a rank runs. The cores counted are those the ranks on its
// host may use together: the union of their affinity masks. Under mpirun each rank is
// bound to its own cores (its mask alone would undercount the host); unbound ranks
// share one mask (adding the masks would overcount it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

struct ThreadBudget {
  int threads = 1;        // this rank's compute threads
  int own_cores = 1;      // cores in this rank's affinity mask
  int ranks_on_host = 1;  // ranks of the job on this rank's host
  int host_cores = 1;     // cores those ranks may use together
  // "warning: ..." (one line, with advice) when the threads exceed the cores: on the
  // host, or in this rank's own mask; "" otherwise.
  std::string oversubscription_warning() const;
};

// This host's identity among the job's ranks (a hash of its host name): equal for ranks
// on one host.
uint64_t host_hash();

// Collective over `comm` (every rank's host name and affinity mask are gathered).
// `requested` is --threads; by default each rank takes an equal share of its host's
// cores, at most its own mask's.
ThreadBudget plan_threads(Communicator& comm, std::optional<int> requested);

}  // namespace shardlm
