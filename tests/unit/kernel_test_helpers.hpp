// Inputs and comparisons the CPU kernel tests share: seeded random vectors, central
// finite differences of a double function, compute-type (bf16 / fp16) round trips, and
// element-by-element comparison against a reference with a per-element error bound.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/convert.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/core/rng.hpp"

namespace kernel_test {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using Half = std::vector<uint16_t>;

// n values offset + scale * N(0, 1), from a seeded generator.
inline Vec random_vec(size_t n, uint64_t seed, double scale = 1.0, double offset = 0.0) {
  shardlm::Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(offset + scale * rng.normal());
  return v;
}

// Top-k routing's assignments (top_expert: [n, k] experts per token) grouped by expert,
// tokens ascending within an expert (model/moe/moe_routing.hpp's order): each
// assignment's token and top-k slot, appended.
inline void group_by_expert(const std::vector<int32_t>& top_expert, int n, int E, int k,
                            std::vector<int32_t>& token, std::vector<int32_t>& slot) {
  for (int e = 0; e < E; ++e)
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j)
        if (top_expert[size_t(t * k + j)] == e) {
          token.push_back(t);
          slot.push_back(j);
        }
}

inline DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

inline double dot(const DVec& a, const DVec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of a double function of one input vector.
inline DVec finite_difference(const std::function<double(const DVec&)>& f, DVec x,
                              double h = 1e-6) {
  DVec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = f(x);
    x[i] = saved - h;
    const double minus = f(x);
    x[i] = saved;
    grad[i] = (plus - minus) / (2.0 * h);
  }
  return grad;
}

// v rounded to `type` (stored as its 16-bit patterns), and back to fp32 (exact).
inline Half to_half(shardlm::DType type, const Vec& v) {
  Half out(v.size());
  shardlm::cpu::convert(shardlm::TypedPtr(out.data(), type), v.data(),
                        static_cast<int64_t>(v.size()));
  return out;
}
inline Vec widen(shardlm::DType type, const Half& v) {
  Vec out(v.size());
  shardlm::cpu::convert(out.data(), shardlm::ConstTypedPtr(v.data(), type),
                        static_cast<int64_t>(v.size()));
  return out;
}

// Relative error bound of one rounding to nearest in `type`: the unit roundoff 2^-p
// (p significant bits: 24 for fp32, 8 for bf16, 11 for fp16).
inline double unit_roundoff(shardlm::DType type) {
  switch (type) {
    case shardlm::DType::bf16: return std::ldexp(1.0, -8);
    case shardlm::DType::fp16: return std::ldexp(1.0, -11);
    case shardlm::DType::fp32: break;
  }
  return std::ldexp(1.0, -24);
}

// Elements with |got - want| > bound; fails the test at the first, naming it.
template <typename Got>
int count_outside(const Got& got, const DVec& want, const DVec& bound, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    if (!(err <= bound[i]) && bad++ == 0)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << want[i]
                    << " error " << err << " bound " << bound[i];
  }
  return bad;
}

// max bound / max |want|: a test checks it is small, so a bound that grew too large
// (a bug in the bound) cannot make a comparison vacuous.
inline double largest_relative_bound(const DVec& want, const DVec& bound) {
  double max_want = 0.0, max_bound = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_want = std::max(max_want, std::fabs(want[i]));
    max_bound = std::max(max_bound, bound[i]);
  }
  return max_bound / max_want;
}

}  // namespace kernel_test
