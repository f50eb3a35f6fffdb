// A stand-in for <cuda_runtime.h> that lets shardlm's .cu kernels compile as plain C++
// and run on the host (SHARDLM_CUDA_EMULATION; see backend/cuda/kernel_launch.hpp).
//
// A block runs as blockDim.x fibers (ucontext) on the calling thread, a block at a
// time: every synchronisation point (__syncthreads, and each half of a
// __shfl_xor_sync: write the lane's slot, then read the partner's) hands control back
// to a scheduler that resumes every fiber of the block in turn until its next one.
// So a round of the scheduler is one barrier phase of the whole block, and the run is
// deterministic. The scheduler checks that all threads of the block reach the same
// sequence of synchronisation points and abort()s with a message otherwise (on a GPU
// that kernel would hang or read stale values). __shared__ is a static (blocks run one
// at a time). It checks index arithmetic, masking, tiling and the barrier structure;
// it says nothing about speed, and cannot show races the barriers would not expose.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

using cudaStream_t = struct CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace shardlm_emulation {

// The synchronisation points a fiber can stop at; a round needs every live fiber at
// the same one (same kind, same count).
enum class Sync { none, block_barrier, shuffle_write, shuffle_read, finished };

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  uint3 thread_index;
  Sync at = Sync::none;
  long syncs = 0;  // synchronisation points reached so far
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  std::vector<float> shuffle_slots;  // one per thread
  std::function<void()> body;
  uint3 block_index;
  unsigned current = 0;
};

inline Block* block = nullptr;
inline dim3 grid_dim, block_dim;

inline Fiber& current_fiber() { return block->fibers[block->current]; }

// Stops the current fiber at a synchronisation point until the scheduler resumes it.
inline void stop_at(Sync kind) {
  Fiber& fiber = current_fiber();
  fiber.at = kind;
  ++fiber.syncs;
  swapcontext(&fiber.context, &block->scheduler);
}

inline void fiber_entry() {
  block->body();
  stop_at(Sync::finished);  // never resumed
}

// Creates the block's fibers (stack_bytes each, their stacks reused from launch to
// launch) at the start of body().
inline void start_fibers(Block& state, size_t stack_bytes) {
  static std::vector<std::unique_ptr<char[]>> stacks;  // uninitialised, kept for later launches
  while (stacks.size() < state.fibers.size()) stacks.push_back(std::make_unique<char[]>(stack_bytes));
  for (size_t t = 0; t < state.fibers.size(); ++t) {
    Fiber& fiber = state.fibers[t];
    fiber.thread_index = {static_cast<unsigned>(t), 0, 0};
    fiber.at = Sync::none;
    fiber.syncs = 0;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = stacks[t].get();
    fiber.context.uc_stack.ss_size = stack_bytes;
    fiber.context.uc_link = nullptr;
    makecontext(&fiber.context, fiber_entry, 0);
  }
}

// Rounds: resumes every fiber up to its next synchronisation point, then checks that
// they all stopped at the same one; returns when they have all finished.
inline void run_block(Block& state) {
  for (;;) {
    for (size_t t = 0; t < state.fibers.size(); ++t) {
      state.current = static_cast<unsigned>(t);
      swapcontext(&state.scheduler, &state.fibers[t].context);
    }
    const Fiber& first = state.fibers[0];
    for (const Fiber& fiber : state.fibers)
      if (fiber.at != first.at || fiber.syncs != first.syncs) {
        std::fprintf(stderr,
                     "emulation: block (%u, %u, %u): thread %u stopped at sync point %ld "
                     "(kind %d) but thread 0 at %ld (kind %d): the threads do not reach the "
                     "same barriers and shuffles\n",
                     state.block_index.x, state.block_index.y, state.block_index.z,
                     fiber.thread_index.x, fiber.syncs, static_cast<int>(fiber.at), first.syncs,
                     static_cast<int>(first.at));
        std::abort();
      }
    if (first.at == Sync::finished) return;
  }
}

// Runs body() as every thread of every block of the grid (1-D blocks of whole warps).
inline void launch(dim3 grid, dim3 block_shape, std::function<void()> body) {
  const unsigned threads = block_shape.x;
  if (threads == 0 || threads % 32 != 0 || block_shape.y != 1 || block_shape.z != 1) {
    std::fprintf(stderr, "emulation: blocks must be 1-D whole warps\n");
    std::abort();
  }
  grid_dim = grid;
  block_dim = block_shape;
  Block state;
  state.fibers.resize(threads);
  state.shuffle_slots.assign(threads, 0.0f);
  state.body = std::move(body);
  block = &state;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        state.block_index = {x, y, z};
        start_fibers(state, 256 * 1024);
        run_block(state);
      }
  block = nullptr;
}

}  // namespace shardlm_emulation

#define threadIdx (::shardlm_emulation::current_fiber().thread_index)
#define blockIdx (::shardlm_emulation::block->block_index)
#define blockDim (::shardlm_emulation::block_dim)
#define gridDim (::shardlm_emulation::grid_dim)

inline void __syncthreads() { ::shardlm_emulation::stop_at(::shardlm_emulation::Sync::block_barrier); }

// Every lane of the warp must call it (the kernels use the full mask).
inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  using namespace ::shardlm_emulation;
  const unsigned t = threadIdx.x;
  block->shuffle_slots[t] = value;
  stop_at(Sync::shuffle_write);
  const unsigned partner = (t & ~31u) | ((t % 32) ^ static_cast<unsigned>(lane_mask));
  const float result = block->shuffle_slots[partner];
  stop_at(Sync::shuffle_read);  // nobody overwrites a slot before its reader is done
  return result;
}

inline float __uint_as_float(uint32_t bits) { return std::bit_cast<float>(bits); }
inline uint32_t __float_as_uint(float value) { return std::bit_cast<uint32_t>(value); }
using std::max;
using std::min;
