#include "shardlm/comm/in_process_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <tuple>

#include "shardlm/comm/reduce_kernels.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/timer.hpp"

namespace shardlm {

namespace {

// What a rank's start_* asked for (an all_reduce_blocking is counted as an all_reduce
// but travels as an all-gather, so this differs from the collective's kind).
enum class Operation { all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all };

}  // namespace

struct InProcessCommunicator::Contribution {
  Collective c;
  Operation operation = Operation::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // floats for reductions, bytes otherwise
  ReduceOp op = ReduceOp::sum;
  WireType wire = WireType::fp32;
  Communicator::AllToAllCounts split;  // all_to_all: elements per peer
  size_t element_bytes = 0;            // all_to_all
  int world_rank = 0;
  std::string injected_failure;
  std::shared_ptr<detail::WorkState> state;
  std::shared_ptr<CounterBlock> counters;

  static Contribution make(const Collective& c, Operation operation, const void* send, void* recv,
                           size_t count, ReduceOp op = ReduceOp::sum,
                           WireType wire = WireType::fp32) {
    Contribution x;
    x.c = c;
    x.operation = operation;
    x.send = send;
    x.recv = recv;
    x.count = count;
    x.op = op;
    x.wire = wire;
    return x;
  }
};

struct InProcessJob::State {
  int size = 1;
  CommOptions options;
  std::mutex mutex;
  std::vector<InProcessFault> faults;
  std::atomic<bool> aborted{false};
  std::string abort_line;
  std::vector<std::weak_ptr<InProcessCommunicator::Group>> groups;
  std::vector<std::shared_ptr<detail::WorkState>> lost;  // never-arriving ranks' own Works
  std::shared_ptr<InProcessCommunicator::Group> world;
  std::vector<bool> world_taken;

  std::optional<InProcessFault> take_fault(int world_rank, const std::string& communicator,
                                           const std::string& label) {
    std::lock_guard lock(mutex);
    for (auto it = faults.begin(); it != faults.end(); ++it) {
      if (it->rank != world_rank || it->communicator != communicator || it->label != label)
        continue;
      InProcessFault fault = *it;
      faults.erase(it);
      return fault;
    }
    return std::nullopt;
  }
  std::string line() {
    std::lock_guard lock(mutex);
    return abort_line;
  }
};

namespace {

// One rank's point-to-point operation: done once each of its halves (one, or two for
// a send_recv) has met its peer's other half.
struct PointToPointOp {
  CollectiveInfo info;
  std::shared_ptr<detail::WorkState> state;
  std::shared_ptr<CounterBlock> counters;
  int world_rank = 0;
  std::string injected_failure;
  int halves_left = 0;  // under the group's mutex
  std::string failure;  // the first failed half's line; under the group's mutex
};

// A send or receive half waiting for its peer's other half.
struct PointToPointHalf {
  std::shared_ptr<PointToPointOp> op;
  bool sending = false;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t bytes = 0;
  int dtype = -1;
  int rank = 0;  // in the group: the rank that posted it
  int peer = 0;
  uint64_t sequence = 0;  // per pair
};

}  // namespace

struct InProcessCommunicator::Group {
  std::shared_ptr<InProcessJob::State> job;
  std::string name;
  std::vector<int> world_ranks;  // rank in this group -> rank in the job
  std::mutex mutex;
  std::condition_variable split_done;
  // Collectives some ranks issued, by sequence number: each rank's contribution.
  std::map<uint64_t, std::vector<std::optional<Contribution>>> pending;
  struct SplitSlot {
    std::vector<std::optional<std::pair<int, int>>> color_key;  // per rank
    int arrived = 0;
    std::vector<std::pair<std::shared_ptr<Group>, int>> result;  // per rank: group, rank in it
  };
  std::map<uint64_t, SplitSlot> splits;
  // Point-to-point halves posted before their peer's, by (sender, receiver, number).
  std::map<std::tuple<int, int, uint64_t>, PointToPointHalf> unmatched;

  int size() const { return static_cast<int>(world_ranks.size()); }
};

namespace {

std::string describe_issue(const CollectiveInfo& info, uint64_t bytes, int root, int op,
                           int dtype) {
  std::string text = fmt::format("{} '{}' (#{}", to_string(info.kind), info.label, info.sequence);
  if (info.kind != CollectiveKind::all_to_all_v) text += fmt::format(", {} bytes", bytes);
  if (root >= 0) text += fmt::format(", root {}", root);
  if (op >= 0) text += fmt::format(", {}", to_string(static_cast<ReduceOp>(op)));
  if (dtype >= 0) text += fmt::format(", {}", dtype_name(static_cast<DType>(dtype)));
  return text + ")";
}

// "rank 0 sent 'kv' (#2 to rank 1, 64 bytes, fp32)"
std::string describe_half(const PointToPointHalf& h) {
  return fmt::format("rank {} {} '{}' (#{} {} rank {}, {} bytes, {})", h.rank,
                     h.sending ? "sent" : "expects", h.op->info.label, h.sequence,
                     h.sending ? "to" : "from", h.peer, h.bytes,
                     dtype_name(static_cast<DType>(h.dtype)));
}

// Every rank's send block q must be what rank q expects from it.
template <typename C>
void check_all_to_all_counts(const std::vector<C>& all) {
  const size_t n = all.size();
  for (size_t p = 0; p < n; ++p)
    for (size_t q = 0; q < n; ++q)
      if (all[p].split.send[q] != all[q].split.recv[p])
        throw Error(fmt::format("counts disagree: rank {} sends {} elements to rank {} but rank {} "
                                "expects {} from rank {}",
                                p, all[p].split.send[q], q, q, all[q].split.recv[p], p));
}

// Block q of every rank's send buffer into block p of rank q's receive buffer.
template <typename C>
void exchange_all_to_all(std::vector<C>& all) {
  check_all_to_all_counts(all);
  const size_t n = all.size();
  const size_t element = all[0].element_bytes;
  std::vector<size_t> send_offset(n, 0);  // per sender: where its block for q starts
  for (size_t q = 0; q < n; ++q) {
    char* to = static_cast<char*>(all[q].recv);
    for (size_t p = 0; p < n; ++p) {
      const size_t bytes = all[q].split.recv[p] * element;
      if (bytes > 0)
        std::memcpy(to, static_cast<const char*>(all[p].send) + send_offset[p] * element, bytes);
      to += bytes;
      send_offset[p] += all[p].split.send[q];
    }
  }
}

// Performs one collective for every rank of the group, on the calling thread.
template <typename C>
void perform(std::vector<C>& all) {
  const int n = static_cast<int>(all.size());
  const C& first = all[0];
  if (first.operation == Operation::all_reduce) {
    std::vector<const float*> inputs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) inputs[static_cast<size_t>(r)] = static_cast<float*>(all[static_cast<size_t>(r)].recv);
    float* result = static_cast<float*>(first.recv);  // reduce_in_rank_order allows out == inputs[0]
    reduce_in_rank_order(inputs.data(), n, result, first.count, first.op);
    for (int r = 1; r < n; ++r)
      std::memcpy(all[static_cast<size_t>(r)].recv, result, first.count * sizeof(float));
  } else if (first.operation == Operation::reduce_scatter) {
    const size_t count = first.count;
    std::vector<const float*> inputs(static_cast<size_t>(n));
    TrackedBuffer rounded;
    if (first.wire == WireType::bf16)
      rounded = TrackedBuffer(MemCategory::comm, static_cast<size_t>(n) * count * sizeof(uint16_t));
    std::vector<const uint16_t*> bf16_inputs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      // Block r of every rank's send buffer, reduced into rank r's recv (which may be
      // that very block of its own send buffer: out == inputs[r] is allowed).
      for (int p = 0; p < n; ++p)
        inputs[static_cast<size_t>(p)] =
            static_cast<const float*>(all[static_cast<size_t>(p)].send) + static_cast<size_t>(r) * count;
      float* out = static_cast<float*>(all[static_cast<size_t>(r)].recv);
      if (first.wire == WireType::fp32) {
        reduce_in_rank_order(inputs.data(), n, out, count, first.op);
        continue;
      }
      for (int p = 0; p < n; ++p) {
        uint16_t* block = rounded.as<uint16_t>() + static_cast<size_t>(p) * count;
        for (size_t i = 0; i < count; ++i) block[i] = float_to_bf16(inputs[static_cast<size_t>(p)][i]);
        bf16_inputs[static_cast<size_t>(p)] = block;
      }
      reduce_in_rank_order(bf16_inputs.data(), n, out, count, first.op);
    }
  } else if (first.operation == Operation::all_gather) {
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) {
        char* to = static_cast<char*>(all[static_cast<size_t>(r)].recv) + static_cast<size_t>(p) * first.count;
        const void* from = all[static_cast<size_t>(p)].send;
        if (to != from && first.count > 0) std::memcpy(to, from, first.count);
      }
  } else if (first.operation == Operation::all_to_all) {
    exchange_all_to_all(all);
  } else if (first.operation == Operation::broadcast) {
    const void* from = all[static_cast<size_t>(first.c.root)].recv;
    for (int r = 0; r < n; ++r)
      if (all[static_cast<size_t>(r)].recv != from && first.count > 0)
        std::memcpy(all[static_cast<size_t>(r)].recv, from, first.count);
  }
}

}  // namespace

InProcessCommunicator::InProcessCommunicator(std::shared_ptr<Group> group, int rank,
                                             int world_rank, CommOptions options)
    : Communicator(rank, group->size(), group->name, options),
      group_(std::move(group)),
      world_rank_(world_rank) {
  WaitPolicy policy;
  policy.who = fmt::format("rank {}", world_rank_);
  policy.timeout_seconds = options.timeout_seconds;
  policy_ = std::make_shared<const WaitPolicy>(std::move(policy));
}

InProcessCommunicator::~InProcessCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

std::string InProcessCommunicator::who() const { return fmt::format("rank {}", world_rank_); }

Work InProcessCommunicator::post(Contribution x) {
  auto state = std::make_shared<detail::WorkState>(x.c.info, counter_block(), policy_);
  x.state = state;
  x.counters = counter_block();
  x.world_rank = world_rank_;
  InProcessJob::State& job = *group_->job;
  const std::optional<InProcessFault> fault = job.take_fault(world_rank_, name(), x.c.info.label);
  std::vector<Contribution> ready;
  {
    std::lock_guard lock(group_->mutex);
    // Checked under the group's lock, which abort_job takes after setting the flag, so
    // a collective is either failed here or found pending there.
    if (job.aborted) {
      state->fail(job.line());
      return Work(state);
    }
    if (fault && fault->kind == InProcessFault::Kind::never_arrives) {
      std::lock_guard job_lock(job.mutex);
      job.lost.push_back(state);
      return Work(state);
    }
    if (fault) x.injected_failure = fault->message;
    auto& slot = group_->pending[x.c.info.sequence];
    if (slot.empty()) slot.resize(static_cast<size_t>(size()));
    slot[static_cast<size_t>(rank())] = std::move(x);
    if (std::all_of(slot.begin(), slot.end(), [](const auto& c) { return c.has_value(); })) {
      for (auto& c : slot) ready.push_back(std::move(*c));
      group_->pending.erase(ready.front().c.info.sequence);
    }
  }
  if (ready.empty()) return Work(state);

  // This rank arrived last: check agreement, then perform the collective for all.
  const Contribution& first = ready.front();
  std::string failure;
  for (size_t r = 1; r < ready.size() && failure.empty(); ++r) {
    const Contribution& other = ready[r];
    if (other.operation == first.operation && other.c.info.kind == first.c.info.kind &&
        other.c.info.label == first.c.info.label && other.c.agreed_bytes == first.c.agreed_bytes &&
        other.c.root == first.c.root && other.c.op == first.c.op && other.c.dtype == first.c.dtype)
      continue;
    const auto issue = [](const Contribution& x) {
      return describe_issue(x.c.info, x.c.agreed_bytes, x.c.root, x.c.op, x.c.dtype);
    };
    failure = fmt::format("collectives out of step on {}: rank 0 of {} issued {} but rank {} issued {}",
                          name(), name(), issue(first), r, issue(other));
  }
  for (const auto& c : ready)
    if (failure.empty() && !c.injected_failure.empty())
      failure = fmt::format("{} (injected on rank {})", c.injected_failure, c.world_rank);
  Stopwatch elapsed;
  if (failure.empty()) {
    try {
      perform(ready);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  for (auto& c : ready) {
    c.counters->add_seconds(c.c.info.kind, elapsed.seconds());
    if (failure.empty())
      c.state->complete();
    else
      c.state->fail(fmt::format("rank {}: {} failed: {}", c.world_rank, describe(c.c.info), failure));
  }
  return Work(state);
}

Work InProcessCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                             const Collective& c) {
  return post(Contribution::make(c, Operation::all_reduce, data, data, count, op));
}

Work InProcessCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_count,
                                                 ReduceOp op, WireType wire, const Collective& c) {
  return post(
      Contribution::make(c, Operation::reduce_scatter, send, recv, recv_count, op, wire));
}

Work InProcessCommunicator::start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                             const Collective& c) {
  return post(Contribution::make(c, Operation::all_gather, send, recv, bytes_per_rank));
}

Work InProcessCommunicator::start_broadcast(void* data, size_t bytes, int, const Collective& c) {
  return post(Contribution::make(c, Operation::broadcast, data, data, bytes));
}

Work InProcessCommunicator::start_barrier(const Collective& c) {
  return post(Contribution::make(c, Operation::barrier, nullptr, nullptr, 0));
}

Work InProcessCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr recv,
                                             const AllToAllCounts& counts, const Collective& c) {
  Contribution x = Contribution::make(c, Operation::all_to_all, send.data, recv.data, 0);
  x.split = counts;
  x.element_bytes = dtype_bytes(send.dtype);
  return post(std::move(x));
}

Work InProcessCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  auto state = std::make_shared<detail::WorkState>(c.info, counter_block(), policy_);
  auto op = std::make_shared<PointToPointOp>();
  op->info = c.info;
  op->state = state;
  op->counters = counter_block();
  op->world_rank = world_rank_;
  std::vector<PointToPointHalf> halves;
  if (p.to >= 0) {
    PointToPointHalf h{op, true, p.send.data, nullptr, p.send_count * dtype_bytes(p.send.dtype),
                       c.dtype, rank(), p.to, c.info.sequence};
    halves.push_back(h);
  }
  if (p.from >= 0) {
    const uint64_t number = p.to >= 0 ? c.info.from_sequence : c.info.sequence;
    PointToPointHalf h{op, false, nullptr, p.recv.data,
                       p.recv_count * dtype_bytes(p.recv.dtype), c.dtype, rank(), p.from, number};
    halves.push_back(h);
  }
  op->halves_left = static_cast<int>(halves.size());
  InProcessJob::State& job = *group_->job;
  const std::optional<InProcessFault> fault = job.take_fault(world_rank_, name(), c.info.label);
  std::vector<std::shared_ptr<PointToPointOp>> settled;
  {
    std::lock_guard lock(group_->mutex);
    if (job.aborted) {
      state->fail(job.line());
      return Work(state);
    }
    if (fault && fault->kind == InProcessFault::Kind::never_arrives) {
      std::lock_guard job_lock(job.mutex);
      job.lost.push_back(state);
      return Work(state);
    }
    if (fault) op->injected_failure = fault->message;
    for (PointToPointHalf& h : halves) {
      const auto key = h.sending ? std::make_tuple(h.rank, h.peer, h.sequence)
                                 : std::make_tuple(h.peer, h.rank, h.sequence);
      auto it = group_->unmatched.find(key);
      if (it == group_->unmatched.end()) {
        group_->unmatched.emplace(key, std::move(h));
        continue;
      }
      const PointToPointHalf other = std::move(it->second);
      group_->unmatched.erase(it);
      const PointToPointHalf& sender = h.sending ? h : other;
      const PointToPointHalf& receiver = h.sending ? other : h;
      std::string failure;
      if (sender.op->info.label != receiver.op->info.label || sender.bytes != receiver.bytes ||
          sender.dtype != receiver.dtype)
        failure = fmt::format("point-to-point out of step on {}: {} but {}", name(),
                              describe_half(sender), describe_half(receiver));
      for (const auto* side : {&sender, &receiver})
        if (failure.empty() && !side->op->injected_failure.empty())
          failure = fmt::format("{} (injected on rank {})", side->op->injected_failure,
                                side->op->world_rank);
      Stopwatch elapsed;
      if (failure.empty() && sender.bytes > 0) std::memcpy(receiver.recv, sender.send, sender.bytes);
      const double seconds = elapsed.seconds();
      for (const auto& side : {sender.op, receiver.op}) {
        side->counters->add_seconds(side->info.kind, seconds);
        if (!failure.empty() && side->failure.empty()) side->failure = failure;
        if (--side->halves_left == 0) settled.push_back(side);
      }
    }
  }
  for (const auto& done : settled) {
    if (done->failure.empty())
      done->state->complete();
    else
      done->state->fail(fmt::format("rank {}: {} failed: {}", done->world_rank,
                                    describe(done->info), done->failure));
  }
  return Work(state);
}

std::unique_ptr<Communicator> InProcessCommunicator::split(int color, int key, std::string name) {
  SHARDLM_CHECK(color >= 0, "split '{}': color must be >= 0, got {}", name, color);
  SHARDLM_CHECK(!finalized(), "split '{}' after finalize()", name);
  InProcessJob::State& job = *group_->job;
  std::unique_lock lock(group_->mutex);
  auto& slot = group_->splits[splits_++];
  if (slot.color_key.empty()) slot.color_key.resize(static_cast<size_t>(size()));
  slot.color_key[static_cast<size_t>(rank())] = std::make_pair(color, key);
  if (++slot.arrived == size()) {
    // Last to arrive: one group per color, ordered by (key, rank).
    slot.result.resize(static_cast<size_t>(size()));
    std::map<int, std::vector<std::pair<int, int>>> members;  // color -> (key, rank)
    for (int r = 0; r < size(); ++r)
      members[slot.color_key[static_cast<size_t>(r)]->first].emplace_back(
          slot.color_key[static_cast<size_t>(r)]->second, r);
    for (auto& [c, list] : members) {
      std::sort(list.begin(), list.end());
      auto child = std::make_shared<Group>();
      child->job = group_->job;
      child->name = name;
      for (size_t i = 0; i < list.size(); ++i) {
        child->world_ranks.push_back(group_->world_ranks[static_cast<size_t>(list[i].second)]);
        slot.result[static_cast<size_t>(list[i].second)] = {child, static_cast<int>(i)};
      }
      std::lock_guard job_lock(job.mutex);
      job.groups.push_back(child);
    }
    group_->split_done.notify_all();
  } else {
    const bool resolved = group_->split_done.wait_for(
        lock, std::chrono::duration<double>(options().timeout_seconds),
        [&] { return !slot.result.empty() || job.aborted; });
    if (job.aborted) throw Error(job.line());
    if (!resolved)
      throw CommTimeout(fmt::format("{}: timed out after {:.1f} s waiting for split into '{}' on {}",
                                    who(), options().timeout_seconds, name, this->name()));
  }
  auto [child, child_rank] = slot.result[static_cast<size_t>(rank())];
  lock.unlock();
  return std::unique_ptr<Communicator>(
      new InProcessCommunicator(child, child_rank, world_rank_, options()));
}

void InProcessCommunicator::abort_job(const std::string& message) {
  const std::string line = fmt::format("{}: {}", who(), message);
  InProcessJob::State& job = *group_->job;
  std::vector<std::shared_ptr<Group>> groups;
  std::vector<std::shared_ptr<detail::WorkState>> lost;
  {
    std::lock_guard lock(job.mutex);
    if (!job.aborted) job.abort_line = line;
    job.aborted = true;
    for (const auto& g : job.groups)
      if (auto group = g.lock()) groups.push_back(group);
    lost.swap(job.lost);
  }
  const std::string first_line = job.line();
  for (auto& group : groups) {
    std::lock_guard lock(group->mutex);
    for (auto& [sequence, slot] : group->pending)
      for (auto& c : slot)
        if (c) c->state->fail(first_line);
    group->pending.clear();
    for (auto& [key, half] : group->unmatched) half.op->state->fail(first_line);
    group->unmatched.clear();
    group->split_done.notify_all();
  }
  for (auto& state : lost) state->fail(first_line);
  throw JobAborted(line);
}

InProcessJob::InProcessJob(int size, CommOptions options) : state_(std::make_shared<State>()) {
  SHARDLM_CHECK(size >= 1, "in-process job: size must be >= 1, got {}", size);
  state_->size = size;
  state_->options = options;
  state_->world = std::make_shared<InProcessCommunicator::Group>();
  state_->world->job = state_;
  state_->world->name = "world";
  for (int r = 0; r < size; ++r) state_->world->world_ranks.push_back(r);
  state_->groups.push_back(state_->world);
  state_->world_taken.assign(static_cast<size_t>(size), false);
}

InProcessJob::~InProcessJob() {
  // Groups point back at the job; break the cycle.
  std::lock_guard lock(state_->mutex);
  state_->world.reset();
}

int InProcessJob::size() const { return state_->size; }

std::unique_ptr<Communicator> InProcessJob::world(int rank) {
  std::lock_guard lock(state_->mutex);
  SHARDLM_CHECK(rank >= 0 && rank < state_->size && !state_->world_taken[static_cast<size_t>(rank)],
                "in-process job: world communicator of rank {} asked twice or out of range", rank);
  state_->world_taken[static_cast<size_t>(rank)] = true;
  return std::unique_ptr<Communicator>(
      new InProcessCommunicator(state_->world, rank, rank, state_->options));
}

void InProcessJob::inject(InProcessFault fault) {
  std::lock_guard lock(state_->mutex);
  state_->faults.push_back(std::move(fault));
}

std::vector<std::string> InProcessJob::run(const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(state_->size));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < state_->size; ++r) comms.push_back(world(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < state_->size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[static_cast<size_t>(r)]);
        comms[static_cast<size_t>(r)]->finalize();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace shardlm
