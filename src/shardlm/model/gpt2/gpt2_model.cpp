#include "shardlm/model/gpt2/gpt2_model.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <type_traits>

#include "shardlm/backend/backend.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/context_parallel/context_parallelism.hpp"
#include "shardlm/model/gpt2/gpt2_family.hpp"
#include "shardlm/model/model_support.hpp"
#include "shardlm/model/tensor_parallel/sequence_parallel_rows.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_parallel_block.hpp"
#include "shardlm/model/tensor_parallel/vocab_parallel.hpp"

namespace shardlm {

namespace {

// Offsets (elements) of a block's parameters inside its unit buffer.
struct BlockOffsets {
  int64_t ln1_w, ln1_b, attn_w, attn_b, attn_proj_w, attn_proj_b;
  int64_t ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
};

// What a block's backward reads, saved by its forward. Without activation
// checkpointing every layer has its own set; with it all layers share one set, which
// block l's backward refills by recomputing block l's forward from residual[l].
// Tensors are in the compute type except the residual stream and the statistics.
struct BlockActivations {
  TypedPtr ln1;               // [N, C]
  float* ln1_mean = nullptr;  // [N]
  float* ln1_rstd = nullptr;  // [N]
  TypedPtr qkv;               // [N, 3A] (biased)
  TypedPtr att;               // [N, A] attention output, before c_proj
  float* att_lse = nullptr;   // [B, H, T] (this tensor rank's heads)
  float* res2 = nullptr;      // [N, C] fp32: residual after the attention branch
  TypedPtr ln2;               // [N, C]
  float* ln2_mean = nullptr;  // [N]
  float* ln2_rstd = nullptr;  // [N]
  TypedPtr fc_pre;            // [N, F] c_fc output with bias (GELU input)
  TypedPtr fc_act;            // [N, F] GELU output
};

// A block's four GEMM weights as the GEMMs read them: the parameters themselves when
// they arrive in the weight type, else their converted copies in the weight scratch.
struct BlockWeights {
  ConstTypedPtr attn, attn_proj, fc, fc_proj;
};

// A block's vectors (biases, LayerNorm weights) as fp32 values of the compute type:
// the parameters themselves in an fp32 run, else rounded or widened copies in the
// vector scratch.
struct BlockVectors {
  const float *ln1_w, *ln1_b, *attn_b, *attn_proj_b, *ln2_w, *ln2_b, *fc_b, *fc_proj_b;
};

}  // namespace

struct Gpt2Model::Impl {
  ModelConfig config;
  ParamLayout layout;
  ModelOptions options;
  int max_batch = 0;
  int max_seq = 0;
  int L = 0, C = 0, V = 0, Vp = 0;
  // This tensor rank's share of the block (the whole model's without tensor parallelism):
  // H attention heads of A = H x head_dim channels, F MLP channels (shape comments: [N, A]).
  int H = 0, A = 0, F = 0;
  int final_unit = 0;
  // Tensor parallelism (tensor_layout.hpp's gpt2 rules): c_attn and c_fc column-parallel,
  // the c_proj weights row-parallel (their outputs summed over the group before the bias
  // and the residual add), wte and the LM head vocabulary-parallel.
  int tensor_size = 1;
  TensorParallelBlock tp;  // the tensor group's collectives (no-ops alone)
  // Sequence parallelism (options.sequence_parallel with T > 1): this rank's block of
  // N / T tokens of the residual stream, its LayerNorms and residual adds
  // (sequence_parallel_rows.hpp); the rest of the block runs on every token.
  bool sequence_parallel = false;
  SequenceParallelRows sp;
  VocabShard vocab;
  VocabParallelEmbedding vocab_embedding;
  VocabParallelHead vocab_head;
  bool vocab_parallel() const { return tensor_size > 1; }
  // Rows of the head weight the GEMMs read: the real vocabulary, or this rank's real rows.
  int64_t head_rows() const { return vocab_parallel() ? vocab.real : V; }
  // Type of the GEMM inputs kept as activations and of the activation gradients
  // that feed GEMMs.
  DType compute = DType::fp32;

  // Parameter offsets.
  int64_t wte = 0, wpe = 0;
  std::vector<BlockOffsets> block_offsets;
  int64_t lnf_w = 0, lnf_b = 0;
  int64_t lm_head = -1;  // offset in the final unit when the head is untied

  // Where the kernels run (options.device); the CPU backend until the constructor.
  Backend* be = &cpu_backend();

  // Activations (one arena).
  TrackedBuffer arena;
  std::vector<float*> residual;  // L + 1 unit boundaries, [N, C] each: the unit inputs
  std::vector<BlockActivations> blocks;  // L sets, or 1 with activation checkpointing
  float* branch = nullptr;       // [N, C] forward scratch: c_proj outputs before the residual add
  TypedPtr lnf;                  // [N, C] compute type
  float* lnf_mean = nullptr;
  float* lnf_rstd = nullptr;
  float* dlnf = nullptr;         // [N, C] gradient at ln_f's output, from the fused head
  float* dres = nullptr;         // [N, C] gradient of the residual stream, updated in place
  float* dsmall = nullptr;       // [N, C] backward scratch
  float* dbig = nullptr;         // [N, max(3A, F)] backward scratch (dqkv, dfc)
  LmHead head;
  // Compute-type scratch (compute != fp32 only; in fp32 the kernels read and write
  // the stored activations directly). In the forward, dbig also holds the c_attn and
  // c_fc GEMMs' fp32 outputs before they are biased and rounded into qkv and fc_pre.
  TypedPtr dres_c;               // [N, C]  dres rounded for the GEMMs
  TypedPtr dbig_c;               // [N, max(3A, F)] dbig rounded for the GEMMs
  // Parameters rounded to the compute type: one unit's weights at a time (a block's
  // four matrices or the LM head) and one unit's vectors (a block's: 6 C + 3 A + F floats).
  std::unique_ptr<ParamRounding> rounding;

  // State of the current micro-batch.
  MicroBatchState state{0};
  int B = 0, T = 0;  // state.B, state.T (the kernels' shorthand)
  // The micro-batch's arrays where the kernels read them (key_begin: packed sequences,
  // where each token's document starts, attention looks no further back; or null).
  StagedBatch staged;
  // During forward_unit_cached: the cache, and the step's positions (cache.length() + t).
  KvCache* kv = nullptr;
  std::vector<int32_t> kv_positions;
  std::vector<int32_t> default_positions;  // position_ids()' array when the batch has none
  // Context parallelism (options.parallel_groups.context of more than one rank): this
  // rank's tokens of each row (their wpe rows the global positions'), and the attention
  // across the group's ranks; else null.
  std::unique_ptr<ContextParallelism> context;

  int64_t N() const { return static_cast<int64_t>(B) * T; }
  int64_t NL() const { return sp.rows(N()); }  // rows of the residual stream here
  TypedPtr block_of(TypedPtr whole) const { return sp.block_of(whole, N()); }
  void gather(TypedPtr whole, const char* label) const { sp.gather(tp, whole, N(), label); }
  float* sum_rows(float* partial, const char* label) const { return sp.sum_rows(tp, partial, N(), label); }
  float* whole_dres() { return sp.whole_dres(*be, tp, dres, N()); }
  // A LayerNorm's backward into (w, b)'s gradients over this rank's rows: with sequence
  // parallelism into scratch, summed over the group by finish_norm_grads.
  std::pair<float*, float*> norm_grad_targets(float* gw, float* gb) const {
    if (!sp.on()) return {gw, gb};
    float* scratch = sp.norm_grads(*be, 2 * int64_t{C});
    return {scratch, scratch + C};
  }
  void finish_norm_grads(float* gw, float* gb) const {
    if (sp.on()) sp.add_norm_grads(*be, tp, {gw, gb}, C);
  }
  // The micro-batch this rank computes on: `full`, or with context parallelism its
  // slice, cut when the embeddings' forward starts the micro-batch.
  const MicroBatch& local_batch(const MicroBatch& full, bool starts) {
    return context ? context->local_batch(full, starts, *be) : full;
  }
  int attention_slot(int l) const { return options.activation_checkpointing ? 0 : l; }

  ConstTypedPtr head_weight(ParamPointers params) const {
    return lm_head < 0 ? params[0].at(wte) : params[final_unit].at(lm_head);
  }
  BlockActivations& acts(int l) {
    return blocks[options.activation_checkpointing ? 0 : static_cast<size_t>(l)];
  }

  // residual[0] = the staged tokens' wte rows + their positions' wpe rows. Vocabulary-
  // parallel: the lookup's sum over the group (exact; with sequence parallelism this
  // rank's block of it), then the wpe rows of those tokens added, so each element is
  // round(wte) + round(wpe) as in the unsplit kernel.
  void embed_forward(ConstTypedPtr p) {
    if (!vocab_parallel()) {
      be->embedding_forward(residual[0], staged.tokens, p.at(wte), p.at(wpe), B, T, C, compute,
                            staged.positions);
      return;
    }
    vocab_embedding.forward(*be, tp, sp.on() ? branch : residual[0], staged.tokens, p.at(wte), B, T, C,
                            compute, sp.on() ? residual[0] : nullptr);
    const int32_t* positions = position_ids() + sp.block_offset(N()) / C;  // of the rows here
    be->embedding_forward(branch, positions, p.at(wpe), ConstTypedPtr(), 1, static_cast<int>(NL()), C,
                          compute, nullptr);
    be->accumulate(residual[0], branch, NL() * C);
  }
  // g (unit 0's gradient) += the embeddings' gradients from dres. Vocabulary-parallel: wpe's
  // rows first (the lookup's backward zeroes dres's rows of tokens held elsewhere), summed
  // in the unsplit kernel's order (each position's rows b = 0, 1, ...).
  void embed_backward(float* g) {
    if (!vocab_parallel()) {
      be->embedding_backward(g + wte, g + wpe, dres, staged.tokens, B, T, C, staged.positions);
      return;
    }
    float* dout = whole_dres();  // every token's gradient (gathered under sequence parallelism)
    be->embedding_backward(g + wpe, nullptr, dout, position_ids(), B, T, C, nullptr);
    vocab_embedding.backward(*be, g + wte, dout, staged.tokens, B, T, C);
  }
  // The micro-batch's position ids: its own (packed rows, context parallelism, the KV
  // cache) or t for every row's t-th token (host memory: on a device, staged.positions
  // holds them, the vocabulary-parallel path staging defaults).
  const int32_t* position_ids() {
    if (staged.positions != nullptr) return staged.positions;
    default_positions.resize(static_cast<size_t>(N()));
    for (int64_t i = 0; i < N(); ++i) default_positions[static_cast<size_t>(i)] = static_cast<int32_t>(i % T);
    return default_positions.data();
  }
  BlockWeights block_weights(int l, ConstTypedPtr p) const;
  ConstTypedPtr head_weights(ParamPointers params) const;
  BlockVectors block_vectors(int l, ConstTypedPtr p) const;
  std::vector<int> needed_units(int unit) const;
  // Shape fields from the config and options (the constructor and plan_memory).
  void set_shape(const ModelConfig& model_config, const ModelOptions& run_options);
  // Requests every activation array for N = batch x seq rows.
  void carve_activations(ArenaCarver& carver, int64_t N);
  int64_t block_width() const { return std::max(3 * A, F); }  // of dbig: dqkv or dfc
  // Elements of the weight scratch: the larger of a block's matrices and the LM head.
  int64_t weight_scratch_elements() const {
    return std::max<int64_t>(int64_t{4} * C * A + int64_t{2} * C * F, head_rows() * C);
  }
  // A block's biases and LayerNorm weights (the final unit's two fit in them).
  int64_t vector_scratch_floats() const { return int64_t{6} * C + 3 * A + F; }

  // recompute: refill the activations block_backward reads (activation
  // checkpointing); skips the last GEMM and the residual add, which backward does
  // not need, and leaves residual[l + 1] alone.
  void block_forward(int l, const BlockVectors& v, const BlockWeights& w, bool recompute);
  // Attention of the step's rows over the KV cache, after adding their keys and values.
  void cached_attention(int l, BlockActivations& a);
  void gemm_forward(int rows, int n, int k, ConstTypedPtr x, ConstTypedPtr w, float* out) {
    forward_gemm(*be, options.row_by_row_gemm, false, rows, n, k, 1.0f, x, k, w, n, 0.0f, out, n);
  }
  void block_backward(int l, const BlockVectors& v, const BlockWeights& w, float* g);
  void final_forward(ParamPointers params, UnitPointers grads, const MicroBatch& batch,
                     bool training, float grad_scale);
};

Gpt2Model::Gpt2Model(const ModelConfig& config, const ParamLayout& layout, int max_batch,
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
  SHARDLM_CHECK(config.head_dim() <= kAttentionMaxHeadDim,
                "model: head_dim {} exceeds the attention kernels' limit {}", config.head_dim(),
                kAttentionMaxHeadDim);
  SHARDLM_CHECK(layout.num_model_units() == m.L + 2,
                "model: layout has {} model units, the config needs {}", layout.num_model_units(),
                m.L + 2);

  // Offsets are relative to each model unit's pointer (the strategy hands the model
  // one pointer per model unit, wherever the layout placed it).
  m.wte = layout.offset_in_model_unit(0, "transformer.wte.weight");
  m.wpe = layout.offset_in_model_unit(0, "transformer.wpe.weight");
  for (int l = 0; l < m.L; ++l) {
    auto off = [&](const char* suffix) {
      return layout.offset_in_model_unit(l + 1, gpt2_param_name(l, suffix));
    };
    m.block_offsets.push_back({off("ln_1.weight"), off("ln_1.bias"), off("attn.c_attn.weight"),
                               off("attn.c_attn.bias"), off("attn.c_proj.weight"),
                               off("attn.c_proj.bias"), off("ln_2.weight"), off("ln_2.bias"),
                               off("mlp.c_fc.weight"), off("mlp.c_fc.bias"),
                               off("mlp.c_proj.weight"), off("mlp.c_proj.bias")});
  }
  check_tensor_parallel_model(layout, options, m.tensor_size);
  m.lnf_w = layout.offset_in_model_unit(m.final_unit, "transformer.ln_f.weight");
  m.lnf_b = layout.offset_in_model_unit(m.final_unit, "transformer.ln_f.bias");
  if (!config.tie_embeddings)
    m.lm_head = layout.offset_in_model_unit(m.final_unit, "lm_head.weight");

  ArenaCarver carver;
  m.context = ContextParallelism::make(options, {m.H, m.H, m.A / m.H}, max_batch, max_seq, m.compute,
                                       options.activation_checkpointing ? 1 : m.L, carver);
  const int local_seq = m.context ? m.context->local_len(max_seq) : max_seq;
  m.sp.check_max_tokens(max_batch, local_seq);
  m.carve_activations(carver, static_cast<int64_t>(max_batch) * local_seq);
  m.be = options.backend != nullptr ? options.backend : &backend_for(options.device);
  m.arena = carver.allocate(*m.be, tracker);
  m.tp = TensorParallelBlock(options.parallel_groups.tensor, config, m.be->stream_handle());
  m.rounding = std::make_unique<ParamRounding>(*m.be, m.compute, m.weight_scratch_elements(),
                                               m.vector_scratch_floats(), tracker);
}

void Gpt2Model::Impl::set_shape(const ModelConfig& model_config, const ModelOptions& run_options) {
  config = model_config;
  options = run_options;
  compute = options.precision;
  L = config.n_layer;
  C = config.n_embd;
  tensor_size = options.parallel_groups.tensor != nullptr ? options.parallel_groups.tensor->size() : 1;
  check_tensor_parallel(config, tensor_size);
  sequence_parallel = options.sequence_parallel && tensor_size > 1;
  sp = SequenceParallelRows(sequence_parallel, tensor_size,
                            tensor_size > 1 ? options.parallel_groups.tensor->rank() : 0, C);
  H = config.n_head / tensor_size;
  A = C / tensor_size;
  F = 4 * C / tensor_size;
  V = config.vocab_size;
  Vp = config.padded_vocab_size();
  vocab = VocabShard::of(V, Vp, {tensor_size, tensor_size > 1 ? options.parallel_groups.tensor->rank() : 0});
  final_unit = L + 1;
  state = MicroBatchState(L + 2);
}

void Gpt2Model::Impl::carve_activations(ArenaCarver& carver, int64_t N) {
  Impl& m = *this;
  const int64_t C = m.C;

  const DType ct = m.compute;
  const int64_t NL = m.sp.rows(N);  // residual stream rows here
  m.residual.assign(m.L + 1, nullptr);
  for (auto& r : m.residual) carver.request(&r, NL * C);
  m.blocks.resize(options.activation_checkpointing ? 1 : m.L);
  // Ulysses and hybrid attention save their own q|k|v for backward: one q|k|v array of
  // this rank's tokens serves every layer. No context attention reads the model's lse.
  const bool qkv_per_layer = !(context && context->attention().keeps_own_qkv());
  for (auto& a : m.blocks) {
    carver.request(&a.ln1, ct, N * C);
    carver.request(&a.ln1_mean, NL);
    carver.request(&a.ln1_rstd, NL);
    if (qkv_per_layer || &a == &m.blocks.front())
      carver.request(&a.qkv, ct, 3 * N * m.A);
    else
      carver.share(&a.qkv, &m.blocks.front().qkv);
    carver.request(&a.att, ct, N * m.A);
    if (!context) carver.request(&a.att_lse, N * m.H);  // context attention keeps its own
    carver.request(&a.res2, NL * C);
    carver.request(&a.ln2, ct, N * C);
    carver.request(&a.ln2_mean, NL);
    carver.request(&a.ln2_rstd, NL);
    carver.request(&a.fc_pre, ct, N * m.F);
    carver.request(&a.fc_act, ct, N * m.F);
  }
  carver.request(&m.branch, N * C);
  carver.request(&m.lnf, ct, N * C);
  carver.request(&m.lnf_mean, NL);
  carver.request(&m.lnf_rstd, NL);
  carver.request(&m.dlnf, N * C);
  if (m.vocab_parallel()) {
    m.vocab_embedding.carve(carver, N, m.vocab);
    m.vocab_head.carve(carver, N, m.vocab, m.Vp, m.C, m.compute);
  } else {
    m.head.carve(carver, N, m.V, m.Vp, m.C, m.compute);
  }
  carver.request(&m.dres, NL * C);
  m.sp.carve(carver, N, 2 * C);  // a LayerNorm's weight and bias gradients
  carver.request(&m.dsmall, N * C);
  carver.request(&m.dbig, N * m.block_width());
  if (ct != DType::fp32) {
    carver.request(&m.dres_c, ct, N * C);
    carver.request(&m.dbig_c, ct, N * m.block_width());
  }
  m.staged.carve(carver, N, !options.device.is_host());
}

ModelMemoryPlan Gpt2Model::plan_memory(const ModelConfig& config, int max_batch, int max_seq,
                                       const ModelOptions& options, bool params_in_compute_type) {
  config.validate();
  Impl m;
  m.set_shape(config, options);
  ArenaCarver carver;
  m.carve_activations(carver, static_cast<int64_t>(max_batch) * max_seq);
  ModelMemoryPlan plan;
  plan.activations = carver.bytes();
  plan.params_scratch = ParamRounding::planned_bytes(
      m.compute, m.weight_scratch_elements(), m.vector_scratch_floats(), params_in_compute_type);
  return plan;
}

Gpt2Model::~Gpt2Model() = default;

const ModelConfig& Gpt2Model::config() const { return impl_->config; }
const ParamLayout& Gpt2Model::layout() const { return impl_->layout; }
const ModelOptions& Gpt2Model::options() const { return impl_->options; }
int Gpt2Model::logits_chunk_rows() const {
  return impl_->vocab_parallel() ? impl_->vocab_head.chunk_rows() : impl_->head.chunk_rows();
}
int Gpt2Model::num_units() const { return impl_->L + 2; }

BlockWeights Gpt2Model::Impl::block_weights(int l, ConstTypedPtr p) const {
  const BlockOffsets& o = block_offsets[static_cast<size_t>(l)];
  const int64_t ca = static_cast<int64_t>(C) * A, cf = static_cast<int64_t>(C) * F;
  return {rounding->gemm_weight(p.at(o.attn_w), 0, 3 * ca), rounding->gemm_weight(p.at(o.attn_proj_w), 3 * ca, ca),
          rounding->gemm_weight(p.at(o.fc_w), 4 * ca, cf), rounding->gemm_weight(p.at(o.fc_proj_w), 4 * ca + cf, cf)};
}

ConstTypedPtr Gpt2Model::Impl::head_weights(ParamPointers params) const {
  // Padded vocabulary rows are never read.
  return rounding->gemm_weight(head_weight(params), 0, head_rows() * C);
}

BlockVectors Gpt2Model::Impl::block_vectors(int l, ConstTypedPtr p) const {
  const BlockOffsets& o = block_offsets[static_cast<size_t>(l)];
  float* scratch = rounding->vector_scratch();  // all of a block's vectors
  BlockVectors v{};
  v.ln1_w = rounding->vector_values(p.at(o.ln1_w), C, &scratch);
  v.ln1_b = rounding->vector_values(p.at(o.ln1_b), C, &scratch);
  v.attn_b = rounding->vector_values(p.at(o.attn_b), 3 * A, &scratch);
  v.attn_proj_b = rounding->vector_values(p.at(o.attn_proj_b), C, &scratch);
  v.ln2_w = rounding->vector_values(p.at(o.ln2_w), C, &scratch);
  v.ln2_b = rounding->vector_values(p.at(o.ln2_b), C, &scratch);
  v.fc_b = rounding->vector_values(p.at(o.fc_b), F, &scratch);
  v.fc_proj_b = rounding->vector_values(p.at(o.fc_proj_b), C, &scratch);
  return v;
}

void Gpt2Model::Impl::block_forward(int l, const BlockVectors& v, const BlockWeights& w,
                                    bool recompute) {
  BlockActivations& a = acts(l);
  const float* x = residual[static_cast<size_t>(l)];
  const int64_t n = N();
  const int rows = static_cast<int>(n);
  const bool fp32 = compute == DType::fp32;
  be->layernorm_forward(block_of(a.ln1), a.ln1_mean, a.ln1_rstd, x, v.ln1_w, v.ln1_b, NL(), C);
  gather(a.ln1, "tensor.sequence_ln1");
  // Attention reads the stored (rounded) qkv, as backward will.
  float* qkv_out = fp32 ? a.qkv.f32() : dbig;
  gemm_forward(rows, 3 * A, C, a.ln1, w.attn, qkv_out);
  be->add_bias(a.qkv, qkv_out, v.attn_b, n, 3 * A);
  if (kv != nullptr)
    cached_attention(l, a);
  else if (context)
    context->attention().forward(attention_slot(l), *be, a.qkv, a.att, B);
  else
    be->attention_forward(a.att, a.att_lse, a.qkv, {B, T, H, H, A / H}, staged.key_begin);
  gemm_forward(rows, C, A, a.att, w.attn_proj, branch);
  const float* attention_out = sum_rows(branch, "tensor.attention_out");  // c_proj: row-parallel
  be->residual_layernorm_forward(a.res2, block_of(a.ln2), a.ln2_mean, a.ln2_rstd, x, attention_out,
                                  v.attn_proj_b, v.ln2_w, v.ln2_b, NL(), C);
  gather(a.ln2, "tensor.sequence_ln2");
  float* fc_out = fp32 ? a.fc_pre.f32() : dbig;
  gemm_forward(rows, F, C, a.ln2, w.fc, fc_out);
  be->bias_gelu_forward(a.fc_act, a.fc_pre, fc_out, v.fc_b, n, F);
  if (recompute) return;
  gemm_forward(rows, C, F, a.fc_act, w.fc_proj, branch);
  const float* mlp_out = sum_rows(branch, "tensor.mlp_out");  // c_proj is row-parallel
  be->residual_add_bias(residual[static_cast<size_t>(l) + 1], a.res2, mlp_out, v.fc_proj_b, NL(),
                         C);
}

void Gpt2Model::Impl::cached_attention(int l, BlockActivations& a) {
  const int past = kv->length();
  be->convert_rows(kv->key_row(l, past), A, a.qkv.at(A), 3 * A, T, A);
  be->convert_rows(kv->value_row(l, past), A, a.qkv.at(2 * A), 3 * A, T, A);
  be->attention_forward_cached(a.att, a.qkv, 3 * A, kv->keys(l), kv->values(l), A,
                               {1, T, H, H, A / H}, past);
}

// On entry dres holds dLoss/d(block output); on exit dLoss/d(block input). Weight
// gradients accumulate straight into g through the GEMMs' beta = 1. Bias and
// LayerNorm gradients are reduced from the fp32 activation gradients.
void Gpt2Model::Impl::block_backward(int l, const BlockVectors& v, const BlockWeights& w,
                                     float* g) {
  const BlockOffsets& o = block_offsets[static_cast<size_t>(l)];
  const BlockActivations& a = acts(l);
  const float* x = residual[static_cast<size_t>(l)];
  const int64_t n = N();
  const int rows = static_cast<int>(n);

  // MLP: y = res2 + gelu(ln2 Wfc + bfc) Wproj + bproj. The GEMMs and the (whole) biases
  // read every token's gradient: with sequence parallelism the blocks gathered.
  float* dy_f = whole_dres();
  ConstTypedPtr dy = rounding->for_gemm(dy_f, dres_c, n * C);
  be->gemm(true, false, F, C, rows, 1.0f, a.fc_act, F, dy, C, 1.0f, g + o.fc_proj_w, C);
  be->bias_backward(g + o.fc_proj_b, dy_f, n, C);
  float* dfc = dbig;
  be->gemm(false, true, rows, F, C, 1.0f, dy, C, w.fc_proj, C, 0.0f, dfc, F);
  be->gelu_backward(dfc, dfc, a.fc_pre, n * F);
  const ConstTypedPtr dfc_g = rounding->for_gemm(dfc, dbig_c, n * F);
  float* dln2 = dsmall;
  be->gemm(false, true, rows, C, F, 1.0f, dfc_g, F, w.fc, F, 0.0f, dln2, C);
  // c_fc is column-parallel: the input gradient's sum travels during the weight gradient.
  SequenceParallelRows::PendingRows dln2_sum = sp.start_sum_rows(tp, dln2, n, "tensor.mlp_in_grad");
  be->gemm(true, false, C, F, rows, 1.0f, a.ln2, C, dfc_g, F, 1.0f, g + o.fc_w, F);
  be->bias_backward(g + o.fc_b, dfc, n, F);
  const float* dln2_rows = dln2_sum.finish();
  const auto [gw2, gb2] = norm_grad_targets(g + o.ln2_w, g + o.ln2_b);
  be->layernorm_backward(dres, gw2, gb2, dln2_rows, a.res2, v.ln2_w, a.ln2_mean, a.ln2_rstd, NL(), C);
  finish_norm_grads(g + o.ln2_w, g + o.ln2_b);

  // Attention: res2 = x + attn(ln1 Wqkv + bqkv) Wproj + bproj
  dy_f = whole_dres();
  dy = rounding->for_gemm(dy_f, dres_c, n * C);
  be->gemm(true, false, A, C, rows, 1.0f, a.att, A, dy, C, 1.0f, g + o.attn_proj_w, C);
  be->bias_backward(g + o.attn_proj_b, dy_f, n, C);
  float* datt = dsmall;  // [N, A]
  be->gemm(false, true, rows, A, C, 1.0f, dy, C, w.attn_proj, C, 0.0f, datt, A);
  float* dqkv = dbig;
  if (context)
    context->attention().backward(attention_slot(l), *be, datt, dqkv, B);
  else
    be->attention_backward(dqkv, datt, a.qkv, a.att, a.att_lse, {B, T, H, H, A / H},
                           staged.key_begin);
  const ConstTypedPtr dqkv_g = rounding->for_gemm(dqkv, dbig_c, n * 3 * A);
  float* dln1 = dsmall;
  be->gemm(false, true, rows, C, 3 * A, 1.0f, dqkv_g, 3 * A, w.attn, 3 * A, 0.0f, dln1, C);
  // c_attn is column-parallel: the input gradient's sum travels during the weight gradient.
  SequenceParallelRows::PendingRows dln1_sum = sp.start_sum_rows(tp, dln1, n, "tensor.attention_in_grad");
  be->gemm(true, false, C, 3 * A, rows, 1.0f, a.ln1, C, dqkv_g, 3 * A, 1.0f, g + o.attn_w, 3 * A);
  be->bias_backward(g + o.attn_b, dqkv, n, 3 * A);
  const float* dln1_rows = dln1_sum.finish();
  const auto [gw1, gb1] = norm_grad_targets(g + o.ln1_w, g + o.ln1_b);
  be->layernorm_backward(dres, gw1, gb1, dln1_rows, x, v.ln1_w, a.ln1_mean, a.ln1_rstd, NL(), C);
  finish_norm_grads(g + o.ln1_w, g + o.ln1_b);
}

void Gpt2Model::Impl::final_forward(ParamPointers params, UnitPointers grads,
                                    const MicroBatch& batch, bool training, float grad_scale) {
  const ConstTypedPtr p = params[final_unit];
  float* scratch = rounding->vector_scratch();
  const float* weight = rounding->vector_values(p.at(lnf_w), C, &scratch);
  const float* bias = rounding->vector_values(p.at(lnf_b), C, &scratch);
  const int64_t n = N();
  be->layernorm_forward(block_of(lnf), lnf_mean, lnf_rstd, residual[L], weight, bias, NL(), C);
  gather(lnf, "tensor.sequence_lnf");  // the vocabulary-parallel head reads every token
  if (batch.targets == nullptr) {
    SHARDLM_CHECK(!training, "model: a training forward needs targets");
    state.finish_forward(false);
    return;
  }
  state.target_count = count_targets(batch.targets, n, V);
  float* dhead = nullptr;
  if (training) {
    const int head_unit = lm_head < 0 ? 0 : final_unit;
    SHARDLM_CHECK(static_cast<int>(grads.size()) == final_unit + 1 &&
                      grads[head_unit] != nullptr && grads[final_unit] != nullptr,
                  "model: a training forward of the final unit needs the gradient buffers of "
                  "units {} and {}",
                  head_unit, final_unit);
    dhead = grads[head_unit] + (lm_head < 0 ? wte : lm_head);
  }
  state.loss_sum = vocab_parallel()
                       ? vocab_head.loss(*be, tp, lnf, head_weights(params), staged.targets,
                                         batch.targets, n,
                                         grad_scale, training ? dlnf : nullptr, dhead, sp.on())
                       : head.loss(*be, lnf, head_weights(params), staged.targets, n, grad_scale,
                                   training ? dlnf : nullptr, dhead);
  state.finish_forward(training);
}

std::vector<int> Gpt2Model::Impl::needed_units(int unit) const {
  SHARDLM_CHECK(unit >= 0 && unit < L + 2, "model: unit {} out of range [0, {})", unit, L + 2);
  return gpt2_family().unit_needs(config)[static_cast<size_t>(unit)];
}

std::vector<int> Gpt2Model::units_needed_for(int unit) const { return impl_->needed_units(unit); }

void Gpt2Model::forward_unit(int unit, ParamPointers params, UnitPointers grads,
                             const MicroBatch& full, bool training, float grad_scale) {
  Impl& m = *impl_;
  check_param_pointers(params, m.L + 2, m.needed_units(unit), unit, m.compute);
  if (unit == 0) {
    check_micro_batch(full, m.max_batch, m.max_seq, m.V);  // the whole rows, as given
    if (full.positions != nullptr)
      for (int64_t i = 0; i < static_cast<int64_t>(full.B) * full.T; ++i)
        SHARDLM_CHECK(full.positions[i] >= 0 && full.positions[i] < m.config.max_seq_len,
                      "model: position id {} at token {} is outside gpt2's position table "
                      "[0, {})",
                      full.positions[i], i, m.config.max_seq_len);
  }
  const MicroBatch& batch = m.local_batch(full, unit == 0);
  if (unit == 0) {
    m.sp.check_tokens(batch.B, batch.T);
    m.state.start(batch);
    m.B = batch.B;
    m.T = batch.T;
    // (the vocabulary-parallel lookup adds wpe rows by position ids: on a device, staged)
    m.staged.stage(*m.be, batch, /*default_positions=*/m.vocab_parallel());
    m.embed_forward(params[0]);
    return;
  }
  m.state.check_forward(unit, batch);
  if (unit < m.final_unit) {
    const ConstTypedPtr p = params[unit];
    m.block_forward(unit - 1, m.block_vectors(unit - 1, p), m.block_weights(unit - 1, p),
                    /*recompute=*/false);
  } else {
    m.final_forward(params, grads, batch, training, grad_scale);
  }
}

void Gpt2Model::backward_unit(int unit, ParamPointers params, UnitPointers grads,
                              const MicroBatch& full) {
  Impl& m = *impl_;
  const MicroBatch& batch = m.local_batch(full, /*starts=*/false);
  m.state.begin_backward(unit, batch);
  check_param_pointers(params, m.L + 2, {unit}, unit, m.compute);
  check_grad_pointer(grads, m.L + 2, unit);
  const int64_t n = m.N();
  const ConstTypedPtr p = params[unit];
  if (unit == m.final_unit) {
    float* g = grads[unit];
    float* scratch = m.rounding->vector_scratch();
    const float* weight = m.rounding->vector_values(p.at(m.lnf_w), m.C, &scratch);
    // (sequence parallelism: dlnf's block of this rank's rows, from the head)
    const int64_t nl = m.NL();
    m.be->fill_zero(m.dres, sizeof(float) * nl * m.C);
    const auto [gw, gb] = m.norm_grad_targets(g + m.lnf_w, g + m.lnf_b);
    m.be->layernorm_backward(m.dres, gw, gb, m.dlnf + m.sp.block_offset(n), m.residual[m.L], weight,
                             m.lnf_mean, m.lnf_rstd, nl, m.C);
    m.finish_norm_grads(g + m.lnf_w, g + m.lnf_b);
  } else if (unit > 0) {
    // One conversion serves the recompute and the backward.
    const BlockVectors v = m.block_vectors(unit - 1, p);
    const BlockWeights w = m.block_weights(unit - 1, p);
    if (m.options.activation_checkpointing) m.block_forward(unit - 1, v, w, /*recompute=*/true);
    m.block_backward(unit - 1, v, w, grads[unit]);
  } else {
    SHARDLM_CHECK(batch.tokens != nullptr, "model: the micro-batch has no tokens");
    m.embed_backward(grads[0]);
  }
}

KvCache Gpt2Model::make_kv_cache(int capacity) const {
  const Impl& m = *impl_;
  SHARDLM_CHECK(capacity >= 1 && capacity <= m.max_seq,
                "model: a KV cache of {} positions; the model was built for [1, {}]", capacity,
                m.max_seq);
  return KvCache(*m.be, m.L, capacity, m.A, m.compute);  // this tensor rank's heads
}

void Gpt2Model::forward_unit_cached(int unit, ParamPointers params, KvCache& cache,
                                    const MicroBatch& batch) {
  Impl& m = *impl_;
  check_param_pointers(params, m.L + 2, m.needed_units(unit), unit, m.compute);
  SHARDLM_CHECK(!m.context, "model: generation with a KV cache runs on one rank; this model "
                "splits its sequences over a context group");
  SHARDLM_CHECK(!m.sequence_parallel, "model: generation with a KV cache does not split its "
                "tokens; this model was built with sequence parallelism");
  if (unit == 0) {
    m.kv_positions = start_cached_step(batch, cache, m.L, m.A, m.compute, m.max_seq, m.V);
    m.state.start(batch);
    m.B = 1;
    m.T = batch.T;
    MicroBatch positioned = batch;
    positioned.positions = m.kv_positions.data();
    m.staged.stage(*m.be, positioned, /*default_positions=*/false);
    m.embed_forward(params[0]);
    return;
  }
  m.state.check_forward(unit, batch);
  if (unit < m.final_unit) {
    const ConstTypedPtr p = params[unit];
    m.kv = &cache;
    try {
      m.block_forward(unit - 1, m.block_vectors(unit - 1, p), m.block_weights(unit - 1, p),
                      /*recompute=*/false);
    } catch (...) {
      m.kv = nullptr;
      throw;
    }
    m.kv = nullptr;
  } else {
    m.final_forward(params, {}, batch, /*training=*/false, 0.0f);
    cache.advance(batch.T);
  }
}

double Gpt2Model::last_loss_sum() const { return impl_->state.loss_sum; }
int64_t Gpt2Model::last_target_count() const { return impl_->state.target_count; }

void Gpt2Model::logits_at(ParamPointers params, int t, float* out) const {
  const Impl& m = *impl_;
  m.state.check_logits_at(t);
  check_param_pointers(params, m.L + 2, m.needed_units(m.final_unit), m.final_unit, m.compute);
  // Row b's hidden state at position t is lnf[(b*T + t)*C]: a strided [B, C] matrix.
  const ConstTypedPtr x = m.lnf.at(static_cast<int64_t>(t) * m.C);
  const int64_t ld = static_cast<int64_t>(m.T) * m.C;
  if (m.vocab_parallel())
    m.vocab_head.logits(*m.be, m.tp, x, ld, m.B, m.head_weights(params), out);
  else
    m.head.logits(*m.be, x, ld, m.B, m.head_weights(params), out);
}

}  // namespace shardlm
