// The meta device (backend/meta) and the recording communicator (comm/): what `plan`
// runs the real step on. Buffers count in the meta backend's own tracker and never in
// the host's or a device's; addresses are distinct and never readable; kernels record
// the work the step-time model rates; collectives are recorded with their bytes and
// groups and complete at once; waits and the compute between them keep their order.
#include <gtest/gtest.h>

#include "shardlm/backend/meta/meta_backend.hpp"
#include "shardlm/comm/recording_communicator.hpp"
#include "shardlm/optim/adamw.hpp"

namespace shardlm {
namespace {

TEST(MetaBackend, CountsInItsOwnTrackerAndHandsOutDisjointAddresses) {
  meta::MetaBackend meta(Device{});  // stands for the host
  EXPECT_TRUE(meta.is_meta());
  EXPECT_TRUE(meta.device().is_host());
  const size_t host_before = MemoryTracker::global().current(MemCategory::params);
  {
    // A terabyte costs nothing: there is no storage behind it.
    TrackedBuffer huge = allocate_on(meta, MemCategory::params, size_t{1} << 40);
    TrackedBuffer small = allocate_on(meta, MemCategory::grads, 100);
    EXPECT_EQ(meta.tracker().current(MemCategory::params), size_t{1} << 40);
    EXPECT_EQ(meta.tracker().current(MemCategory::grads), 100u);
    EXPECT_EQ(MemoryTracker::global().current(MemCategory::params), host_before);
    const auto a = reinterpret_cast<uintptr_t>(huge.data());
    const auto b = reinterpret_cast<uintptr_t>(small.data());
    EXPECT_TRUE(b >= a + (size_t{1} << 40) || a >= b + 100);
    EXPECT_EQ(a % 64, 0u);
    EXPECT_NE(a & (uintptr_t{1} << 60), 0u);  // never a canonical (readable) address
  }
  EXPECT_EQ(meta.tracker().current(MemCategory::params), 0u);
  EXPECT_EQ(meta.tracker().peak(MemCategory::params), size_t{1} << 40);
}

TEST(MetaBackend, KernelsRecordTheirWork) {
  meta::MetaBackend meta(Device{DeviceKind::emulated, 0});
  TrackedBuffer c = allocate_on(meta, MemCategory::activations, 4 * 6 * 7);
  meta.gemm(false, true, 6, 7, 5, 1.0f, ConstTypedPtr(), 5, ConstTypedPtr(), 5, 0.0f,
            c.as<float>(), 7);
  meta.fill_zero(c.data(), c.bytes());
  meta.adamw_update(nullptr, nullptr, nullptr, nullptr, 10, {}, 1e-3f, 1.0f, 1, AdamWConfig{},
                    TypedPtr());
  EXPECT_EQ(meta.sum_of_squares(c.as<float>(), 42), 0.0);
  const ComputeWork w = meta.take_work();
  EXPECT_EQ(w.gemm_flops, 2.0 * 6 * 7 * 5);
  EXPECT_EQ(w.optimizer_bytes, 28.0 * 10);
  EXPECT_EQ(w.state_bytes, 4.0 * 6 * 7 + 4.0 * 42);
  EXPECT_TRUE(meta.take_work().empty());
}

TEST(RecordingCommunicator, RecordsCollectivesGroupsWaitsAndTheComputeBetween) {
  meta::MetaBackend meta(Device{});
  StepRecording recording;
  recording.add_compute_source(meta);
  CommOptions options;
  options.scratch_bytes = 1000;
  RecordingCommunicator world(8, recording, {4}, meta, options);
  EXPECT_EQ(meta.tracker().current(MemCategory::comm), 1000u);  // the MPI scratch
  auto shard = world.split(0, 0, "shard group");
  EXPECT_EQ(shard->size(), 4);
  EXPECT_EQ(shard->rank(), 0);
  EXPECT_THROW(world.split(0, 0, "one more"), Error);  // no size planned for it

  TrackedBuffer grads = allocate_on(meta, MemCategory::grads, 4 * 1024);
  float* g = grads.as<float>();
  meta.fill_zero(g, grads.bytes());  // compute before the first collective
  Work reduce = shard->reduce_scatter(g, g, 256, ReduceOp::sum, "reduce grads", WireType::bf16);
  Work gather = world.all_gather(g, g, 128, "gather params");
  meta.fill_zero(g, 16);
  reduce.wait();
  reduce.wait();  // a second wait is not recorded again
  gather.wait();
  double loss = 1.5;
  world.all_reduce_blocking(std::span<double>(&loss, 1), ReduceOp::sum, "loss sum");
  EXPECT_EQ(loss, 8 * 1.5);  // a symmetric world: every rank's loss is this rank's
  recording.end_step();

  const auto& cs = recording.collectives();
  ASSERT_EQ(cs.size(), 3u);
  EXPECT_EQ(cs[0].kind, CollectiveKind::reduce_scatter);
  EXPECT_EQ(cs[0].group, "shard group");
  EXPECT_EQ(cs[0].group_size, 4);
  EXPECT_EQ(cs[0].bytes, 256u * 4 * 2);  // 4 blocks of 256 bf16 values
  EXPECT_EQ(cs[0].bus_bytes, bus_bytes_for(CollectiveKind::reduce_scatter, 256 * 4 * 2, 4));
  EXPECT_EQ(cs[0].element_bytes, 2u);
  EXPECT_EQ(cs[1].group, "world");
  EXPECT_EQ(cs[1].bytes, 128u * 4 * 8);
  EXPECT_EQ(cs[2].label, "loss sum");
  using K = RecordedOp::Kind;
  const std::vector<std::pair<K, int>> expected = {
      {K::compute, -1}, {K::issue, 0}, {K::issue, 1}, {K::compute, -1}, {K::wait, 0},
      {K::wait, 1},     {K::issue, 2}, {K::wait, 2},  {K::step_end, -1}};
  const auto& ops = recording.ops();
  ASSERT_EQ(ops.size(), expected.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(ops[i].kind, expected[i].first) << i;
    EXPECT_EQ(ops[i].collective, expected[i].second) << i;
  }
  EXPECT_EQ(ops[0].work.state_bytes, 4.0 * 1024);
  EXPECT_EQ(ops[3].work.state_bytes, 16.0);
  // The base class's counters see the same bytes.
  EXPECT_EQ(world.counters().by_kind[static_cast<size_t>(CollectiveKind::all_gather)].bus_bytes,
            bus_bytes_for(CollectiveKind::all_gather, 128 * 4 * 8, 8));
}

TEST(RecordingCommunicator, ASpansWorkReplacesItsKernelsWhereTheyRan) {
  // A tensor-parallel backward as the trace sees it: the input gradient's GEMM (6
  // FLOPs), its reduction issued, the weight gradient's GEMM (2) while it travels, the
  // wait, then a norm (elementwise only). The span's own work (80 FLOPs, 100 bytes, 7
  // loss bytes no kernel recorded) replaces the kernels': 60 | 20 FLOPs around the
  // issue, the bytes where the norm ran, the loss bytes after the last event.
  meta::MetaBackend meta(Device{});
  StepRecording recording;
  recording.add_compute_source(meta);
  RecordingCommunicator world(2, recording, {}, meta);
  TrackedBuffer x = allocate_on(meta, MemCategory::activations, 4 * 64);
  meta.fill_zero(x.data(), 8);  // before the span: its own op
  const size_t span = recording.begin_span();
  const auto gemm = [&](int k) {
    meta.gemm(false, false, 1, 1, k, 1.0f, ConstTypedPtr(), k, ConstTypedPtr(), 1, 0.0f, x.as<float>(), 1);
  };
  gemm(3);
  Work sum = world.all_reduce(x.as<float>(), 4, ReduceOp::sum, "tensor.mlp_in_grad");
  gemm(1);
  sum.wait();
  meta.add_bias(x.as<float>(), nullptr, 1, 5);  // the norm: elementwise only
  ComputeWork work;
  work.gemm_flops = 80;
  work.elementwise_bytes = 100;
  work.loss_bytes = 7;
  recording.end_span(span, work, "backward unit 1");
  using K = RecordedOp::Kind;
  const auto& ops = recording.ops();
  ASSERT_EQ(ops.size(), 6u);
  const std::vector<K> kinds = {K::compute, K::compute, K::issue, K::compute, K::wait, K::compute};
  for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(ops[i].kind, kinds[i]) << i;
  EXPECT_EQ(ops[0].work.state_bytes, 8.0);
  EXPECT_EQ(ops[0].label, "kernels");
  EXPECT_EQ(ops[1].work.gemm_flops, 60.0);
  EXPECT_EQ(ops[3].work.gemm_flops, 20.0);
  EXPECT_EQ(ops[5].work.gemm_flops, 0.0);
  EXPECT_EQ(ops[1].work.elementwise_bytes + ops[3].work.elementwise_bytes, 0.0);
  EXPECT_EQ(ops[5].work.elementwise_bytes, 100.0);
  EXPECT_EQ(ops[5].work.loss_bytes, 7.0);
  for (size_t i : {1, 3, 5}) EXPECT_EQ(ops[i].label, "backward unit 1");
}

}  // namespace
}  // namespace shardlm
