#include "shardlm/plan/unit_work.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

ComputeWork& ComputeWork::operator+=(const ComputeWork& o) {
  gemm_flops += o.gemm_flops;
  attention_flops += o.attention_flops;
  elementwise_bytes += o.elementwise_bytes;
  loss_bytes += o.loss_bytes;
  state_bytes += o.state_bytes;
  return *this;
}

ComputeWork ComputeWork::operator*(double f) const {
  return {gemm_flops * f, attention_flops * f, elementwise_bytes * f, loss_bytes * f,
          state_bytes * f};
}

bool ComputeWork::empty() const {
  return gemm_flops == 0 && attention_flops == 0 && elementwise_bytes == 0 && loss_bytes == 0 &&
         state_bytes == 0;
}

namespace {

bool is_matrix(const ParamInfo& p) { return p.shape.size() == 2; }

// Elements of a unit's vocabulary matrices (token embedding or LM head: the ones
// with padded vocabulary rows, ParamInfo::valid_rows).
double vocab_matrix_elements(const UnitLayout& unit) {
  double n = 0;
  for (const auto& p : unit.params)
    if (is_matrix(p) && p.valid_rows >= 0) n += static_cast<double>(p.logical_numel());
  return n;
}

}  // namespace

std::vector<UnitWork> model_unit_work(const ModelConfig& config,
                                      const std::vector<UnitLayout>& model_units,
                                      const std::vector<std::vector<int>>& unit_needs,
                                      double flops_per_token, int micro_batch, int seq_len,
                                      bool activation_checkpointing) {
  const size_t M = model_units.size();
  SHARDLM_CHECK(M >= 3 && unit_needs.size() == M,
                "internal: {} model units with {} need lists", M, unit_needs.size());
  const double tokens = static_cast<double>(micro_batch) * seq_len;
  const double C = config.n_embd;
  const double V = config.padded_vocab_size();
  std::vector<UnitWork> work(M);
  double gemm_per_token = 0;  // forward
  for (size_t m = 0; m < M; ++m) {
    const UnitLayout& unit = model_units[m];
    double matrix = 0, vectors = 0;
    for (const auto& p : unit.params) (is_matrix(p) ? matrix : vectors) += static_cast<double>(p.logical_numel());
    UnitWork& w = work[m];
    if (m == 0) {  // lookups: each embedding matrix contributes one row per token
      double tables = 0;
      for (const auto& p : unit.params) tables += is_matrix(p) ? 1 : 0;
      w.forward.elementwise_bytes = 8 * (tables * C + vectors) * tokens;
    } else {
      double gemm = 2 * matrix;
      if (m + 1 == M)  // the head may read a vocabulary matrix of another unit (tied)
        for (int v : unit_needs[m])
          if (static_cast<size_t>(v) != m)
            gemm += 2 * vocab_matrix_elements(model_units[static_cast<size_t>(v)]);
      gemm_per_token += gemm;
      w.forward.gemm_flops = gemm * tokens;
      w.forward.elementwise_bytes = 8 * (matrix / C + vectors) * tokens;
      if (m + 1 == M) w.forward.loss_bytes = 8 * V * tokens;
    }
    w.backward.gemm_flops = 2 * w.forward.gemm_flops;
    w.backward.elementwise_bytes = 2 * w.forward.elementwise_bytes;
  }
  // Whatever the family counts beyond the GEMMs is attention, in the blocks.
  const size_t blocks = M - 2;
  const double attention_per_token = std::max(0.0, flops_per_token - 3 * gemm_per_token);
  for (size_t m = 1; m + 1 < M; ++m) {
    const double a = attention_per_token * tokens / static_cast<double>(blocks);
    work[m].forward.attention_flops = a / 3;
    work[m].backward.attention_flops = 2 * a / 3;
    if (activation_checkpointing) work[m].backward += work[m].forward;
  }
  return work;
}

}  // namespace shardlm
