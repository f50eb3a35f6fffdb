#include "shardlm/comm/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>

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
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      options_(options),
      sends_to_(static_cast<size_t>(std::max(size, 1)), 0),
      receives_from_(static_cast<size_t>(std::max(size, 1)), 0) {
  SHARDLM_CHECK(size >= 1 && rank >= 0 && rank < size, "invalid communicator: rank {} of {}", rank,
                size);
  SHARDLM_CHECK(options.timeout_seconds > 0, "--comm-timeout must be positive seconds, got {}",
                options.timeout_seconds);
}

std::string Communicator::who() const { return fmt::format("rank {}", rank_); }

CommCounters Communicator::counters() const {
  CommCounters total = counters_->snapshot();
  std::lock_guard lock(mutex_);
  for (const auto& child : children_counters_) total += child->snapshot();
  return total;
}

CommCounters Communicator::take_counters() {
  CommCounters total = counters_->take();
  std::lock_guard lock(mutex_);
  for (const auto& child : children_counters_) total += child->take();
  return total;
}

void Communicator::count_with_parent(const Communicator& child) {
  SHARDLM_CHECK(&child != this, "internal: communicator '{}' counted with itself", name_);
  std::lock_guard lock(mutex_);
  children_counters_.push_back(child.counters_);
}

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
  Collective c = begin_counted(kind, std::move(label), bytes, bus_bytes_for(kind, bytes, size_), 0);
  c.root = root;
  c.op = op;
  return c;
}

Communicator::Collective Communicator::begin_counted(CollectiveKind kind, std::string label,
                                                     uint64_t bytes, uint64_t bus_bytes,
                                                     uint64_t messages) {
  const bool point_to_point = kind == CollectiveKind::send || kind == CollectiveKind::recv ||
                              kind == CollectiveKind::send_recv;
  Collective c;
  c.info.kind = kind;
  c.info.label = std::move(label);
  c.info.communicator = name_;
  c.bytes = bytes;
  c.agreed_bytes = bytes;
  {
    std::lock_guard lock(mutex_);
    SHARDLM_CHECK(!finalized_, "{}: {} '{}' issued on communicator '{}' after finalize()", who(),
                  to_string(kind), c.info.label, name_);
    if (!point_to_point) c.info.sequence = next_sequence_++;
  }
  counters_->add_call(kind, bytes, bus_bytes, messages);
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

Work Communicator::all_to_all(ConstTypedPtr send, TypedPtr recv, size_t count_per_peer,
                              std::string label) {
  AllToAllCounts counts;
  counts.send.assign(static_cast<size_t>(size_), count_per_peer);
  counts.recv = counts.send;
  return begin_all_to_all(CollectiveKind::all_to_all, send, recv, std::move(counts),
                          std::move(label));
}

Work Communicator::all_to_all_v(ConstTypedPtr send, std::span<const size_t> send_counts,
                                TypedPtr recv, std::span<const size_t> recv_counts,
                                std::string label) {
  SHARDLM_CHECK(send_counts.size() == static_cast<size_t>(size_) &&
                    recv_counts.size() == static_cast<size_t>(size_),
                "all_to_all_v '{}': expected {} send and {} recv counts (one per rank of {}), got "
                "{} and {}",
                label, size_, size_, name_, send_counts.size(), recv_counts.size());
  AllToAllCounts counts;
  counts.send.assign(send_counts.begin(), send_counts.end());
  counts.recv.assign(recv_counts.begin(), recv_counts.end());
  return begin_all_to_all(CollectiveKind::all_to_all_v, send, recv, std::move(counts),
                          std::move(label));
}

Work Communicator::begin_all_to_all(CollectiveKind kind, ConstTypedPtr send, TypedPtr recv,
                                    AllToAllCounts counts, std::string label) {
  const std::string_view what = to_string(kind);
  SHARDLM_CHECK(send.dtype == recv.dtype, "{} '{}': send is {} but recv is {} (expected one dtype)",
                what, label, dtype_name(send.dtype), dtype_name(recv.dtype));
  const size_t element = dtype_bytes(send.dtype);
  const auto me = static_cast<size_t>(rank_);
  SHARDLM_CHECK(counts.send[me] == counts.recv[me],
                "{} '{}': rank {} sends {} elements to itself but expects {} from itself", what,
                label, rank_, counts.send[me], counts.recv[me]);
  uint64_t send_total = 0, recv_total = 0, sent_away = 0, messages = 0;
  for (size_t p = 0; p < counts.send.size(); ++p) {
    send_total += counts.send[p];
    recv_total += counts.recv[p];
    if (p != me) {
      sent_away += counts.send[p];
      messages += 1;
    }
  }
  SHARDLM_CHECK((send.data != nullptr || send_total == 0) && (recv.data != nullptr || recv_total == 0),
                "{} '{}': null buffer", what, label);
  SHARDLM_CHECK(!overlaps(send.data, send_total * element, recv.data, recv_total * element),
                "{} '{}': send and recv must not overlap (no in-place all-to-all)", what, label);
  Collective c = begin_counted(kind, std::move(label), send_total * element,
                               size_ > 1 ? sent_away * element : 0, size_ > 1 ? messages : 0);
  c.agreed_bytes = kind == CollectiveKind::all_to_all ? c.bytes : 0;
  c.dtype = static_cast<int>(send.dtype);
  return track(start_all_to_all(send, recv, counts, c));
}

Work Communicator::send(ConstTypedPtr data, size_t count, int peer, std::string label) {
  PointToPoint p;
  p.send = data;
  p.send_count = count;
  p.to = peer;
  return begin_point_to_point(CollectiveKind::send, p, std::move(label));
}

Work Communicator::recv(TypedPtr data, size_t count, int peer, std::string label) {
  PointToPoint p;
  p.recv = data;
  p.recv_count = count;
  p.from = peer;
  return begin_point_to_point(CollectiveKind::recv, p, std::move(label));
}

Work Communicator::send_recv(ConstTypedPtr send, size_t send_count, int to, TypedPtr recv,
                             size_t recv_count, int from, std::string label) {
  PointToPoint p;
  p.send = send;
  p.send_count = send_count;
  p.to = to;
  p.recv = recv;
  p.recv_count = recv_count;
  p.from = from;
  return begin_point_to_point(CollectiveKind::send_recv, p, std::move(label));
}

Work Communicator::begin_point_to_point(CollectiveKind kind, const PointToPoint& p,
                                        std::string label) {
  const std::string_view what = to_string(kind);
  const bool sends = kind != CollectiveKind::recv;
  const bool receives = kind != CollectiveKind::send;
  for (const auto& [used, peer, role] : {std::tuple{sends, p.to, "peer to send to"},
                                         std::tuple{receives, p.from, "peer to receive from"}})
    SHARDLM_CHECK(!used || (peer >= 0 && peer < size_),
                  "{} '{}': {} {} is not a rank of {} (size {})", what, label, role, peer, name_,
                  size_);
  if (kind == CollectiveKind::send_recv) {
    SHARDLM_CHECK(p.send.dtype == p.recv.dtype,
                  "send_recv '{}': send is {} but recv is {} (expected one dtype)", label,
                  dtype_name(p.send.dtype), dtype_name(p.recv.dtype));
    SHARDLM_CHECK((p.to == rank_) == (p.from == rank_),
                  "send_recv '{}': sends to rank {} and receives from rank {}: either both are "
                  "this rank ({}, a ring of one) or neither",
                  label, p.to, p.from, rank_);
    SHARDLM_CHECK(p.to != rank_ || p.send_count == p.recv_count,
                  "send_recv '{}': sends {} elements to itself but expects {}", label,
                  p.send_count, p.recv_count);
  } else {
    const int peer = sends ? p.to : p.from;
    SHARDLM_CHECK(peer != rank_,
                  "{} '{}': peer {} is this rank (a message to itself: use send_recv with to == "
                  "from == {}, or a copy)",
                  what, label, peer, rank_);
  }
  const size_t element = dtype_bytes(sends ? p.send.dtype : p.recv.dtype);
  const uint64_t send_bytes = sends ? p.send_count * element : 0;
  const uint64_t recv_bytes = receives ? p.recv_count * element : 0;
  SHARDLM_CHECK((!sends || p.send.data != nullptr || send_bytes == 0) &&
                    (!receives || p.recv.data != nullptr || recv_bytes == 0),
                "{} '{}': null buffer", what, label);
  SHARDLM_CHECK(!overlaps(p.send.data, send_bytes, p.recv.data, recv_bytes),
                "send_recv '{}': send and recv must not overlap", label);
  const bool to_other = sends && p.to != rank_;
  Collective c = begin_counted(kind, std::move(label), sends ? send_bytes : recv_bytes,
                               to_other ? send_bytes : 0, to_other ? 1 : 0);
  c.dtype = static_cast<int>(sends ? p.send.dtype : p.recv.dtype);
  {
    std::lock_guard lock(mutex_);
    // Numbered per pair, not per communicator: begin_counted took no sequence number.
    if (sends) {
      c.info.to = p.to;
      c.info.sequence = sends_to_[static_cast<size_t>(p.to)]++;
    }
    if (receives) {
      c.info.from = p.from;
      const uint64_t n = receives_from_[static_cast<size_t>(p.from)]++;
      if (sends)
        c.info.from_sequence = n;
      else
        c.info.sequence = n;
    }
  }
  return track(start_point_to_point(p, c));
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
