// GemmRecorder: while one is alive, cpu::gemm notes the shape of every call it serves,
// so a benchmark can time the GEMM library alone on exactly the calls a training step
// of any model makes (bench/step_gemm_rate). One recorder at a time; recording costs
// the model nothing when none is installed (one pointer test per GEMM).
#pragma once

#include <vector>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

struct GemmCall {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  float beta = 0.0f;
  DType a_type = DType::fp32, b_type = DType::fp32;
  bool operator==(const GemmCall&) const = default;
};

class GemmRecorder {
 public:
  GemmRecorder();
  ~GemmRecorder();
  GemmRecorder(const GemmRecorder&) = delete;
  GemmRecorder& operator=(const GemmRecorder&) = delete;
  const std::vector<GemmCall>& calls() const { return calls_; }

  // Called by cpu::gemm.
  static void note(const GemmCall& call);

 private:
  std::vector<GemmCall> calls_;
};

}  // namespace shardlm::cpu
