#include "shardlm/comm/recording_communicator.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shardlm/core/error.hpp"

namespace shardlm {

// ---- StepRecording ----

void StepRecording::add_compute_source(meta::MetaBackend& backend) {
  for (auto* s : sources_)
    if (s == &backend) return;
  sources_.push_back(&backend);
}

void StepRecording::flush_compute() {
  ComputeWork work;
  for (auto* s : sources_) work += s->take_work();
  if (!work.empty()) ops_.push_back({RecordedOp::Kind::compute, work, -1, "kernels"});
}

void StepRecording::drop_kernels() {
  for (auto* s : sources_) s->take_work();
}

size_t StepRecording::begin_span() {
  flush_compute();
  return ops_.size();
}

namespace {

// ComputeWork's counts, one at a time.
constexpr double ComputeWork::* kWorkCounts[] = {
    &ComputeWork::gemm_flops,  &ComputeWork::attention_flops, &ComputeWork::elementwise_bytes,
    &ComputeWork::loss_bytes,  &ComputeWork::state_bytes,     &ComputeWork::optimizer_bytes};

}  // namespace

void StepRecording::end_span(size_t span, const ComputeWork& work, const std::string& label) {
  SHARDLM_ASSERT(span <= ops_.size());
  flush_compute();
  // The span's segments: its compute ops (the kernels' work between its events), and
  // one after its last event for the counts no kernel recorded.
  if (ops_.size() == span || ops_.back().kind != RecordedOp::Kind::compute)
    ops_.push_back({RecordedOp::Kind::compute, {}, -1, label});
  std::vector<size_t> segments;
  for (size_t i = span; i < ops_.size(); ++i)
    if (ops_[i].kind == RecordedOp::Kind::compute) segments.push_back(i);
  std::vector<ComputeWork> placed(segments.size());
  for (double ComputeWork::*count : kWorkCounts) {
    double recorded = 0;
    for (size_t i : segments) recorded += ops_[i].work.*count;
    if (recorded <= 0) {
      placed.back().*count = work.*count;
      continue;
    }
    // The last segment the kernels counted in takes the remainder, so the span's total
    // is work's.
    double given = 0;
    size_t last = 0;
    for (size_t k = 0; k < segments.size(); ++k)
      if (ops_[segments[k]].work.*count > 0) last = k;
    for (size_t k = 0; k < last; ++k) {
      placed[k].*count = work.*count * (ops_[segments[k]].work.*count / recorded);
      given += placed[k].*count;
    }
    placed[last].*count = work.*count - given;
  }
  // Segments left with nothing are no ops at all.
  std::vector<RecordedOp> tail;
  for (size_t i = span, k = 0; i < ops_.size(); ++i) {
    if (ops_[i].kind != RecordedOp::Kind::compute) {
      tail.push_back(std::move(ops_[i]));
      continue;
    }
    if (!placed[k].empty()) tail.push_back({RecordedOp::Kind::compute, placed[k], -1, label});
    ++k;
  }
  ops_.resize(span);
  for (RecordedOp& op : tail) ops_.push_back(std::move(op));
}

int StepRecording::issue(RecordedCollective collective) {
  flush_compute();
  collectives_.push_back(std::move(collective));
  waited_.push_back(false);
  const int id = static_cast<int>(collectives_.size()) - 1;
  ops_.push_back({RecordedOp::Kind::issue, {}, id, {}});
  return id;
}

void StepRecording::wait(int id) {
  SHARDLM_ASSERT(id >= 0 && static_cast<size_t>(id) < collectives_.size());
  if (waited_[static_cast<size_t>(id)]) return;
  flush_compute();
  waited_[static_cast<size_t>(id)] = true;
  ops_.push_back({RecordedOp::Kind::wait, {}, id, {}});
}

void StepRecording::end_step() {
  flush_compute();
  ops_.push_back({RecordedOp::Kind::step_end, {}, -1, {}});
}

void StepRecording::clear() {
  drop_kernels();
  ops_.clear();
  // Collectives stay numbered (Works issued before may still be waited for); a wait
  // for one of them after clear() is recorded against its old index, which the
  // program's issue ops do not name: mark them waited so none is.
  waited_.assign(waited_.size(), true);
}

// ---- RecordingCommunicator ----

namespace {

// Completion decided by the recording: done at the first poll, which is the caller's
// first wait (or is_done()), recorded as the moment the rank waited.
class RecordedCompletion final : public CompletionSource {
 public:
  RecordedCompletion(StepRecording& recording, int id) : recording_(recording), id_(id) {}
  CompletionPoll poll() override {
    recording_.wait(id_);
    return {CompletionStatus::done, {}, 0.0};
  }

 private:
  StepRecording& recording_;
  const int id_;
};

}  // namespace

RecordingCommunicator::RecordingCommunicator(int size, StepRecording& recording,
                                             std::vector<int> split_sizes, Backend& scratch_on,
                                             CommOptions options)
    : RecordingCommunicator(0, size, "world", recording,
                            std::make_shared<std::vector<int>>(std::move(split_sizes)), options) {
  if (size > 1) scratch_ = allocate_on(scratch_on, MemCategory::comm, options.scratch_bytes);
}

RecordingCommunicator::RecordingCommunicator(int rank, int size, std::string name,
                                             StepRecording& recording,
                                             std::shared_ptr<std::vector<int>> split_sizes,
                                             CommOptions options)
    : Communicator(rank, size, std::move(name), options),
      recording_(recording),
      split_sizes_(std::move(split_sizes)) {
  WaitPolicy policy;
  policy.who = "rank 0";
  policy.timeout_seconds = options.timeout_seconds;
  policy_ = std::make_shared<const WaitPolicy>(std::move(policy));
}

RecordingCommunicator::~RecordingCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

std::unique_ptr<Communicator> RecordingCommunicator::split(int color, int key, std::string name) {
  SHARDLM_CHECK(color >= 0, "split '{}': color must be >= 0, got {}", name, color);
  (void)key;
  SHARDLM_CHECK(!split_sizes_->empty(),
                "internal: recording communicator split '{}' without a planned group size", name);
  const int group_size = split_sizes_->front();
  split_sizes_->erase(split_sizes_->begin());
  SHARDLM_CHECK(group_size >= 1 && size() % group_size == 0,
                "internal: split '{}' of {} ranks into groups of {}", name, size(), group_size);
  return std::unique_ptr<Communicator>(new RecordingCommunicator(
      0, group_size, std::move(name), recording_, split_sizes_, options()));
}

void RecordingCommunicator::abort_job(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "rank 0: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

Work RecordingCommunicator::record(const Collective& c, size_t element_bytes) {
  RecordedCollective r;
  r.kind = c.info.kind;
  r.group = name();
  r.group_size = size();
  r.bytes = c.bytes;
  r.bus_bytes = bus_bytes_for(c.info.kind, c.bytes, size());
  r.element_bytes = element_bytes;
  r.label = c.info.label;
  const int id = recording_.issue(std::move(r));
  auto state = std::make_shared<detail::WorkState>(
      c.info, counter_block(), policy_, std::make_shared<RecordedCompletion>(recording_, id),
      std::chrono::steady_clock::now());
  return Work(state);
}

Work RecordingCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                             const Collective& c) {
  if (op == ReduceOp::sum && !meta::is_meta_address(data))
    for (size_t i = 0; i < count; ++i) data[i] *= static_cast<float>(size());
  return record(c, sizeof(float));
}

Work RecordingCommunicator::start_reduce_scatter(const float*, float*, size_t, ReduceOp,
                                                 WireType wire, const Collective& c) {
  return record(c, wire_bytes(wire));
}

Work RecordingCommunicator::start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                             const Collective& c) {
  if (!meta::is_meta_address(recv) && bytes_per_rank > 0) {
    auto* blocks = static_cast<char*>(recv);
    std::memmove(blocks, send, bytes_per_rank);  // send may be block 0 itself (rank 0)
    for (int r = 1; r < size(); ++r)
      std::memcpy(blocks + static_cast<size_t>(r) * bytes_per_rank, blocks, bytes_per_rank);
  }
  return record(c, sizeof(float));
}

Work RecordingCommunicator::start_broadcast(void*, size_t, int, const Collective& c) {
  return record(c, 1);
}

Work RecordingCommunicator::start_barrier(const Collective& c) { return record(c, 1); }

Work RecordingCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr, const AllToAllCounts&,
                                             const Collective& c) {
  return record(c, dtype_bytes(send.dtype));
}

Work RecordingCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  return record(c, dtype_bytes(p.send.data != nullptr ? p.send.dtype : p.recv.dtype));
}

}  // namespace shardlm
