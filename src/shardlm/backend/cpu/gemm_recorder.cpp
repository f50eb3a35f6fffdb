#include "shardlm/backend/cpu/gemm_recorder.hpp"

#include <atomic>

#include "shardlm/core/error.hpp"

namespace shardlm::cpu {

namespace {
std::atomic<GemmRecorder*> active{nullptr};
}  // namespace

GemmRecorder::GemmRecorder() {
  GemmRecorder* expected = nullptr;
  SHARDLM_CHECK(active.compare_exchange_strong(expected, this),
                "internal: only one GemmRecorder may be installed at a time");
}

GemmRecorder::~GemmRecorder() { active.store(nullptr); }

void GemmRecorder::note(const GemmCall& call) {
  // The model calls gemm from one thread (the kernels parallelise inside it).
  if (GemmRecorder* r = active.load(std::memory_order_relaxed)) r->calls_.push_back(call);
}

}  // namespace shardlm::cpu
