#include "shardlm/backend/cpu/dtype.hpp"

#include <cstring>

#include "shardlm/core/error.hpp"
#include "shardlm/core/phase_profile.hpp"

namespace shardlm {

size_t dtype_bytes(DType dtype) { return dtype == DType::fp32 ? 4 : 2; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "fp32") return DType::fp32;
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::fp16;
  throw Error(fmt::format("{} '{}' is not a precision; expected fp32, bf16 or fp16", what, name));
}

}  // namespace shardlm

namespace shardlm::cpu {

float* TypedPtr::f32() const {
  SHARDLM_CHECK(dtype == DType::fp32, "internal: a {} tensor was read as fp32", dtype_name(dtype));
  return static_cast<float*>(data);
}

const float* ConstTypedPtr::f32() const {
  SHARDLM_CHECK(dtype == DType::fp32, "internal: a {} tensor was read as fp32", dtype_name(dtype));
  return static_cast<const float*>(data);
}

namespace {

// Below this many elements a conversion runs on the calling thread (a parallel
// region costs a few microseconds). Op is a lambda, never a function pointer, so it
// inlines and the loop vectorizes.
constexpr int64_t kParallelThreshold = 1 << 15;

template <typename Dst, typename Src, typename Op>
void map_elements(Dst* dst, const Src* src, int64_t n, Op op, bool may_thread = true) {
  if (!may_thread || n < kParallelThreshold) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = op(src[i]);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = op(src[i]);
}

// may_thread = false: the caller is already inside a parallel region.
void convert_contiguous(TypedPtr dst, ConstTypedPtr src, int64_t n, bool may_thread = true) {
  if (n <= 0) return;
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.data, src.data, static_cast<size_t>(n) * dtype_bytes(dst.dtype));
    return;
  }
  auto* d16 = static_cast<uint16_t*>(dst.data);
  const auto* s16 = static_cast<const uint16_t*>(src.data);
  if (src.dtype == DType::fp32) {
    const auto* s = static_cast<const float*>(src.data);
    if (dst.dtype == DType::bf16)
      return map_elements(d16, s, n, [](float v) { return float_to_bf16(v); }, may_thread);
    return map_elements(d16, s, n, [](float v) { return float_to_fp16(v); }, may_thread);
  }
  if (dst.dtype == DType::fp32) {
    auto* d = static_cast<float*>(dst.data);
    if (src.dtype == DType::bf16)
      return map_elements(d, s16, n, [](uint16_t v) { return bf16_to_float(v); }, may_thread);
    return map_elements(d, s16, n, [](uint16_t v) { return fp16_to_float(v); }, may_thread);
  }
  // bf16 <-> fp16 through fp32 (not used by the model; kept total).
  if (dst.dtype == DType::fp16)
    return map_elements(d16, s16, n, [](uint16_t v) { return float_to_fp16(bf16_to_float(v)); },
                        may_thread);
  return map_elements(d16, s16, n, [](uint16_t v) { return float_to_bf16(fp16_to_float(v)); },
                      may_thread);
}

}  // namespace

void convert(TypedPtr dst, ConstTypedPtr src, int64_t n) {
  const PhaseScope phase(Phase::norms_elementwise);
  convert_contiguous(dst, src, n);
}

void convert_rows(TypedPtr dst, int64_t ld_dst, ConstTypedPtr src, int64_t ld_src, int64_t rows,
                  int64_t cols) {
  const PhaseScope phase(Phase::norms_elementwise);
  if (ld_dst == cols && ld_src == cols) return convert_contiguous(dst, src, rows * cols);
  if (rows * cols < kParallelThreshold) {
    for (int64_t r = 0; r < rows; ++r) convert_contiguous(dst.at(r * ld_dst), src.at(r * ld_src), cols);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    convert_contiguous(dst.at(r * ld_dst), src.at(r * ld_src), cols, /*may_thread=*/false);
}

void round_to(DType dtype, float* dst, const float* src, int64_t n) {
  const PhaseScope phase(Phase::norms_elementwise);
  switch (dtype) {
    case DType::bf16:
      return map_elements(dst, src, n, [](float v) { return bf16_to_float(float_to_bf16(v)); });
    case DType::fp16:
      return map_elements(dst, src, n, [](float v) { return fp16_to_float(float_to_fp16(v)); });
    case DType::fp32:
      if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
  }
}

}  // namespace shardlm::cpu
