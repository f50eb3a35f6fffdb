// NF4 quantization against a naive reference written from the definition: per block
// of 64 the absmax, per value the code nearest to value / absmax (ties to the lower
// code), two codes per byte high nibble first after the block absmaxes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "shardlm/backend/cpu/nf4.hpp"

namespace shardlm {
namespace {

using cpu::kNf4Codes;

int naive_index(float x, float absmax) {
  if (absmax == 0.0f) return 7;
  const double v = static_cast<double>(x / absmax);
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs(v - kNf4Codes[i]) < std::fabs(v - kNf4Codes[best])) best = i;  // ties: lower
  return best;
}

struct Naive {
  std::vector<float> absmax;
  std::vector<int> codes;
};

Naive naive_quantize(const std::vector<float>& x) {
  Naive r;
  for (size_t b = 0; b < x.size(); b += 64) {
    float a = 0;
    for (size_t i = b; i < std::min(x.size(), b + 64); ++i) a = std::max(a, std::fabs(x[i]));
    r.absmax.push_back(a);
    for (size_t i = b; i < std::min(x.size(), b + 64); ++i) r.codes.push_back(naive_index(x[i], a));
  }
  return r;
}

std::vector<uint32_t> quantize(const std::vector<float>& x) {
  std::vector<uint32_t> words(static_cast<size_t>(cpu::nf4_storage_words(static_cast<int64_t>(x.size()))),
                              0xdeadbeefu);
  cpu::nf4_quantize(x.data(), static_cast<int64_t>(x.size()), words.data());
  return words;
}

void expect_matches_naive(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<uint32_t> words = quantize(x);
  const Naive ref = naive_quantize(x);
  ASSERT_EQ(static_cast<int64_t>(ref.absmax.size()), cpu::nf4_blocks(n));
  for (size_t b = 0; b < ref.absmax.size(); ++b) {
    float a;
    std::memcpy(&a, &words[b], 4);
    EXPECT_EQ(a, ref.absmax[b]) << "block " << b;
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(words.data() + ref.absmax.size());
  for (int64_t i = 0; i < n; ++i) {
    const int code = (i % 2 == 0) ? bytes[i / 2] >> 4 : bytes[i / 2] & 15;
    EXPECT_EQ(code, ref.codes[static_cast<size_t>(i)]) << "value " << i << " = " << x[static_cast<size_t>(i)];
  }
  if (n % 2 == 1) {
    EXPECT_EQ(bytes[n / 2] & 15, 0) << "the odd tail low nibble is zero";
  }
  // Bytes past the nibbles, up to the word boundary, are zero (deterministic storage).
  const int64_t used = (n + 1) / 2;
  const int64_t total = 4 * (static_cast<int64_t>(words.size()) - static_cast<int64_t>(ref.absmax.size()));
  for (int64_t i = used; i < total; ++i) EXPECT_EQ(bytes[i], 0) << "padding byte " << i;

  // Dequantize: code * absmax in fp32; bf16 and fp16 are that value converted once.
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<uint16_t> out_bf16(static_cast<size_t>(n)), out_fp16(static_cast<size_t>(n));
  cpu::nf4_dequantize(words.data(), n, out.data());
  cpu::nf4_dequantize(words.data(), n, TypedPtr(out_bf16.data(), DType::bf16));
  cpu::nf4_dequantize(words.data(), n, TypedPtr(out_fp16.data(), DType::fp16));
  for (int64_t i = 0; i < n; ++i) {
    const size_t s = static_cast<size_t>(i);
    const float expect = kNf4Codes[ref.codes[s]] * ref.absmax[s / 64];
    EXPECT_EQ(out[s], expect) << i;
    EXPECT_EQ(out_bf16[s], float_to_bf16(expect)) << i;
    EXPECT_EQ(out_fp16[s], float_to_fp16(expect)) << i;
    // Within half the widest gap between codes (-1 to -0.696).
    EXPECT_LE(std::fabs(out[s] - x[s]), 0.5f * (1.0f - 0.6961928009986877f) * ref.absmax[s / 64] * 1.0001f);
  }
}

TEST(Nf4, StorageSize) {
  EXPECT_EQ(cpu::nf4_storage_words(64), 1 + 8);       // 36 bytes: 0.5625 B/value
  EXPECT_EQ(cpu::nf4_storage_words(128), 2 + 16);
  EXPECT_EQ(cpu::nf4_storage_words(1), 1 + 1);
  EXPECT_EQ(cpu::nf4_storage_words(65), 2 + 9);       // 33 nibble bytes -> 9 words
  EXPECT_EQ(cpu::nf4_storage_words(896 * 896) * 4, 896 * 896 / 64 * 36);
}

TEST(Nf4, CodesAreThePublishedOnes) {
  // Sorted, symmetric ends, exact zero at index 7 (bitsandbytes' table).
  for (int i = 0; i < 15; ++i) EXPECT_LT(kNf4Codes[i], kNf4Codes[i + 1]);
  EXPECT_EQ(kNf4Codes[0], -1.0f);
  EXPECT_EQ(kNf4Codes[7], 0.0f);
  EXPECT_EQ(kNf4Codes[15], 1.0f);
  EXPECT_EQ(kNf4Codes[8], 0.07958029955625534f);
  // Each code maps to itself.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(cpu::nf4_code_index(kNf4Codes[i]), i);
}

TEST(Nf4, RandomNormalAndUniform) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> x(64 * 37);
  for (auto& v : x) v = normal(rng);
  expect_matches_naive(x);
  for (auto& v : x) v = uniform(rng);
  expect_matches_naive(x);
}

TEST(Nf4, EdgeBlocks) {
  std::vector<float> x(64 * 6, 0.0f);
  // block 0: zeros (absmax 0, every code 7, dequantized to 0)
  // block 1: a single nonzero value
  x[64 + 17] = -0.375f;
  // block 2: +-absmax and values near them
  x[128] = 2.5f;
  x[129] = -2.5f;
  x[130] = std::nextafter(2.5f, 0.0f);
  x[131] = -0.0f;
  // block 3: absmax 1, then every midpoint between codes and its float neighbours
  x[192] = 1.0f;
  for (int i = 0; i < 15; ++i) {
    const double mid = (static_cast<double>(kNf4Codes[i]) + kNf4Codes[i + 1]) / 2.0;
    const float m = static_cast<float>(mid);
    x[static_cast<size_t>(193 + 3 * i)] = m;
    x[static_cast<size_t>(194 + 3 * i)] = std::nextafter(m, 2.0f);
    x[static_cast<size_t>(195 + 3 * i)] = std::nextafter(m, -2.0f);
  }
  // block 4: tiny and huge magnitudes
  x[256] = 1e-30f;
  x[257] = -1e-38f;
  x[258] = 3e38f;
  // block 5: one negative absmax
  x[320] = -7.0f;
  x[321] = 3.5f;
  expect_matches_naive(x);
}

TEST(Nf4, TiesGoToTheLowerCode) {
  // Halfway between 0 and the first positive code, and between the last negative
  // code and 0 (both exact floats): the lower code wins.
  EXPECT_EQ(cpu::nf4_code_index(kNf4Codes[8] / 2), 7);
  EXPECT_EQ(cpu::nf4_code_index(kNf4Codes[6] / 2), 6);
  EXPECT_EQ(cpu::nf4_code_index(std::nextafter(kNf4Codes[8] / 2, 1.0f)), 8);
  EXPECT_EQ(cpu::nf4_code_index(std::nextafter(kNf4Codes[6] / 2, 0.0f)), 7);
}

TEST(Nf4, TailBlocksShorterThan64) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 2, 7, 63, 65, 100, 129, 191}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = normal(rng);
    SCOPED_TRACE(n);
    expect_matches_naive(x);
  }
}

TEST(Nf4, RefusesNonFinite) {
  std::vector<float> x(64, 1.0f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint32_t> words(static_cast<size_t>(cpu::nf4_storage_words(64)));
  EXPECT_THROW(cpu::nf4_quantize(x.data(), 64, words.data()), std::exception);
}

}  // namespace
}  // namespace shardlm
