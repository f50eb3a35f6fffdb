#include "shardlm/plan/step_program.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/comm/mpi_algorithms.hpp"

namespace shardlm {

double collective_messages(CollectiveKind kind, double bytes, int n, size_t scratch_bytes,
                           size_t element_bytes) {
  if (n <= 1) return 0;
  const double peers = n - 1;
  const auto reduce_scatter_rounds = [&](double elements_per_rank) {
    const double floats = static_cast<double>(scratch_bytes) / 4;
    const double slots = element_bytes == 2 ? 2 * floats / (2 * n - 1) : floats / (n - 1);
    const double chunk = std::max(1.0, std::min(elements_per_rank, std::floor(slots)));
    return std::max(1.0, std::ceil(elements_per_rank / chunk));
  };
  switch (kind) {
    case CollectiveKind::all_gather:
    case CollectiveKind::broadcast:
      return peers;
    case CollectiveKind::reduce_scatter:
      return peers * reduce_scatter_rounds(bytes / static_cast<double>(element_bytes) / n);
    case CollectiveKind::all_reduce:
      if (bytes * n <= static_cast<double>(mpi::kSmallAllReduceBytes)) return peers;
      return peers * reduce_scatter_rounds(bytes / 4 / n) + peers;
    // The exchanges as comm/counters.hpp counts them (and calibration fits them): one
    // message to every other rank, or the one a send (or a ring step's send_recv) sends.
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v:
      return peers;
    case CollectiveKind::send:
    case CollectiveKind::send_recv:
      return 1;
    default:
      return 0;
  }
}

double adamw_state_bytes(double owned, bool writes_bf16_copy) {
  return (28 + (writes_bf16_copy ? 2 : 0)) * owned;
}

}  // namespace shardlm
