// The per-unit pieces of FlatUnitStrategy on their own: BufferPool's lending, what a
// FlatUnit allocates and hands the optimizer under each strategy's plan, and one
// unit's gather and reduce-scatter on 2 in-process ranks. The strategy's schedule over
// them is tested in test_flat_unit_strategy.cpp.
#include <gtest/gtest.h>

#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace shardlm {
namespace {

ModelConfig tiny_config() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 2;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  return c;
}

StrategyOptions options(StrategyKind kind, DType param_dtype = DType::fp32) {
  StrategyOptions o;
  o.kind = kind;
  o.param_dtype = param_dtype;
  return o;
}

TEST(BufferPool, LendsTheLastReleasedBufferFirstAndCountsItsBytesOnce) {
  MemoryTracker tracker;
  BufferPool pool(2, MemCategory::grads, 256, tracker);
  EXPECT_EQ(tracker.current(MemCategory::grads), 512u);
  const int a = pool.acquire();
  const int b = pool.acquire();
  EXPECT_NE(a, b);
  EXPECT_NE(pool.data(a), pool.data(b));
  EXPECT_FALSE(pool.has_free());
  pool.release(a);
  EXPECT_TRUE(pool.has_free());
  EXPECT_EQ(pool.acquire(), a);
  EXPECT_EQ(tracker.current(MemCategory::grads), 512u);  // lending allocates nothing
}

// Every flat unit plus the two pools allocate exactly what plan_buffers counts.
TEST(FlatUnit, UnitsAndPoolsAllocateWhatThePlanCounts) {
  const ModelConfig config = tiny_config();
  const auto needs = model_family("gpt2").unit_needs(config);
  const ParamLayout layout = ParamLayout::build(config, 2);
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                            StrategyKind::zero3}) {
    for (DType dtype : {DType::fp32, DType::bf16}) {
      const StrategyBufferPlan plan =
          FlatUnitStrategy::plan_buffers(layout, needs, options(kind, dtype));
      MemoryTracker tracker;
      std::vector<FlatUnit> units;
      units.reserve(static_cast<size_t>(layout.num_units()));
      for (int u = 0; u < layout.num_units(); ++u)
        units.emplace_back(layout, u, plan, /*shard_rank=*/1, tracker, cpu_backend());
      const BufferPool gather(plan.param_pool, MemCategory::params,
                              static_cast<size_t>(plan.gather_buffer_bytes), tracker);
      const BufferPool grads(plan.grad_pool, MemCategory::grads,
                             static_cast<size_t>(plan.largest_trainable_private_unit) * 4, tracker);
      const std::string what = to_string(kind) + " " + std::string(dtype_name(dtype));
      EXPECT_EQ(tracker.current(MemCategory::params), static_cast<size_t>(plan.params_bytes))
          << what;
      EXPECT_EQ(tracker.current(MemCategory::grads), static_cast<size_t>(plan.grads_bytes)) << what;
      EXPECT_EQ(tracker.current(MemCategory::optimizer), static_cast<size_t>(plan.optimizer_bytes))
          << what;
    }
  }
}

// --offload optimizer: the units and pools allocate what the plan counts on the device
// (parameters in the compute type, no master, no persistent gradient, no AdamW state),
// and a HostOwnedState over them what it counts on the host, category by category.
TEST(FlatUnit, OffloadedUnitsAndTheirHostStateAllocateWhatThePlanCounts) {
  const ModelConfig config = tiny_config();
  const auto needs = model_family("gpt2").unit_needs(config);
  const ParamLayout layout = ParamLayout::build(config, 2);
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                            StrategyKind::zero3}) {
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      StrategyOptions o = options(kind, dtype);
      o.optimizer_on_host = true;
      const StrategyBufferPlan plan = FlatUnitStrategy::plan_buffers(layout, needs, o);
      const std::string what = to_string(kind) + " " + std::string(dtype_name(dtype));
      MemoryTracker device;
      std::vector<FlatUnit> units;
      units.reserve(static_cast<size_t>(layout.num_units()));
      for (int u = 0; u < layout.num_units(); ++u)
        units.emplace_back(layout, u, plan, /*shard_rank=*/1, device, cpu_backend());
      const BufferPool gather(plan.param_pool, MemCategory::params,
                              static_cast<size_t>(plan.gather_buffer_bytes), device);
      const BufferPool grads(plan.grad_pool, MemCategory::grads,
                             static_cast<size_t>(plan.largest_trainable_private_unit) * 4, device);
      EXPECT_EQ(device.current(MemCategory::params), static_cast<size_t>(plan.params_bytes)) << what;
      EXPECT_EQ(device.current(MemCategory::grads), static_cast<size_t>(plan.grads_bytes)) << what;
      EXPECT_EQ(device.current(MemCategory::optimizer), 0u) << what;
      EXPECT_EQ(plan.optimizer_bytes, 0) << what;
      // Every trainable unit is stored as the model reads it, in the compute type.
      for (int u = 0; u < layout.num_units(); ++u) {
        const OwnedSlice s = units[static_cast<size_t>(u)].owned();
        EXPECT_EQ(s.master, nullptr) << what;
        EXPECT_EQ(s.grad, nullptr) << what;
        EXPECT_EQ(s.stored.dtype, dtype) << what;
      }
    }
  }
}

// The optimizer's view: ddp updates whole units (and, in bf16, their compute copy);
// the others the rank's slice, with the gradient where each strategy reduces it to.
TEST(FlatUnit, OwnedSliceFollowsWhatTheStrategyShards) {
  const ModelConfig config = tiny_config();
  const auto needs = model_family("gpt2").unit_needs(config);
  const ParamLayout layout = ParamLayout::build(config, 2);
  const int u = 1;  // a transformer block: private, trainable
  const int64_t P = layout.units[u].padded_numel, S = P / 2;
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                            StrategyKind::zero3}) {
    const StrategyBufferPlan plan = FlatUnitStrategy::plan_buffers(
        layout, needs, options(kind, DType::bf16));
    MemoryTracker tracker;
    FlatUnit unit(layout, u, plan, /*shard_rank=*/1, tracker, cpu_backend());
    const OwnedSlice o = unit.owned();
    const std::string what = to_string(kind);
    if (kind == StrategyKind::ddp) {
      EXPECT_EQ(o.begin, 0) << what;
      EXPECT_EQ(o.end, P) << what;
      EXPECT_EQ(o.compute_copy.dtype, DType::bf16) << what;
      EXPECT_EQ(o.grad, unit.grads()) << what;
    } else {
      EXPECT_EQ(o.begin, S) << what;
      EXPECT_EQ(o.end, P) << what;
      EXPECT_EQ(o.compute_copy.data, nullptr) << what;
    }
    ASSERT_NE(o.master, nullptr) << what;
    ASSERT_NE(o.adam_m, nullptr) << what;
    ASSERT_NE(o.adam_v, nullptr) << what;
    if (kind == StrategyKind::zero1) {
      EXPECT_EQ(o.grad, unit.grads() + S) << what;
    }
    // Sharded gradients live in a transient buffer only between backward and reduce.
    if (kind == StrategyKind::zero2 || kind == StrategyKind::zero3) {
      EXPECT_EQ(unit.grads(), nullptr) << what;
    }
    EXPECT_EQ(unit.replicated_params() == nullptr, kind == StrategyKind::zero3) << what;
  }
}

// zero3 on 2 ranks: a unit's gather rounds each owned slice to bf16 and assembles the
// unit in a pool buffer; its reduce-scatter sums both ranks' gradients into the owned
// slice (accumulating) and gives both pool buffers back.
TEST(FlatUnit, GatherAndReduceOnTwoRanks) {
  const ModelConfig config = tiny_config();
  const auto needs = model_family("gpt2").unit_needs(config);
  const ParamLayout layout = ParamLayout::build(config, 2);
  const int u = 1;
  const int64_t P = layout.units[u].padded_numel, S = P / 2;
  const StrategyBufferPlan plan =
      FlatUnitStrategy::plan_buffers(layout, needs, options(StrategyKind::zero3, DType::bf16));
  InProcessJob job(2);
  const auto errors = job.run([&](Communicator& comm) {
    MemoryTracker tracker;
    FlatUnit unit(layout, u, plan, comm.rank(), tracker, cpu_backend());
    BufferPool gather(1, MemCategory::params, static_cast<size_t>(plan.gather_buffer_bytes),
                      tracker);
    BufferPool grads(1, MemCategory::grads, static_cast<size_t>(P) * 4, tracker);
    OwnedSlice o = unit.owned();
    // 1.0 + 2^-10 rounds to 1.0 in bf16: the gather sends the rounded value.
    for (int64_t i = 0; i < S; ++i) o.master[i] = static_cast<float>(comm.rank() + 1) + 0x1p-10f;
    unit.start_gather(gather, comm);
    EXPECT_FALSE(gather.has_free());
    unit.finish_gather();
    ASSERT_TRUE(unit.gathered());
    const ConstTypedPtr full = unit.params();
    ASSERT_EQ(full.dtype, DType::bf16);
    const auto* bits = static_cast<const uint16_t*>(full.data);
    EXPECT_EQ(bf16_to_float(bits[0]), 1.0f);
    EXPECT_EQ(bf16_to_float(bits[P - 1]), 2.0f);
    unit.release_gather(gather);
    EXPECT_TRUE(gather.has_free());
    EXPECT_EQ(unit.params().data, nullptr);

    unit.zero_reduced_grads();
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      unit.acquire_grads(grads);
      for (int64_t i = 0; i < P; ++i) unit.grads()[i] = static_cast<float>(comm.rank() + 1);
      unit.start_reduce(comm, WireType::fp32);
      EXPECT_TRUE(unit.reduce_pending());
      unit.finish_reduce(/*replica=*/nullptr, grads);
      EXPECT_FALSE(unit.reduce_pending());
      EXPECT_EQ(unit.grads(), nullptr);
      EXPECT_TRUE(grads.has_free());
    }
    for (int64_t i = 0; i < S; ++i) ASSERT_EQ(o.grad[i], 6.0f);  // (1 + 2) per micro-batch
    EXPECT_EQ(unit.reduced_grad_sum_of_squares(), 36.0 * static_cast<double>(S));
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace shardlm
