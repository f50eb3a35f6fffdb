#include "shardlm/comm/counters.hpp"

#include <nlohmann/json.hpp>
#include <string>

namespace shardlm {

std::string_view to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::all_to_all:
      return "all_to_all";
    case CollectiveKind::all_to_all_v:
      return "all_to_all_v";
    case CollectiveKind::send:
      return "send";
    case CollectiveKind::recv:
      return "recv";
    case CollectiveKind::send_recv:
      return "send_recv";
    case CollectiveKind::count:
      break;
  }
  return "unknown";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "unknown";
}

size_t wire_bytes(WireType wire) { return wire == WireType::bf16 ? 2 : 4; }

uint64_t bus_bytes_for(CollectiveKind kind, uint64_t bytes, int world_size) {
  if (world_size <= 1) return 0;
  const auto n = static_cast<__uint128_t>(world_size);
  const auto fraction = [&](uint64_t times) {
    return static_cast<uint64_t>(static_cast<__uint128_t>(bytes) * times * (n - 1) / n);
  };
  switch (kind) {
    case CollectiveKind::all_reduce:
      return fraction(2);
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v:  // estimate; the communicator counts the exact figure
      return fraction(1);
    case CollectiveKind::broadcast:
    case CollectiveKind::send:
    case CollectiveKind::send_recv:
      return bytes;
    case CollectiveKind::recv:
    case CollectiveKind::barrier:
    case CollectiveKind::count:
      break;
  }
  return 0;
}

CollectiveStats CommCounters::total() const {
  CollectiveStats sum;
  for (const auto& s : by_kind) {
    sum.calls += s.calls;
    sum.bytes += s.bytes;
    sum.bus_bytes += s.bus_bytes;
    sum.messages += s.messages;
    sum.seconds += s.seconds;
  }
  return sum;
}

CommCounters& CommCounters::operator+=(const CommCounters& other) {
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    by_kind[k].calls += other.by_kind[k].calls;
    by_kind[k].bytes += other.by_kind[k].bytes;
    by_kind[k].bus_bytes += other.by_kind[k].bus_bytes;
    by_kind[k].messages += other.by_kind[k].messages;
    by_kind[k].seconds += other.by_kind[k].seconds;
  }
  exposed_seconds += other.exposed_seconds;
  return *this;
}

static nlohmann::json stats_json(const CollectiveStats& s) {
  return {{"calls", s.calls},
          {"bytes", s.bytes},
          {"bus_bytes", s.bus_bytes},
          {"messages", s.messages},
          {"seconds", s.seconds}};
}

nlohmann::json CommCounters::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (int k = 0; k < kNumCollectiveKinds; ++k)
    out[std::string(to_string(static_cast<CollectiveKind>(k)))] = stats_json(by_kind[k]);
  out["total"] = stats_json(total());
  out["exposed_seconds"] = exposed_seconds;
  return out;
}

void CounterBlock::add_call(CollectiveKind kind, uint64_t bytes, uint64_t bus_bytes,
                           uint64_t messages) {
  std::lock_guard lock(mutex_);
  auto& s = counters_[kind];
  s.calls += 1;
  s.bytes += bytes;
  s.bus_bytes += bus_bytes;
  s.messages += messages;
}

void CounterBlock::add_seconds(CollectiveKind kind, double seconds) {
  std::lock_guard lock(mutex_);
  counters_[kind].seconds += seconds;
}

void CounterBlock::add_exposed_seconds(double seconds) {
  std::lock_guard lock(mutex_);
  counters_.exposed_seconds += seconds;
}

CommCounters CounterBlock::snapshot() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

CommCounters CounterBlock::take() {
  std::lock_guard lock(mutex_);
  CommCounters out = counters_;
  counters_ = CommCounters{};
  return out;
}

}  // namespace shardlm
