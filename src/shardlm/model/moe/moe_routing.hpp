// Top-k routing of a mixture-of-experts layer and its load-balancing loss, as
// transformers computes them (Qwen3MoeTopKRouter / MixtralTopKRouter and
// load_balancing_loss_func, transformers 5.24), on host arrays:
//   p = softmax(logits) over E experts; the k largest (ties: the lower expert first);
//   weights w_j = p_{i_j}, or p_{i_j} / sum_m p_{i_m} with norm_topk_prob.
// The assignments are then grouped by expert (tokens ascending within an expert), the
// fixed order every expert GEMM sees them in, so results do not depend on anything
// but the tokens.
//
// Load-balancing loss over R = (sparse layers) x (tokens) rows of one forward:
//   aux = E * sum_e (c_e / R) (P_e / R)
// with c_e the top-k assignments to expert e and P_e the summed probabilities of e
// over all rows of all sparse layers (transformers concatenates the layers' router
// logits). c is a count: only P carries a gradient, d aux / d p[row, e] = E c_e / R^2.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlm {

// One sparse layer's routing of n tokens; arrays owned by the caller.
struct MoeRouting {
  float* probs = nullptr;         // [n, E]
  int32_t* top_expert = nullptr;  // [n, k], highest probability first
  float* top_weight = nullptr;    // [n, k]
  int32_t* expert_begin = nullptr;  // [E + 1]: expert e's assignments [begin[e], begin[e+1])
  int32_t* token = nullptr;       // [n k] each assignment's token
  int32_t* slot = nullptr;        // [n k] its top-k slot
};

struct RouterShape {
  int64_t tokens = 0;
  int experts = 0;
  int top_k = 0;
  bool norm_topk_prob = true;
};

// Routes from logits [n, E] (fp32).
void route_tokens(const float* logits, const RouterShape& s, MoeRouting& r);

// (The backward through the softmax and top-k is a backend kernel,
// Backend::moe_router_backward, on the routing's probabilities and chosen experts.)

// The load-balancing loss's sums over one forward's sparse layers.
class LoadBalanceStats {
 public:
  void reset(int experts);
  void add(const MoeRouting& r, const RouterShape& s);
  // aux as above (0 without rows).
  double loss() const;
  // d(weight x aux) / d p[row, e] for every row (length E).
  std::vector<float> prob_gradient(double weight) const;
  const std::vector<double>& assignments() const { return count_; }
  // The sums as one array (counts, probability sums, rows) and back: a context group
  // adds its ranks' so that every rank's loss and gradient are those of the whole rows.
  std::vector<double> sums() const;
  void set_sums(const std::vector<double>& sums);

 private:
  std::vector<double> count_, prob_sum_;
  double rows_ = 0;
};

}  // namespace shardlm
