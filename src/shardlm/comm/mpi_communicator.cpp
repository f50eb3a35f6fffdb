#include "shardlm/comm/mpi_communicator.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "shardlm/comm/comm_thread.hpp"
#include "shardlm/comm/launcher_watch.hpp"
#include "shardlm/comm/world.hpp"
#include "shardlm/comm/mpi_algorithms.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm {

namespace {

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) hash = (hash ^ ch) * 0x100000001b3ull;
  return hash;
}

// What ranks compare before each collective in check mode. Plain bytes, so it travels
// as MPI_BYTE.
struct Fingerprint {
  uint64_t sequence = 0;
  uint64_t bytes = 0;
  uint64_t label_hash = 0;
  int32_t kind = 0;
  int32_t root = -1;
  int32_t op = -1;
  int32_t dtype = -1;
  char label[48] = {};  // truncated, for the message only

  bool same_collective(const Fingerprint& o) const {
    return sequence == o.sequence && bytes == o.bytes && label_hash == o.label_hash &&
           kind == o.kind && root == o.root && op == o.op && dtype == o.dtype;
  }
  std::string label_text() const { return std::string(label, strnlen(label, sizeof(label))); }
  std::string describe() const {
    const auto k = static_cast<CollectiveKind>(kind);
    std::string text = fmt::format("{} '{}' (#{}", to_string(k), label_text(), sequence);
    if (k != CollectiveKind::all_to_all_v) text += fmt::format(", {} bytes", bytes);
    if (root >= 0) text += fmt::format(", root {}", root);
    if (op >= 0) text += fmt::format(", {}", to_string(static_cast<ReduceOp>(op)));
    if (dtype >= 0) text += fmt::format(", {}", dtype_name(static_cast<DType>(dtype)));
    return text + ")";
  }
};

// What the two sides of one point-to-point message compare in check mode: the pair,
// its per-pair number, size, dtype and label.
struct MessageFingerprint {
  uint64_t sequence = 0;
  uint64_t bytes = 0;
  uint64_t label_hash = 0;
  int32_t sender = 0;  // ranks of the communicator
  int32_t receiver = 0;
  int32_t dtype = -1;
  int32_t sending = 0;  // 1: the sender's side
  char label[48] = {};

  bool same_message(const MessageFingerprint& o) const {
    return sequence == o.sequence && bytes == o.bytes && label_hash == o.label_hash &&
           sender == o.sender && receiver == o.receiver && dtype == o.dtype;
  }
  // "rank 0 sent 'kv' (#2 to rank 1, 64 bytes, fp32)"
  std::string describe() const {
    return fmt::format("rank {} {} '{}' (#{} {} rank {}, {} bytes, {})", sending ? sender : receiver,
                       sending ? "sent" : "expects", std::string(label, strnlen(label, sizeof(label))),
                       sequence, sending ? "to" : "from", sending ? receiver : sender, bytes,
                       dtype_name(static_cast<DType>(dtype)));
  }
};

}  // namespace

// One per process: MPI start-up and shutdown, the communication thread and the
// reduction scratch, shared by the world and its sub-communicators.
class MpiRuntime {
 public:
  explicit MpiRuntime(const CommOptions& options) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    owns_mpi_ = initialized == 0;
    if (owns_mpi_)
      mpi::check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_),
                 "MPI_Init_thread");
    else
      mpi::check(MPI_Query_thread(&thread_level_), "MPI_Query_thread");
    // A private copy of the world, returning errors instead of aborting inside MPI, so
    // a failure names the collective it happened in.
    mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &world_), "MPI_Comm_dup");
    mpi::check(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi::check(MPI_Comm_rank(world_, &rank_), "MPI_Comm_rank");
    mpi::check(MPI_Comm_size(world_, &size_), "MPI_Comm_size");
    if (thread_level_ < MPI_THREAD_SERIALIZED)
      print_line_and_end_job(fmt::format(
          "rank {}: MPI provides thread level {}, but shardlm calls MPI from its communication "
          "thread and needs at least MPI_THREAD_SERIALIZED ({})",
          rank_, thread_level_, MPI_THREAD_SERIALIZED));
    // A rank whose mpirun (or Open MPI daemon) is gone stops instead of training on.
    if (launched_by_mpi_launcher()) exit_when_launcher_dies(fmt::format("rank {}", rank_));
    scratch_ = TrackedBuffer(MemCategory::comm, options.scratch_bytes);
    WaitPolicy policy;
    policy.who = fmt::format("rank {}", rank_);
    policy.timeout_seconds = options.timeout_seconds;
    policy.on_timeout = [](const std::string& line) { print_line_and_end_job(line); };
    thread_ = std::make_unique<CommThread>(
        std::move(policy), options.overlap ? CommStart::at_once : CommStart::on_wait);
  }

  ~MpiRuntime() {
    try {
      finalize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  // Drains and joins the communication thread, then releases MPI. Must run on the
  // thread that created the runtime (MPI_Finalize belongs to the initialising thread).
  void finalize() {
    if (finalized_) return;
    finalized_ = true;
    thread_->shutdown();
    MPI_Comm_free(&world_);
    if (owns_mpi_) MPI_Finalize();
  }

  bool finalized() const { return finalized_; }
  CommThread& thread() { return *thread_; }
  MPI_Comm world() const { return world_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int thread_level() const { return thread_level_; }
  mpi::Scratch scratch() const { return {scratch_.as<float>(), scratch_.bytes() / sizeof(float)}; }

 private:
  bool owns_mpi_ = false;
  bool finalized_ = false;
  int thread_level_ = 0;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm world_ = MPI_COMM_NULL;
  TrackedBuffer scratch_;
  std::unique_ptr<CommThread> thread_;
};

// Touched only by the communication thread once the communicator is built.
struct MpiCommunicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  mpi::Scratch scratch;
  std::string name;
  int rank = 0;
  int size = 1;
  std::string out_of_step;  // set once the sequence check found ranks disagreeing
};

namespace {

void verify_in_step(MpiCommunicator::State& state, const Fingerprint& mine) {
  std::vector<Fingerprint> all(state.size);
  mpi::check(MPI_Allgather(&mine, sizeof(Fingerprint), MPI_BYTE, all.data(), sizeof(Fingerprint),
                           MPI_BYTE, state.comm),
             "MPI_Allgather (sequence check)");
  for (int r = 1; r < state.size; ++r) {
    if (all[r].same_collective(all[0])) continue;
    // Every rank sees the same table, so every rank fails here with the same text.
    state.out_of_step =
        fmt::format("collectives out of step on {}: rank 0 of {} issued {} but rank {} issued {}",
                    state.name, state.name, all[0].describe(), r, all[r].describe());
    throw Error(state.out_of_step);
  }
}

// Check mode, all_to_all_v: every rank's counts (send then recv, N each) to every
// rank, so all see the same table and fail with the same line on a disagreement.
void verify_counts(MpiCommunicator::State& state, const std::vector<size_t>& send_counts,
                   const std::vector<size_t>& recv_counts) {
  const auto n = static_cast<size_t>(state.size);
  std::vector<uint64_t> row(2 * n), table(2 * n * n);
  for (size_t p = 0; p < n; ++p) {
    row[p] = send_counts[p];
    row[n + p] = recv_counts[p];
  }
  mpi::check(MPI_Allgather(row.data(), static_cast<int>(2 * n), MPI_UINT64_T, table.data(),
                           static_cast<int>(2 * n), MPI_UINT64_T, state.comm),
             "MPI_Allgather (all_to_all_v counts check)");
  for (size_t p = 0; p < n; ++p)
    for (size_t q = 0; q < n; ++q) {
      const uint64_t sends = table[p * 2 * n + q];
      const uint64_t expects = table[q * 2 * n + n + p];
      if (sends == expects) continue;
      state.out_of_step = fmt::format(
          "counts disagree on {}: rank {} sends {} elements to rank {} but rank {} expects {} from "
          "rank {}",
          state.name, p, sends, q, q, expects, p);
      throw Error(state.out_of_step);
    }
}

// Check mode, point-to-point: each half trades fingerprints with its peer before any
// data moves; both sides of a disagreeing pair fail with the same line.
void verify_messages(MpiCommunicator::State& state, const std::vector<MessageFingerprint>& mine) {
  std::vector<MessageFingerprint> theirs(mine.size());
  std::vector<MPI_Request> requests;
  requests.reserve(2 * mine.size());
  constexpr int kTag = 7105;
  for (size_t i = 0; i < mine.size(); ++i) {
    const int peer = mine[i].sending ? mine[i].receiver : mine[i].sender;
    requests.emplace_back();
    mpi::check(MPI_Irecv(&theirs[i], sizeof(MessageFingerprint), MPI_BYTE, peer, kTag, state.comm,
                         &requests.back()),
               "MPI_Irecv (point-to-point check)");
  }
  for (const auto& m : mine) {
    requests.emplace_back();
    mpi::check(MPI_Isend(&m, sizeof(MessageFingerprint), MPI_BYTE, m.sending ? m.receiver : m.sender,
                         kTag, state.comm, &requests.back()),
               "MPI_Isend (point-to-point check)");
  }
  mpi::check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
             "MPI_Waitall (point-to-point check)");
  // With to == from, the peer's two fingerprints arrive in its order: match by direction.
  const auto peer_of = [](const MessageFingerprint& m) { return m.sending ? m.receiver : m.sender; };
  for (size_t i = 0; i < mine.size(); ++i) {
    const MessageFingerprint& m = mine[i];
    const MessageFingerprint* other = &theirs[i];
    for (size_t j = 0; j < mine.size(); ++j)
      if (peer_of(mine[j]) == peer_of(m) && theirs[j].sending != m.sending &&
          theirs[j].sender == m.sender && theirs[j].receiver == m.receiver)
        other = &theirs[j];
    if (m.same_message(*other)) continue;
    const MessageFingerprint& sender = m.sending ? m : *other;
    const MessageFingerprint& receiver = m.sending ? *other : m;
    throw Error(fmt::format("point-to-point out of step on {}: {} but {}", state.name,
                            sender.describe(), receiver.describe()));
  }
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::create_world(CommOptions options) {
  auto runtime = std::make_shared<MpiRuntime>(options);
  auto state = std::make_shared<State>();
  state->comm = runtime->world();
  state->scratch = runtime->scratch();
  state->name = "world";
  state->rank = runtime->rank();
  state->size = runtime->size();
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(
      runtime, state, state->rank, state->size, "world", options, /*is_world=*/true));
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, std::shared_ptr<State> state,
                                 int rank, int size, std::string name, CommOptions options,
                                 bool is_world)
    : Communicator(rank, size, std::move(name), options),
      runtime_(std::move(runtime)),
      state_(std::move(state)),
      is_world_(is_world) {}

MpiCommunicator::~MpiCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  if (!is_world_ && !runtime_->finalized()) {
    // Queued behind this communicator's last collectives; nobody needs to wait for it.
    CollectiveInfo info{CollectiveKind::barrier, "free", 0, name()};
    runtime_->thread().submit(info, nullptr, [state = state_] { MPI_Comm_free(&state->comm); });
  }
}

void MpiCommunicator::finalize() {
  if (is_world_) runtime_->finalize();
  Communicator::finalize();
}

int MpiCommunicator::thread_level() const { return runtime_->thread_level(); }

std::string MpiCommunicator::who() const { return fmt::format("rank {}", runtime_->rank()); }

void MpiCommunicator::abort_job(const std::string& message) {
  print_line_and_end_job(fmt::format("{}: {}", who(), message));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
  SHARDLM_CHECK(color >= 0, "split '{}': color must be >= 0, got {}", name, color);
  SHARDLM_CHECK(!finalized(), "split '{}' after finalize()", name);
  auto child = std::make_shared<State>();
  child->scratch = state_->scratch;
  child->name = name;
  CollectiveInfo info{CollectiveKind::barrier, fmt::format("split into '{}'", name),
                      next_sequence(), this->name()};
  runtime_->thread()
      .submit(info, nullptr,
              [parent = state_, child, color, key] {
                mpi::check(MPI_Comm_split(parent->comm, color, key, &child->comm),
                           "MPI_Comm_split");
                mpi::check(MPI_Comm_rank(child->comm, &child->rank), "MPI_Comm_rank");
                mpi::check(MPI_Comm_size(child->comm, &child->size), "MPI_Comm_size");
              })
      .wait();
  const int rank = child->rank;
  const int size = child->size;
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(runtime_, child, rank, size, std::move(name), options(), false));
}

Work MpiCommunicator::submit(const Collective& c, std::function<void(MPI_Comm)> body,
                             const AllToAllCounts* counts) {
  Fingerprint fingerprint;
  fingerprint.sequence = c.info.sequence;
  fingerprint.bytes = c.agreed_bytes;
  fingerprint.label_hash = fnv1a(c.info.label);
  fingerprint.kind = static_cast<int32_t>(c.info.kind);
  fingerprint.root = c.root;
  fingerprint.op = c.op;
  fingerprint.dtype = c.dtype;
  std::strncpy(fingerprint.label, c.info.label.c_str(), sizeof(fingerprint.label) - 1);
  std::optional<AllToAllCounts> varying;
  if (counts != nullptr && c.info.kind == CollectiveKind::all_to_all_v) varying = *counts;
  return runtime_->thread().submit(
      c.info, counter_block(),
      [state = state_, check = options().check_sequence, fingerprint, varying,
       body = std::move(body)] {
        if (!state->out_of_step.empty())
          throw Error("ranks fell out of step at an earlier collective: " + state->out_of_step);
        if (check) verify_in_step(*state, fingerprint);
        if (check && varying) verify_counts(*state, varying->send, varying->recv);
        body(state->comm);
      });
}

Work MpiCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                       const Collective& c) {
  const mpi::Scratch scratch = state_->scratch;
  return submit(c,
                [=](MPI_Comm comm) { mpi::all_reduce_rank_order(comm, data, count, op, scratch); });
}

Work MpiCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_count,
                                           ReduceOp op, WireType wire, const Collective& c) {
  const mpi::Scratch scratch = state_->scratch;
  return submit(c, [=](MPI_Comm comm) {
    mpi::reduce_scatter_rank_order(comm, send, recv, recv_count, op, scratch, wire);
  });
}

Work MpiCommunicator::start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                       const Collective& c) {
  return submit(c, [=](MPI_Comm comm) { mpi::all_gather(comm, send, recv, bytes_per_rank); });
}

Work MpiCommunicator::start_broadcast(void* data, size_t bytes, int root, const Collective& c) {
  return submit(c, [=](MPI_Comm comm) { mpi::broadcast(comm, data, bytes, root); });
}

Work MpiCommunicator::start_barrier(const Collective& c) {
  return submit(c, [](MPI_Comm comm) { mpi::check(MPI_Barrier(comm), "MPI_Barrier"); });
}

Work MpiCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr recv,
                                       const AllToAllCounts& counts, const Collective& c) {
  const size_t element = dtype_bytes(send.dtype);
  std::vector<size_t> send_bytes(counts.send.size()), recv_bytes(counts.recv.size());
  for (size_t p = 0; p < counts.send.size(); ++p) {
    send_bytes[p] = counts.send[p] * element;
    recv_bytes[p] = counts.recv[p] * element;
  }
  return submit(
      c,
      [from = send.data, to = recv.data, send_bytes = std::move(send_bytes),
       recv_bytes = std::move(recv_bytes)](MPI_Comm comm) {
        mpi::all_to_all_v(comm, from, send_bytes.data(), to, recv_bytes.data());
      },
      &counts);
}

Work MpiCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  const uint64_t send_bytes = p.to >= 0 ? p.send_count * dtype_bytes(p.send.dtype) : 0;
  const uint64_t recv_bytes = p.from >= 0 ? p.recv_count * dtype_bytes(p.recv.dtype) : 0;
  std::vector<MessageFingerprint> halves;
  if (options().check_sequence && p.to != rank()) {
    MessageFingerprint m;
    m.label_hash = fnv1a(c.info.label);
    m.dtype = c.dtype;
    std::strncpy(m.label, c.info.label.c_str(), sizeof(m.label) - 1);
    if (p.to >= 0) {
      MessageFingerprint h = m;
      h.sequence = c.info.sequence;
      h.bytes = send_bytes;
      h.sender = rank();
      h.receiver = p.to;
      h.sending = 1;
      halves.push_back(h);
    }
    if (p.from >= 0) {
      MessageFingerprint h = m;
      h.sequence = p.to >= 0 ? c.info.from_sequence : c.info.sequence;
      h.bytes = recv_bytes;
      h.sender = p.from;
      h.receiver = rank();
      halves.push_back(h);
    }
  }
  // Not submit(): point-to-point operations take no part in the collective sequence
  // check, and a failed pair does not stop the communicator's collectives.
  return runtime_->thread().submit(
      c.info, counter_block(),
      [state = state_, halves = std::move(halves), send = p.send.data, send_bytes, to = p.to,
       recv = p.recv.data, recv_bytes, from = p.from] {
        if (!state->out_of_step.empty())
          throw Error("ranks fell out of step at an earlier collective: " + state->out_of_step);
        if (!halves.empty()) verify_messages(*state, halves);
        mpi::send_recv(state->comm, send, send_bytes, to, recv, recv_bytes, from);
      });
}

}  // namespace shardlm
