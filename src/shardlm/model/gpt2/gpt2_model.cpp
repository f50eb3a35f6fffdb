#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/model/gpt2/gpt2_model.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <type_traits>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/gelu.hpp"
#include "shardlm/backend/cpu/gemm_mixed.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/lm_head_loss.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/gpt2/gpt2_family.hpp"

namespace shardlm {

namespace {

using cpu::gemm;

// Target size of one chunk of logits in the fused LM head + loss. Each chunk
// re-reads the [V, C] head weight twice and read-modify-writes its gradient once,
// so small chunks make the head memory-bound and its GEMMs short and wide: on the
// 2-vCPU Zen5 box (GPT-2 vocabulary, C = 384, one thread) 32 rows ran at ~53
// GFLOP/s, 64 at ~72, 128 at ~93, 256-512 no better. With both threads the head's
// three bf16 GEMMs (N = 2048, C = 384) took 612 ms in 304-row chunks, 590 in 512,
// 570 in 1024, 560 in one; whole training steps, alternating runs: gpt2-small-30m
// bf16 1065-1124 ms at 64 MiB of logits (304 rows), 1031-1056 at 256 MiB (1024
// rows); fp32 1923-1955 and 1875-1884. 256 MiB (~1330 rows of 50304 logits, plus
// half as much again for bf16 dlogits) keeps peak RSS for that config at ~1.06 GiB,
// well under half of PyTorch's; the rows are then spread evenly over the chunks (a
// short last chunk is slow).
constexpr int64_t kLogitsChunkBytes = 256ll << 20;

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
  TypedPtr qkv;               // [N, 3C] (biased)
  TypedPtr att;               // [N, C] attention output, before c_proj
  float* att_lse = nullptr;   // [B, H, T]
  float* res2 = nullptr;      // [N, C] fp32: residual after the attention branch
  TypedPtr ln2;               // [N, C]
  float* ln2_mean = nullptr;  // [N]
  float* ln2_rstd = nullptr;  // [N]
  TypedPtr fc_pre;            // [N, 4C] c_fc output with bias (GELU input)
  TypedPtr fc_act;            // [N, 4C] GELU output
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

// Carves 64-byte aligned arrays out of one tracked allocation: requests are
// recorded first, then one buffer of the summed size is allocated and handed out.
class ArenaCarver {
 public:
  void request(float** slot, int64_t count) {
    add([slot](std::byte* p) { *slot = reinterpret_cast<float*>(p); }, count * 4);
  }
  void request(TypedPtr* slot, DType dtype, int64_t count) {
    add([slot, dtype](std::byte* p) { *slot = TypedPtr(p, dtype); },
        count * static_cast<int64_t>(dtype_bytes(dtype)));
  }
  int64_t bytes() const { return offset_; }
  TrackedBuffer allocate(MemoryTracker& tracker) {
    TrackedBuffer buffer(MemCategory::activations, static_cast<size_t>(offset_), tracker);
    for (const auto& r : requests_) r.assign(buffer.as<std::byte>() + r.offset);
    return buffer;
  }

 private:
  static constexpr int64_t kAlignBytes = 64;
  struct Request {
    std::function<void(std::byte*)> assign;
    int64_t offset;
  };
  void add(std::function<void(std::byte*)> assign, int64_t bytes) {
    requests_.push_back({std::move(assign), offset_});
    offset_ += (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  }
  std::vector<Request> requests_;
  int64_t offset_ = 0;
};

}  // namespace

struct Gpt2Model::Impl {
  ModelConfig config;
  ParamLayout layout;
  ModelOptions options;
  int max_batch = 0;
  int max_seq = 0;
  int L = 0, C = 0, H = 0, V = 0, Vp = 0;
  int final_unit = 0;
  // Type of the GEMM inputs kept as activations and of the activation gradients
  // that feed GEMMs; and the type the GEMMs read weights in (fp16 compute keeps
  // fp16-rounded weights in fp32: there is no fp16 GEMM to feed here).
  DType compute = DType::fp32;
  DType weight_type = DType::fp32;

  // Parameter offsets.
  int64_t wte = 0, wpe = 0;
  std::vector<BlockOffsets> block_offsets;
  int64_t lnf_w = 0, lnf_b = 0;
  int64_t lm_head = -1;  // offset in the final unit when the head is untied

  // Activations (one arena).
  TrackedBuffer arena;
  std::vector<float*> residual;  // L + 1 unit boundaries, [N, C] each: the unit inputs
  std::vector<BlockActivations> blocks;  // L sets, or 1 with activation checkpointing
  float* branch = nullptr;       // [N, C] forward scratch: c_proj outputs before the residual add
  TypedPtr lnf;                  // [N, C] compute type
  float* lnf_mean = nullptr;
  float* lnf_rstd = nullptr;
  float* dlnf = nullptr;         // [N, C] gradient at ln_f's output, from the fused head
  float* logits_chunk = nullptr; // [chunk_rows, Vp]
  float* row_loss = nullptr;     // [N]
  float* dres = nullptr;         // [N, C] gradient of the residual stream, updated in place
  float* dsmall = nullptr;       // [N, C] backward scratch
  float* dbig = nullptr;         // [N, 4C] backward scratch (also dqkv [N, 3C])
  int chunk_rows = 0;
  // Compute-type scratch (compute != fp32 only; in fp32 the kernels read and write
  // the stored activations directly). In the forward, dbig also holds the c_attn and
  // c_fc GEMMs' fp32 outputs before they are biased and rounded into qkv and fc_pre.
  TypedPtr dres_c;               // [N, C]  dres rounded for the GEMMs
  TypedPtr dbig_c;               // [N, 4C] dbig rounded for the GEMMs
  TypedPtr dlogits_c;            // [chunk_rows, Vp] the head's dlogits rounded
  // One unit's converted weights (MemCategory::params), allocated on first need:
  // never when the weights arrive in the weight type (bf16: every strategy hands bf16).
  MemoryTracker* tracker = nullptr;
  mutable TrackedBuffer weight_buffer;
  TrackedBuffer vector_buffer;   // one unit's rounded vectors, fp32 (MemCategory::params)

  // State of the current micro-batch.
  int B = 0, T = 0;
  bool have_batch = false;
  bool final_done = false;        // final unit's forward ran for this batch (logits_at)
  int next_backward_unit = -1;    // -1: no backward pending
  double loss_sum = 0.0;
  int64_t target_count = 0;

  int64_t N() const { return static_cast<int64_t>(B) * T; }

  ConstTypedPtr head_weight(ParamPointers params) const {
    return lm_head < 0 ? params[0].at(wte) : params[final_unit].at(lm_head);
  }
  BlockActivations& acts(int l) {
    return blocks[options.activation_checkpointing ? 0 : static_cast<size_t>(l)];
  }

  // Weights as the GEMMs read them: parameters already in the weight type as they
  // are, else converted into the weight scratch at scratch_offset (the scratch holds
  // one unit's weights at a time).
  ConstTypedPtr gemm_weight(ConstTypedPtr src, int64_t scratch_offset, int64_t count) const;
  BlockWeights block_weights(int l, ConstTypedPtr p) const;
  ConstTypedPtr head_weights(ParamPointers params) const;
  // count parameters from src as fp32 values of the compute type: src itself in an
  // fp32 run, else rounded or widened into *scratch (which then moves past them).
  const float* vector_values(ConstTypedPtr src, int64_t count, float** scratch) const;
  BlockVectors block_vectors(int l, ConstTypedPtr p) const;
  std::vector<int> needed_units(int unit) const;
  // Shape fields from the config and options (the constructor and plan_memory).
  void set_shape(const ModelConfig& model_config, const ModelOptions& run_options);
  // Requests every activation array for N = batch x seq rows (sets chunk_rows).
  void carve_activations(ArenaCarver& carver, int64_t N);
  // Every unit `unit` reads is present, fp32 or in the compute type.
  void check_params(ParamPointers params, int unit, const std::vector<int>& units) const;
  // src as a GEMM input: itself in fp32, else rounded into `scratch`.
  ConstTypedPtr for_gemm(const float* src, TypedPtr scratch, int64_t count) const;

  // recompute: refill the activations block_backward reads (activation
  // checkpointing); skips the last GEMM and the residual add, which backward does
  // not need, and leaves residual[l + 1] alone.
  void block_forward(int l, const BlockVectors& v, const BlockWeights& w, bool recompute);
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
  SHARDLM_CHECK(config.head_dim() <= cpu::kAttentionMaxHeadDim,
                "model: head_dim {} exceeds the CPU attention kernel's limit {}",
                config.head_dim(), cpu::kAttentionMaxHeadDim);
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
  m.lnf_w = layout.offset_in_model_unit(m.final_unit, "transformer.ln_f.weight");
  m.lnf_b = layout.offset_in_model_unit(m.final_unit, "transformer.ln_f.bias");
  if (!config.tie_embeddings)
    m.lm_head = layout.offset_in_model_unit(m.final_unit, "lm_head.weight");

  ArenaCarver carver;
  m.carve_activations(carver, static_cast<int64_t>(max_batch) * max_seq);
  m.arena = carver.allocate(tracker);
  if (m.compute != DType::fp32) {
    m.tracker = &tracker;
    m.vector_buffer = TrackedBuffer(MemCategory::params, sizeof(float) * 13 * m.C, tracker);
  }
}

void Gpt2Model::Impl::set_shape(const ModelConfig& model_config, const ModelOptions& run_options) {
  config = model_config;
  options = run_options;
  compute = options.precision;
  weight_type = compute == DType::fp16 ? DType::fp32 : compute;
  L = config.n_layer;
  C = config.n_embd;
  H = config.n_head;
  V = config.vocab_size;
  Vp = config.padded_vocab_size();
  final_unit = L + 1;
}

void Gpt2Model::Impl::carve_activations(ArenaCarver& carver, int64_t N) {
  Impl& m = *this;
  const int64_t C = m.C;
  const int64_t max_rows =
      std::clamp<int64_t>(kLogitsChunkBytes / (static_cast<int64_t>(m.Vp) * 4), 1, N);
  const int64_t num_chunks = (N + max_rows - 1) / max_rows;
  int64_t rows = (N + num_chunks - 1) / num_chunks;
  if (rows >= 16) rows = std::min<int64_t>((rows + 15) / 16 * 16, N);
  m.chunk_rows = static_cast<int>(rows);

  const DType ct = m.compute;
  m.residual.assign(m.L + 1, nullptr);
  for (auto& r : m.residual) carver.request(&r, N * C);
  m.blocks.resize(options.activation_checkpointing ? 1 : m.L);
  for (auto& a : m.blocks) {
    carver.request(&a.ln1, ct, N * C);
    carver.request(&a.ln1_mean, N);
    carver.request(&a.ln1_rstd, N);
    carver.request(&a.qkv, ct, 3 * N * C);
    carver.request(&a.att, ct, N * C);
    carver.request(&a.att_lse, N * m.H);
    carver.request(&a.res2, N * C);
    carver.request(&a.ln2, ct, N * C);
    carver.request(&a.ln2_mean, N);
    carver.request(&a.ln2_rstd, N);
    carver.request(&a.fc_pre, ct, 4 * N * C);
    carver.request(&a.fc_act, ct, 4 * N * C);
  }
  carver.request(&m.branch, N * C);
  carver.request(&m.lnf, ct, N * C);
  carver.request(&m.lnf_mean, N);
  carver.request(&m.lnf_rstd, N);
  carver.request(&m.dlnf, N * C);
  carver.request(&m.logits_chunk, static_cast<int64_t>(m.chunk_rows) * m.Vp);
  carver.request(&m.row_loss, N);
  carver.request(&m.dres, N * C);
  carver.request(&m.dsmall, N * C);
  carver.request(&m.dbig, 4 * N * C);
  if (ct != DType::fp32) {
    carver.request(&m.dres_c, ct, N * C);
    carver.request(&m.dbig_c, ct, 4 * N * C);
    carver.request(&m.dlogits_c, ct, static_cast<int64_t>(m.chunk_rows) * m.Vp);
  }
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
  if (m.compute != DType::fp32) {
    plan.params_scratch = static_cast<int64_t>(sizeof(float)) * 13 * m.C;
    // The weight scratch (gemm_weight) serves weights that arrive in another type.
    const bool weights_ready = params_in_compute_type && m.weight_type == m.compute;
    if (!weights_ready)
      plan.params_scratch += std::max<int64_t>(12ll * m.C * m.C, static_cast<int64_t>(m.V) * m.C) *
                             static_cast<int64_t>(dtype_bytes(m.weight_type));
  }
  return plan;
}

Gpt2Model::~Gpt2Model() = default;

const ModelConfig& Gpt2Model::config() const { return impl_->config; }
const ParamLayout& Gpt2Model::layout() const { return impl_->layout; }
const ModelOptions& Gpt2Model::options() const { return impl_->options; }
int Gpt2Model::logits_chunk_rows() const { return impl_->chunk_rows; }
int Gpt2Model::num_units() const { return impl_->L + 2; }

ConstTypedPtr Gpt2Model::Impl::gemm_weight(ConstTypedPtr src, int64_t scratch_offset,
                                           int64_t count) const {
  const bool ready = src.dtype == weight_type && (compute == DType::fp32 || src.dtype != DType::fp32);
  if (ready) return src;
  if (weight_buffer.data() == nullptr) {
    const int64_t elements = std::max<int64_t>(12ll * C * C, static_cast<int64_t>(V) * C);
    weight_buffer = TrackedBuffer(MemCategory::params,
                                  static_cast<size_t>(elements) * dtype_bytes(weight_type), *tracker);
  }
  const TypedPtr scratch = TypedPtr(weight_buffer.data(), weight_type).at(scratch_offset);
  if (src.dtype == DType::fp32 && weight_type == DType::fp32) {
    cpu::round_to(compute, scratch.f32(), src.f32(), count);  // fp16 values kept in fp32
  } else {
    cpu::convert(scratch, src, count);  // rounds fp32 to bf16, or widens fp16 exactly
  }
  return scratch;
}

BlockWeights Gpt2Model::Impl::block_weights(int l, ConstTypedPtr p) const {
  const BlockOffsets& o = block_offsets[static_cast<size_t>(l)];
  const int64_t cc = static_cast<int64_t>(C) * C;
  return {gemm_weight(p.at(o.attn_w), 0, 3 * cc), gemm_weight(p.at(o.attn_proj_w), 3 * cc, cc),
          gemm_weight(p.at(o.fc_w), 4 * cc, 4 * cc), gemm_weight(p.at(o.fc_proj_w), 8 * cc, 4 * cc)};
}

ConstTypedPtr Gpt2Model::Impl::head_weights(ParamPointers params) const {
  // Padded vocabulary rows are never read.
  return gemm_weight(head_weight(params), 0, static_cast<int64_t>(V) * C);
}

const float* Gpt2Model::Impl::vector_values(ConstTypedPtr src, int64_t count,
                                            float** scratch) const {
  if (compute == DType::fp32) return src.f32();
  float* dst = *scratch;
  *scratch += count;
  if (src.dtype == DType::fp32) {
    cpu::round_to(compute, dst, src.f32(), count);
  } else {
    cpu::convert(dst, src, count);
  }
  return dst;
}

BlockVectors Gpt2Model::Impl::block_vectors(int l, ConstTypedPtr p) const {
  const BlockOffsets& o = block_offsets[static_cast<size_t>(l)];
  float* scratch = vector_buffer.as<float>();  // 13 C floats: all of a block's vectors
  BlockVectors v{};
  v.ln1_w = vector_values(p.at(o.ln1_w), C, &scratch);
  v.ln1_b = vector_values(p.at(o.ln1_b), C, &scratch);
  v.attn_b = vector_values(p.at(o.attn_b), 3 * C, &scratch);
  v.attn_proj_b = vector_values(p.at(o.attn_proj_b), C, &scratch);
  v.ln2_w = vector_values(p.at(o.ln2_w), C, &scratch);
  v.ln2_b = vector_values(p.at(o.ln2_b), C, &scratch);
  v.fc_b = vector_values(p.at(o.fc_b), 4 * C, &scratch);
  v.fc_proj_b = vector_values(p.at(o.fc_proj_b), C, &scratch);
  return v;
}

ConstTypedPtr Gpt2Model::Impl::for_gemm(const float* src, TypedPtr scratch, int64_t count) const {
  if (compute == DType::fp32) return src;
  cpu::convert(scratch, src, count);
  return scratch;
}

void Gpt2Model::Impl::block_forward(int l, const BlockVectors& v, const BlockWeights& w,
                                    bool recompute) {
  BlockActivations& a = acts(l);
  const float* x = residual[static_cast<size_t>(l)];
  const int64_t n = N();
  const int rows = static_cast<int>(n);
  const bool fp32 = compute == DType::fp32;
  cpu::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, v.ln1_w, v.ln1_b, n, C);
  // Attention reads the stored (rounded) qkv, as backward will.
  float* qkv_out = fp32 ? a.qkv.f32() : dbig;
  gemm(false, false, rows, 3 * C, C, 1.0f, a.ln1, C, w.attn, 3 * C, 0.0f, qkv_out, 3 * C);
  cpu::add_bias(a.qkv, qkv_out, v.attn_b, n, 3 * C);
  cpu::attention_forward(a.att, a.att_lse, a.qkv, {B, T, H, H, C / H});
  gemm(false, false, rows, C, C, 1.0f, a.att, C, w.attn_proj, C, 0.0f, branch, C);
  cpu::residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, branch,
                                  v.attn_proj_b, v.ln2_w, v.ln2_b, n, C);
  float* fc_out = fp32 ? a.fc_pre.f32() : dbig;
  gemm(false, false, rows, 4 * C, C, 1.0f, a.ln2, C, w.fc, 4 * C, 0.0f, fc_out, 4 * C);
  cpu::bias_gelu_forward(a.fc_act, a.fc_pre, fc_out, v.fc_b, n, 4 * C);
  if (recompute) return;
  gemm(false, false, rows, C, 4 * C, 1.0f, a.fc_act, 4 * C, w.fc_proj, C, 0.0f, branch, C);
  cpu::residual_add_bias(residual[static_cast<size_t>(l) + 1], a.res2, branch, v.fc_proj_b, n,
                         C);
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

  // MLP: y = res2 + gelu(ln2 Wfc + bfc) Wproj + bproj
  ConstTypedPtr dy = for_gemm(dres, dres_c, n * C);
  gemm(true, false, 4 * C, C, rows, 1.0f, a.fc_act, 4 * C, dy, C, 1.0f, g + o.fc_proj_w, C);
  cpu::bias_backward(g + o.fc_proj_b, dres, n, C);
  float* dfc = dbig;
  gemm(false, true, rows, 4 * C, C, 1.0f, dy, C, w.fc_proj, C, 0.0f, dfc, 4 * C);
  cpu::gelu_backward(dfc, dfc, a.fc_pre, n * 4 * C);
  const ConstTypedPtr dfc_g = for_gemm(dfc, dbig_c, n * 4 * C);
  gemm(true, false, C, 4 * C, rows, 1.0f, a.ln2, C, dfc_g, 4 * C, 1.0f, g + o.fc_w, 4 * C);
  cpu::bias_backward(g + o.fc_b, dfc, n, 4 * C);
  float* dln2 = dsmall;
  gemm(false, true, rows, C, 4 * C, 1.0f, dfc_g, 4 * C, w.fc, 4 * C, 0.0f, dln2, C);
  cpu::layernorm_backward(dres, g + o.ln2_w, g + o.ln2_b, dln2, a.res2, v.ln2_w, a.ln2_mean,
                          a.ln2_rstd, n, C);

  // Attention: res2 = x + attn(ln1 Wqkv + bqkv) Wproj + bproj
  dy = for_gemm(dres, dres_c, n * C);
  gemm(true, false, C, C, rows, 1.0f, a.att, C, dy, C, 1.0f, g + o.attn_proj_w, C);
  cpu::bias_backward(g + o.attn_proj_b, dres, n, C);
  float* datt = dsmall;
  gemm(false, true, rows, C, C, 1.0f, dy, C, w.attn_proj, C, 0.0f, datt, C);
  float* dqkv = dbig;
  cpu::attention_backward(dqkv, datt, a.qkv, a.att, a.att_lse, {B, T, H, H, C / H});
  const ConstTypedPtr dqkv_g = for_gemm(dqkv, dbig_c, n * 3 * C);
  gemm(true, false, C, 3 * C, rows, 1.0f, a.ln1, C, dqkv_g, 3 * C, 1.0f, g + o.attn_w, 3 * C);
  cpu::bias_backward(g + o.attn_b, dqkv, n, 3 * C);
  float* dln1 = dsmall;
  gemm(false, true, rows, C, 3 * C, 1.0f, dqkv_g, 3 * C, w.attn, 3 * C, 0.0f, dln1, C);
  cpu::layernorm_backward(dres, g + o.ln1_w, g + o.ln1_b, dln1, x, v.ln1_w, a.ln1_mean,
                          a.ln1_rstd, n, C);
}

void Gpt2Model::Impl::final_forward(ParamPointers params, UnitPointers grads,
                                    const MicroBatch& batch, bool training, float grad_scale) {
  const ConstTypedPtr p = params[final_unit];
  float* scratch = vector_buffer.as<float>();
  const float* weight = vector_values(p.at(lnf_w), C, &scratch);
  const float* bias = vector_values(p.at(lnf_b), C, &scratch);
  const int64_t n = N();
  cpu::layernorm_forward(lnf, lnf_mean, lnf_rstd, residual[L], weight, bias, n, C);
  final_done = true;
  if (batch.targets == nullptr) {
    SHARDLM_CHECK(!training, "model: a training forward needs targets");
    return;
  }
  target_count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = batch.targets[i];
    SHARDLM_CHECK(t == kIgnoreIndex || (t >= 0 && t < V),
                  "model: target {} at position {} is outside [0, {}) and is not the ignore "
                  "index {}",
                  t, i, V, kIgnoreIndex);
    target_count += t != kIgnoreIndex;
  }
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
  cpu::LmHeadLossArgs args;
  args.x = lnf;
  args.weight = head_weights(params);
  args.targets = batch.targets;
  args.N = n;
  args.C = C;
  args.V = V;
  args.grad_scale = grad_scale;
  args.logits_scratch = logits_chunk;
  args.logits_stride = Vp;
  args.dlogits_scratch = dlogits_c;
  args.chunk_rows = chunk_rows;
  cpu::lm_head_cross_entropy(args, row_loss, training ? dlnf : nullptr, dhead);
  loss_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) loss_sum += row_loss[i];
  if (training) next_backward_unit = final_unit;
}

namespace {

template <typename Pointer>
void check_pointers(std::span<const Pointer> pointers, int needed_unit, int num_units,
                    const char* what, int unit) {
  SHARDLM_CHECK(static_cast<int>(pointers.size()) == num_units,
                "model: {} for unit {} must have one entry per unit ({}), got {}", what, unit,
                num_units, pointers.size());
  const void* p = nullptr;
  if constexpr (std::is_pointer_v<Pointer>) {
    p = pointers[needed_unit];
  } else {
    p = pointers[needed_unit].data;
  }
  SHARDLM_CHECK(p != nullptr, "model: {} of unit {} is null (needed by unit {})", what,
                needed_unit, unit);
}

}  // namespace

void Gpt2Model::Impl::check_params(ParamPointers params, int unit,
                                   const std::vector<int>& units) const {
  for (int needed : units) {
    check_pointers(params, needed, L + 2, "params", unit);
    const DType type = params[needed].dtype;
    SHARDLM_CHECK(type == DType::fp32 || type == compute,
                  "model: params of unit {} are {}; a {} run takes fp32 or {}", needed,
                  dtype_name(type), dtype_name(compute), dtype_name(compute));
  }
}

std::vector<int> Gpt2Model::Impl::needed_units(int unit) const {
  SHARDLM_CHECK(unit >= 0 && unit < L + 2, "model: unit {} out of range [0, {})", unit, L + 2);
  return gpt2_family().unit_needs(config)[static_cast<size_t>(unit)];
}

std::vector<int> Gpt2Model::units_needed_for(int unit) const { return impl_->needed_units(unit); }

void Gpt2Model::forward_unit(int unit, ParamPointers params, UnitPointers grads,
                             const MicroBatch& batch, bool training, float grad_scale) {
  Impl& m = *impl_;
  m.check_params(params, unit, m.needed_units(unit));
  if (unit == 0) {
    SHARDLM_CHECK(batch.B > 0 && batch.B <= m.max_batch,
                  "model: batch size {} is outside [1, {}] (the size the model was built for)",
                  batch.B, m.max_batch);
    SHARDLM_CHECK(batch.T > 0 && batch.T <= m.max_seq,
                  "model: sequence length {} is outside [1, {}] (the size the model was built for)",
                  batch.T, m.max_seq);
    SHARDLM_CHECK(batch.tokens != nullptr, "model: the micro-batch has no tokens");
    m.B = batch.B;
    m.T = batch.T;
    const int64_t n = m.N();
    for (int64_t i = 0; i < n; ++i)
      SHARDLM_CHECK(batch.tokens[i] >= 0 && batch.tokens[i] < m.V,
                    "model: token {} at position {} is outside the vocabulary [0, {})",
                    batch.tokens[i], i, m.V);
    m.have_batch = true;
    m.final_done = false;
    m.next_backward_unit = -1;
    m.loss_sum = 0.0;
    m.target_count = 0;
    const ConstTypedPtr p = params[0];
    cpu::embedding_forward(m.residual[0], batch.tokens, p.at(m.wte), p.at(m.wpe), m.B, m.T, m.C,
                           m.compute);
    return;
  }
  SHARDLM_CHECK(m.have_batch && batch.B == m.B && batch.T == m.T,
                "model: forward of unit {} got a {}x{} batch; unit 0 last ran {}x{}", unit, batch.B,
                batch.T, m.B, m.T);
  if (unit < m.final_unit) {
    const ConstTypedPtr p = params[unit];
    m.block_forward(unit - 1, m.block_vectors(unit - 1, p), m.block_weights(unit - 1, p),
                    /*recompute=*/false);
  } else {
    m.final_forward(params, grads, batch, training, grad_scale);
  }
}

void Gpt2Model::backward_unit(int unit, ParamPointers params, UnitPointers grads,
                              const MicroBatch& batch) {
  Impl& m = *impl_;
  SHARDLM_CHECK(m.next_backward_unit >= 0,
                "model: backward of unit {} without a training forward of the final unit", unit);
  SHARDLM_CHECK(unit == m.next_backward_unit,
                "model: backward of unit {} out of order (expected unit {})", unit,
                m.next_backward_unit);
  SHARDLM_CHECK(batch.B == m.B && batch.T == m.T,
                "model: backward of unit {} got a {}x{} batch; the forward ran {}x{}", unit,
                batch.B, batch.T, m.B, m.T);
  m.check_params(params, unit, {unit});
  check_pointers(grads, unit, num_units(), "grads", unit);
  const int64_t n = m.N();
  const ConstTypedPtr p = params[unit];
  if (unit == m.final_unit) {
    float* g = grads[unit];
    float* scratch = m.vector_buffer.as<float>();
    const float* weight = m.vector_values(p.at(m.lnf_w), m.C, &scratch);
    std::memset(m.dres, 0, sizeof(float) * n * m.C);
    cpu::layernorm_backward(m.dres, g + m.lnf_w, g + m.lnf_b, m.dlnf, m.residual[m.L], weight,
                            m.lnf_mean, m.lnf_rstd, n, m.C);
  } else if (unit > 0) {
    // One conversion serves the recompute and the backward.
    const BlockVectors v = m.block_vectors(unit - 1, p);
    const BlockWeights w = m.block_weights(unit - 1, p);
    if (m.options.activation_checkpointing) m.block_forward(unit - 1, v, w, /*recompute=*/true);
    m.block_backward(unit - 1, v, w, grads[unit]);
  } else {
    SHARDLM_CHECK(batch.tokens != nullptr, "model: the micro-batch has no tokens");
    float* g = grads[0];
    cpu::embedding_backward(g + m.wte, g + m.wpe, m.dres, batch.tokens, m.B, m.T, m.C);
  }
  m.next_backward_unit = unit - 1;
}

double Gpt2Model::last_loss_sum() const { return impl_->loss_sum; }
int64_t Gpt2Model::last_target_count() const { return impl_->target_count; }

void Gpt2Model::logits_at(ParamPointers params, int t, float* out) const {
  const Impl& m = *impl_;
  SHARDLM_CHECK(m.final_done, "model: logits_at needs a forward of the final unit first");
  SHARDLM_CHECK(t >= 0 && t < m.T, "model: logits_at position {} is outside [0, {})", t, m.T);
  m.check_params(params, m.final_unit, m.needed_units(m.final_unit));
  // Row b's hidden state at position t is lnf[(b*T + t)*C]: a strided [B, C] matrix.
  gemm(false, true, m.B, m.V, m.C, 1.0f, m.lnf.at(static_cast<int64_t>(t) * m.C), m.T * m.C,
       m.head_weights(params), m.C, 0.0f, out, m.V);
}

}  // namespace shardlm
