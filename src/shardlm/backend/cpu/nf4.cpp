#include "shardlm/backend/cpu/nf4.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/core/error.hpp"

namespace shardlm::cpu {

namespace {

// Midpoints between consecutive codes, exact in double (the codes are floats of
// nearby magnitudes).
struct Midpoints {
  double m[15];
  Midpoints() {
    for (int i = 0; i < 15; ++i)
      m[i] = (static_cast<double>(kNf4Codes[i]) + static_cast<double>(kNf4Codes[i + 1])) / 2.0;
  }
};
const Midpoints kMidpoints;

const uint8_t* nibbles_of(const void* storage, int64_t n) {
  return static_cast<const uint8_t*>(storage) + 4 * nf4_blocks(n);
}

// A block's 16 dequantized values in the output type, then the codes looked up.
template <typename T, typename Convert>
void dequantize_block(const float* absmax, const uint8_t* bytes, int64_t n, int64_t block,
                      T* out, Convert convert) {
  const int64_t begin = block * kNf4BlockSize;
  const int64_t end = std::min(begin + kNf4BlockSize, n);
  T table[16];
  for (int i = 0; i < 16; ++i) table[i] = convert(kNf4Codes[i] * absmax[block]);
  // begin is even (the block size is), so values pair up within a byte.
  int64_t i = begin;
  for (; i + 1 < end; i += 2) {
    const uint8_t b = bytes[i / 2];
    out[i] = table[b >> 4];
    out[i + 1] = table[b & 15];
  }
  if (i < end) out[i] = table[bytes[i / 2] >> 4];
}

}  // namespace

int nf4_code_index(float v) {
  const double x = v;
  int index = 0;
  for (int i = 0; i < 15; ++i) index += x > kMidpoints.m[i] ? 1 : 0;
  return index;
}

void nf4_quantize(const float* x, int64_t n, void* out) {
  SHARDLM_CHECK(n >= 0, "nf4: negative element count {}", n);
  const int64_t blocks = nf4_blocks(n);
  float* absmax = static_cast<float*>(out);
  uint8_t* bytes = static_cast<uint8_t*>(out) + 4 * blocks;
  const int64_t words = nf4_storage_words(n);
  // Zero the padding of the last word (and the low nibble of an odd tail).
  std::memset(static_cast<uint8_t*>(out) + 4 * (words - 1), 0, 4);
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4BlockSize;
    const int64_t end = std::min(begin + kNf4BlockSize, n);
    float a = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      finite = finite && std::isfinite(x[i]);
      a = std::max(a, std::fabs(x[i]));
    }
    absmax[b] = a;
    for (int64_t i = begin; i < end; i += 2) {
      const int hi = a > 0.0f ? nf4_code_index(x[i] / a) : 7;
      const int lo = i + 1 < end ? (a > 0.0f ? nf4_code_index(x[i + 1] / a) : 7) : 0;
      bytes[i / 2] = static_cast<uint8_t>((hi << 4) | lo);
    }
  }
  SHARDLM_CHECK(finite, "nf4: cannot quantize a non-finite value");
}

void nf4_dequantize(const void* in, int64_t n, TypedPtr out) {
  const float* absmax = static_cast<const float*>(in);
  const uint8_t* bytes = nibbles_of(in, n);
  const int64_t blocks = nf4_blocks(n);
  switch (out.dtype) {
    case DType::fp32: {
      float* o = static_cast<float*>(out.data);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < blocks; ++b)
        dequantize_block(absmax, bytes, n, b, o, [](float v) { return v; });
      break;
    }
    case DType::bf16: {
      uint16_t* o = static_cast<uint16_t*>(out.data);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < blocks; ++b)
        dequantize_block(absmax, bytes, n, b, o, [](float v) { return float_to_bf16(v); });
      break;
    }
    case DType::fp16: {
      uint16_t* o = static_cast<uint16_t*>(out.data);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < blocks; ++b)
        dequantize_block(absmax, bytes, n, b, o, [](float v) { return float_to_fp16(v); });
      break;
    }
  }
}

}  // namespace shardlm::cpu
