#include "shardlm/comm/mpi_communicator.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  char label[52] = {};  // truncated, for the message only

  bool same_collective(const Fingerprint& o) const {
    return sequence == o.sequence && bytes == o.bytes && label_hash == o.label_hash &&
           kind == o.kind && root == o.root && op == o.op;
  }
  std::string describe() const {
    std::string text =
        fmt::format("{} '{}' (#{}, {} bytes", to_string(static_cast<CollectiveKind>(kind)),
                    std::string(label, strnlen(label, sizeof(label))), sequence, bytes);
    if (root >= 0) text += fmt::format(", root {}", root);
    if (op >= 0) text += fmt::format(", {}", to_string(static_cast<ReduceOp>(op)));
    return text + ")";
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

Work MpiCommunicator::submit(const Collective& c, std::function<void(MPI_Comm)> body) {
  Fingerprint fingerprint;
  fingerprint.sequence = c.info.sequence;
  fingerprint.bytes = c.bytes;
  fingerprint.label_hash = fnv1a(c.info.label);
  fingerprint.kind = static_cast<int32_t>(c.info.kind);
  fingerprint.root = c.root;
  fingerprint.op = c.op;
  std::strncpy(fingerprint.label, c.info.label.c_str(), sizeof(fingerprint.label) - 1);
  return runtime_->thread().submit(
      c.info, counter_block(),
      [state = state_, check = options().check_sequence, fingerprint, body = std::move(body)] {
        if (!state->out_of_step.empty())
          throw Error("ranks fell out of step at an earlier collective: " + state->out_of_step);
        if (check) verify_in_step(*state, fingerprint);
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

}  // namespace shardlm
