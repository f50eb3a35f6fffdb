// MoeExperts: the sparse layers' expert computation of the Llama-family model
// (qwen3_moe, mixtral), with the routing and activations it keeps between units.
//
// A sparse layer is one model unit (attention, norms and the router) followed by one
// model unit per expert (model/llama/llama_lora.hpp), so that under ZeRO-3 each expert
// is gathered and freed on its own, and so that expert parallelism can later place
// E / ep of them on each rank and move tokens with an all-to-all around them:
//   layer unit:    h2 = rmsnorm(r) w_post; logits = h2 Wr^T; route (moe_routing.hpp);
//                  y = r
//   expert unit e: for e's tokens t (ascending): y_t += w_{t,e} (silu(g) * u) Wdown^T,
//                  g|u = h2_t Wgu^T: one GEMM pair over all of e's tokens
// Experts add into y in expert order, so the sum is deterministic. No token is
// dropped. Backward runs the experts in reverse, accumulating the gradient of h2 and
// of the top-k weights, then the layer unit's router backward adds the softmax/top-k
// chain and the load-balancing loss's gradient (LoadBalanceStats).
//
// Precision as the dense MLP's: the experts' GEMM inputs (gathered h2 rows, g|u,
// silu(g) * u) are kept in the compute type, outputs and gradients in fp32.
// Activation checkpointing (recompute): each sparse layer keeps a copy of h2 and its
// routing, the experts share one set of g|u and silu(g) * u, and each expert recomputes
// its own right before its backward (bitwise the same: same inputs, same GEMMs).
//
// Where the work runs (as Megablocks and torchtitan split it): the router GEMM, the row
// gathers, the expert GEMMs, the weighted scatter-add back (combine), the top-k weights'
// and the router's backward run as backend kernels on the run's device (cpu/moe.hpp).
// The routing decision (softmax, top-k, renormalisation, the grouping by expert) is made
// on the host, from a copy of the small [n, E] router logits on a device, and its arrays
// are copied back to the device; the per-expert counts stay on the host, which sizes the
// GEMMs and the all-to-alls with them. On the CPU the host computes into the arrays
// the kernels read (no copies).
// The meta device (`plan` runs the step there, backend/meta) has no contents to route,
// so every expert is taken to get an equal share of the n k assignments (the balanced
// routing the load-balancing loss aims at), and the same kernels run, with the sizes a
// run would give them.
//
// Expert parallelism (an expert group of P ranks, ModelParallelGroups::expert; the
// ranks of a group read different rows): rank q of the group holds experts
// [q E/P, (q+1) E/P) of every sparse layer, and only their units run anything.
// moe_expert_parallel.cpp moves the tokens in chunks: a chunk is a run of held experts
// (chunk_begin), one all_to_all_v each way carries between every pair of ranks the rows
// of the receiver's held experts of that run. On a device there is one chunk per held
// expert, so that an expert computes while the next one's rows travel (DeepSpeed-MoE's
// and Megatron's overlapped all-to-all); on the host one chunk of every held expert, the
// exchange of a layer in one all_to_all_v each way: the communication thread would
// share the GEMMs' cores, and more exchanges mean more rendezvous of the group's ranks
// (ModelOptions::expert_exchange_chunks, docs/parallelism.md). The chunking changes
// where rows lie in the buffers, never a result:
//   dispatch (after route): the per-expert counts first (all_to_all), then, one
//     all_to_all_v per chunk, every assignment's h2 row in the routing's grouping (by
//     expert, tokens ascending); a source lays its rows out chunk by chunk (within a
//     chunk, peer by peer, each peer's experts of the chunk in order), a holder keeps,
//     per layer, chunk by chunk each source's rows for the chunk's experts in turn.
//   each held expert waits for its chunk, then runs one GEMM pair per source block:
//     the same rows in the same order, so the same results, as that expert's GEMMs on
//     the source rank at P = 1; after a chunk's last expert its outputs start back
//     (the reverse all_to_all_v of the chunk) while the next chunk computes.
//   combine (the layer's last expert unit): once every chunk is back, each source adds
//     w * o in expert order, as at P = 1.
//   backward: the layer's first backward expert unit starts every chunk's dy rows and
//     top-k weights towards the holders (the last chunk first); a chunk's first
//     backward expert waits for them, and its blocks give dW (+=, over its sources in
//     rank order), the top-k weights' dot products and dh2 rows, which start back after
//     the chunk's last backward expert; the layer's last backward expert unit waits for
//     them and adds in the P = 1 order.
// Every rank issues its chunks at the same place of its own held experts (and the
// dispatches at the same units), so the group's collectives and the other groups'
// come in one order on every rank (comm/comm_thread.hpp runs them in issue order).
// With SHARDLM_COMM_OVERLAP=0 a collective starts only once waited for: the same
// exchanges, none beside the GEMMs.
// With activation checkpointing each sparse layer keeps h2 and its routing and the
// counts received, the holders one shared set of received rows and activations: the
// layer's first backward expert unit sends the h2 rows again (beside the dy rows, in
// the same order on every rank of the group) and each held expert recomputes its
// activations from them right before its backward (bitwise the forward's).
// Forward values and dLoss/dh2 are bitwise those of P = 1; an expert's weight gradient
// sums its sources' GEMMs in one buffer (source order) where P = 1 reduces them across
// ranks, so it differs in rounding only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/model/config.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/moe/moe_expert_lora.hpp"
#include "shardlm/model/moe/moe_routing.hpp"

namespace shardlm {

struct ExpertWeights {
  ConstTypedPtr gate_up;  // [2 I, C]: gate_proj rows, then up_proj rows
  ConstTypedPtr down;     // [C, I]
  ExpertAdapters lora;    // LoRA on the expert (moe_expert_lora.hpp); none by default
};

class MoeExperts {
 public:
  // meta: the buffers have no storage (see above); recompute: activation checkpointing;
  // expert_group: the expert-parallel group (null or one rank: every expert here);
  // on_device: the arrays carve() hands out are device memory (the routing is made in
  // host arrays and copied there); with meta, the device plan stands for.
  // exchange_chunks: ModelOptions::expert_exchange_chunks.
  MoeExperts(const ModelConfig& config, DType compute, bool meta = false, bool recompute = false,
             Communicator* expert_group = nullptr, bool on_device = false,
             int exchange_chunks = 0);

  // Requests the arrays for micro-batches of up to n tokens.
  void carve(ArenaCarver& carver, int64_t n);
  // Expert weights' elements (the model's weight scratch holds one expert's).
  int64_t expert_weight_elements() const { return 3 * I_ * C_; }

  // The router GEMM's output, [n, E] fp32, that route() reads.
  float* router_logits() const { return logits_; }
  // Routes sparse layer `layer`'s n tokens from router_logits(); the first sparse layer
  // starts the micro-batch's load-balancing sums.
  void route(int layer, int64_t n, Backend& be);
  // Recompute: keeps layer l's h2 [n, C] (after route) for its experts.
  void keep_h2(int layer, Backend& be, ConstTypedPtr h2);
  ConstTypedPtr kept_h2(int layer) { return this->layer(layer).kept_h2; }
  // out [n, C] += expert e's contribution for its tokens, reading h2 [n, C].
  void expert_forward(int layer, int e, Backend& be, bool row_by_row, ConstTypedPtr h2,
                      const ExpertWeights& w, float* out);
  // From dy = dLoss/dy [n, C]: the expert's weight gradients (+=, null: frozen) and its
  // shares of dLoss/dh2 and of the top-k weights' gradients. Experts in reverse order.
  void expert_backward(int layer, int e, Backend& be, const ParamRounding& rounding,
                       ConstTypedPtr h2, const ExpertWeights& w, const float* dy,
                       float* grad_gate_up, float* grad_down);
  // After every expert's backward: dLoss/dlogits [n, E] of the router as a GEMM input,
  // aux_weight the load-balancing loss's gradient weight (coefficient x the
  // micro-batch's share).
  ConstTypedPtr router_backward(int layer, Backend& be, double aux_weight,
                                const ParamRounding& rounding);
  // dLoss/dh2 [n, C] from the experts (the router's share is the model's to add).
  float* h2_gradient() const { return dh2_; }

  // The micro-batch's load-balancing loss (after the last sparse layer's forward).
  double aux_loss() const { return stats_.loss(); }
  // Context parallelism: adds the load-balancing sums of the group's ranks (each routed
  // its own tokens of the same rows), so that the loss, its gradient and the
  // assignments are the whole rows' on every rank, as transformers computes them over
  // one forward. After the last sparse layer's forward, before any router backward.
  void sum_load_balance(Communicator& context_group);
  int experts() const { return E_; }
  // Whether expert e's unit is held (and runs) on this rank.
  bool holds(int e) const { return e >= local_begin_ && e < local_begin_ + local_experts_; }
  // The micro-batch's top-k assignments per expert (this rank's tokens, all sparse
  // layers summed; length E): what metrics.jsonl reports per step.
  const std::vector<double>& assignments_per_expert() const { return stats_.assignments(); }

  // --- expert parallelism (moe_expert_parallel.cpp) ---
  // Sends sparse layer l's assignments' h2 rows [n, C] to their experts' holders.
  void dispatch(int layer, Backend& be, ConstTypedPtr h2);

 private:
  // Expert parallelism: a holder's received h2 rows and its experts' activations on
  // them, [R, C], [R, 2 I], [R, I] (R: the rows' capacity, ep_carve).
  struct HeldRows {
    TypedPtr h2, gate_up, act;
  };
  struct LayerRouting {
    MoeRouting routing;  // the kernels' arrays (device memory on a device)
    std::vector<int32_t> host_begin;  // on a device: routing.expert_begin on the host
    TypedPtr gate_up;  // [n k, 2 I] per assignment, grouped by expert (recompute: shared, [n, 2 I])
    TypedPtr act;      // [n k, I] (recompute: shared, [n, I])
    TypedPtr kept_h2;  // recompute: [n, C]
    // Expert parallelism: the rows this rank received for its experts (from peer j
    // for held expert e, source-major) and keeps for the backward.
    std::vector<int64_t> received;  // [P x E/P] rows
    HeldRows held;                  // (recompute: the shared set's)
  };
  // Where expert e's rows of g|u and silu(g) * u are (recompute: the shared set's start).
  int64_t activation_row(int64_t begin) const { return recompute_ ? 0 : begin; }
  void expert_activations(LayerRouting& r, int64_t begin, int64_t rows, Backend& be,
                          bool row_by_row, ConstTypedPtr h2, const ExpertWeights& w);
  LayerRouting& layer(int l);
  RouterShape shape() const { return {n_, E_, k_, norm_topk_}; }
  // Expert e's assignments [begin, end) in sparse layer l's grouping.
  std::pair<int64_t, int64_t> assignments(const LayerRouting& r, int e) const;
  void gather_h2(ConstTypedPtr h2, const int32_t* tokens, int64_t rows, Backend& be);
  bool parallel() const { return group_ != nullptr; }
  void ep_carve(ArenaCarver& carver, int64_t n);
  // The layer's held rows: its own, or with activation checkpointing the one set the
  // layers share (the backward receives the h2 rows again and recomputes the rest).
  HeldRows& held_rows(LayerRouting& r) { return recompute_ ? shared_held_ : r.held; }
  // Where each expert's rows start in this rank's send layout [n k]: chunk by chunk
  // (within a chunk peer by peer, each peer's experts of the chunk in turn), each
  // expert's rows in the grouping's order.
  std::vector<int64_t> sent_begin(const LayerRouting& r) const;
  // The layer's assignments' h2 rows into ep_send_h2_, in the send layout.
  void pack_h2_rows(LayerRouting& r, Backend& be, ConstTypedPtr h2,
                    const std::vector<int64_t>& sent);
  // Starts chunk `chunk`'s all_to_all_v of `width` elements per row: from the send
  // layout at `from` to the held rows at `to` (to_holders), or back (to_sources).
  enum class Direction { to_holders, to_sources };
  Work exchange_chunk(const LayerRouting& r, const std::vector<int64_t>& sent, int chunk,
                      Direction direction, ConstTypedPtr from, TypedPtr to, int64_t width,
                      const char* what);
  // Held expert `local`'s g|u and silu(g) * u on the rows received from peer j.
  void held_activations(LayerRouting& r, int local, int peer, Backend& be, bool row_by_row,
                        const ExpertWeights& w);
  void ep_expert_forward(LayerRouting& r, int e, Backend& be, bool row_by_row,
                         const ExpertWeights& w, float* out);
  void ep_expert_backward(LayerRouting& r, int e, Backend& be, const ParamRounding& rounding,
                          ConstTypedPtr h2, const ExpertWeights& w, const float* dy,
                          float* grad_gate_up, float* grad_down);
  // Rows each peer of the group sends this rank for each held expert: the layer's
  // counts [P x E/P]; the received rows lie chunk by chunk (within a chunk source by
  // source, each source's rows for the chunk's experts in turn): block (j, e) starts at
  // received_begin.
  int64_t received_rows(const LayerRouting& r, int peer, int local) const;
  int64_t received_begin(const LayerRouting& r, int peer, int local) const;
  // Chunk c's held experts are [chunk_begin(c), chunk_begin(c + 1)); chunk_of(local) is
  // the chunk of held expert `local`.
  int chunk_begin(int chunk) const;
  int chunk_of(int local) const;
  // The routing made on the host from the logits on a device, copied into r.routing.
  void route_on_host(LayerRouting& r, Backend& be);

  int E_ = 0, k_ = 0;
  Communicator* group_ = nullptr;  // null unless the expert group has more than one rank
  int local_begin_ = 0, local_experts_ = 0;
  int chunks_ = 1;  // the exchanges of a layer's dispatch or combine (1 to local_experts_)
  int64_t C_ = 0, I_ = 0;
  bool norm_topk_ = true;
  DType compute_ = DType::fp32;
  bool meta_ = false;
  bool recompute_ = false;
  bool on_device_ = false;
  // On a device: route()'s host arrays (logits, then the routing the layer's are copied from).
  std::vector<float> host_logits_, host_probs_, host_top_weight_;
  std::vector<int32_t> host_top_expert_, host_token_, host_slot_;
  TypedPtr shared_gate_up_, shared_act_;  // recompute
  std::vector<int32_t> meta_begin_;  // meta: the balanced grouping, [E + 1]
  std::vector<int> sparse_index_;  // per layer: index into layers_, or -1
  int first_sparse_ = -1;
  std::vector<LayerRouting> layers_;
  int64_t n_ = 0;  // tokens of the current micro-batch
  LoadBalanceStats stats_;
  // Scratch shared by the layers (one unit runs at a time).
  float* logits_ = nullptr;  // [n, E]
  TypedPtr xe_;              // [n, C] an expert's gathered h2 rows
  float* gu_f_ = nullptr;    // [n, 2I] fp32 GEMM output (compute != fp32)
  float* out_ = nullptr;     // [n, C] an expert's output; backward: its dy rows
  TypedPtr out_c_;           // [n, C] compute-type copy of out_ for GEMMs
  float* g_ = nullptr;       // [n, I]
  float* dgu_ = nullptr;     // [n, 2I]
  TypedPtr dgu_c_;           // [n, 2I]
  float* dx_ = nullptr;      // [n, C]
  float* dh2_ = nullptr;     // [n, C]
  float* dtop_ = nullptr;    // [n, k]
  float* dlogits_ = nullptr;  // [n, E]
  float* aux_dprob_ = nullptr;  // [E] the load-balancing loss's probability gradient
  float* row_weight_ = nullptr;  // [n] an expert's rows' top-k weights (no expert parallelism)
  float* row_dot_ = nullptr;     // [n] their gradients
  TypedPtr dlogits_c_;        // [n, E]
  std::unique_ptr<ExpertLora> lora_;  // LoRA on the experts' projections (else null)
  // Expert parallelism's exchange buffers (one layer at a time).
  int64_t ep_capacity_ = 0;   // R: rows this rank can receive for its experts
  HeldRows shared_held_;      // recompute: the layers' one set
  TypedPtr ep_send_h2_;       // [n k, C] assignments' h2 rows, grouped by expert
  float* ep_rows_ = nullptr;  // [R, C] held experts' outputs; backward: their dh2 rows
  float* ep_back_ = nullptr;  // [n k, C] those rows back at their source (send layout);
                              // backward, first the assignments' dy rows sent
  float* ep_dy_ = nullptr;       // [R, C] the dy rows received
  float* ep_send_w_ = nullptr;   // [n k] assignments' top-k weights
  float* ep_w_ = nullptr;        // [R] received
  float* ep_dot_ = nullptr;      // [R] top-k weight gradients of the received rows
  float* ep_dot_back_ = nullptr;  // [n k] back at their source
  float* ep_counts_ = nullptr;    // [2 E] counts exchanged (fp32: exact below 2^24 rows)
  // Per chunk: the exchanges in flight that its compute waits for, and those that
  // bring its rows back, which the layer's last (backward) expert unit waits for.
  std::vector<std::vector<Work>> arriving_, returning_;
};

}  // namespace shardlm
