#include "shardlm/model/llama/llama_model.hpp"

#include <algorithm>
#include <cstring>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/backend/cpu/rope.hpp"
#include "shardlm/backend/backend.hpp"
#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/context_parallel/context_parallelism.hpp"
#include "shardlm/model/llama/llama_family.hpp"
#include "shardlm/model/llama/llama_lora.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/moe/moe_experts.hpp"
#include "shardlm/model/moe/moe_names.hpp"
#include "shardlm/model/moe/moe_shared_expert.hpp"
#include "shardlm/model/tensor_parallel/sequence_parallel_rows.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_parallel_block.hpp"
#include "shardlm/model/tensor_parallel/vocab_parallel.hpp"

namespace shardlm {

namespace {

// Offsets (elements) of a layer's parameters inside its unit buffer; -1: absent.
// QLoRA (nf4): q, k, v and gate, up are separate NF4 tensors (k_w, v_w, up_w set),
// dequantized back to back so the GEMMs still read one packed matrix.
struct LayerOffsets {
  int64_t ln1 = -1, qkv_w = -1, qkv_b = -1, q_norm = -1, k_norm = -1;
  int64_t o_w = -1, o_b = -1, ln2 = -1, gu_w = -1, down_w = -1;
  int64_t k_w = -1, v_w = -1, up_w = -1;
  int64_t router_w = -1;  // a sparse layer's router (it has no gu_w, down_w)
  // A sparse layer's experts: gate_proj|up_proj and down_proj in each expert's unit
  // (QLoRA: up_proj its own NF4 tensor, expert_up).
  std::vector<std::pair<int64_t, int64_t>> experts;
  std::vector<int64_t> expert_up;
  // qwen2_moe's shared expert (in the layer's unit): gate_proj|up_proj, down_proj, its gate.
  int64_t shared_gu = -1, shared_up = -1, shared_down = -1, shared_gate = -1;
  // LoRA on the experts: per expert its A and B of gate_up_proj and down_proj in the
  // expert's adapter unit (-1: not targeted).
  struct ExpertAdapterOffsets {
    int64_t gate_up_a = -1, gate_up_b = -1, down_a = -1, down_b = -1;
  };
  std::vector<ExpertAdapterOffsets> expert_adapters;
};

// What a layer's backward reads, saved by its forward (one set per layer, or one shared
// set refilled by recomputation with activation checkpointing).
struct LayerActivations {
  TypedPtr ln1;                // [N, C] rmsnorm(x) * w_in
  float* rstd1 = nullptr;      // [N]
  TypedPtr qk_pre;             // [N, Q + KVD] q and k before their norms (qwen3 only)
  float* rstd_q = nullptr;     // [N * H] (qwen3)
  float* rstd_k = nullptr;     // [N * KV] (qwen3)
  TypedPtr qkv;                // [N, Q + 2 KVD] q, k after RoPE; v
  TypedPtr att;                // [N, Q] attention output, before o_proj
  float* lse = nullptr;        // [B, H, T]
  float* res2 = nullptr;       // [N, C] fp32: residual after the attention branch
  TypedPtr ln2;                // [N, C]
  float* rstd2 = nullptr;      // [N]
  TypedPtr gate_up;            // [N, 2I] g|u
  TypedPtr act;                // [N, I] silu(g) * u
};

struct LayerWeights {
  ConstTypedPtr qkv, o, gate_up, down;
  ConstTypedPtr router;  // sparse layers (no gate_up, down)
  SharedExpertWeights shared;  // qwen2_moe's sparse layers
};

// fp32 values of the compute type; null where the parameter does not exist.
struct LayerVectors {
  const float* ln1 = nullptr;
  const float* qkv_b = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* o_b = nullptr;
  const float* ln2 = nullptr;
};

// Layer l's adapters for one call: per LoRA group, its packed A [n r, in] and each
// target's B [out, r] as the GEMMs read them, and where their gradients go.
struct GroupAdapters {
  const LoraGroup* group = nullptr;  // of the layer's lora_groups
  ConstTypedPtr a;
  std::vector<ConstTypedPtr> b;
  float* grad_a = nullptr;
  std::vector<float*> grad_b;
};
using LayerAdapters = std::vector<GroupAdapters>;  // per group of the layer's; empty: no LoRA

}  // namespace

struct LlamaModel::Impl {
  ModelConfig config;
  ParamLayout layout;
  ModelOptions options;
  int max_batch = 0, max_seq = 0;
  int L = 0, num_units = 0, final_unit = 0;
  // H, KV and I are this tensor rank's (the whole model's without tensor parallelism).
  int64_t C = 0, H = 0, KV = 0, hd = 0, Q = 0, KVD = 0, QKV = 0, I = 0;
  int tensor_size = 1;
  TensorParallelBlock tp;                 // the tensor group's collectives (no-ops alone)
  // Sequence parallelism (options.sequence_parallel with T > 1): this rank's block of
  // N / T tokens of the residual stream, its norms and residual adds; the norms' outputs
  // are gathered whole for the column-parallel GEMMs, the row-parallel GEMMs' partial
  // sums reduce-scattered back to the block (sequence_parallel_rows.hpp).
  bool sequence_parallel = false;
  SequenceParallelRows sp;
  float* dkv_replicas = nullptr;          // [N, 2 KVD] key/value heads replicated over ranks
  float* qk_norm_grad = nullptr;          // [2 hd] qwen3 under tensor parallelism
  int V = 0, Vp = 0;
  // Under tensor parallelism the embedding and the LM head are vocabulary-parallel:
  // this rank's rows of them, its lookup and its loss (vocab_parallel.hpp).
  VocabShard vocab;
  VocabParallelEmbedding vocab_embedding;
  VocabParallelHead vocab_head;
  float eps = 1e-6f;
  DType compute = DType::fp32;

  int64_t embed = 0, norm_w = 0, lm_head = -1;
  std::vector<LayerOffsets> offsets;
  // Every model unit's role and the units it reads (computed once: an MoE model has
  // thousands of units).
  std::vector<LlamaUnitRole> roles;
  std::vector<std::vector<int>> needs;
  // Mixture of experts (config.moe): the sparse layers' experts and routing.
  std::unique_ptr<MoeExperts> moe;
  std::unique_ptr<MoeSharedExpert> shared_expert;  // qwen2_moe
  double aux_loss = 0.0;
  std::vector<double> expert_tokens;  // the last forward's assignments per expert
  // LoRA: per layer the groups' targets (a sparse layer's MLP groups are its shared
  // expert's), per layer and group the A and B offsets in the adapter unit, the scale
  // alpha / r and scratch for x A^T and its gradient ([N, 3 r] at most).
  std::vector<std::vector<LoraGroup>> lora_groups;
  std::vector<std::vector<std::pair<int64_t, std::vector<int64_t>>>> adapter_offsets;
  float lora_scale = 0.0f;
  int64_t lora_width = 0;  // largest n r of a group
  float* lora_u = nullptr;
  float* lora_du = nullptr;
  TypedPtr lora_u_c, lora_du_c;

  // Where the kernels run (options.device); the CPU backend until the constructor.
  Backend* be = &cpu_backend();
  TrackedBuffer arena;
  std::vector<float*> residual;           // L + 1 layer inputs, [N, C]
  std::vector<LayerActivations> layers;   // L sets, or 1 with activation checkpointing
  float* branch = nullptr;                // [N, C] o_proj / down_proj outputs
  TypedPtr lnf;                           // [N, C]
  float* lnf_rstd = nullptr;
  float* dlnf = nullptr;                  // [N, C] gradient at the final norm's output
  float* dres = nullptr;                  // [N, C] gradient of the residual stream (N / T rows
                                          // with sequence parallelism, as residual, res2, rstd*)
  float* dsmall = nullptr;                // [N, C]
  float* dmid = nullptr;                  // [N, max(Q, I)]
  float* dbig = nullptr;                  // [N, max(QKV, 2I)]; forward: GEMM outputs
  float* dqk = nullptr;                   // [N, Q + KVD] qwen3: gradient before the q/k norms
  TypedPtr dres_c, dbig_c;                // compute-type copies of dres and dbig for GEMMs
  int32_t* default_positions = nullptr;   // [N]: t
  LmHead head;
  std::unique_ptr<ParamRounding> rounding;
  std::unique_ptr<cpu::RopeTable> rope;  // made on the host
  TrackedBuffer rope_on_device;          // its copy on a device (else empty)
  RopeTableView rope_view;               // the table the kernels read
  // QLoRA: one layer's base weights dequantized (weight type), reused by every layer.
  bool nf4 = false;
  TrackedBuffer dequantized;

  MicroBatchState state{0};
  StagedBatch staged;                     // the micro-batch's arrays on the device
  const int32_t* positions = nullptr;     // of the current micro-batch, where kernels read them
  const int32_t* key_begin = nullptr;
  // Context parallelism (options.parallel_groups.context of more than one rank): this
  // rank's tokens of each row, and the attention across the group's ranks; else null.
  std::unique_ptr<ContextParallelism> context;
  // During forward_unit_cached: the cache, and the step's positions (cache.length() + t).
  KvCache* kv = nullptr;
  std::vector<int32_t> kv_positions;

  int64_t N() const { return state.N(); }
  // Tokens of the residual stream here: N, or this rank's block of N / T.
  int64_t NL() const { return sp.rows(N()); }
  int64_t block_offset() const { return sp.block_offset(N()); }
  // Where a norm writes its block of a gathered activation, then the gather.
  TypedPtr block_of(TypedPtr whole) const { return sp.block_of(whole, N()); }
  void gather(TypedPtr whole, const char* label) const { sp.gather(tp, whole, N(), label); }
  // A row-parallel GEMM's output, or the column-parallel GEMMs' input gradient: partial
  // sums [N, C] -> the sum (sequence parallelism: this rank's block of it); returns where it is.
  float* sum_rows(float* partial, const char* label) const { return sp.sum_rows(tp, partial, N(), label); }
  // dres as the GEMMs read it: whole (gathered from the blocks under sequence parallelism).
  float* whole_dres() { return sp.whole_dres(*be, tp, dres, N()); }
  // A norm's weight gradient over this rank's block, summed over the group into g (null:
  // frozen).
  float* norm_grad_target(float* g) const { return sp.on() && g != nullptr ? sp.norm_grads(*be, C) : g; }
  void finish_norm_grad(float* g) const {
    if (sp.on() && g != nullptr) sp.add_norm_grads(*be, tp, {g}, C);
  }
  // The micro-batch this rank computes on: `full`, or with context parallelism its
  // slice, cut when the embeddings' forward starts the micro-batch.
  const MicroBatch& local_batch(const MicroBatch& full, bool starts) {
    return context ? context->local_batch(full, starts, *be) : full;
  }
  AttentionShape attention_shape() const {
    return {state.B, state.T, static_cast<int>(H), static_cast<int>(KV), static_cast<int>(hd)};
  }
  LayerActivations& acts(int l) {
    return layers[options.activation_checkpointing ? 0 : static_cast<size_t>(l)];
  }
  int64_t adapter_elements() const {  // of the layer with the most
    int64_t most = 0;
    for (const auto& groups : lora_groups) {
      int64_t n = 0;
      for (const auto& g : groups)
        for (const auto& tg : g.targets) n += config.lora.rank * (g.in + tg.out);
      most = std::max(most, n);
    }
    return most;
  }
  int64_t base_weight_elements() const {
    const int64_t attention = QKV * C + C * Q;
    const int64_t sparse = moe ? attention + static_cast<int64_t>(moe->experts()) * C +
                                     (shared_expert ? shared_expert->weight_elements() : 0)
                               : 0;
    const int64_t dense = config.moe.sparse_layers(L) == L ? 0 : attention + 2 * I * C + C * I;
    return std::max(sparse, dense);
  }
  int64_t layer_weight_elements() const { return base_weight_elements() + adapter_elements(); }
  int64_t dequantized_bytes() const {
    const int64_t expert = moe ? moe->expert_weight_elements() : 0;
    return nf4 ? std::max(base_weight_elements(), expert) * static_cast<int64_t>(dtype_bytes(rounding_weight_type()))
               : 0;
  }
  DType rounding_weight_type() const { return compute == DType::fp16 ? DType::fp32 : compute; }
  // An expert's adapters' elements (they follow its weights in the weight scratch).
  int64_t expert_adapter_elements() const {
    if (!llama_expert_lora(config)) return 0;
    const int64_t r = config.lora.rank, Ie = config.moe.expert_intermediate_size;
    return (config.lora.targets_module("experts.gate_up_proj") ? r * (C + 2 * Ie) : 0) +
           (config.lora.targets_module("experts.down_proj") ? r * (Ie + C) : 0);
  }
  int64_t weight_scratch_elements() const {
    const int64_t expert = moe ? moe->expert_weight_elements() + expert_adapter_elements() : 0;
    // (Every tensor rank sizes it for its whole share of rows: the same on each.)
    const int64_t head = vocab_parallel() ? vocab.rows : V;
    return std::max<int64_t>({layer_weight_elements(), head * C, expert});
  }
  bool vocab_parallel() const { return tensor_size > 1; }
  // Rows of the head weight the GEMMs read: the real vocabulary, or this rank's real rows.
  int64_t head_rows() const { return vocab_parallel() ? vocab.real : V; }
  int64_t vector_scratch_floats() const { return 3 * C + QKV + 2 * hd; }

  void set_shape(const ModelConfig& model_config, const ModelOptions& run_options);
  void carve_activations(ArenaCarver& carver, int64_t n);
  std::vector<int> needed_units(int unit) const;
  LayerWeights layer_weights(int l, ConstTypedPtr p) const;
  // Expert e's weights from its unit's parameters p, with its adapters (LoRA on the
  // experts) from params and their gradients into grads (empty: none computed).
  ExpertWeights expert_weights(int l, int e, ConstTypedPtr p, ParamPointers params = {},
                               UnitPointers grads = {}) const;
  bool sparse(int l) const { return config.moe.sparse_layer(l); }
  // The dense MLP's backward or a sparse layer's router's, ending with the gradient
  // through the post-attention norm into dres.
  void mlp_backward(int l, const LayerVectors& v, const LayerWeights& w, const LayerAdapters& ad,
                    float* g, double aux_weight);
  LayerVectors layer_vectors(int l, ConstTypedPtr p) const;
  ConstTypedPtr head_weights(ParamPointers params) const {
    const ConstTypedPtr w = lm_head < 0 ? params[0].at(embed) : params[final_unit].at(lm_head);
    return rounding->gemm_weight(w, 0, head_rows() * C);
  }

  LayerAdapters layer_adapters(int l, ParamPointers params, UnitPointers grads) const;
  void layer_forward(int l, const LayerVectors& v, const LayerWeights& w,
                     const LayerAdapters& ad, bool recompute);
  void layer_backward(int l, const LayerVectors& v, const LayerWeights& w,
                      const LayerAdapters& ad, float* g, double aux_weight);
  // The shared expert's adapters (a sparse layer's MLP groups) as its GEMMs call them.
  SharedExpertLora shared_expert_lora(const LayerAdapters& ad);
  // out [N, group width] += scale (x A^T) B^T over the group's targets.
  void lora_forward(size_t group, const LayerAdapters& ad, ConstTypedPtr x, float* out);
  // Adapter gradients from the group output's gradient dy (as the base GEMMs read it),
  // and dx += its share of the input gradient.
  void lora_backward(size_t group, const LayerAdapters& ad, ConstTypedPtr x, ConstTypedPtr dy,
                     float* dx) {
    lora_b_backward(group, ad, x, dy);
    lora_input_backward(group, ad, x, dy, dx);
  }
  // Its two halves: B's gradient, and A's with dx's share (the same dy but where key/value
  // heads are replicated over tensor ranks: B's takes every replica's, dx this rank's).
  void lora_b_backward(size_t group, const LayerAdapters& ad, ConstTypedPtr x, ConstTypedPtr dy);
  void lora_input_backward(size_t group, const LayerAdapters& ad, ConstTypedPtr x,
                           ConstTypedPtr dy, float* dx);
  // Attention of the step's rows over the KV cache, after adding their keys and values.
  void cached_attention(int l, LayerActivations& a);
  void gemm_forward(int rows, int n, int k, float alpha, ConstTypedPtr x, int ldx,
                    ConstTypedPtr w, float beta, float* out, int ldc) {
    forward_gemm(*be, options.row_by_row_gemm, true, rows, n, k, alpha, x, ldx, w, k, beta, out,
                 ldc);
  }
  void qk_norm_forward(LayerActivations& a, const LayerVectors& v, float* qkv_f);
  void qk_norm_backward(const LayerActivations& a, const LayerVectors& v, float* dqkv,
                        float* dq_norm, float* dk_norm);
  void final_forward(ParamPointers params, UnitPointers grads, const MicroBatch& batch,
                     bool training, float grad_scale);
  // residual[0] = the staged tokens' embedding rows (B x T of them).
  void embed_forward(ConstTypedPtr p, int B, int T) {
    if (vocab_parallel())  // (sequence parallelism: looked up whole in branch, scattered)
      vocab_embedding.forward(*be, tp, sequence_parallel ? branch : residual[0], staged.tokens,
                              p.at(embed), B, T, static_cast<int>(C), compute,
                              sequence_parallel ? residual[0] : nullptr);
    else
      be->embedding_forward(residual[0], staged.tokens, p.at(embed), ConstTypedPtr(), B, T,
                            static_cast<int>(C), compute, nullptr);
  }
  const LlamaUnitRole& role(int unit) const {
    SHARDLM_CHECK(unit >= 0 && unit < num_units, "model: unit {} out of range [0, {})", unit,
                  num_units);
    return roles[static_cast<size_t>(unit)];
  }
  // h2 as the experts read it: the layer's own, or with activation checkpointing (whose
  // one shared set the later layers overwrite) the copy MoeExperts keeps.
  ConstTypedPtr expert_input(int l) {
    return options.activation_checkpointing ? moe->kept_h2(l) : ConstTypedPtr(acts(l).ln2);
  }
  // Whether this rank holds (and computes) the unit: all but the experts held elsewhere
  // under expert parallelism.
  bool holds(const LlamaUnitRole& r) const {
    return (r.kind != LlamaUnitRole::Kind::expert && r.kind != LlamaUnitRole::Kind::expert_adapters) ||
           moe->holds(r.expert);
  }
  void expert_forward(const LlamaUnitRole& r, ParamPointers params) {
    const ConstTypedPtr p = params[llama_expert_unit(config, r.layer, r.expert)];
    moe->expert_forward(r.layer, r.expert, *be, options.row_by_row_gemm, expert_input(r.layer),
                        holds(r) ? expert_weights(r.layer, r.expert, p, params) : ExpertWeights{},
                        residual[static_cast<size_t>(r.layer) + 1]);
  }
};

void LlamaModel::Impl::set_shape(const ModelConfig& model_config, const ModelOptions& run_options) {
  config = model_config;
  options = run_options;
  compute = options.precision;
  L = config.n_layer;
  num_units = llama_num_units(config);
  final_unit = num_units - 1;
  tensor_size = options.parallel_groups.tensor != nullptr ? options.parallel_groups.tensor->size() : 1;
  sequence_parallel = options.sequence_parallel && tensor_size > 1;
  check_tensor_parallel(config, tensor_size);
  C = config.n_embd;
  sp = SequenceParallelRows(sequence_parallel, tensor_size,
                            tensor_size > 1 ? options.parallel_groups.tensor->rank() : 0, C);
  H = config.n_head / tensor_size;
  KV = tensor_local_kv_heads(config, tensor_size);
  hd = config.head_dim();
  Q = H * hd;
  KVD = KV * hd;
  QKV = Q + 2 * KVD;
  I = config.mlp_width() / tensor_size;
  V = config.vocab_size;
  Vp = config.padded_vocab_size();
  vocab = VocabShard::of(V, Vp, {tensor_size, tensor_size > 1 ? options.parallel_groups.tensor->rank() : 0});
  eps = config.norm_eps;
  nf4 = config.quantize_base == BaseQuant::nf4;
  lora_groups.assign(static_cast<size_t>(L), {});
  if (config.lora.enabled())
    for (int l = 0; l < L; ++l) lora_groups[static_cast<size_t>(l)] = llama_lora_groups(config, tensor_size, l);
  lora_scale = config.lora.enabled() ? config.lora.scale() : 0.0f;
  lora_width = 0;
  for (const auto& groups : lora_groups)
    for (const auto& g : groups)
      lora_width = std::max<int64_t>(lora_width, static_cast<int64_t>(g.targets.size()) * config.lora.rank);
  state = MicroBatchState(num_units);
  roles = llama_unit_roles(config);
  needs = model_family(config.family).unit_needs(config);
  moe = config.moe.enabled()
            ? std::make_unique<MoeExperts>(config, compute, false, options.activation_checkpointing,
                                           options.parallel_groups.expert)
            : nullptr;
  shared_expert = config.moe.has_shared_expert()
                      ? std::make_unique<MoeSharedExpert>(config, compute, options.activation_checkpointing)
                      : nullptr;
}

void LlamaModel::Impl::carve_activations(ArenaCarver& carver, int64_t n) {
  const DType ct = compute;
  residual.assign(static_cast<size_t>(L) + 1, nullptr);
  const int64_t nl = sequence_parallel ? n / tensor_size : n;  // residual stream rows here
  for (auto& r : residual) carver.request(&r, nl * C);
  layers.resize(options.activation_checkpointing ? 1 : static_cast<size_t>(L));
  // Ulysses and hybrid attention save their own (exchanged) q|k|v for backward, so the
  // model's q|k|v of this rank's tokens lives only through a layer's forward: one array
  // for every layer. No context attention reads the model's log-sum-exp.
  const bool qkv_per_layer = !(context && context->attention().keeps_own_qkv());
  for (size_t li = 0; li < layers.size(); ++li) {
    LayerActivations& a = layers[li];
    carver.request(&a.ln1, ct, n * C);
    carver.request(&a.rstd1, nl);
    if (config.qk_norm) {
      carver.request(&a.qk_pre, ct, n * (Q + KVD));
      carver.request(&a.rstd_q, n * H);
      carver.request(&a.rstd_k, n * KV);
    }
    if (qkv_per_layer || li == 0)
      carver.request(&a.qkv, ct, n * QKV);
    else
      carver.share(&a.qkv, &layers[0].qkv);
    carver.request(&a.att, ct, n * Q);
    if (!context) carver.request(&a.lse, n * H);  // context attention keeps its own
    carver.request(&a.res2, nl * C);
    carver.request(&a.ln2, ct, n * C);
    carver.request(&a.rstd2, nl);
    // A sparse layer's experts keep their own (MoeExperts); the one shared set of
    // activation checkpointing serves the dense layers too.
    const bool any_dense = config.moe.sparse_layers(L) < L;
    if (options.activation_checkpointing ? !any_dense : sparse(static_cast<int>(li))) continue;
    carver.request(&a.gate_up, ct, n * 2 * I);
    carver.request(&a.act, ct, n * I);
  }
  if (moe) moe->carve(carver, n);
  if (shared_expert) shared_expert->carve(carver, n);
  carver.request(&branch, n * C);
  carver.request(&lnf, ct, n * C);
  carver.request(&lnf_rstd, nl);
  carver.request(&dlnf, n * C);
  carver.request(&dres, nl * C);
  sp.carve(carver, n, C);
  carver.request(&dsmall, n * C);
  carver.request(&dmid, n * std::max(Q, I));
  carver.request(&dbig, n * std::max(QKV, 2 * I));
  if (config.qk_norm) carver.request(&dqk, n * (Q + KVD));
  if (tensor_size > 1 && config.kv_heads() % tensor_size != 0) carver.request(&dkv_replicas, n * 2 * KVD);
  if (tensor_size > 1 && config.qk_norm) carver.request(&qk_norm_grad, 2 * hd);
  carver.request(&default_positions, n);
  staged.carve(carver, n, !options.device.is_host());
  if (lora_width > 0) {
    carver.request(&lora_u, n * lora_width);
    carver.request(&lora_du, n * lora_width);
    if (ct != DType::fp32) {
      carver.request(&lora_u_c, ct, n * lora_width);
      carver.request(&lora_du_c, ct, n * lora_width);
    }
  }
  if (vocab_parallel()) {
    vocab_embedding.carve(carver, n, vocab);
    vocab_head.carve(carver, n, vocab, Vp, static_cast<int>(C), ct);
  } else {
    head.carve(carver, n, V, Vp, static_cast<int>(C), ct);
  }
  if (ct != DType::fp32) {
    carver.request(&dres_c, ct, n * C);
    carver.request(&dbig_c, ct, n * std::max(QKV, 2 * I));
  }
}

LlamaModel::LlamaModel(const ModelConfig& config, const ParamLayout& layout, int max_batch,
                       int max_seq, const ModelOptions& options, MemoryTracker& tracker)
    : impl_(std::make_unique<Impl>()) {
  config.validate();
  Impl& m = *impl_;
  m.set_shape(config, options);
  m.layout = layout;
  m.max_batch = max_batch;
  m.max_seq = max_seq;
  SHARDLM_CHECK(max_batch > 0, "model: max batch must be positive, got {}", max_batch);
  SHARDLM_CHECK(max_seq > 0 && max_seq <= config.max_seq_len,
                "model: max sequence length {} must be in [1, max_seq_len {}]", max_seq,
                config.max_seq_len);
  SHARDLM_CHECK(m.hd <= kAttentionMaxHeadDim,
                "model: head_dim {} exceeds the attention kernels' limit {}", m.hd,
                kAttentionMaxHeadDim);
  if (m.moe) {
    const bool meta = options.backend != nullptr && options.backend->is_meta();
    m.moe = std::make_unique<MoeExperts>(config, m.compute, meta, options.activation_checkpointing,
                                         options.parallel_groups.expert, !options.device.is_host(),
                                         options.expert_exchange_chunks);
    // Expert parallelism: the experts held elsewhere read nothing here.
    for (int u = 0; u < m.num_units; ++u)
      if (!m.holds(m.roles[static_cast<size_t>(u)])) m.needs[static_cast<size_t>(u)].clear();
    if (m.shared_expert)
      m.shared_expert = std::make_unique<MoeSharedExpert>(config, m.compute, options.activation_checkpointing);
  }
  check_tensor_parallel_model(layout, options, m.tensor_size);
  SHARDLM_CHECK(layout.num_model_units() == m.num_units,
                "model: layout has {} model units, the config needs {}", layout.num_model_units(),
                m.num_units);
  m.embed = layout.offset_in_model_unit(0, "model.embed_tokens.weight");
  for (int l = 0; l < m.L; ++l) {
    const int unit = llama_layer_unit(config, l);
    auto off = [&](const char* suffix) {
      return layout.offset_in_model_unit(unit, llama_param_name(l, suffix));
    };
    LayerOffsets o;
    o.ln1 = off("input_layernorm.weight");
    o.qkv_w = off("self_attn.q_proj.weight");
    if (m.nf4) {
      o.k_w = off("self_attn.k_proj.weight");
      o.v_w = off("self_attn.v_proj.weight");
      if (!m.sparse(l)) o.up_w = off("mlp.up_proj.weight");
    } else {
      SHARDLM_ASSERT(off("self_attn.v_proj.weight") == o.qkv_w + (m.Q + m.KVD) * m.C);
    }
    if (config.qkv_bias) o.qkv_b = off("self_attn.q_proj.bias");
    if (config.qk_norm) {
      o.q_norm = off("self_attn.q_norm.weight");
      o.k_norm = off("self_attn.k_norm.weight");
    }
    o.o_w = off("self_attn.o_proj.weight");
    if (config.o_bias) o.o_b = off("self_attn.o_proj.bias");
    o.ln2 = off("post_attention_layernorm.weight");
    if (m.sparse(l)) {
      o.router_w = off(moe_names(config).router_suffix().c_str());
      for (int e = 0; e < config.moe.num_experts; ++e) {
        const int eu = llama_expert_unit(config, l, e);
        const MoeNames::Expert names = moe_names(config).expert(l, e);
        const int64_t gu = layout.offset_in_model_unit(eu, names.gate);
        o.expert_up.push_back(layout.offset_in_model_unit(eu, names.up));
        SHARDLM_ASSERT(m.nf4 || o.expert_up.back() == gu + config.moe.expert_intermediate_size * m.C);
        o.experts.emplace_back(gu, layout.offset_in_model_unit(eu, names.down));
        if (llama_expert_lora(config)) {
          const int au = llama_expert_adapter_unit(config, l, e);
          LayerOffsets::ExpertAdapterOffsets a;
          auto at = [&](const char* projection, char matrix) {
            return layout.offset_in_model_unit(au, expert_lora_name(l, e, projection, matrix));
          };
          if (config.lora.targets_module("experts.gate_up_proj")) {
            a.gate_up_a = at("gate_up_proj", 'A');
            a.gate_up_b = at("gate_up_proj", 'B');
          }
          if (config.lora.targets_module("experts.down_proj")) {
            a.down_a = at("down_proj", 'A');
            a.down_b = at("down_proj", 'B');
          }
          o.expert_adapters.push_back(a);
        }
      }
      if (m.shared_expert) {
        o.shared_gu = off("mlp.shared_expert.gate_proj.weight");
        o.shared_up = off("mlp.shared_expert.up_proj.weight");
        SHARDLM_ASSERT(m.nf4 || o.shared_up == o.shared_gu + config.moe.shared_expert_intermediate_size * m.C);
        o.shared_down = off("mlp.shared_expert.down_proj.weight");
        o.shared_gate = off("mlp.shared_expert_gate.weight");
      }
    } else {
      o.gu_w = off("mlp.gate_proj.weight");
      SHARDLM_ASSERT(m.nf4 || off("mlp.up_proj.weight") == o.gu_w + m.I * m.C);
      o.down_w = off("mlp.down_proj.weight");
    }
    m.offsets.push_back(o);
    if (llama_layer_adapters(config)) {
      const int adapters = llama_adapter_unit(config, l);
      std::vector<std::pair<int64_t, std::vector<int64_t>>> groups;
      for (const auto& g : m.lora_groups[static_cast<size_t>(l)]) {
        const int64_t a = layout.offset_in_model_unit(adapters, lora_a_name(l, g.targets.front()));
        std::vector<int64_t> b;
        for (const auto& tg : g.targets) b.push_back(layout.offset_in_model_unit(adapters, lora_b_name(l, tg)));
        groups.push_back({a, b});
      }
      m.adapter_offsets.push_back(groups);
    }
  }
  m.norm_w = layout.offset_in_model_unit(m.final_unit, "model.norm.weight");
  if (!config.tie_embeddings) m.lm_head = layout.offset_in_model_unit(m.final_unit, "lm_head.weight");

  ArenaCarver carver;
  m.context = ContextParallelism::make(
      options, {static_cast<int>(m.H), static_cast<int>(m.KV), static_cast<int>(m.hd)}, max_batch,
      max_seq, m.compute, options.activation_checkpointing ? 1 : m.L, carver);
  const int local_seq = m.context ? m.context->local_len(max_seq) : max_seq;
  m.sp.check_max_tokens(max_batch, local_seq);
  m.carve_activations(carver, static_cast<int64_t>(max_batch) * local_seq);
  m.be = options.backend != nullptr ? options.backend : &backend_for(options.device);
  m.arena = carver.allocate(*m.be, tracker);
  m.tp = TensorParallelBlock(options.parallel_groups.tensor, config, m.be->stream_handle());
  m.rounding = std::make_unique<ParamRounding>(*m.be, m.compute, m.weight_scratch_elements(),
                                               m.vector_scratch_floats(), tracker);
  m.rope = std::make_unique<cpu::RopeTable>(static_cast<int>(m.hd), max_seq, config.rope_theta,
                                            config.rope_scaling, tracker);
  m.rope_view = m.rope->view();
  if (!options.device.is_host()) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(m.rope->values());
    m.rope_on_device = allocate_on(*m.be, MemCategory::other, bytes, tracker);
    m.be->copy_from_host(m.rope_on_device.data(), m.rope->data(), bytes);
    const float* cos = m.rope_on_device.as<float>();
    m.rope_view = {cos, cos + m.rope->values() / 2, m.rope_view.head_dim,
                   m.rope_view.max_positions};
  }
  if (m.nf4)
    m.dequantized = allocate_on(*m.be, MemCategory::params,
                                static_cast<size_t>(m.dequantized_bytes()), tracker);
}

LlamaModel::~LlamaModel() = default;

ModelMemoryPlan LlamaModel::plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                                        const ModelOptions& options, bool params_in_compute_type) {
  config.validate();
  Impl m;
  m.set_shape(config, options);
  ArenaCarver carver;
  m.carve_activations(carver, static_cast<int64_t>(max_batch) * max_seq);
  ModelMemoryPlan plan;
  plan.activations = carver.bytes();  // the RoPE table is "other" (not planned)
  // A QLoRA layer's fp32 norm weights arrive as stored (raw units are never rounded),
  // so the vector scratch serves them as it serves fp32 parameters; its weights go
  // through the dequantization buffer, never the weight scratch.
  plan.params_scratch = ParamRounding::planned_bytes(m.compute, m.weight_scratch_elements(),
                                                     m.vector_scratch_floats(),
                                                     params_in_compute_type) +
                        m.dequantized_bytes();
  return plan;
}

const ModelConfig& LlamaModel::config() const { return impl_->config; }
const ParamLayout& LlamaModel::layout() const { return impl_->layout; }
const ModelOptions& LlamaModel::options() const { return impl_->options; }
int LlamaModel::logits_chunk_rows() const {
  return impl_->vocab_parallel() ? impl_->vocab_head.chunk_rows() : impl_->head.chunk_rows();
}
int LlamaModel::num_units() const { return impl_->num_units; }

std::vector<int> LlamaModel::Impl::needed_units(int unit) const {
  SHARDLM_CHECK(unit >= 0 && unit < num_units, "model: unit {} out of range [0, {})", unit,
                num_units);
  return needs[static_cast<size_t>(unit)];
}

std::vector<int> LlamaModel::units_needed_for(int unit) const { return impl_->needed_units(unit); }

LayerWeights LlamaModel::Impl::layer_weights(int l, ConstTypedPtr p) const {
  const LayerOffsets& o = offsets[static_cast<size_t>(l)];
  if (nf4) {
    SHARDLM_CHECK(p.dtype == DType::fp32, "model: NF4 layer {} arrived as {}, expected its stored "
                  "words (fp32-tagged)", l, dtype_name(p.dtype));
    // Each NF4 tensor dequantized into its place in the buffer: q|k|v and gate|up come
    // out packed as the GEMMs read them.
    const TypedPtr buffer(dequantized.data(), rounding_weight_type());
    int64_t at = 0;
    auto weight = [&](int64_t offset, int64_t count) {
      const TypedPtr dst = buffer.at(at);
      be->nf4_dequantize(p.at(offset).data, count, dst);
      if (compute == DType::fp16) be->round_to(DType::fp16, dst.f32(), dst.f32(), count);
      at += count;
      return ConstTypedPtr(dst);
    };
    LayerWeights w;
    w.qkv = weight(o.qkv_w, Q * C);
    weight(o.k_w, KVD * C);
    weight(o.v_w, KVD * C);
    w.o = weight(o.o_w, C * Q);
    if (o.router_w >= 0) {
      // The router and the shared expert's gate stay fp32 words: converted to the
      // compute type in the same buffer (the weight scratch is not a QLoRA layer's);
      // the shared expert is NF4.
      auto plain = [&](int64_t offset, int64_t count) -> ConstTypedPtr {
        if (compute == DType::fp32) return p.at(offset);
        const TypedPtr dst = buffer.at(at);
        if (compute == DType::fp16) {
          be->round_to(DType::fp16, dst.f32(), p.at(offset).f32(), count);
        } else {
          be->convert(dst, p.at(offset), count);
        }
        at += count;
        return dst;
      };
      w.router = plain(o.router_w, static_cast<int64_t>(moe->experts()) * C);
      if (o.shared_gu >= 0) {
        const int64_t Is = config.moe.shared_expert_intermediate_size;
        w.shared.gate_up = weight(o.shared_gu, Is * C);
        weight(o.shared_up, Is * C);
        w.shared.down = weight(o.shared_down, C * Is);
        w.shared.gate = plain(o.shared_gate, C);
      }
      return w;
    }
    w.gate_up = weight(o.gu_w, I * C);
    weight(o.up_w, I * C);
    w.down = weight(o.down_w, C * I);
    return w;
  }
  int64_t at = 0;
  auto weight = [&](int64_t offset, int64_t count) {
    const ConstTypedPtr w = rounding->gemm_weight(p.at(offset), at, count);
    at += count;
    return w;
  };
  LayerWeights w;
  w.qkv = weight(o.qkv_w, QKV * C);
  w.o = weight(o.o_w, C * Q);
  if (o.router_w >= 0) {
    w.router = weight(o.router_w, static_cast<int64_t>(moe->experts()) * C);
    if (o.shared_gu >= 0) {
      const int64_t Is = config.moe.shared_expert_intermediate_size;
      w.shared.gate_up = weight(o.shared_gu, 2 * Is * C);
      w.shared.down = weight(o.shared_down, C * Is);
      w.shared.gate = weight(o.shared_gate, C);
    }
    return w;
  }
  w.gate_up = weight(o.gu_w, 2 * I * C);
  w.down = weight(o.down_w, C * I);
  return w;
}

ExpertWeights LlamaModel::Impl::expert_weights(int l, int e, ConstTypedPtr p, ParamPointers params,
                                              UnitPointers grads) const {
  const LayerOffsets& o = offsets[static_cast<size_t>(l)];
  const auto [gu, down] = o.experts[static_cast<size_t>(e)];
  const int64_t count = moe->expert_weight_elements() / 3;
  ExpertWeights w;
  if (nf4) {  // QLoRA: gate, up, down dequantized back to back (gate|up one matrix)
    const TypedPtr buffer(dequantized.data(), rounding_weight_type());
    auto weight = [&](int64_t offset, int64_t at) {
      const TypedPtr dst = buffer.at(at);
      be->nf4_dequantize(p.at(offset).data, count, dst);
      if (compute == DType::fp16) be->round_to(DType::fp16, dst.f32(), dst.f32(), count);
      return ConstTypedPtr(dst);
    };
    w.gate_up = weight(gu, 0);
    weight(o.expert_up[static_cast<size_t>(e)], count);
    w.down = weight(down, 2 * count);
  } else {
    w.gate_up = rounding->gemm_weight(p.at(gu), 0, 2 * count);
    w.down = rounding->gemm_weight(p.at(down), 2 * count, count);
  }
  if (o.expert_adapters.empty()) return w;
  // The adapters' converted copies follow the expert's weights in the weight scratch.
  const int unit = llama_expert_adapter_unit(config, l, e);
  const ConstTypedPtr a = params[unit];
  float* g = grads.empty() ? nullptr : grads[unit];
  const LayerOffsets::ExpertAdapterOffsets& ao = o.expert_adapters[static_cast<size_t>(e)];
  const int64_t r = config.lora.rank, Ie = config.moe.expert_intermediate_size;
  int64_t at = 3 * count;
  auto factor = [&](int64_t a_off, int64_t b_off, int64_t in, int64_t out) {
    ExpertLoraFactor f;
    f.a = rounding->gemm_weight(a.at(a_off), at, r * in);
    at += r * in;
    f.b = rounding->gemm_weight(a.at(b_off), at, out * r);
    at += out * r;
    if (g != nullptr) {
      f.grad_a = g + a_off;
      f.grad_b = g + b_off;
    }
    return f;
  };
  if (ao.gate_up_a >= 0) w.lora.gate_up = factor(ao.gate_up_a, ao.gate_up_b, C, 2 * Ie);
  if (ao.down_a >= 0) w.lora.down = factor(ao.down_a, ao.down_b, Ie, C);
  return w;
}

LayerVectors LlamaModel::Impl::layer_vectors(int l, ConstTypedPtr p) const {
  const LayerOffsets& o = offsets[static_cast<size_t>(l)];
  float* scratch = rounding->vector_scratch();
  auto vec = [&](int64_t offset, int64_t count) -> const float* {
    return offset < 0 ? nullptr : rounding->vector_values(p.at(offset), count, &scratch);
  };
  LayerVectors v;
  v.ln1 = vec(o.ln1, C);
  v.qkv_b = vec(o.qkv_b, QKV);
  v.q_norm = vec(o.q_norm, hd);
  v.k_norm = vec(o.k_norm, hd);
  v.o_b = vec(o.o_b, C);
  v.ln2 = vec(o.ln2, C);
  return v;
}

// Qwen3: q and k as the GEMM made them (with bias) are stored in the compute type, and
// each head is RMS-normalised from the stored values into qkv_f (fp32), where RoPE
// reads them.
void LlamaModel::Impl::qk_norm_forward(LayerActivations& a, const LayerVectors& v, float* qkv_f) {
  const int64_t n = N();
  be->convert_rows(a.qk_pre, Q + KVD, qkv_f, QKV, n, Q + KVD);
  be->rmsnorm_forward(qkv_f, QKV, a.rstd_q, a.qk_pre, Q + KVD, v.q_norm,
                       {n, static_cast<int>(H), static_cast<int>(hd)}, eps);
  be->rmsnorm_forward(qkv_f + Q, QKV, a.rstd_k, a.qk_pre.at(Q), Q + KVD, v.k_norm,
                       {n, static_cast<int>(KV), static_cast<int>(hd)}, eps);
}

void LlamaModel::Impl::qk_norm_backward(const LayerActivations& a, const LayerVectors& v,
                                        float* dqkv, float* dq_norm, float* dk_norm) {
  const int64_t n = N();
  be->rmsnorm_backward(dqk, Q + KVD, dq_norm, dqkv, QKV, a.qk_pre, Q + KVD, v.q_norm,
                        a.rstd_q, {n, static_cast<int>(H), static_cast<int>(hd)}, false);
  be->rmsnorm_backward(dqk + Q, Q + KVD, dk_norm, dqkv + Q, QKV, a.qk_pre.at(Q), Q + KVD,
                        v.k_norm, a.rstd_k, {n, static_cast<int>(KV), static_cast<int>(hd)}, false);
  be->convert_rows(dqkv, QKV, dqk, Q + KVD, n, Q + KVD);
}

// Index of the layer's LoRA group reading `input`, or -1 (no adapters there).
static int group_index(const LayerAdapters& ad, LoraGroup::Input input) {
  for (size_t i = 0; i < ad.size(); ++i)
    if (ad[i].group->input == input) return static_cast<int>(i);
  return -1;
}

LayerAdapters LlamaModel::Impl::layer_adapters(int l, ParamPointers params,
                                               UnitPointers grads) const {
  LayerAdapters ad;
  if (!llama_layer_adapters(config)) return ad;
  const int unit = llama_adapter_unit(config, l);
  const ConstTypedPtr p = params[unit];
  float* g = grads.empty() ? nullptr : grads[unit];
  const int64_t r = config.lora.rank;
  // The adapters' converted copies follow the layer's own weights in the weight scratch.
  int64_t at = base_weight_elements();
  const auto& offsets_l = adapter_offsets[static_cast<size_t>(l)];
  const std::vector<LoraGroup>& groups = lora_groups[static_cast<size_t>(l)];
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const LoraGroup& group = groups[gi];
    const auto& [a_off, b_offs] = offsets_l[gi];
    GroupAdapters ga;
    ga.group = &group;
    const int64_t a_count = static_cast<int64_t>(group.targets.size()) * r * group.in;
    ga.a = rounding->gemm_weight(p.at(a_off), at, a_count);
    at += a_count;
    ga.grad_a = g != nullptr ? g + a_off : nullptr;
    for (size_t ti = 0; ti < group.targets.size(); ++ti) {
      const int64_t b_count = group.targets[ti].out * r;
      ga.b.push_back(rounding->gemm_weight(p.at(b_offs[ti]), at, b_count));
      at += b_count;
      ga.grad_b.push_back(g != nullptr ? g + b_offs[ti] : nullptr);
    }
    ad.push_back(std::move(ga));
  }
  return ad;
}

void LlamaModel::Impl::lora_forward(size_t gi, const LayerAdapters& ad, ConstTypedPtr x,
                                    float* out) {
  const GroupAdapters& w = ad[gi];
  const LoraGroup& g = *w.group;
  const int rows = static_cast<int>(N()), r = config.lora.rank, in = static_cast<int>(g.in);
  const int width = static_cast<int>(g.targets.size()) * r;
  gemm_forward(rows, width, in, 1.0f, x, in, w.a, 0.0f, lora_u, width);  // u = x A^T
  const ConstTypedPtr u = rounding->for_gemm(lora_u, lora_u_c, N() * width);
  for (size_t ti = 0; ti < g.targets.size(); ++ti) {
    const LoraTarget& tg = g.targets[ti];
    gemm_forward(rows, static_cast<int>(tg.out), r, lora_scale, u.at(static_cast<int64_t>(ti) * r),
                 width, w.b[ti], 1.0f, out + tg.out_offset, static_cast<int>(g.out_width));
  }
}

// y += s u B^T, u = x A^T: dB += s dy^T u; du = s dy B; dA += du^T x; dx += du A.
// Under tensor parallelism a row-parallel base's (o, down) x and A are this rank's
// input columns: u is a partial sum (summed here before dB; the forward's s u B^T joins
// the base's partial sum instead). A column-parallel base's (q|k|v, gate|up) dy and B
// are its output columns: du is a partial sum, which dx takes as it is (dx is summed
// over the group after the layer's GEMMs) and dA after the sum.
void LlamaModel::Impl::lora_b_backward(size_t gi, const LayerAdapters& ad, ConstTypedPtr x,
                                       ConstTypedPtr dy) {
  const GroupAdapters& w = ad[gi];
  const LoraGroup& g = *w.group;
  const int rows = static_cast<int>(N()), r = config.lora.rank, in = static_cast<int>(g.in);
  const int width = static_cast<int>(g.targets.size()) * r, out_w = static_cast<int>(g.out_width);
  const bool row_parallel = g.input == LoraGroup::Input::attention || g.input == LoraGroup::Input::act;
  be->gemm(false, true, rows, width, in, 1.0f, x, in, w.a, in, 0.0f, lora_u, width);  // recomputed
  if (row_parallel) tp.sum_partial(lora_u, N() * width, "tensor.lora_u");
  const ConstTypedPtr u = rounding->for_gemm(lora_u, lora_u_c, N() * width);
  for (size_t ti = 0; ti < g.targets.size(); ++ti) {
    const LoraTarget& tg = g.targets[ti];
    be->gemm(true, false, static_cast<int>(tg.out), r, rows, lora_scale, dy.at(tg.out_offset), out_w,
             u.at(static_cast<int64_t>(ti) * r), width, 1.0f, w.grad_b[ti], r);
  }
}

void LlamaModel::Impl::lora_input_backward(size_t gi, const LayerAdapters& ad, ConstTypedPtr x,
                                           ConstTypedPtr dy, float* dx) {
  const GroupAdapters& w = ad[gi];
  const LoraGroup& g = *w.group;
  const int rows = static_cast<int>(N()), r = config.lora.rank, in = static_cast<int>(g.in);
  const int width = static_cast<int>(g.targets.size()) * r, out_w = static_cast<int>(g.out_width);
  const bool row_parallel = g.input == LoraGroup::Input::attention || g.input == LoraGroup::Input::act;
  for (size_t ti = 0; ti < g.targets.size(); ++ti) {
    const LoraTarget& tg = g.targets[ti];
    be->gemm(false, false, rows, r, static_cast<int>(tg.out), lora_scale, dy.at(tg.out_offset), out_w,
             w.b[ti], r, 0.0f, lora_du + static_cast<int64_t>(ti) * r, width);
  }
  if (row_parallel || !tp.active()) {
    const ConstTypedPtr du = rounding->for_gemm(lora_du, lora_du_c, N() * width);
    be->gemm(true, false, width, in, rows, 1.0f, du, width, x, in, 1.0f, w.grad_a, in);
    be->gemm(false, false, rows, in, width, 1.0f, du, width, w.a, in, 1.0f, dx, in);
    return;
  }
  const ConstTypedPtr own = rounding->for_gemm(lora_du, lora_du_c, N() * width);
  be->gemm(false, false, rows, in, width, 1.0f, own, width, w.a, in, 1.0f, dx, in);
  tp.sum_partial(lora_du, N() * width, "tensor.lora_du");
  const ConstTypedPtr du = rounding->for_gemm(lora_du, lora_du_c, N() * width);
  be->gemm(true, false, width, in, rows, 1.0f, du, width, x, in, 1.0f, w.grad_a, in);
}

SharedExpertLora LlamaModel::Impl::shared_expert_lora(const LayerAdapters& ad) {
  SharedExpertLora lora;
  const int gu = group_index(ad, LoraGroup::Input::ln2), down = group_index(ad, LoraGroup::Input::act);
  if (gu >= 0) {
    const auto g = static_cast<size_t>(gu);
    lora.gate_up_forward = [this, &ad, g](ConstTypedPtr x, float* y) { lora_forward(g, ad, x, y); };
    lora.gate_up_backward = [this, &ad, g](ConstTypedPtr x, ConstTypedPtr dy, float* dx) {
      lora_backward(g, ad, x, dy, dx);
    };
  }
  if (down >= 0) {
    const auto g = static_cast<size_t>(down);
    lora.down_forward = [this, &ad, g](ConstTypedPtr x, float* y) { lora_forward(g, ad, x, y); };
    lora.down_backward = [this, &ad, g](ConstTypedPtr x, ConstTypedPtr dy, float* dx) {
      lora_backward(g, ad, x, dy, dx);
    };
  }
  return lora;
}

void LlamaModel::Impl::layer_forward(int l, const LayerVectors& v, const LayerWeights& w,
                                     const LayerAdapters& ad, bool recompute) {
  LayerActivations& a = acts(l);
  const float* x = residual[static_cast<size_t>(l)];
  const int64_t n = N();
  const int rows = static_cast<int>(n);
  // LoRA groups by the activation they read (-1: none).
  const int lora_qkv = group_index(ad, LoraGroup::Input::ln1);
  const int lora_o = group_index(ad, LoraGroup::Input::attention);
  const int lora_gu = group_index(ad, LoraGroup::Input::ln2);
  const int lora_down = group_index(ad, LoraGroup::Input::act);
  be->rmsnorm_forward(block_of(a.ln1), C, a.rstd1, x, C, v.ln1, {NL(), 1, static_cast<int>(C)}, eps);
  gather(a.ln1, "tensor.sequence_ln1");
  // q|k|v in one GEMM over the packed [QKV, C] projection (HF's [out, in] weights).
  float* qkv_f = dbig;
  gemm_forward(rows, static_cast<int>(QKV), static_cast<int>(C), 1.0f, a.ln1, static_cast<int>(C),
               w.qkv, 0.0f, qkv_f, static_cast<int>(QKV));
  if (lora_qkv >= 0) lora_forward(static_cast<size_t>(lora_qkv), ad, a.ln1, qkv_f);
  if (v.qkv_b != nullptr) be->add_bias(qkv_f, v.qkv_b, n, static_cast<int>(QKV));
  if (config.qk_norm) qk_norm_forward(a, v, qkv_f);
  // Attention reads q and k after RoPE, and v, as stored (rounded), as backward will.
  be->rope_forward(a.qkv, QKV, qkv_f, QKV, n, static_cast<int>(H), static_cast<int>(hd),
                    positions, rope_view);
  be->rope_forward(a.qkv.at(Q), QKV, qkv_f + Q, QKV, n, static_cast<int>(KV),
                    static_cast<int>(hd), positions, rope_view);
  be->convert_rows(a.qkv.at(Q + KVD), QKV, qkv_f + Q + KVD, QKV, n, KVD);
  if (kv != nullptr)
    cached_attention(l, a);
  else if (context)
    context->attention().forward(options.activation_checkpointing ? 0 : l, *be, a.qkv, a.att, state.B);
  else
    be->attention_forward(a.att, a.lse, a.qkv, attention_shape(), key_begin);
  gemm_forward(rows, static_cast<int>(C), static_cast<int>(Q), 1.0f, a.att, static_cast<int>(Q),
               w.o, 0.0f, branch, static_cast<int>(C));
  if (lora_o >= 0) lora_forward(static_cast<size_t>(lora_o), ad, a.att, branch);
  const float* attention_out = sum_rows(branch, "tensor.attention_out");  // o_proj: row-parallel
  be->residual_rmsnorm_forward(a.res2, block_of(a.ln2), a.rstd2, x, attention_out, v.o_b, v.ln2,
                                NL(), static_cast<int>(C), eps);
  gather(a.ln2, "tensor.sequence_ln2");
  if (sparse(l)) {
    // Recomputation (activation checkpointing) needs r and h2 again, and the shared
    // expert's activations; the routing is kept.
    const SharedExpertLora shared_lora = shared_expert_lora(ad);
    if (recompute) {
      if (shared_expert)
        shared_expert->forward(l, *be, options.row_by_row_gemm, a.ln2, w.shared, n, nullptr, shared_lora);
      return;
    }
    // The router; the experts' units add their outputs to y = r (+ the shared expert's).
    gemm_forward(rows, moe->experts(), static_cast<int>(C), 1.0f, a.ln2, static_cast<int>(C),
                 w.router, 0.0f, moe->router_logits(), moe->experts());
    moe->route(l, n, *be);
    moe->dispatch(l, *be, a.ln2);
    if (options.activation_checkpointing) moe->keep_h2(l, *be, a.ln2);
    float* y = residual[static_cast<size_t>(l) + 1];
    be->convert_rows(y, C, a.res2, C, n, C);
    if (shared_expert) shared_expert->forward(l, *be, options.row_by_row_gemm, a.ln2, w.shared, n, y, shared_lora);
    return;
  }
  float* gu_f = compute == DType::fp32 ? a.gate_up.f32() : dbig;
  gemm_forward(rows, static_cast<int>(2 * I), static_cast<int>(C), 1.0f, a.ln2, static_cast<int>(C),
               w.gate_up, 0.0f, gu_f, static_cast<int>(2 * I));
  if (lora_gu >= 0) lora_forward(static_cast<size_t>(lora_gu), ad, a.ln2, gu_f);
  be->swiglu_forward(a.act, a.gate_up, gu_f, n, static_cast<int>(I));
  if (recompute) return;
  gemm_forward(rows, static_cast<int>(C), static_cast<int>(I), 1.0f, a.act, static_cast<int>(I),
               w.down, 0.0f, branch, static_cast<int>(C));
  if (lora_down >= 0) lora_forward(static_cast<size_t>(lora_down), ad, a.act, branch);
  const float* mlp_out = sum_rows(branch, "tensor.mlp_out");  // down_proj is row-parallel
  be->residual_add_bias(residual[static_cast<size_t>(l) + 1], a.res2, mlp_out, nullptr, NL(),
                         static_cast<int>(C));
}

void LlamaModel::Impl::cached_attention(int l, LayerActivations& a) {
  const int past = kv->length();
  const int64_t n = N();
  be->convert_rows(kv->key_row(l, past), KVD, a.qkv.at(Q), QKV, n, KVD);
  be->convert_rows(kv->value_row(l, past), KVD, a.qkv.at(Q + KVD), QKV, n, KVD);
  AttentionShape s = attention_shape();
  be->attention_forward_cached(a.att, a.qkv, QKV, kv->keys(l), kv->values(l), KVD, s, past);
}

// On entry dres holds dLoss/d(layer output); on exit dLoss/d(layer input). Weight
// gradients accumulate into g through the GEMMs' beta = 1; for y = x W^T (W [out, in])
// dW += dy^T x and dx = dy W. A frozen layer (g null: LoRA's base) computes only the
// input gradients, and its adapters' gradients.
void LlamaModel::Impl::mlp_backward(int l, const LayerVectors& v, const LayerWeights& w,
                                    const LayerAdapters& ad, float* g, double aux_weight) {
  const LayerOffsets& o = offsets[static_cast<size_t>(l)];
  const LayerActivations& a = acts(l);
  const int64_t n = N();
  const int rows = static_cast<int>(n);
  const int c = static_cast<int>(C), i2 = static_cast<int>(2 * I), i1 = static_cast<int>(I);
  const bool trains = g != nullptr;
  auto grad = [&](int64_t offset) { return trains && offset >= 0 ? g + offset : nullptr; };
  if (sparse(l)) {
    // The experts' backward ran (their units come after this one): add the router's
    // share of dLoss/dh2 to theirs.
    const int e = moe->experts();
    const ConstTypedPtr dz = moe->router_backward(l, *be, aux_weight, *rounding);
    if (trains) be->gemm(true, false, e, c, rows, 1.0f, dz, e, a.ln2, c, 1.0f, g + o.router_w, c);
    float* dln2 = moe->h2_gradient();
    be->gemm(false, false, rows, c, e, 1.0f, dz, e, w.router, c, 1.0f, dln2, c);
    if (shared_expert)
      shared_expert->backward(l, *be, *rounding, a.ln2, w.shared, dres, grad(o.shared_gu),
                              grad(o.shared_down), grad(o.shared_gate), dln2, shared_expert_lora(ad));
    be->rmsnorm_backward(dres, C, grad(o.ln2), dln2, C, a.res2, C, v.ln2, a.rstd2, {n, 1, c},
                          /*accumulate_dx=*/true);
    return;
  }
  const int lora_gu = group_index(ad, LoraGroup::Input::ln2);
  const int lora_down = group_index(ad, LoraGroup::Input::act);
  // MLP: y = r + (silu(g) * u) Wdown^T
  ConstTypedPtr dy = rounding->for_gemm(whole_dres(), dres_c, n * C);
  if (trains) be->gemm(true, false, c, i1, rows, 1.0f, dy, c, a.act, i1, 1.0f, g + o.down_w, i1);
  float* dact = dmid;
  be->gemm(false, false, rows, i1, c, 1.0f, dy, c, w.down, i1, 0.0f, dact, i1);
  if (lora_down >= 0) lora_backward(static_cast<size_t>(lora_down), ad, a.act, dy, dact);
  float* dgu = dbig;
  be->swiglu_backward(dgu, dact, a.gate_up, n, i1);
  const ConstTypedPtr dgu_g = rounding->for_gemm(dgu, dbig_c, n * 2 * I);
  float* dln2 = dsmall;
  be->gemm(false, false, rows, c, i2, 1.0f, dgu_g, i2, w.gate_up, c, 0.0f, dln2, c);
  if (lora_gu >= 0) lora_backward(static_cast<size_t>(lora_gu), ad, a.ln2, dgu_g, dln2);
  // gate|up is column-parallel: the input gradient's sum travels during the weight gradient.
  SequenceParallelRows::PendingRows dln2_sum = sp.start_sum_rows(tp, dln2, n, "tensor.mlp_in_grad");
  if (trains) be->gemm(true, false, i2, c, rows, 1.0f, dgu_g, i2, a.ln2, c, 1.0f, g + o.gu_w, c);
  const float* dln2_rows = dln2_sum.finish();
  be->rmsnorm_backward(dres, C, norm_grad_target(grad(o.ln2)), dln2_rows, C, a.res2, C, v.ln2,
                        a.rstd2, {NL(), 1, c}, /*accumulate_dx=*/true);
  finish_norm_grad(grad(o.ln2));
}

void LlamaModel::Impl::layer_backward(int l, const LayerVectors& v, const LayerWeights& w,
                                      const LayerAdapters& ad, float* g, double aux_weight) {
  const LayerOffsets& o = offsets[static_cast<size_t>(l)];
  const LayerActivations& a = acts(l);
  const float* x = residual[static_cast<size_t>(l)];
  const int64_t n = N();
  const int rows = static_cast<int>(n);
  const int c = static_cast<int>(C), q = static_cast<int>(Q), qkv = static_cast<int>(QKV);
  const bool trains = g != nullptr;
  auto grad = [&](int64_t offset) { return trains && offset >= 0 ? g + offset : nullptr; };
  const int lora_qkv = group_index(ad, LoraGroup::Input::ln1);
  const int lora_o = group_index(ad, LoraGroup::Input::attention);
  mlp_backward(l, v, w, ad, g, aux_weight);

  // Attention: r = x + attention(...) Wo^T (+ b_o)
  const float* dy_f = whole_dres();
  ConstTypedPtr dy = rounding->for_gemm(dy_f, dres_c, n * C);
  if (trains) be->gemm(true, false, c, q, rows, 1.0f, dy, c, a.att, q, 1.0f, g + o.o_w, q);
  if (trains && o.o_b >= 0) be->bias_backward(g + o.o_b, dy_f, n, c);
  float* datt = dmid;
  be->gemm(false, false, rows, q, c, 1.0f, dy, c, w.o, q, 0.0f, datt, q);
  if (lora_o >= 0) lora_backward(static_cast<size_t>(lora_o), ad, a.att, dy, datt);
  float* dqkv = dbig;
  if (context)
    context->attention().backward(options.activation_checkpointing ? 0 : l, *be, datt, dqkv, state.B);
  else
    be->attention_backward(dqkv, datt, a.qkv, a.att, a.lse, attention_shape(), key_begin);
  be->rope_backward(dqkv, QKV, dqkv, QKV, n, static_cast<int>(H), static_cast<int>(hd), positions,
                     rope_view);
  be->rope_backward(dqkv + Q, QKV, dqkv + Q, QKV, n, static_cast<int>(KV), static_cast<int>(hd),
                     positions, rope_view);
  if (config.qk_norm) {
    if (tp.active()) {
      // Whole per-head norm weights that saw this rank's heads only: a partial sum.
      be->fill_zero(qk_norm_grad, sizeof(float) * static_cast<size_t>(2 * hd));
      qk_norm_backward(a, v, dqkv, qk_norm_grad, qk_norm_grad + hd);
      tp.sum_partial(qk_norm_grad, 2 * hd, "tensor.qk_norm_grad");
      if (trains) be->accumulate(g + o.q_norm, qk_norm_grad, hd);
      if (trains) be->accumulate(g + o.k_norm, qk_norm_grad + hd, hd);
    } else {
      qk_norm_backward(a, v, dqkv, grad(o.q_norm), grad(o.k_norm));
    }
  }
  float* dln1 = dsmall;
  if (tp.replicates_kv()) {
    // The input gradient takes this rank's own share of its replicated key/value head;
    // the head's weight and bias gradients take every replica's.
    const ConstTypedPtr own = rounding->for_gemm(dqkv, dbig_c, n * QKV);
    be->gemm(false, false, rows, c, qkv, 1.0f, own, qkv, w.qkv, c, 0.0f, dln1, c);
    if (lora_qkv >= 0) lora_input_backward(static_cast<size_t>(lora_qkv), ad, a.ln1, own, dln1);
    be->convert_rows(dkv_replicas, 2 * KVD, dqkv + Q, QKV, n, 2 * KVD);
    tp.sum_kv_replicas(dkv_replicas, n * 2 * KVD, "tensor.kv_replicas_grad");
    be->convert_rows(dqkv + Q, QKV, dkv_replicas, 2 * KVD, n, 2 * KVD);
  }
  if (trains && o.qkv_b >= 0) be->bias_backward(g + o.qkv_b, dqkv, n, qkv);
  const ConstTypedPtr dqkv_g = rounding->for_gemm(dqkv, dbig_c, n * QKV);
  if (!tp.replicates_kv())
    be->gemm(false, false, rows, c, qkv, 1.0f, dqkv_g, qkv, w.qkv, c, 0.0f, dln1, c);
  if (lora_qkv >= 0 && tp.replicates_kv())
    lora_b_backward(static_cast<size_t>(lora_qkv), ad, a.ln1, dqkv_g);
  else if (lora_qkv >= 0)
    lora_backward(static_cast<size_t>(lora_qkv), ad, a.ln1, dqkv_g, dln1);
  // q|k|v is column-parallel: the input gradient's sum travels during the weight gradient.
  SequenceParallelRows::PendingRows dln1_sum = sp.start_sum_rows(tp, dln1, n, "tensor.attention_in_grad");
  if (trains) be->gemm(true, false, qkv, c, rows, 1.0f, dqkv_g, qkv, a.ln1, c, 1.0f, g + o.qkv_w, c);
  const float* dln1_rows = dln1_sum.finish();
  be->rmsnorm_backward(dres, C, norm_grad_target(grad(o.ln1)), dln1_rows, C, x, C, v.ln1, a.rstd1,
                        {NL(), 1, c}, /*accumulate_dx=*/true);
  finish_norm_grad(grad(o.ln1));
}

void LlamaModel::Impl::final_forward(ParamPointers params, UnitPointers grads,
                                     const MicroBatch& batch, bool training, float grad_scale) {
  const ConstTypedPtr p = params[final_unit];
  float* scratch = rounding->vector_scratch();
  const float* weight = rounding->vector_values(p.at(norm_w), C, &scratch);
  const int64_t n = N();
  be->rmsnorm_forward(block_of(lnf), C, lnf_rstd, residual[static_cast<size_t>(L)], C, weight,
                       {NL(), 1, static_cast<int>(C)}, eps);
  gather(lnf, "tensor.sequence_lnf");
  if (batch.targets == nullptr) {
    SHARDLM_CHECK(!training, "model: a training forward needs targets");
    state.finish_forward(false);
    return;
  }
  state.target_count = count_targets(batch.targets, n, V);
  if (moe && context) moe->sum_load_balance(*options.parallel_groups.context);
  aux_loss = moe ? moe->aux_loss() : 0.0;
  if (moe) expert_tokens = moe->assignments_per_expert();
  float* dhead = nullptr;  // stays null for a frozen head (LoRA): dlnf is still needed
  if (training && !config.lora.enabled()) {
    const int head_unit = lm_head < 0 ? 0 : final_unit;
    check_grad_pointer(grads, num_units, head_unit);
    check_grad_pointer(grads, num_units, final_unit);
    dhead = grads[head_unit] + (lm_head < 0 ? embed : lm_head);
  }
  state.loss_sum = vocab_parallel()
                       ? vocab_head.loss(*be, tp, lnf, head_weights(params), staged.targets,
                                         batch.targets, n,
                                         grad_scale, training ? dlnf : nullptr, dhead,
                                         sequence_parallel)
                       : head.loss(*be, lnf, head_weights(params), staged.targets, n, grad_scale,
                                   training ? dlnf : nullptr, dhead);
  state.finish_forward(training);
}

void LlamaModel::forward_unit(int unit, ParamPointers params, UnitPointers grads,
                              const MicroBatch& full, bool training, float grad_scale) {
  Impl& m = *impl_;
  check_param_pointers(params, m.num_units, m.needed_units(unit), unit, m.compute);
  const LlamaUnitRole role = m.role(unit);
  const MicroBatch& batch = m.local_batch(full, role.kind == LlamaUnitRole::Kind::embeddings);
  if (role.kind == LlamaUnitRole::Kind::embeddings) {
    check_micro_batch(full, m.max_batch, m.max_seq, m.V);  // the whole rows, as given
    m.sp.check_tokens(batch.B, batch.T);
    m.state.start(batch);
    m.staged.stage(*m.be, batch, /*default_positions=*/true);
    if (m.be->device().is_host()) {
      const int64_t n = m.N();
      // (The meta device has no arena to write: plan runs this step on it.)
      if (!m.be->is_meta())
        for (int64_t i = 0; i < n; ++i) m.default_positions[i] = static_cast<int32_t>(i % batch.T);
      m.positions = batch.positions != nullptr ? batch.positions : m.default_positions;
    } else {
      m.positions = m.staged.positions;
    }
    m.key_begin = m.staged.key_begin;
    m.embed_forward(params[0], batch.B, batch.T);
    return;
  }
  m.state.check_forward(unit, batch);
  switch (role.kind) {
    case LlamaUnitRole::Kind::adapters:
    case LlamaUnitRole::Kind::expert_adapters:
      return;  // read by its layer or expert
    case LlamaUnitRole::Kind::expert:
      m.expert_forward(role, params);
      return;
    case LlamaUnitRole::Kind::layer: {
      const ConstTypedPtr p = params[unit];
      m.layer_forward(role.layer, m.layer_vectors(role.layer, p), m.layer_weights(role.layer, p),
                      m.layer_adapters(role.layer, params, {}), /*recompute=*/false);
      return;
    }
    default:
      m.final_forward(params, grads, batch, training, grad_scale);
  }
}

void LlamaModel::backward_unit(int unit, ParamPointers params, UnitPointers grads,
                               const MicroBatch& full) {
  Impl& m = *impl_;
  const MicroBatch& batch = m.local_batch(full, /*starts=*/false);
  m.state.begin_backward(unit, batch);
  check_param_pointers(params, m.num_units, m.needed_units(unit), unit, m.compute);
  const LlamaUnitRole role = m.role(unit);
  const bool base_trains = !m.config.lora.enabled();
  // A frozen unit has no gradient buffer; a trainable one must have one.
  if ((base_trains && m.holds(role)) || role.kind == LlamaUnitRole::Kind::adapters ||
      (role.kind == LlamaUnitRole::Kind::expert_adapters && m.holds(role)))
    check_grad_pointer(grads, m.num_units, unit);
  float* g = base_trains ? grads[unit] : nullptr;
  const ConstTypedPtr p = params[unit];
  switch (role.kind) {
    case LlamaUnitRole::Kind::final: {
      float* scratch = m.rounding->vector_scratch();
      const float* weight = m.rounding->vector_values(p.at(m.norm_w), m.C, &scratch);
      const int64_t nl = m.NL();
      float* g_norm = g != nullptr ? g + m.norm_w : nullptr;
      m.be->fill_zero(m.dres, sizeof(float) * static_cast<size_t>(nl * m.C));
      m.be->rmsnorm_backward(m.dres, m.C, m.norm_grad_target(g_norm), m.dlnf + m.block_offset(), m.C,
                            m.residual[static_cast<size_t>(m.L)], m.C, weight, m.lnf_rstd,
                            {nl, 1, static_cast<int>(m.C)}, /*accumulate_dx=*/true);
      m.finish_norm_grad(g_norm);
      return;
    }
    case LlamaUnitRole::Kind::layer: {
      if (llama_layer_adapters(m.config))
        check_grad_pointer(grads, m.num_units, llama_adapter_unit(m.config, role.layer));
      // One conversion serves the recompute and the backward.
      const LayerVectors v = m.layer_vectors(role.layer, p);
      const LayerWeights w = m.layer_weights(role.layer, p);
      const LayerAdapters ad = m.layer_adapters(role.layer, params, grads);
      if (m.options.activation_checkpointing) m.layer_forward(role.layer, v, w, ad, /*recompute=*/true);
      m.layer_backward(role.layer, v, w, ad, g,
                       m.config.moe.aux_loss_coef() * static_cast<double>(batch.aux_loss_share));
      return;
    }
    case LlamaUnitRole::Kind::expert: {
      const bool held = m.holds(role);
      if (held && llama_expert_lora(m.config))
        check_grad_pointer(grads, m.num_units, llama_expert_adapter_unit(m.config, role.layer, role.expert));
      const ExpertWeights w = held ? m.expert_weights(role.layer, role.expert, p, params, grads) : ExpertWeights{};
      if (!held) g = nullptr;
      const auto [gu, down] = m.offsets[static_cast<size_t>(role.layer)].experts[static_cast<size_t>(role.expert)];
      m.moe->expert_backward(role.layer, role.expert, *m.be, *m.rounding, m.expert_input(role.layer), w,
                             m.dres, g != nullptr ? g + gu : nullptr, g != nullptr ? g + down : nullptr);
      return;
    }
    case LlamaUnitRole::Kind::adapters:
    case LlamaUnitRole::Kind::expert_adapters:
      return;  // its gradients came from its layer's (expert's) backward
    case LlamaUnitRole::Kind::embeddings:
      if (g == nullptr) return;
      if (m.vocab_parallel())
        m.vocab_embedding.backward(*m.be, g + m.embed, m.whole_dres(), m.staged.tokens, m.state.B,
                                   m.state.T, static_cast<int>(m.C));
      else
        m.be->embedding_backward(g + m.embed, nullptr, m.dres, m.staged.tokens, m.state.B,
                                 m.state.T, static_cast<int>(m.C), nullptr);
      return;
  }
}

KvCache LlamaModel::make_kv_cache(int capacity) const {
  const Impl& m = *impl_;
  SHARDLM_CHECK(capacity >= 1 && capacity <= m.max_seq,
                "model: a KV cache of {} positions; the model was built for [1, {}]", capacity,
                m.max_seq);
  return KvCache(*m.be, m.L, capacity, m.KVD, m.compute);
}

void LlamaModel::forward_unit_cached(int unit, ParamPointers params, KvCache& cache,
                                     const MicroBatch& batch) {
  Impl& m = *impl_;
  check_param_pointers(params, m.num_units, m.needed_units(unit), unit, m.compute);
  SHARDLM_CHECK(!m.context, "model: generation with a KV cache runs on one rank; this model "
                "splits its sequences over a context group");
  SHARDLM_CHECK(!m.sequence_parallel, "model: generation with a KV cache does not split its "
                "tokens; this model was built with sequence parallelism");
  const LlamaUnitRole role = m.role(unit);
  switch (role.kind) {
    case LlamaUnitRole::Kind::embeddings: {
      m.kv_positions = start_cached_step(batch, cache, m.L, m.KVD, m.compute, m.max_seq, m.V);
      SHARDLM_CHECK(m.be->device().is_host(), "model: generation with a KV cache runs on the "
                    "CPU; this model runs on {}", m.be->description());
      m.state.start(batch);
      m.staged.stage(*m.be, batch, /*default_positions=*/true);
      m.positions = m.kv_positions.data();
      m.key_begin = nullptr;
      m.embed_forward(params[0], 1, batch.T);
      return;
    }
    case LlamaUnitRole::Kind::adapters:
    case LlamaUnitRole::Kind::expert_adapters:
      m.state.check_forward(unit, batch);
      return;  // read by its layer or expert
    case LlamaUnitRole::Kind::expert:
      m.state.check_forward(unit, batch);
      m.expert_forward(role, params);
      return;
    case LlamaUnitRole::Kind::layer: {
      m.state.check_forward(unit, batch);
      const ConstTypedPtr p = params[unit];
      m.kv = &cache;
      try {
        m.layer_forward(role.layer, m.layer_vectors(role.layer, p), m.layer_weights(role.layer, p),
                        m.layer_adapters(role.layer, params, {}), /*recompute=*/false);
      } catch (...) {
        m.kv = nullptr;
        throw;
      }
      m.kv = nullptr;
      return;
    }
    default:
      m.state.check_forward(unit, batch);
      m.final_forward(params, {}, batch, /*training=*/false, 0.0f);
      cache.advance(batch.T);
  }
}

double LlamaModel::last_loss_sum() const { return impl_->state.loss_sum; }
double LlamaModel::last_aux_loss() const { return impl_->aux_loss; }
std::vector<double> LlamaModel::last_expert_tokens() const { return impl_->expert_tokens; }
int64_t LlamaModel::last_target_count() const { return impl_->state.target_count; }

void LlamaModel::logits_at(ParamPointers params, int t, float* out) const {
  const Impl& m = *impl_;
  m.state.check_logits_at(t);
  check_param_pointers(params, m.num_units, m.needed_units(m.final_unit), m.final_unit, m.compute);
  // Row b's hidden state at position t is lnf[(b*T + t)*C]: a strided [B, C] matrix.
  const ConstTypedPtr x = m.lnf.at(static_cast<int64_t>(t) * m.C);
  const int64_t ld = static_cast<int64_t>(m.state.T) * m.C;
  if (m.vocab_parallel())
    m.vocab_head.logits(*m.be, m.tp, x, ld, m.state.B, m.head_weights(params), out);
  else
    m.head.logits(*m.be, x, ld, m.state.B, m.head_weights(params), out);
}

}  // namespace shardlm
