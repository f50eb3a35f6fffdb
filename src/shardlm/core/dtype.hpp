// Element types of compute tensors, dtype-tagged pointers, and scalar conversions
// (every room uses them; the array conversions are CPU kernels: backend/cpu/convert.hpp).
//
// Precision is a property of the run (--precision fp32|bf16|fp16): master weights,
// optimizer state and gradients stay fp32; GEMM inputs are held in the compute type.
// Kernels that read or write compute-type tensors take TypedPtr / ConstTypedPtr, so
// the call sites do not change with the precision. A float* converts implicitly to
// a fp32-tagged pointer.
//
// Conversions round to nearest, ties to even (what the hardware's cvtneps2bf16 and
// vcvtps2ph do). Values beyond the type's range become +-inf (fp16 overflows above
// 65504, which is what fp16 loss scaling detects); NaN stays NaN.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlm {

enum class DType : uint8_t { fp32, bf16, fp16 };

size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);  // "fp32", "bf16", "fp16"
// Parses "fp32", "bf16" or "fp16"; throws Error naming `what` (e.g. "--precision")
// and the accepted values otherwise.
DType parse_dtype(std::string_view name, std::string_view what);


struct TypedPtr {
  void* data = nullptr;
  DType dtype = DType::fp32;

  TypedPtr() = default;
  TypedPtr(void* d, DType t) : data(d), dtype(t) {}
  TypedPtr(float* d) : data(d), dtype(DType::fp32) {}  // NOLINT: implicit on purpose

  // The pointer `elements` elements further on.
  TypedPtr at(int64_t elements) const {
    return {static_cast<std::byte*>(data) + elements * static_cast<int64_t>(dtype_bytes(dtype)),
            dtype};
  }
  float* f32() const;  // throws Error unless dtype == fp32
};

struct ConstTypedPtr {
  const void* data = nullptr;
  DType dtype = DType::fp32;

  ConstTypedPtr() = default;
  ConstTypedPtr(const void* d, DType t) : data(d), dtype(t) {}
  ConstTypedPtr(const float* d) : data(d), dtype(DType::fp32) {}  // NOLINT: implicit
  ConstTypedPtr(TypedPtr p) : data(p.data), dtype(p.dtype) {}     // NOLINT: implicit

  ConstTypedPtr at(int64_t elements) const {
    return {static_cast<const std::byte*>(data) +
                elements * static_cast<int64_t>(dtype_bytes(dtype)),
            dtype};
  }
  const float* f32() const;  // throws Error unless dtype == fp32
};

// Scalar conversions, inline so the array loops below vectorize.
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
inline float bf16_to_float(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}
inline uint16_t float_to_fp16(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}
inline float fp16_to_float(uint16_t value) {
  return static_cast<float>(std::bit_cast<_Float16>(value));
}
// value rounded to `dtype` and widened back (exact in fp32).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(float_to_bf16(value));
    case DType::fp16: return fp16_to_float(float_to_fp16(value));
    case DType::fp32: break;
  }
  return value;
}

// Element writers for kernels that compute in fp32 and store in the output's type:
// a kernel templated on the writer stays one loop the compiler vectorizes, and its
// fp32 instance is the plain store. with_writer() picks the instance for a TypedPtr.
// round(v) is v rounded to the writer's type (what a store and reload would give).
struct Fp32Writer {
  float* p;
  static float round(float v) { return v; }
  void operator()(int64_t i, float v) const { p[i] = v; }
  Fp32Writer at(int64_t offset) const { return {p + offset}; }
};
struct Bf16Writer {
  uint16_t* p;
  static float round(float v) { return bf16_to_float(float_to_bf16(v)); }
  void operator()(int64_t i, float v) const { p[i] = float_to_bf16(v); }
  Bf16Writer at(int64_t offset) const { return {p + offset}; }
};
struct Fp16Writer {
  uint16_t* p;
  static float round(float v) { return fp16_to_float(float_to_fp16(v)); }
  void operator()(int64_t i, float v) const { p[i] = float_to_fp16(v); }
  Fp16Writer at(int64_t offset) const { return {p + offset}; }
};

template <typename F>
void with_writer(TypedPtr out, F&& f) {
  switch (out.dtype) {
    case DType::fp32: f(Fp32Writer{static_cast<float*>(out.data)}); return;
    case DType::bf16: f(Bf16Writer{static_cast<uint16_t*>(out.data)}); return;
    case DType::fp16: f(Fp16Writer{static_cast<uint16_t*>(out.data)}); return;
  }
}

// Element readers, the counterpart for kernels that read a compute-type input and
// compute in fp32. at(offset) is the reader `offset` elements further on.
struct Fp32Reader {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
  Fp32Reader at(int64_t offset) const { return {p + offset}; }
};
struct Bf16Reader {
  const uint16_t* p;
  float operator()(int64_t i) const { return bf16_to_float(p[i]); }
  Bf16Reader at(int64_t offset) const { return {p + offset}; }
};
struct Fp16Reader {
  const uint16_t* p;
  float operator()(int64_t i) const { return fp16_to_float(p[i]); }
  Fp16Reader at(int64_t offset) const { return {p + offset}; }
};

template <typename F>
void with_reader(ConstTypedPtr in, F&& f) {
  switch (in.dtype) {
    case DType::fp32: f(Fp32Reader{static_cast<const float*>(in.data)}); return;
    case DType::bf16: f(Bf16Reader{static_cast<const uint16_t*>(in.data)}); return;
    case DType::fp16: f(Fp16Reader{static_cast<const uint16_t*>(in.data)}); return;
  }
}

}  // namespace shardlm
