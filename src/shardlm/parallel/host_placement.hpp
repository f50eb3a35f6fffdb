#pragma once

#include <string>
#include <vector>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/parallel/mesh_shape.hpp"

namespace shardlm {

// Every rank's host name, in rank order (one all-gather of a fixed-size name).
std::vector<std::string> rank_hosts(Communicator& world);

// A warning line when a tensor group of `mesh` spans more than one host (hosts[r]: rank
// r's host), naming the first such group and its hosts; "" when each sits on one host.
// Tensor parallelism exchanges activations several times per layer each way: across hosts
// that traffic runs over the network, which works but is slow: a warning, not a refusal.
std::string tensor_groups_across_hosts_warning(const MeshShape& mesh,
                                               const std::vector<std::string>& hosts);

}  // namespace shardlm
