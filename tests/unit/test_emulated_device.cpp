// The model's device path, checked without a GPU: every family runs a training
// micro-batch with its parameters, gradients and arrays on the emulated device
// (backend/emulated: the CPU kernels on memory the host cannot dereference) and must
// give bitwise the CPU backend's loss, gradients and logits. A host read or write of
// device memory anywhere on that path would fault; host memory handed to a device
// kernel is an error naming the kernel. The arena and scratch are counted by the
// device's memory tracker, not the host's.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/backend/emulated/emulated_backend.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/memory_tracker.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/model.hpp"
#include "tiny_family_config.hpp"

namespace shardlm {
namespace {

constexpr Device kEmulated{DeviceKind::emulated, 0};

// One fp32 buffer per flat unit on a backend's device, filled from host values.
struct UnitBuffers {
  std::vector<TrackedBuffer> buffers;
  std::vector<float*> model_ptrs;  // per model unit
  UnitBuffers(Backend& backend, const ParamLayout& layout,
              const std::vector<std::vector<float>>& host) {
    for (const auto& values : host) {
      buffers.push_back(allocate_on(backend, MemCategory::params, values.size() * sizeof(float)));
      backend.copy_from_host(buffers.back().data(), values.data(), values.size() * sizeof(float));
    }
    for (const auto& place : layout.model_units)
      model_ptrs.push_back(buffers[static_cast<size_t>(place.unit)].as<float>() + place.base);
  }
  std::vector<std::vector<float>> to_host(Backend& backend) const {
    std::vector<std::vector<float>> out;
    for (const auto& b : buffers) {
      out.emplace_back(b.bytes() / sizeof(float));
      backend.copy_to_host(out.back().data(), b.data(), b.bytes());
    }
    return out;
  }
};

struct Result {
  double loss = 0.0;
  int64_t targets = 0;
  std::vector<std::vector<float>> grads;
  std::vector<float> logits;  // after a second, loss-free forward
};

struct Batch {
  std::vector<int32_t> tokens, targets, positions, key_begin;
  int B = 2, T = 12;
  MicroBatch micro_batch(bool packed) const {
    return {tokens.data(), targets.data(), B, T, packed ? positions.data() : nullptr,
            packed ? key_begin.data() : nullptr};
  }
};

Batch random_batch(int vocab) {
  Batch b;
  Rng rng(3);
  for (int i = 0; i < b.B * b.T; ++i) {
    const int t = i % b.T;
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(t % 5 == 0 ? -1 : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    // Two documents per row: [0, 5) and [5, T).
    b.positions.push_back(t < 5 ? t : t - 5);
    b.key_begin.push_back(t < 5 ? 0 : 5);
  }
  return b;
}

Result run_on(Device device, const ModelConfig& config, DType precision, bool packed) {
  const ParamLayout layout = ParamLayout::build(config, 1);
  const Batch batch = random_batch(config.vocab_size);
  ModelOptions options;
  options.precision = precision;
  options.device = device;
  auto model = model_family(config.family).make_model(config, layout, batch.B, batch.T, options,
                                                      MemoryTracker::global());
  std::vector<std::vector<float>> params, zeros;
  for (int u = 0; u < layout.num_units(); ++u) {
    params.emplace_back(layout.units[static_cast<size_t>(u)].padded_numel, 0.0f);
    model->init_unit(u, 7, params.back().data());
    Rng rng(100 + static_cast<uint64_t>(u));
    for (float& p : params.back()) p += 0.02f * (static_cast<float>(rng.uniform()) - 0.5f);
    zeros.emplace_back(params.back().size(), 0.0f);
  }
  Backend& backend = backend_for(device);
  UnitBuffers p(backend, layout, params), g(backend, layout, zeros);
  const MicroBatch mb = batch.micro_batch(packed);
  for (int u = 0; u < model->num_units(); ++u)
    model->forward_unit(u, p.model_ptrs, g.model_ptrs, mb, true, 1.0f / 17);
  for (int u = model->num_units() - 1; u >= 0; --u)
    model->backward_unit(u, p.model_ptrs, g.model_ptrs, mb);
  Result r;
  r.loss = model->last_loss_sum();
  r.targets = model->last_target_count();
  r.grads = g.to_host(backend);
  MicroBatch sampling = mb;
  sampling.targets = nullptr;
  for (int u = 0; u < model->num_units(); ++u)
    model->forward_unit(u, p.model_ptrs, {}, sampling, false, 1.0f);
  r.logits.resize(static_cast<size_t>(batch.B) * config.vocab_size);
  model->logits_at(p.model_ptrs, batch.T - 1, r.logits.data());
  return r;
}

struct Case {
  std::string preset;
  DType precision;
  bool packed;
};

class EmulatedDevice : public ::testing::TestWithParam<Case> {};

TEST_P(EmulatedDevice, TrainingMicroBatchIsBitwiseTheCpuBackends) {
  const Case c = GetParam();
  const ModelConfig config = tiny_family_config(c.preset);
  const Result want = run_on(Device{}, config, c.precision, c.packed);
  const Result got = run_on(kEmulated, config, c.precision, c.packed);
  EXPECT_GT(want.targets, 0);
  EXPECT_EQ(got.targets, want.targets);
  EXPECT_EQ(got.loss, want.loss);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  bool any_nonzero = false;
  for (size_t u = 0; u < want.grads.size(); ++u) {
    ASSERT_EQ(got.grads[u].size(), want.grads[u].size());
    EXPECT_EQ(std::memcmp(got.grads[u].data(), want.grads[u].data(),
                          want.grads[u].size() * sizeof(float)),
              0)
        << "flat unit " << u;
    for (float v : want.grads[u]) any_nonzero |= v != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  EXPECT_EQ(got.logits, want.logits);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny", "qwen3-moe-tiny",
                             "qwen2-moe-tiny", "mixtral-tiny"})
    for (DType precision : {DType::fp32, DType::bf16})
      for (bool packed : {false, true}) out.push_back({preset, precision, packed});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, EmulatedDevice, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string name = info.param.preset + "_" +
                                              std::string(dtype_name(info.param.precision)) +
                                              (info.param.packed ? "_packed" : "_rows");
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(EmulatedDeviceMemory, ModelArraysAreCountedOnTheDeviceNotTheHost) {
  const ModelConfig config = tiny_family_config("llama-tiny");
  const ParamLayout layout = ParamLayout::build(config, 1);
  MemoryTracker& device = MemoryTracker::for_device(kEmulated);
  const size_t device_before = device.current(MemCategory::activations);
  const size_t host_before = MemoryTracker::global().current(MemCategory::activations);
  ModelOptions options;
  options.device = kEmulated;
  {
    auto model = model_family(config.family).make_model(config, layout, 2, 8, options,
                                                        MemoryTracker::global());
    const ModelMemoryPlan plan = model_family(config.family).plan_memory(config, 2, 8, options, false);
    EXPECT_EQ(device.current(MemCategory::activations) - device_before,
              static_cast<size_t>(plan.activations));
    EXPECT_EQ(MemoryTracker::global().current(MemCategory::activations), host_before);
  }
  EXPECT_EQ(device.current(MemCategory::activations), device_before);
}

TEST(EmulatedDeviceMemory, HostMemoryHandedToADeviceKernelIsAnError) {
  Backend& backend = backend_for(kEmulated);
  std::vector<float> host(16, 1.0f);
  TrackedBuffer on_device = allocate_on(backend, MemCategory::other, 16 * sizeof(float));
  EXPECT_TRUE(emulated::is_device_pointer(on_device.data()));
  try {
    backend.convert(on_device.as<float>(), host.data(), 16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("convert was handed host memory"), std::string::npos)
        << e.what();
  }
  // Device memory round-trips through the copies.
  backend.copy_from_host(on_device.data(), host.data(), 16 * sizeof(float));
  std::vector<float> back(16, 0.0f);
  backend.copy_to_host(back.data(), on_device.data(), 16 * sizeof(float));
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace shardlm
