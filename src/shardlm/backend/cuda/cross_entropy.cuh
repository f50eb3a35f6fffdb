// Row-wise cross-entropy over a chunk of fp32 logits on the GPU: the softmax part of
// the fused LM head + loss (cpu::lm_head_cross_entropy's row_cross_entropy), whose
// GEMMs run elsewhere (cuBLASLt).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace shardlm::cuda {

// For each row r < rows (V real columns at logits + r * stride; columns beyond V are
// never read or written): losses[r] = logsumexp(row) - row[targets[r]], and with
// want_grad the row is OVERWRITTEN with grad_scale * (softmax(row) - onehot(target)).
// A negative target is ignored: loss 0 and, with want_grad, a zero row. A target >= V
// is a caller bug the device cannot report: its loss is NaN (so the run notices) and
// its gradient row zero; nothing outside the row is read. One block per row, fp32,
// max-subtracted, deterministic (a fixed reduction order). All pointers on the device.
void cross_entropy_rows(cudaStream_t stream, float* logits, int64_t stride,
                        const int32_t* targets, int64_t rows, int V, float grad_scale,
                        float* losses, bool want_grad);

}  // namespace shardlm::cuda
