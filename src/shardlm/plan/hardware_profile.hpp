// HardwareProfile: how fast a machine computes and communicates, the input of the
// step-time model (plan/time_model.hpp). `shardlm calibrate` measures one for this
// machine; built-in profiles describe common GPU nodes from published figures
// (docs/planning.md cites them). Rates are per rank.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "shardlm/comm/counters.hpp"

namespace shardlm {

// One collective kind on one transport: t = latency x messages + bus bytes / bandwidth
// (bus bytes as the communicator counts them, comm/counters.hpp).
struct CollectiveRate {
  double latency_s = 0;         // per message a rank sends
  double bus_bytes_per_s = 0;
};

// A way ranks exchange data: shared memory, TCP at some link rate, NVLink, InfiniBand.
// Messages per call, for the fit and the model: all_to_all(_v) one per other rank,
// send_recv (and a lone send or recv) one.
struct TransportFigures {
  std::string name;
  CollectiveRate all_gather, reduce_scatter, all_reduce;
  // all_to_all and all_to_all_v; send, recv and send_recv. A profile file written
  // before these existed gets its all_gather figures for both (same links, same kind
  // of traffic: every byte leaves its rank once), which `calibrate` then replaces.
  CollectiveRate all_to_all, send_recv;
  // Speed of computation, as a fraction of its speed alone, while a collective is in
  // flight (1: free overlap, e.g. a NIC's DMA; ~0.5: a busy-polling communication
  // thread sharing the core with the compute thread).
  double compute_share_during_comm = 1.0;
  const CollectiveRate& rate(CollectiveKind kind) const;
};

// Computation rates for one precision. FLOP and byte conventions: plan/unit_work.hpp.
struct ComputeRates {
  double gemm_flops_per_s = 0;
  double attention_flops_per_s = 0;
  double elementwise_bytes_per_s = 0;  // norms, biases, activations, residuals, embeddings
  double loss_bytes_per_s = 0;         // softmax / cross-entropy over the vocabulary
  double state_bytes_per_s = 0;        // AdamW, gradient zeroing and norms, rounding
};

struct ComputeFigures {
  int ranks_per_node = 1;    // ranks that were computing side by side when measured
  int threads_per_rank = 1;
  std::map<std::string, ComputeRates> by_precision;  // "fp32", "bf16", "fp16"
};

struct HardwareProfile {
  std::string name;
  std::string description;  // what it is and where the figures come from
  double memory_per_rank_bytes = 0;  // device memory (GPU) or this host's RAM / ranks
  int ranks_per_node = 1;            // ranks a node holds (GPUs; cores for CPU runs)
  // A node's host RAM, which a device run's host side (HostOwnedState: mirrors, or the
  // offloaded optimizer) of all its ranks shares; 0: not known (a profile file from
  // before the field), then not checked.
  double host_memory_per_node_bytes = 0;
  std::vector<ComputeFigures> compute;  // at least one
  TransportFigures intra_node;          // ranks on one node
  TransportFigures inter_node;          // ranks on different nodes

  // The rates for a precision at `ranks_per_node` ranks on a node: the entry measured
  // with that many ranks side by side, else the nearest. Error naming the profile and
  // the precision when it has no figures for it.
  const ComputeRates& rates(const std::string& precision, int ranks_per_node) const;
  // The transport for ranks placed `within_node` or not.
  const TransportFigures& transport(bool within_node) const {
    return within_node ? intra_node : inter_node;
  }

  nlohmann::json to_json() const;
  // Error naming the field on a malformed profile.
  static HardwareProfile from_json(const nlohmann::json& j);
};

// The JSON of a profile's parts (fields as in HardwareProfile::to_json; `where` names
// the enclosing field in errors).
nlohmann::json transport_to_json(const TransportFigures& t);
TransportFigures transport_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json rates_to_json(const ComputeRates& r);
ComputeRates rates_from_json(const nlohmann::json& j, const std::string& where);

// Built-in profiles: "a100-80g" (8 x A100 SXM4 80 GB per node, NVLink/NVSwitch, 8 x
// HDR InfiniBand), "h100-80g" (8 x H100 SXM5, NVLink 4, 8 x NDR InfiniBand), "h200-141g"
// (the same node with H200 SXM 141 GB), "l4-24g" (8 x L4 24 GB on PCIe 4, 100 Gbit/s
// Ethernet).
std::vector<std::string> builtin_profile_names();
HardwareProfile builtin_profile(const std::string& name);  // Error on an unknown name

// A built-in name, or a profile JSON file written by `shardlm calibrate`.
HardwareProfile load_profile(const std::string& name_or_path);

// Inter-node links for `plan --link`: "1gbit", "10gbit", "25gbit", "100gbit" (TCP over
// Ethernet: 94% of the line rate as goodput), "ib-hdr", "ib-ndr", "nvlink".
// compute_share is the overlap figure to keep (the profile's own, for TCP whose stack
// runs on the host's cores).
std::vector<std::string> link_names();
TransportFigures link_transport(const std::string& name, double compute_share);

// Where the conventional calibrated profile lives: $SHARDLM_PROFILE, else
// $XDG_CACHE_HOME/shardlm/profile.json, else ~/.cache/shardlm/profile.json.
std::string default_profile_path();

}  // namespace shardlm
