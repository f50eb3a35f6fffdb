// The mixture-of-experts layer's row movement and per-row arithmetic around the expert
// GEMMs (model/moe/moe_experts.hpp): gathering an expert's token rows, adding the
// weighted outputs back, the top-k weights' gradients, the router's softmax/top-k
// backward and qwen2_moe's shared-expert gate. The routing decision itself (softmax,
// top-k, the grouping by expert) is made on the host (model/moe/moe_routing.hpp); these
// take its index arrays. Every loop runs in a fixed order: a token's several
// contributions add in assignment order, so results do not depend on threads.
#pragma once

#include <cstdint>

#include "shardlm/core/dtype.hpp"

namespace shardlm::cpu {

// dst row i = src row index[i] (`width` elements each, one storage type), i < rows.
void gather_rows(TypedPtr dst, ConstTypedPtr src, const int32_t* index, int64_t rows,
                 int64_t width);

// For i = 0, 1, ..., rows - 1 in order: out row index[i] += weight[i] * src row i
// (weight null: += src row i), `width` fp32 elements each.
void scatter_add_rows(float* out, const float* src, const int32_t* index, const float* weight,
                      int64_t rows, int64_t width);

// The top-k weights of `rows` assignments: weight[i] = top_weight[token[i] k + slot[i]].
void moe_assignment_weights(float* weight, const float* top_weight, const int32_t* token,
                            const int32_t* slot, int k, int64_t rows);

// d_top_weight[token[i] k + slot[i]] += dot[i] for i < rows, in order.
void moe_scatter_weight_grads(float* d_top_weight, const float* dot, const int32_t* token,
                              const int32_t* slot, int k, int64_t rows);

// An expert's output o = a Wdown^T enters as weight * o. From g = dy Wdown [rows, I]
// (unweighted) and the activations a [rows, I] (fp32): dot[i] = sum_j g[i, j] a[i, j]
// (the weight's gradient, summed in fp32 in j order), then g[i, :] *= weight[i] and
// dy[i, :] *= weight[i] ([rows, C]: the weighted dy of Wdown's gradient).
void moe_weight_backward(float* dot, float* g, const float* act, int64_t I, float* dy, int64_t C,
                         const float* weight, int64_t rows);

// The router's backward over n tokens of E experts, top-k: from the softmax
// probabilities [n, E], the chosen experts [n, k] and the gradient of their weights
// [n, k] (renormalised over the k when norm_topk_prob), plus aux_dprob [E] (may be
// null) added to every row's probability gradient: dlogits [n, E] (overwritten).
void moe_router_backward(float* dlogits, const float* probs, const int32_t* top_expert,
                         const float* d_top_weight, const float* aux_dprob, int64_t n, int E,
                         int k, bool norm_topk_prob);

// qwen2_moe's shared expert, y += sigmoid(z) s: gate [n] holds z (h2 w_gate^T) and is
// overwritten by sigmoid(z); with y non-null, y row t += gate[t] out row t ([n, C]).
void shared_expert_gate_forward(float* gate, float* y, const float* out, int64_t n, int64_t C);
// From dy [n, C]: dz[t] = <dy_t, out_t> g (1 - g) and ds = g dy (both overwritten).
void shared_expert_gate_backward(float* dz, float* ds, const float* dy, const float* gate,
                                 const float* out, int64_t n, int64_t C);

}  // namespace shardlm::cpu
