// ComputeWork: what kernels do, by the kinds the step-time model rates (plan/
// time_model.hpp, plan/unit_work.hpp): GEMM and attention FLOPs, bytes streamed by
// elementwise kernels (norms, biases, activations, rotary, embeddings,
// dequantization), by the loss's softmax, by state kernels (copies, zeroing,
// conversions, accumulation, sums) and by AdamW. The meta backend records it
// (meta_backend.hpp); plan prices it.
#pragma once

namespace shardlm {

struct ComputeWork {
  double gemm_flops = 0;
  double attention_flops = 0;
  double elementwise_bytes = 0;
  double loss_bytes = 0;
  double state_bytes = 0;
  double optimizer_bytes = 0;

  ComputeWork& operator+=(const ComputeWork& o) {
    gemm_flops += o.gemm_flops;
    attention_flops += o.attention_flops;
    elementwise_bytes += o.elementwise_bytes;
    loss_bytes += o.loss_bytes;
    state_bytes += o.state_bytes;
    optimizer_bytes += o.optimizer_bytes;
    return *this;
  }
  ComputeWork operator*(double f) const {
    return {gemm_flops * f, attention_flops * f, elementwise_bytes * f,
            loss_bytes * f, state_bytes * f,     optimizer_bytes * f};
  }
  bool empty() const {
    return gemm_flops == 0 && attention_flops == 0 && elementwise_bytes == 0 &&
           loss_bytes == 0 && state_bytes == 0 && optimizer_bytes == 0;
  }
};

}  // namespace shardlm
