#include "shardlm/comm/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "shardlm/comm/reduce_kernels.hpp"

namespace shardlm {

namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

}  // namespace

Communicator::Communicator(int rank, int size, std::string name, CommOptions options)
    : rank_(rank), size_(size), name_(std::move(name)), options_(options) {
  SHARDLM_CHECK(size >= 1 && rank >= 0 && rank < size, "invalid communicator: rank {} of {}", rank,
                size);
  SHARDLM_CHECK(options.timeout_seconds > 0, "--comm-timeout must be positive seconds, got {}",
                options.timeout_seconds);
}

std::string Communicator::who() const { return fmt::format("rank {}", rank_); }

uint64_t Communicator::next_sequence() const {
  std::lock_guard lock(mutex_);
  return next_sequence_;
}

bool Communicator::finalized() const {
  std::lock_guard lock(mutex_);
  return finalized_;
}

Communicator::Collective Communicator::begin(CollectiveKind kind, std::string label, uint64_t bytes,
                                             int root, int op) {
  Collective c;
  c.info.kind = kind;
  c.info.label = std::move(label);
  c.info.communicator = name_;
  c.bytes = bytes;
  c.root = root;
  c.op = op;
  {
    std::lock_guard lock(mutex_);
    SHARDLM_CHECK(!finalized_, "{}: {} '{}' issued on communicator '{}' after finalize()", who(),
                  to_string(kind), c.info.label, name_);
    c.info.sequence = next_sequence_++;
  }
  counters_->add_call(kind, bytes, bus_bytes_for(kind, bytes, size_));
  return c;
}

Work Communicator::track(Work work) {
  std::lock_guard lock(mutex_);
  if (unobserved_.size() >= prune_at_) {
    std::erase_if(unobserved_, [](const Work& w) { return w.observed(); });
    prune_at_ = std::max<size_t>(64, 2 * unobserved_.size());
  }
  unobserved_.push_back(work);
  return work;
}

Work Communicator::all_reduce(float* data, size_t count, ReduceOp op, std::string label) {
  SHARDLM_CHECK(data != nullptr || count == 0, "all_reduce '{}': null buffer", label);
  auto c = begin(CollectiveKind::all_reduce, std::move(label), count * sizeof(float), -1,
                 static_cast<int>(op));
  return track(start_all_reduce(data, count, op, c));
}

Work Communicator::reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                                  std::string label, WireType wire) {
  const size_t block_bytes = recv_count * sizeof(float);
  SHARDLM_CHECK((send != nullptr && recv != nullptr) || recv_count == 0,
                "reduce_scatter '{}': null buffer", label);
  SHARDLM_CHECK(recv == send + static_cast<size_t>(rank_) * recv_count ||
                    !overlaps(send, block_bytes * size_, recv, block_bytes),
                "reduce_scatter '{}': recv must be send + rank * recv_count or not overlap send",
                label);
  auto c = begin(CollectiveKind::reduce_scatter, std::move(label),
                 recv_count * wire_bytes(wire) * size_, -1, static_cast<int>(op));
  return track(start_reduce_scatter(send, recv, recv_count, op, wire, c));
}

Work Communicator::all_gather(const float* send, float* recv, size_t send_count,
                              std::string label) {
  return all_gather_bytes(send, recv, send_count * sizeof(float), std::move(label));
}

Work Communicator::all_gather_bytes(const void* send, void* recv, size_t bytes_per_rank,
                                    std::string label) {
  SHARDLM_CHECK((send != nullptr && recv != nullptr) || bytes_per_rank == 0,
                "all_gather '{}': null buffer", label);
  const auto* own_block =
      static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes_per_rank;
  SHARDLM_CHECK(send == own_block || !overlaps(send, bytes_per_rank, recv, bytes_per_rank * size_),
                "all_gather '{}': send must be recv + rank * count or not overlap recv", label);
  auto c = begin(CollectiveKind::all_gather, std::move(label), bytes_per_rank * size_, -1, -1);
  return track(start_all_gather(send, recv, bytes_per_rank, c));
}

Work Communicator::broadcast(void* data, size_t bytes, int root, std::string label) {
  SHARDLM_CHECK(root >= 0 && root < size_, "broadcast '{}': root {} is not a rank of {} (size {})",
                label, root, name_, size_);
  SHARDLM_CHECK(data != nullptr || bytes == 0, "broadcast '{}': null buffer", label);
  auto c = begin(CollectiveKind::broadcast, std::move(label), bytes, root, -1);
  return track(start_broadcast(data, bytes, root, c));
}

Work Communicator::barrier(std::string label) {
  auto c = begin(CollectiveKind::barrier, std::move(label), 0, -1, -1);
  return track(start_barrier(c));
}

// Small all-reduces are an all-gather plus a local reduction in rank order: one
// round trip, the same result on every rank, counted as the all-reduce it is.
template <typename T>
void Communicator::all_reduce_values(std::span<T> values, ReduceOp op, std::string label) {
  std::vector<T> gathered(values.size() * size_);
  auto c = begin(CollectiveKind::all_reduce, std::move(label), values.size_bytes(), -1,
                 static_cast<int>(op));
  track(start_all_gather(values.data(), gathered.data(), values.size_bytes(), c)).wait();
  reduce_gathered(gathered.data(), size_, values.size(), values.data(), op);
}

void Communicator::all_reduce_blocking(std::span<double> values, ReduceOp op, std::string label) {
  all_reduce_values(values, op, std::move(label));
}

void Communicator::all_reduce_blocking(std::span<int64_t> values, ReduceOp op, std::string label) {
  all_reduce_values(values, op, std::move(label));
}

std::vector<uint64_t> Communicator::all_gather_u64(uint64_t value, std::string label) {
  std::vector<uint64_t> gathered(size_);
  all_gather_bytes(&value, gathered.data(), sizeof(value), std::move(label)).wait();
  return gathered;
}

void Communicator::broadcast_string(std::string& text, int root, std::string label) {
  uint64_t length = text.size();
  broadcast(&length, sizeof(length), root, label + " (length)").wait();
  text.resize(length);
  broadcast(text.data(), length, root, std::move(label)).wait();
}

void Communicator::finalize() {
  std::vector<Work> leaked;
  {
    std::lock_guard lock(mutex_);
    finalized_ = true;
    for (auto& w : unobserved_)
      if (!w.observed()) leaked.push_back(w);
    unobserved_.clear();
  }
  if (leaked.empty()) return;
  std::string list;
  for (size_t i = 0; i < leaked.size() && i < 5; ++i)
    list += (i ? ", " : "") + describe(*leaked[i].info());
  if (leaked.size() > 5) list += fmt::format(", and {} more", leaked.size() - 5);
  throw Error(fmt::format("{}: {} collective(s) on {} were never waited for: {}", who(),
                          leaked.size(), name_, list));
}

}  // namespace shardlm
