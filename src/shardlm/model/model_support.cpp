#include "shardlm/model/model_support.hpp"

#include <algorithm>

#include "shardlm/core/error.hpp"

namespace shardlm {

namespace {

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

}  // namespace

void ArenaCarver::request(float** slot, int64_t count) {
  add([slot](std::byte* p) { *slot = reinterpret_cast<float*>(p); }, count * 4);
}

void ArenaCarver::request(int32_t** slot, int64_t count) {
  add([slot](std::byte* p) { *slot = reinterpret_cast<int32_t*>(p); }, count * 4);
}

void ArenaCarver::request(TypedPtr* slot, DType dtype, int64_t count) {
  add([slot, dtype](std::byte* p) { *slot = TypedPtr(p, dtype); },
      count * static_cast<int64_t>(dtype_bytes(dtype)));
}

void ArenaCarver::share(TypedPtr* slot, const TypedPtr* same_as) {
  requests_.push_back({[slot, same_as](std::byte*) { *slot = *same_as; }, offset_});
}

TrackedBuffer ArenaCarver::allocate(Backend& backend, MemoryTracker& tracker) {
  TrackedBuffer buffer =
      allocate_on(backend, MemCategory::activations, static_cast<size_t>(offset_), tracker);
  for (const auto& r : requests_) r.assign(buffer.as<std::byte>() + r.offset);
  return buffer;
}

void ArenaCarver::add(std::function<void(std::byte*)> assign, int64_t bytes) {
  requests_.push_back({std::move(assign), offset_});
  offset_ += (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

ParamRounding::ParamRounding(Backend& backend, DType compute, int64_t weight_scratch_elements,
                             int64_t vector_scratch_floats, MemoryTracker& tracker)
    : backend_(&backend),
      compute_(compute),
      weight_type_(compute == DType::fp16 ? DType::fp32 : compute),
      weight_scratch_elements_(weight_scratch_elements),
      tracker_(&tracker) {
  if (compute_ != DType::fp32)
    vector_buffer_ = allocate_on(backend, MemCategory::params,
                                 sizeof(float) * static_cast<size_t>(vector_scratch_floats), tracker);
}

int64_t ParamRounding::planned_bytes(DType compute, int64_t weight_scratch_elements,
                                     int64_t vector_scratch_floats, bool params_in_compute_type) {
  if (compute == DType::fp32) return 0;
  int64_t bytes = static_cast<int64_t>(sizeof(float)) * vector_scratch_floats;
  const DType weight_type = compute == DType::fp16 ? DType::fp32 : compute;
  // The weight scratch serves weights that arrive in another type.
  const bool weights_ready = params_in_compute_type && weight_type == compute;
  if (!weights_ready)
    bytes += weight_scratch_elements * static_cast<int64_t>(dtype_bytes(weight_type));
  return bytes;
}

ConstTypedPtr ParamRounding::gemm_weight(ConstTypedPtr src, int64_t scratch_offset,
                                         int64_t count) const {
  const bool ready =
      src.dtype == weight_type_ && (compute_ == DType::fp32 || src.dtype != DType::fp32);
  if (ready) return src;
  if (weight_buffer_.data() == nullptr)
    weight_buffer_ = allocate_on(
        *backend_, MemCategory::params,
        static_cast<size_t>(weight_scratch_elements_) * dtype_bytes(weight_type_), *tracker_);
  SHARDLM_ASSERT(scratch_offset + count <= weight_scratch_elements_);
  const TypedPtr scratch = TypedPtr(weight_buffer_.data(), weight_type_).at(scratch_offset);
  if (src.dtype == DType::fp32 && weight_type_ == DType::fp32) {
    backend_->round_to(compute_, scratch.f32(), src.f32(), count);  // fp16 values kept in fp32
  } else {
    backend_->convert(scratch, src, count);  // rounds fp32 to bf16, or widens fp16 exactly
  }
  return scratch;
}

const float* ParamRounding::vector_values(ConstTypedPtr src, int64_t count, float** scratch) const {
  if (compute_ == DType::fp32) return src.f32();
  float* dst = *scratch;
  *scratch += count;
  if (src.dtype == DType::fp32) {
    backend_->round_to(compute_, dst, src.f32(), count);
  } else {
    backend_->convert(dst, src, count);
  }
  return dst;
}

ConstTypedPtr ParamRounding::for_gemm(const float* src, TypedPtr scratch, int64_t count) const {
  if (compute_ == DType::fp32) return src;
  backend_->convert(scratch, src, count);
  return scratch;
}

void check_param_pointers(ParamPointers params, int num_units, const std::vector<int>& units,
                          int unit, DType compute) {
  SHARDLM_CHECK(static_cast<int>(params.size()) == num_units,
                "model: params for unit {} must have one entry per unit ({}), got {}", unit,
                num_units, params.size());
  for (int needed : units) {
    SHARDLM_CHECK(params[needed].data != nullptr,
                  "model: params of unit {} is null (needed by unit {})", needed, unit);
    const DType type = params[needed].dtype;
    SHARDLM_CHECK(type == DType::fp32 || type == compute,
                  "model: params of unit {} are {}; a {} run takes fp32 or {}", needed,
                  dtype_name(type), dtype_name(compute), dtype_name(compute));
  }
}

void check_grad_pointer(UnitPointers grads, int num_units, int unit) {
  SHARDLM_CHECK(static_cast<int>(grads.size()) == num_units,
                "model: grads for unit {} must have one entry per unit ({}), got {}", unit,
                num_units, grads.size());
  SHARDLM_CHECK(grads[unit] != nullptr, "model: grads of unit {} is null (needed by unit {})",
                unit, unit);
}

void forward_gemm(Backend& backend, bool row_by_row, bool trans_w, int rows, int N, int K,
                  float alpha, ConstTypedPtr x, int lda, ConstTypedPtr w, int ldw, float beta,
                  float* out, int ldc) {
  if (!row_by_row) {
    backend.gemm(false, trans_w, rows, N, K, alpha, x, lda, w, ldw, beta, out, ldc);
    return;
  }
  for (int r = 0; r < rows; ++r)
    backend.gemm(false, trans_w, 1, N, K, alpha, x.at(static_cast<int64_t>(r) * lda), lda, w, ldw,
                 beta, out + static_cast<int64_t>(r) * ldc, ldc);
}

std::vector<int32_t> start_cached_step(const MicroBatch& batch, const KvCache& cache,
                                       int layers, int64_t kv_width, DType compute, int max_seq,
                                       int vocab_size) {
  SHARDLM_CHECK(batch.B == 1 && batch.targets == nullptr && batch.positions == nullptr &&
                    batch.key_begin == nullptr,
                "model: a KV-cache step takes one sequence of tokens (batch {}), without "
                "targets, positions or document starts",
                batch.B);
  SHARDLM_CHECK(cache.layers() == layers && cache.kv_width() == kv_width &&
                    cache.dtype() == compute,
                "model: the KV cache holds {} layers x {} {} values; this model needs {} x {} {}",
                cache.layers(), cache.kv_width(), dtype_name(cache.dtype()), layers, kv_width,
                dtype_name(compute));
  SHARDLM_CHECK(batch.T >= 1 && batch.T <= cache.room(),
                "model: {} new tokens do not fit the KV cache ({} of {} positions used)", batch.T,
                cache.length(), cache.capacity());
  SHARDLM_CHECK(cache.capacity() <= max_seq,
                "model: the KV cache holds {} positions, the model was built for {}",
                cache.capacity(), max_seq);
  MicroBatch tokens_only = batch;
  check_micro_batch(tokens_only, 1, max_seq, vocab_size);
  std::vector<int32_t> positions(static_cast<size_t>(batch.T));
  for (int t = 0; t < batch.T; ++t) positions[static_cast<size_t>(t)] = cache.length() + t;
  return positions;
}

void check_micro_batch(const MicroBatch& batch, int max_batch, int max_seq, int vocab_size) {
  SHARDLM_CHECK(batch.B > 0 && batch.B <= max_batch,
                "model: batch size {} is outside [1, {}] (the size the model was built for)",
                batch.B, max_batch);
  SHARDLM_CHECK(batch.T > 0 && batch.T <= max_seq,
                "model: sequence length {} is outside [1, {}] (the size the model was built for)",
                batch.T, max_seq);
  SHARDLM_CHECK(batch.tokens != nullptr, "model: the micro-batch has no tokens");
  const int64_t n = static_cast<int64_t>(batch.B) * batch.T;
  for (int64_t i = 0; i < n; ++i)
    SHARDLM_CHECK(batch.tokens[i] >= 0 && batch.tokens[i] < vocab_size,
                  "model: token {} at position {} is outside the vocabulary [0, {})",
                  batch.tokens[i], i, vocab_size);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i % batch.T;
    if (batch.positions != nullptr)
      SHARDLM_CHECK(batch.positions[i] >= 0 && batch.positions[i] <= t,
                    "model: position id {} at row {} column {} is outside [0, {}]",
                    batch.positions[i], i / batch.T, t, t);
    if (batch.key_begin != nullptr)
      SHARDLM_CHECK(batch.key_begin[i] >= 0 && batch.key_begin[i] <= t,
                    "model: document start {} at row {} column {} is outside [0, {}]",
                    batch.key_begin[i], i / batch.T, t, t);
  }
}

int64_t count_targets(const int32_t* targets, int64_t n, int vocab_size) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets[i];
    SHARDLM_CHECK(t == kIgnoreIndex || (t >= 0 && t < vocab_size),
                  "model: target {} at position {} is outside [0, {}) and is not the ignore "
                  "index {}",
                  t, i, vocab_size, kIgnoreIndex);
    count += t != kIgnoreIndex;
  }
  return count;
}

void MicroBatchState::start(const MicroBatch& batch) {
  B = batch.B;
  T = batch.T;
  have_batch_ = true;
  final_done_ = false;
  next_backward_unit_ = -1;
  loss_sum = 0.0;
  target_count = 0;
}

void MicroBatchState::check_forward(int unit, const MicroBatch& batch) const {
  SHARDLM_CHECK(have_batch_ && batch.B == B && batch.T == T,
                "model: forward of unit {} got a {}x{} batch; unit 0 last ran {}x{}", unit, batch.B,
                batch.T, B, T);
}

void MicroBatchState::finish_forward(bool training) {
  final_done_ = true;
  if (training) next_backward_unit_ = num_units_ - 1;
}

void MicroBatchState::begin_backward(int unit, const MicroBatch& batch) {
  SHARDLM_CHECK(next_backward_unit_ >= 0,
                "model: backward of unit {} without a training forward of the final unit", unit);
  SHARDLM_CHECK(unit == next_backward_unit_,
                "model: backward of unit {} out of order (expected unit {})", unit,
                next_backward_unit_);
  SHARDLM_CHECK(batch.B == B && batch.T == T,
                "model: backward of unit {} got a {}x{} batch; the forward ran {}x{}", unit,
                batch.B, batch.T, B, T);
  next_backward_unit_ = unit - 1;
}

void MicroBatchState::check_logits_at(int t) const {
  SHARDLM_CHECK(final_done_, "model: logits_at needs a forward of the final unit first");
  SHARDLM_CHECK(t >= 0 && t < T, "model: logits_at position {} is outside [0, {})", t, T);
}

int LmHead::chunk_rows_for(int64_t n, int padded_vocab) {
  const int64_t max_rows =
      std::clamp<int64_t>(kLogitsChunkBytes / (static_cast<int64_t>(padded_vocab) * 4), 1, n);
  const int64_t num_chunks = (n + max_rows - 1) / max_rows;
  int64_t rows = (n + num_chunks - 1) / num_chunks;
  if (rows >= 16) rows = std::min<int64_t>((rows + 15) / 16 * 16, n);
  return static_cast<int>(rows);
}

void LmHead::carve(ArenaCarver& carver, int64_t n, int vocab_size, int padded_vocab, int C,
                   DType compute) {
  V_ = vocab_size;
  Vp_ = padded_vocab;
  C_ = C;
  chunk_rows_ = chunk_rows_for(n, padded_vocab);
  carver.request(&logits_chunk_, static_cast<int64_t>(chunk_rows_) * Vp_);
  carver.request(&row_loss_, n);
  if (compute != DType::fp32)
    carver.request(&dlogits_c_, compute, static_cast<int64_t>(chunk_rows_) * Vp_);
}

double LmHead::loss(Backend& backend, ConstTypedPtr x, ConstTypedPtr weight,
                    const int32_t* targets, int64_t n, float grad_scale, float* dx,
                    float* dweight) const {
  LmHeadLossArgs args;
  args.x = x;
  args.weight = weight;
  args.targets = targets;
  args.N = n;
  args.C = C_;
  args.V = V_;
  args.grad_scale = grad_scale;
  args.logits_scratch = logits_chunk_;
  args.logits_stride = Vp_;
  args.dlogits_scratch = dlogits_c_;
  args.chunk_rows = chunk_rows_;
  backend.lm_head_cross_entropy(args, row_loss_, dx, dweight);
  return backend.sum(row_loss_, n);
}

void LmHead::logits(Backend& backend, ConstTypedPtr x, int64_t ld, int rows,
                    ConstTypedPtr weight, float* out) const {
  if (backend.device().is_host()) {
    backend.gemm(false, true, rows, V_, C_, 1.0f, x, static_cast<int>(ld), weight, C_, 0.0f, out,
                 V_);
    return;
  }
  SHARDLM_CHECK(rows <= chunk_rows_, "model: logits of {} rows exceed the logits chunk ({} rows)",
                rows, chunk_rows_);
  backend.gemm(false, true, rows, V_, C_, 1.0f, x, static_cast<int>(ld), weight, C_, 0.0f,
               logits_chunk_, V_);
  backend.copy_to_host(out, logits_chunk_, sizeof(float) * static_cast<size_t>(rows) * V_);
}

void StagedBatch::carve(ArenaCarver& carver, int64_t n, bool on_device) {
  on_device_ = on_device;
  if (!on_device) return;
  carver.request(&device_tokens_, n);
  carver.request(&device_targets_, n);
  carver.request(&device_positions_, n);
  carver.request(&device_key_begin_, n);
}

void StagedBatch::stage(Backend& backend, const MicroBatch& batch, bool default_positions) {
  if (!on_device_) {
    tokens = batch.tokens;
    targets = batch.targets;
    positions = batch.positions;
    key_begin = batch.key_begin;
    return;
  }
  const size_t n = static_cast<size_t>(batch.B) * static_cast<size_t>(batch.T);
  auto upload = [&](int32_t* dst, const int32_t* src) -> const int32_t* {
    if (src == nullptr) return nullptr;
    backend.copy_from_host(dst, src, n * sizeof(int32_t));
    return dst;
  };
  tokens = upload(device_tokens_, batch.tokens);
  targets = upload(device_targets_, batch.targets);
  key_begin = upload(device_key_begin_, batch.key_begin);
  const int32_t* host_positions = batch.positions;
  if (host_positions == nullptr && default_positions) {
    host_positions_.resize(n);
    for (size_t i = 0; i < n; ++i)
      host_positions_[i] = static_cast<int32_t>(i % static_cast<size_t>(batch.T));
    host_positions = host_positions_.data();
  }
  positions = upload(device_positions_, host_positions);
}

}  // namespace shardlm
