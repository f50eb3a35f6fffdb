#include "shardlm/plan/hardware_profile.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"

namespace shardlm {

const CollectiveRate& TransportFigures::rate(CollectiveKind kind) const {
  switch (kind) {
    case CollectiveKind::all_gather: return all_gather;
    case CollectiveKind::reduce_scatter: return reduce_scatter;
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v: return all_to_all;
    case CollectiveKind::send:
    case CollectiveKind::recv:
    case CollectiveKind::send_recv: return send_recv;
    default: return all_reduce;
  }
}

const ComputeRates& HardwareProfile::rates(const std::string& precision, int ranks) const {
  const ComputeFigures* best = nullptr;
  for (const auto& c : compute) {
    if (!c.by_precision.count(precision)) continue;
    if (best == nullptr ||
        std::abs(c.ranks_per_node - ranks) < std::abs(best->ranks_per_node - ranks))
      best = &c;
  }
  SHARDLM_CHECK(best != nullptr,
                "profile '{}' has no compute figures for precision {} (calibrate with "
                "--precisions {})",
                name, precision, precision);
  return best->by_precision.at(precision);
}

namespace {

nlohmann::json rate_json(const CollectiveRate& r) {
  return {{"latency_us", r.latency_s * 1e6}, {"bus_gb_per_s", r.bus_bytes_per_s / 1e9}};
}

}  // namespace

nlohmann::json transport_to_json(const TransportFigures& t) {
  return {{"name", t.name},
          {"all_gather", rate_json(t.all_gather)},
          {"reduce_scatter", rate_json(t.reduce_scatter)},
          {"all_reduce", rate_json(t.all_reduce)},
          {"all_to_all", rate_json(t.all_to_all)},
          {"send_recv", rate_json(t.send_recv)},
          {"compute_share_during_comm", t.compute_share_during_comm}};
}

nlohmann::json rates_to_json(const ComputeRates& r) {
  return {{"gemm_gflop_per_s", r.gemm_flops_per_s / 1e9},
          {"attention_gflop_per_s", r.attention_flops_per_s / 1e9},
          {"elementwise_gb_per_s", r.elementwise_bytes_per_s / 1e9},
          {"loss_gb_per_s", r.loss_bytes_per_s / 1e9},
          {"state_gb_per_s", r.state_bytes_per_s / 1e9}};
}

namespace {

// Reads a positive number at j[key]; `where` names the enclosing field in errors.
double positive(const nlohmann::json& j, const char* key, const std::string& where) {
  SHARDLM_CHECK(j.contains(key) && j.at(key).is_number(),
                "profile: field {}.{} is missing or not a number", where, key);
  const double v = j.at(key).get<double>();
  SHARDLM_CHECK(v > 0 && std::isfinite(v), "profile: field {}.{} must be positive, got {}",
                where, key, v);
  return v;
}

CollectiveRate rate_from(const nlohmann::json& j, const std::string& where) {
  SHARDLM_CHECK(j.is_object(), "profile: field {} must be an object", where);
  CollectiveRate r;
  SHARDLM_CHECK(j.contains("latency_us") && j.at("latency_us").is_number() &&
                    j.at("latency_us").get<double>() >= 0,
                "profile: field {}.latency_us must be a number >= 0", where);
  r.latency_s = j.at("latency_us").get<double>() * 1e-6;
  r.bus_bytes_per_s = positive(j, "bus_gb_per_s", where) * 1e9;
  return r;
}

}  // namespace

TransportFigures transport_from_json(const nlohmann::json& j, const std::string& where) {
  SHARDLM_CHECK(j.is_object(), "profile: field {} must be an object", where);
  TransportFigures t;
  t.name = j.value("name", where);
  t.all_gather = rate_from(j.value("all_gather", nlohmann::json()), where + ".all_gather");
  t.reduce_scatter =
      rate_from(j.value("reduce_scatter", nlohmann::json()), where + ".reduce_scatter");
  t.all_reduce = rate_from(j.value("all_reduce", nlohmann::json()), where + ".all_reduce");
  // Absent in profiles written before all-to-all and point-to-point existed.
  t.all_to_all = j.contains("all_to_all") ? rate_from(j.at("all_to_all"), where + ".all_to_all")
                                          : t.all_gather;
  t.send_recv = j.contains("send_recv") ? rate_from(j.at("send_recv"), where + ".send_recv")
                                        : t.all_gather;
  t.compute_share_during_comm = positive(j, "compute_share_during_comm", where);
  SHARDLM_CHECK(t.compute_share_during_comm <= 1.0,
                "profile: field {}.compute_share_during_comm must be in (0, 1], got {}", where,
                t.compute_share_during_comm);
  return t;
}

ComputeRates rates_from_json(const nlohmann::json& j, const std::string& where) {
  SHARDLM_CHECK(j.is_object(), "profile: field {} must be an object", where);
  return {positive(j, "gemm_gflop_per_s", where) * 1e9,
          positive(j, "attention_gflop_per_s", where) * 1e9,
          positive(j, "elementwise_gb_per_s", where) * 1e9,
          positive(j, "loss_gb_per_s", where) * 1e9, positive(j, "state_gb_per_s", where) * 1e9};
}

namespace {

// A transport whose collectives share one latency and bus bandwidth.
TransportFigures uniform(const std::string& name, double latency_s, double bytes_per_s,
                         double compute_share) {
  const CollectiveRate r{latency_s, bytes_per_s};
  TransportFigures t;
  t.name = name;
  t.all_gather = t.reduce_scatter = t.all_reduce = t.all_to_all = t.send_recv = r;
  t.compute_share_during_comm = compute_share;
  return t;
}

// Inter-node figures for all-to-all and point-to-point, which are bound by each rank's
// own NIC rather than by the node's: a ring's collectives spread over every NIC of the
// node (the node's aggregate, above), but a rank's messages to other nodes leave
// through its own (one NIC per GPU on DGX A100 / H100 with rail-optimised
// PXN routing; an L4 node's 8 ranks share one).
TransportFigures with_per_rank_nic(TransportFigures t, double latency_s, double nic_bytes_per_s) {
  t.all_to_all = {latency_s, nic_bytes_per_s};
  t.send_recv = {latency_s, nic_bytes_per_s};
  return t;
}

// GPU rates from peak figures and the efficiencies docs/planning.md states.
ComputeRates gpu_rates(double peak_flops, double memory_bytes_per_s, double attention_fraction) {
  return {0.7 * peak_flops, attention_fraction * peak_flops, 0.7 * memory_bytes_per_s,
          0.7 * memory_bytes_per_s, 0.8 * memory_bytes_per_s};
}

HardwareProfile gpu_node(const std::string& name, const std::string& description,
                         double memory_gib, double host_memory_gib, double fp32_peak,
                         double bf16_peak,
                         double memory_bytes_per_s, double attention_fraction,
                         TransportFigures intra, TransportFigures inter) {
  HardwareProfile p;
  p.name = name;
  p.description = description;
  p.memory_per_rank_bytes = memory_gib * double(1ll << 30);
  p.host_memory_per_node_bytes = host_memory_gib * double(1ll << 30);
  p.ranks_per_node = 8;
  ComputeFigures c;
  c.ranks_per_node = 8;
  c.threads_per_rank = 1;
  c.by_precision["fp32"] = gpu_rates(fp32_peak, memory_bytes_per_s, attention_fraction);
  c.by_precision["bf16"] = gpu_rates(bf16_peak, memory_bytes_per_s, attention_fraction);
  c.by_precision["fp16"] = c.by_precision["bf16"];
  p.compute.push_back(c);
  p.intra_node = std::move(intra);
  p.inter_node = std::move(inter);
  return p;
}

constexpr double kGpuOverlapShare = 0.9;  // NCCL kernels take a few SMs from the GEMMs

}  // namespace

nlohmann::json HardwareProfile::to_json() const {
  nlohmann::json computes = nlohmann::json::array();
  for (const auto& c : compute) {
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [precision, r] : c.by_precision) by[precision] = rates_to_json(r);
    computes.push_back({{"ranks_per_node", c.ranks_per_node},
                        {"threads_per_rank", c.threads_per_rank},
                        {"rates", by}});
  }
  return {{"name", name},
          {"description", description},
          {"memory_per_rank_gib", memory_per_rank_bytes / double(1ll << 30)},
          {"ranks_per_node", ranks_per_node},
          {"host_memory_per_node_gib", host_memory_per_node_bytes / double(1ll << 30)},
          {"compute", computes},
          {"intra_node", transport_to_json(intra_node)},
          {"inter_node", transport_to_json(inter_node)}};
}

HardwareProfile HardwareProfile::from_json(const nlohmann::json& j) {
  SHARDLM_CHECK(j.is_object(), "profile: expected a JSON object");
  HardwareProfile p;
  p.name = j.value("name", std::string("profile"));
  p.description = j.value("description", std::string());
  p.memory_per_rank_bytes = positive(j, "memory_per_rank_gib", "profile") * double(1ll << 30);
  SHARDLM_CHECK(j.contains("ranks_per_node") && j.at("ranks_per_node").is_number_integer() &&
                    j.at("ranks_per_node").get<int>() >= 1,
                "profile: field ranks_per_node must be an integer >= 1");
  p.ranks_per_node = j.at("ranks_per_node").get<int>();
  // Optional (profiles written before it have none; 0 also means unknown).
  if (j.contains("host_memory_per_node_gib")) {
    const auto& h = j.at("host_memory_per_node_gib");
    SHARDLM_CHECK(h.is_number() && h.get<double>() >= 0,
                  "profile: field host_memory_per_node_gib must be a number >= 0 (GiB; 0: unknown)");
    p.host_memory_per_node_bytes = h.get<double>() * double(1ll << 30);
  }
  SHARDLM_CHECK(j.contains("compute") && j.at("compute").is_array() && !j.at("compute").empty(),
                "profile: field compute must be a non-empty array");
  for (size_t i = 0; i < j.at("compute").size(); ++i) {
    const auto& c = j.at("compute")[i];
    const std::string where = "compute[" + std::to_string(i) + "]";
    SHARDLM_CHECK(c.is_object() && c.contains("rates") && c.at("rates").is_object() &&
                      !c.at("rates").empty(),
                  "profile: field {}.rates must be a non-empty object of precisions", where);
    ComputeFigures f;
    f.ranks_per_node = static_cast<int>(positive(c, "ranks_per_node", where));
    f.threads_per_rank = static_cast<int>(positive(c, "threads_per_rank", where));
    for (auto it = c.at("rates").begin(); it != c.at("rates").end(); ++it)
      f.by_precision[it.key()] = rates_from_json(it.value(), where + ".rates." + it.key());
    p.compute.push_back(std::move(f));
  }
  p.intra_node = transport_from_json(j.value("intra_node", nlohmann::json()), "intra_node");
  p.inter_node = transport_from_json(j.value("inter_node", nlohmann::json()), "inter_node");
  return p;
}

std::vector<std::string> builtin_profile_names() {
  return {"a100-80g", "h100-80g", "h200-141g", "l4-24g"};
}

HardwareProfile builtin_profile(const std::string& name) {
  // Peak figures: NVIDIA's A100, H100, H200 and L4 datasheets; efficiencies: docs/planning.md.
  // Links: NVLink 3 600 GB/s and NVLink 4 900 GB/s per GPU both ways (300 / 450 each
  // way; A100, H100 and H200 datasheets), HDR 200 Gbit/s = 25 GB/s and NDR 400 Gbit/s =
  // 50 GB/s per ConnectX-6 / -7 port, one per GPU (DGX A100 / DGX H100 user guides).
  // all_to_all and send_recv use the same efficiencies (0.8 of NVLink, 0.9 of IB).
  // Host memory per node: DGX A100 1 TB (its datasheet's standard configuration, 16 x
  // 64 GiB DIMMs; 2 TB optional), DGX H100 and DGX H200 2 TB (their datasheets: 32 x 64
  // GiB), an 8 x L4 node 384 GB (Google Cloud's g2-standard-96, whose GB are GiB).
  if (name == "a100-80g")
    return gpu_node(name,
                    "8 x A100 SXM4 80 GB per node (NVLink 3 / NVSwitch), 8 x HDR 200 Gbit/s "
                    "InfiniBand per node; datasheet peaks x stated efficiencies",
                    80, 1024, 19.5e12, 312e12, 2039e9, 0.6,
                    uniform("nvlink3", 2e-6, 0.8 * 300e9, kGpuOverlapShare),
                    with_per_rank_nic(uniform("8x ib-hdr", 5e-6, 0.9 * 200e9, kGpuOverlapShare),
                                      5e-6, 0.9 * 25e9));
  if (name == "h100-80g")
    return gpu_node(name,
                    "8 x H100 SXM5 80 GB per node (NVLink 4 / NVSwitch), 8 x NDR 400 Gbit/s "
                    "InfiniBand per node; datasheet peaks x stated efficiencies",
                    80, 2048, 67e12, 989e12, 3350e9, 0.5,
                    uniform("nvlink4", 2e-6, 0.8 * 450e9, kGpuOverlapShare),
                    with_per_rank_nic(uniform("8x ib-ndr", 5e-6, 0.9 * 400e9, kGpuOverlapShare),
                                      5e-6, 0.9 * 50e9));
  if (name == "h200-141g")  // H200 SXM: H100's compute, HBM3e 4.8 TB/s, 141 GB
    return gpu_node(name,
                    "8 x H200 SXM 141 GB per node (NVLink 4 / NVSwitch), 8 x NDR 400 Gbit/s "
                    "InfiniBand per node; datasheet peaks x stated efficiencies",
                    141, 2048, 67e12, 989e12, 4800e9, 0.5,
                    uniform("nvlink4", 2e-6, 0.8 * 450e9, kGpuOverlapShare),
                    with_per_rank_nic(uniform("8x ib-ndr", 5e-6, 0.9 * 400e9, kGpuOverlapShare),
                                      5e-6, 0.9 * 50e9));
  if (name == "l4-24g")
    return gpu_node(name,
                    "8 x L4 24 GB per node on PCIe 4.0 x16 (no NVLink), 100 Gbit/s Ethernet; "
                    "datasheet peaks x stated efficiencies",
                    24, 384, 30.3e12, 121e12, 300e9, 0.5,
                    uniform("pcie4", 5e-6, 0.6 * 32e9, kGpuOverlapShare),
                    [] {
                      TransportFigures t = link_transport("100gbit", kGpuOverlapShare);
                      t.all_to_all.bus_bytes_per_s /= 8;  // 8 ranks' traffic, one NIC
                      return t;  // a lone pair has the NIC to itself: send_recv keeps it
                    }());
  std::string known;
  for (const auto& n : builtin_profile_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown profile '{}' (expected a profile JSON file from `shardlm "
                          "calibrate` or one of: {})",
                          name, known));
}

HardwareProfile load_profile(const std::string& name_or_path) {
  for (const auto& n : builtin_profile_names())
    if (n == name_or_path) return builtin_profile(n);
  if (!std::filesystem::exists(name_or_path)) return builtin_profile(name_or_path);
  std::ifstream in(name_or_path);
  SHARDLM_CHECK(in.good(), "cannot read profile '{}'", name_or_path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("profile '{}' is not valid JSON: {}", name_or_path, e.what()));
  }
  try {
    return HardwareProfile::from_json(j);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in '{}')", e.what(), name_or_path));
  }
}

std::vector<std::string> link_names() {
  return {"1gbit", "10gbit", "25gbit", "100gbit", "ib-hdr", "ib-ndr", "nvlink"};
}

TransportFigures link_transport(const std::string& name, double compute_share) {
  // TCP goodput over Ethernet with 1500-byte frames: ~94% of the line rate.
  const auto ethernet = [&](double gbit, double latency_s) {
    return uniform(name, latency_s, 0.94 * gbit * 1e9 / 8, compute_share);
  };
  if (name == "1gbit") return ethernet(1, 50e-6);
  if (name == "10gbit") return ethernet(10, 20e-6);
  if (name == "25gbit") return ethernet(25, 15e-6);
  if (name == "100gbit") return ethernet(100, 10e-6);
  if (name == "ib-hdr") return uniform(name, 2e-6, 0.9 * 25e9, compute_share);
  if (name == "ib-ndr") return uniform(name, 2e-6, 0.9 * 50e9, compute_share);
  if (name == "nvlink") return uniform(name, 2e-6, 0.8 * 450e9, compute_share);
  std::string known;
  for (const auto& n : link_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown --link '{}' (expected one of: {})", name, known));
}

std::string default_profile_path() {
  if (const char* p = std::getenv("SHARDLM_PROFILE"); p != nullptr && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x)
    return std::string(x) + "/shardlm/profile.json";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h)
    return std::string(h) + "/.cache/shardlm/profile.json";
  return "shardlm-profile.json";
}

}  // namespace shardlm
