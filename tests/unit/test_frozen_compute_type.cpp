// A LoRA run's frozen base in a bf16/fp16 run is stored once, in the compute type (2
// bytes per value, as PEFT holds it), on every strategy: whole units for ddp, zero1 and
// zero2, owned slices for zero3 and hybrid. Checked on 2 in-process ranks (4 for
// hybrid) against references written here: the values the model reads are the fp32
// init rounded to nearest even (a bf16 rounding written from its definition, fp16 by
// the compiler's IEEE conversion), the tracker's frozen bytes are 2 per value (the
// plan's arithmetic, to the byte), trainable adapters keep their fp32 masters, fp32
// runs keep fp32, and a checkpoint holds the stored values widened to fp32, which load
// back bitwise into any strategy and world size (and into an fp32 run as those values).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace fs = std::filesystem;
using namespace shardlm;

namespace {

constexpr uint64_t kSeed = 4321;

ModelConfig lora_config(BaseQuant quant = BaseQuant::none) {
  ModelConfig c = model_preset("qwen3-tiny");
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "v_proj"};
  c.quantize_base = quant;
  c.validate();
  return c;
}

// x rounded to the nearest bf16 (ties to the even one), from the definition: the two
// bf16 values around x are its upper 16 bits truncated and one bf16 step further.
float naive_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const float below = std::bit_cast<float>(bits & 0xffff0000u);
  const float above = std::bit_cast<float>((bits & 0xffff0000u) + 0x10000u);
  const double d_below = std::fabs(static_cast<double>(x) - below);
  const double d_above = std::fabs(static_cast<double>(above) - x);
  if (d_below != d_above) return d_below < d_above ? below : above;
  return ((bits >> 16) & 1u) == 0 ? below : above;
}

float naive_round(DType type, float x) {
  if (type == DType::bf16) return naive_bf16(x);
  if (type == DType::fp16) return static_cast<float>(static_cast<_Float16>(x));
  return x;
}

float read_value(ConstTypedPtr p, int64_t i) {
  switch (p.dtype) {
    case DType::bf16:
      return std::bit_cast<float>(static_cast<uint32_t>(static_cast<const uint16_t*>(p.data)[i]) << 16);
    case DType::fp16:
      return static_cast<float>(std::bit_cast<_Float16>(static_cast<const uint16_t*>(p.data)[i]));
    case DType::fp32: break;
  }
  return static_cast<const float*>(p.data)[i];
}

struct Case {
  StrategyKind kind;
  int ranks;
  int shard_group = 0;
};

const Case kCases[] = {{StrategyKind::ddp, 2},   {StrategyKind::zero1, 2}, {StrategyKind::zero2, 2},
                       {StrategyKind::zero3, 2}, {StrategyKind::hybrid, 4, 2}};

// Every rank initialises its owned slices, the strategy makes them consistent, and each
// frozen unit the model reads is checked against the rounded fp32 init.
TEST(FrozenComputeType, StoredOnceInTheComputeTypeOnEveryStrategy) {
  for (BaseQuant quant : {BaseQuant::none, BaseQuant::nf4}) {
    const ModelConfig config = lora_config(quant);
    const ModelFamily& family = model_family(config.family);
    const auto needs = family.unit_needs(config);
    for (const Case& c : kCases) {
      for (DType type : {DType::fp32, DType::bf16, DType::fp16}) {
        SCOPED_TRACE(fmt::format("{} {} x{}{}", to_string(c.kind), dtype_name(type), c.ranks,
                                 quant == BaseQuant::nf4 ? " nf4" : ""));
        StrategyOptions o;
        o.kind = c.kind;
        o.param_dtype = type;
        o.shard_group_size = c.shard_group;
        const int partition = partition_size(o, c.ranks);
        const ParamLayout layout = ParamLayout::build(config, partition);
        const StrategyBufferPlan plan = FlatUnitStrategy::plan_buffers(layout, needs, o);
        const bool sharded = c.kind == StrategyKind::zero3 || c.kind == StrategyKind::hybrid;
        // The expected frozen bytes, from the layout: values of non-raw frozen units at
        // 2 bytes (bf16/fp16) or 4 (fp32), raw NF4 words at 4.
        int64_t want_frozen = 0;
        for (const auto& u : layout.units) {
          if (u.trainable) continue;
          const int64_t held = sharded ? u.shard_numel(partition) : u.padded_numel;
          want_frozen += (u.raw || type == DType::fp32 ? 4 : 2) * held;
        }
        EXPECT_EQ(plan.frozen_bytes, want_frozen);
        InProcessJob job(c.ranks);
        std::mutex failures_mutex;
        std::vector<std::string> failures;
        auto fail = [&](std::string what) {
          std::lock_guard<std::mutex> lock(failures_mutex);
          if (failures.size() < 5) failures.push_back(std::move(what));
        };
        std::atomic<int64_t> compared{0};
        const auto errors = job.run([&](Communicator& world) {
          MemoryTracker tracker;
          auto model = family.make_model(config, layout, 1, 8, ModelOptions{type}, tracker);
          FlatUnitStrategy strategy(layout, needs, world, o, tracker);
          if (tracker.peak(MemCategory::frozen) != static_cast<size_t>(want_frozen))
            fail(fmt::format("rank {}: tracker frozen {} bytes, want {}", world.rank(),
                             tracker.peak(MemCategory::frozen), want_frozen));
          for (int u = 0; u < layout.num_units(); ++u) {
            const UnitLayout& unit = layout.units[static_cast<size_t>(u)];
            const OwnedSlice s = strategy.owned(u);
            const bool compact = !unit.trainable && !unit.raw && type != DType::fp32;
            if ((s.master == nullptr) != compact || (compact && s.stored.dtype != type))
              fail(fmt::format("unit {}: master {}, frozen storage {}", unit.name,
                               s.master != nullptr, s.stored.data != nullptr));
            init_owned_params(*model, u, kSeed, s);
          }
          strategy.after_load();
          for (int m = 0; m < layout.num_model_units(); ++m) {
            strategy.before_forward(m, /*training=*/false);
            const auto params = strategy.params();
            for (int v : needs[static_cast<size_t>(m)]) {
              const auto& place = layout.model_units[static_cast<size_t>(v)];
              const UnitLayout& unit = layout.units[static_cast<size_t>(place.unit)];
              if (unit.trainable || unit.raw) continue;
              const ConstTypedPtr p = params[static_cast<size_t>(v)];
              if (p.dtype != type) fail(fmt::format("unit {} handed as {}", unit.name, dtype_name(p.dtype)));
              std::vector<float> init(static_cast<size_t>(unit.padded_numel));
              init_param_range(unit, kSeed, 0, unit.padded_numel, init.data());
              // The model unit's part of the flat unit: from its base to the unit's end.
              compared += unit.padded_numel - place.base;
              for (int64_t i = place.base; i < unit.padded_numel; ++i)
                if (std::bit_cast<uint32_t>(read_value(p, i - place.base)) !=
                    std::bit_cast<uint32_t>(naive_round(type, init[static_cast<size_t>(i)]))) {
                  fail(fmt::format("unit {} element {}: {} read, init {}", unit.name, i,
                                   read_value(p, i - place.base), init[static_cast<size_t>(i)]));
                  break;
                }
            }
            strategy.after_forward(m);
          }
        });
        for (const auto& e : errors) EXPECT_EQ(e, "");
        EXPECT_GT(compared.load(), 0) << "no frozen value was checked";
        for (const auto& f : failures) ADD_FAILURE() << f;
      }
    }
  }
}

class FrozenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm-frozen-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// bf16 zero3 saves; ddp bf16 and ddp fp32 load. The checkpoint's frozen values are the
// bf16 values the run held (widened exactly), so the bf16 load gives the same bits and
// the fp32 load those values; the adapters' fp32 masters are untouched by either.
TEST_F(FrozenCheckpoint, HoldsTheStoredValuesAndLoadsIntoAnyStrategy) {
  const ModelConfig config = lora_config();
  const ModelFamily& family = model_family(config.family);
  const auto needs = family.unit_needs(config);
  const ParamLayout layout = ParamLayout::build(config, 1);
  SingleProcessCommunicator comm;
  auto strategy_of = [&](StrategyKind kind, DType type) {
    StrategyOptions o;
    o.kind = kind;
    o.param_dtype = type;
    return std::make_unique<FlatUnitStrategy>(layout, needs, comm, o);
  };
  auto model = family.make_model(config, layout, 1, 8, ModelOptions{DType::bf16}, MemoryTracker::global());
  auto saver = strategy_of(StrategyKind::zero3, DType::bf16);
  for (int u = 0; u < layout.num_units(); ++u) init_owned_params(*model, u, kSeed, saver->owned(u));
  saver->after_load();
  CheckpointInfo info{0, 0, config, "byte", "zero3", 1, {{"options", nlohmann::json::object()}}};
  const CheckpointReader reader(save_checkpoint(dir_.string(), layout, *saver, info, 0, comm));
  for (DType type : {DType::bf16, DType::fp32}) {
    SCOPED_TRACE(dtype_name(type));
    auto loaded = strategy_of(StrategyKind::ddp, type);
    reader.load_into(layout, *loaded);
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitLayout& unit = layout.units[static_cast<size_t>(u)];
      std::vector<float> init(static_cast<size_t>(unit.padded_numel));
      init_param_range(unit, kSeed, 0, unit.padded_numel, init.data());
      std::vector<float> got(init.size());
      read_owned_params(loaded->owned(u), 0, unit.padded_numel, got.data());
      for (size_t i = 0; i < init.size(); ++i) {
        const float want = unit.trainable ? init[i] : naive_bf16(init[i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
            << unit.name << " element " << i;
      }
    }
  }
}

}  // namespace
