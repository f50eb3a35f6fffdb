// RecordingCommunicator: a world of any size in which one rank is simulated, for
// `plan` (plan/traced_step.hpp). Every rank of a symmetric mesh does the same, so the
// one rank's collectives are the step's: each is recorded (kind, group, bytes, bus
// bytes, label) in a StepRecording and completes at once without moving anything.
// The recording also notes when the rank first waits for each collective and, between
// those events, the work the meta backends' kernels recorded (backend/meta), so it
// holds the step as the compute thread ran it: compute, issue, wait.
//
// Buffers are the meta device's (no storage: nothing is touched) or, for the host's
// values (the trainer's scalar all-reduces, digests), real host memory, which is
// filled as a symmetric world would fill it: every rank's block of an all-gather is
// this rank's, a sum all-reduce is size() times this rank's value.
//
// Validation, sequence numbers, labels and counters are the Communicator base class's,
// as in every communicator. The world allocates the MPI communicator's reduction
// scratch (CommOptions::scratch_bytes, MemCategory::comm) on the backend it is given
// when it has more than one rank, as MpiCommunicator does; its splits share it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardlm/backend/meta/meta_backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/memory_tracker.hpp"

namespace shardlm {

struct RecordedCollective {
  CollectiveKind kind = CollectiveKind::barrier;
  std::string group;  // the communicator's name: "world", "shard group", ...
  int group_size = 1;
  uint64_t bytes = 0;      // algorithm bytes (comm/counters.hpp)
  uint64_t bus_bytes = 0;  // per rank, as the counters count them
  size_t element_bytes = 4;  // of the values on the wire (bf16 reductions: 2)
  std::string label;
};

struct RecordedOp {
  enum class Kind { compute, issue, wait, step_end };
  Kind kind = Kind::compute;
  ComputeWork work;  // compute
  int collective = -1;    // issue, wait: index into collectives()
  std::string label;      // compute: "kernels", or what add_compute named
};

class StepRecording {
 public:
  // Kernels whose work is recorded as compute between communication events (the
  // device's meta backend and, for a device run, the host's).
  void add_compute_source(meta::MetaBackend& backend);
  int issue(RecordedCollective collective);
  // The first wait for collective `id` (later ones find it done and are not recorded).
  void wait(int id);
  void end_step();
  // A span whose work the caller accounts for itself (plan's model units:
  // plan/traced_step.cpp). begin_span() closes the kernels' work before it as its own
  // compute op and returns the span's start; end_span() replaces the kernels' work
  // recorded since with `work`, placed where the kernels ran: the span's collectives
  // cut it into segments (a tensor-parallel backward's weight-gradient GEMM runs
  // between the issue and the wait of its input gradient's reduction), and each of
  // work's counts is shared out over the segments in proportion to the kernels' own
  // count there (a count no kernel recorded goes after the span's last event).
  size_t begin_span();
  void end_span(size_t span, const ComputeWork& work, const std::string& label);
  // Forgets everything recorded so far (construction and initialisation, before the
  // steps) and the compute sources' pending work.
  void clear();

  const std::vector<RecordedCollective>& collectives() const { return collectives_; }
  const std::vector<RecordedOp>& ops() const { return ops_; }

 private:
  void flush_compute();
  void drop_kernels();
  std::vector<meta::MetaBackend*> sources_;
  std::vector<RecordedCollective> collectives_;
  std::vector<bool> waited_;
  std::vector<RecordedOp> ops_;
};

class RecordingCommunicator final : public Communicator {
 public:
  // A world of `size` ranks simulating rank 0. split_sizes: the size of the group each
  // split() forms, in call order (the recording cannot ask the other ranks for their
  // colors; the caller knows its mesh). scratch_on: where the world's reduction
  // scratch is counted.
  RecordingCommunicator(int size, StepRecording& recording, std::vector<int> split_sizes,
                        Backend& scratch_on, CommOptions options = {});
  ~RecordingCommunicator() override;

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  [[noreturn]] void abort_job(const std::string& message) override;

 protected:
  Work start_all_reduce(float* data, size_t count, ReduceOp op, const Collective& c) override;
  Work start_reduce_scatter(const float* send, float* recv, size_t recv_count, ReduceOp op,
                            WireType wire, const Collective& c) override;
  Work start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                        const Collective& c) override;
  Work start_broadcast(void* data, size_t bytes, int root, const Collective& c) override;
  Work start_barrier(const Collective& c) override;
  Work start_all_to_all(ConstTypedPtr send, TypedPtr recv, const AllToAllCounts& counts,
                        const Collective& c) override;
  Work start_point_to_point(const PointToPoint& p, const Collective& c) override;

 private:
  RecordingCommunicator(int rank, int size, std::string name, StepRecording& recording,
                        std::shared_ptr<std::vector<int>> split_sizes, CommOptions options);
  Work record(const Collective& c, size_t element_bytes);
  StepRecording& recording_;
  std::shared_ptr<std::vector<int>> split_sizes_;  // shared with the splits, consumed in order
  std::shared_ptr<const WaitPolicy> policy_;
  TrackedBuffer scratch_;
};

}  // namespace shardlm
