#include "shardlm/plan/unit_work.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

namespace {

bool is_matrix(const ParamInfo& p) { return p.shape.size() == 2; }

// The model unit that multiplies model unit v's matrices: the last one reading it.
std::vector<size_t> matrix_owners(const std::vector<std::vector<int>>& unit_needs) {
  std::vector<size_t> owner(unit_needs.size());
  for (size_t v = 0; v < owner.size(); ++v) owner[v] = v;
  for (size_t m = 0; m < unit_needs.size(); ++m)
    for (int v : unit_needs[m]) owner[static_cast<size_t>(v)] = std::max(owner[static_cast<size_t>(v)], m);
  return owner;
}

// Bytes of dequantizing a unit's NF4 weights once: the stored words read, the values
// written in the weight type the model multiplies by (fp16 runs: fp32, then rounded
// in place, llama_model's layer_weights).
double dequantize_bytes(const UnitLayout& unit, DType precision) {
  double bytes = 0;
  for (const auto& p : unit.params) {
    if (!p.quantized()) continue;
    const double values = static_cast<double>(p.logical_numel());
    const double written = precision == DType::fp16 ? 4 + 8 : static_cast<double>(dtype_bytes(precision));
    bytes += 4.0 * static_cast<double>(p.numel) + written * values;
  }
  return bytes;
}

// Per model unit: GEMM FLOPs and elementwise bytes per token, dequantization bytes per
// micro-batch, on the unit doing the work (owner) of each unit's matrices.
struct MatrixWork {
  std::vector<double> gemm_forward, gemm_backward, elementwise, dequantize;
};

// whole_vector_share: the share of a unit's tokens its whole (unsplit) 1-D parameters'
// work runs over (sequence parallelism: 1/T, the norms and biases of the residual stream
// on this tensor rank's tokens).
MatrixWork matrix_work(const std::vector<UnitLayout>& model_units, const std::vector<size_t>& owner,
                       double C, DType precision, double whole_vector_share = 1.0) {
  const size_t M = model_units.size();
  MatrixWork w{std::vector<double>(M, 0), std::vector<double>(M, 0), std::vector<double>(M, 0),
               std::vector<double>(M, 0)};
  auto& [gemm_forward, gemm_backward, elementwise, dequantize] = w;
  for (size_t v = 0; v < M; ++v) {
    const UnitLayout& unit = model_units[v];
    const double backward_per_forward = unit.trainable ? 2.0 : 1.0;  // dX (+ dW)
    for (const auto& p : unit.params) {
      const double n = static_cast<double>(p.logical_numel());
      if (v == 0) {
        // Embedding tables are looked up (one row per token); a vocabulary table a
        // later unit reads is the tied LM head's matrix, multiplied there.
        if (!is_matrix(p)) {
          elementwise[0] += 8 * n;
          continue;
        }
        elementwise[0] += 8 * C;
        if (owner[0] != 0 && p.valid_rows >= 0) {
          gemm_forward[owner[0]] += 2 * n;
          gemm_backward[owner[0]] += 2 * n * backward_per_forward;
        }
        continue;
      }
      if (is_matrix(p)) {
        const double f = unit.token_fraction;
        gemm_forward[owner[v]] += 2 * n * f;
        gemm_backward[owner[v]] += 2 * n * backward_per_forward * f;
        elementwise[owner[v]] += 8 * n / C * f;
      } else {
        elementwise[owner[v]] += 8 * n * (p.piece.whole() ? whole_vector_share : 1.0);
      }
    }
    dequantize[owner[v]] += dequantize_bytes(unit, precision);
  }
  return w;
}

}  // namespace

std::vector<UnitWork> model_unit_work(const ModelConfig& config,
                                      const std::vector<UnitLayout>& model_units,
                                      const std::vector<std::vector<int>>& unit_needs,
                                      double flops_per_token, int micro_batch, int seq_len,
                                      const ModelOptions& options, TensorSplit tensor) {
  const size_t M = model_units.size();
  SHARDLM_CHECK(M >= 3 && unit_needs.size() == M,
                "internal: {} model units with {} need lists", M, unit_needs.size());
  const double tokens = static_cast<double>(micro_batch) * seq_len;
  const double C = config.n_embd;
  const double V = config.padded_vocab_size();
  const std::vector<size_t> owner = matrix_owners(unit_needs);
  // The unsplit model's GEMMs tell attention apart from the family's FLOPs (below); a
  // tensor rank multiplies its own pieces.
  const MatrixWork whole = matrix_work(model_units, owner, C, options.precision);
  const MatrixWork local =
      tensor.size > 1
          ? matrix_work(split_for_tensor_rank(model_units, config, tensor), owner, C, options.precision,
                        options.sequence_parallel ? 1.0 / tensor.size : 1.0)
          : whole;
  const std::vector<double>& gemm_forward = local.gemm_forward;
  const std::vector<double>& gemm_backward = local.gemm_backward;
  const std::vector<double>& elementwise = local.elementwise;
  const std::vector<double>& dequantize = local.dequantize;

  std::vector<UnitWork> work(M);
  double gemm_per_token = 0;  // forward and backward
  size_t blocks = 0;
  for (size_t m = 0; m < M; ++m) {
    UnitWork& w = work[m];
    w.forward.gemm_flops = gemm_forward[m] * tokens;
    w.backward.gemm_flops = gemm_backward[m] * tokens;
    w.forward.elementwise_bytes = elementwise[m] * tokens;
    // A frozen embedding's backward writes no gradient rows.
    const bool writes_nothing = m == 0 && !model_units[0].trainable;
    w.backward.elementwise_bytes = writes_nothing ? 0 : 2 * w.forward.elementwise_bytes;
    // The vocabulary-parallel head: padded vocabulary / T logits per token on a rank.
    if (m + 1 == M) w.forward.loss_bytes = 8 * V / tensor.size * tokens;
    gemm_per_token += whole.gemm_forward[m] + whole.gemm_backward[m];
    if (m > 0 && m + 1 < M && gemm_forward[m] > 0) ++blocks;
  }
  SHARDLM_CHECK(blocks > 0, "internal: {} model units and none of them a block", M);
  // What the family counts beyond the GEMMs is attention. Negative would mean the
  // family and this count disagree on the GEMMs: a bug, never clamped away.
  const double attention_per_token = flops_per_token - gemm_per_token;
  SHARDLM_CHECK(attention_per_token >= -1e-9 * flops_per_token,
                "internal: {} counts {} FLOPs per token, fewer than its GEMMs' {}", config.family,
                flops_per_token, gemm_per_token);
  for (size_t m = 1; m + 1 < M; ++m) {
    if (gemm_forward[m] == 0) continue;  // not a block (LoRA's adapter units)
    const double a = std::max(0.0, attention_per_token) * tokens / static_cast<double>(blocks) /
                     tensor.size;
    work[m].forward.attention_flops = a / 3;
    work[m].backward.attention_flops = 2 * a / 3;
    if (options.activation_checkpointing) work[m].backward += work[m].forward;
  }
  for (size_t m = 0; m < M; ++m) {
    work[m].forward.elementwise_bytes += dequantize[m];
    work[m].backward.elementwise_bytes += dequantize[m];
  }
  return work;
}

}  // namespace shardlm
