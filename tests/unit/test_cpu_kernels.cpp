// CPU kernels against independent references: every forward against a naive
// double-precision implementation written here, every backward against central
// finite differences of that double forward (small shapes) and against a naive
// double backward (larger shapes, the naive backward itself checked by finite
// differences). Shapes are odd on purpose: T = 1, 7, 13, 33, 65, 67, 70, 130 (one,
// two and three key blocks), head_dim 8, 24, 64 and 128 (vector tails and the limit), LM-head chunks that split unevenly, ignored
// targets, a fully ignored chunk and a padded vocabulary.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "shardlm/backend/cpu/attention.hpp"
#include "shardlm/backend/cpu/bias.hpp"
#include "shardlm/backend/cpu/embedding.hpp"
#include "shardlm/backend/cpu/fast_math.hpp"
#include "shardlm/backend/cpu/gelu.hpp"
#include "shardlm/backend/cpu/gemm.hpp"
#include "shardlm/backend/cpu/layernorm.hpp"
#include "shardlm/backend/cpu/lm_head_loss.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "kernel_test_helpers.hpp"
#include "naive_attention.hpp"
#include "relative_error.hpp"

namespace {

using namespace kernel_test;


// ---------------------------------------------------------------- fast math

TEST(FastMath, ExpAndTanhMatchTheLibraryToAFewUlp) {
  double worst_exp = 0.0, worst_tanh = 0.0;
  for (int i = -870000; i <= 880000; i += 7) {
    const float x = static_cast<float>(i) * 1e-4f;
    const double want = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(shardlm::cpu::exp_approx(x) - want) / want);
    const double want_tanh = std::tanh(static_cast<double>(x));
    worst_tanh = std::max(worst_tanh, std::fabs(shardlm::cpu::tanh_approx(x) - want_tanh));
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_LT(shardlm::cpu::exp_approx(-INFINITY), 1e-37f);  // clamped, not NaN
}

// ---------------------------------------------------------------- layernorm

DVec layernorm_ref(const DVec& x, const DVec& w, const DVec& b, int N, int C, DVec* mean = nullptr,
                   DVec* rstd = nullptr) {
  DVec out(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + shardlm::cpu::kLayerNormEps);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) * r * w[c] + b[c];
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
  return out;
}

TEST(LayerNorm, ForwardMatchesNaiveDouble) {
  for (int C : {7, 67, 384}) {
    const int N = 13;
    const Vec x = random_vec(N * C, 1, 2.0, 0.5), w = random_vec(C, 2, 0.3, 1.0),
              b = random_vec(C, 3, 0.3);
    Vec out(N * C), mean(N), rstd(N);
    shardlm::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    b.data(), N, C);
    DVec want_mean(N), want_rstd(N);
    const DVec want =
        layernorm_ref(to_double(x), to_double(w), to_double(b), N, C, &want_mean, &want_rstd);
    EXPECT_LT(relative_to_max_error(out, want), 2e-6) << "C=" << C;
    EXPECT_LT(relative_to_max_error(mean, want_mean), 2e-6) << "C=" << C;
    EXPECT_LT(relative_to_max_error(rstd, want_rstd), 2e-6) << "C=" << C;
  }
}

TEST(LayerNorm, ResidualFusedForwardMatchesNaiveDouble) {
  const int N = 11, C = 67;
  const Vec a = random_vec(N * C, 4), branch = random_vec(N * C, 5), branch_bias = random_vec(C, 6),
            w = random_vec(C, 7, 0.3, 1.0), b = random_vec(C, 8, 0.3);
  for (bool with_bias : {true, false}) {
    Vec residual(N * C), out(N * C), mean(N), rstd(N);
    shardlm::cpu::residual_layernorm_forward(residual.data(), out.data(), mean.data(), rstd.data(),
                                             a.data(), branch.data(),
                                             with_bias ? branch_bias.data() : nullptr, w.data(),
                                             b.data(), N, C);
    DVec want_residual(N * C);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c)
        want_residual[n * C + c] = double(a[n * C + c]) + branch[n * C + c] +
                                   (with_bias ? double(branch_bias[c]) : 0.0);
    const DVec want = layernorm_ref(want_residual, to_double(w), to_double(b), N, C);
    EXPECT_LT(relative_to_max_error(residual, want_residual), 1e-6);
    EXPECT_LT(relative_to_max_error(out, want), 2e-6);
  }
}

TEST(LayerNorm, BackwardAccumulatesFiniteDifferenceGradients) {
  const int N = 5, C = 19;
  const Vec x = random_vec(N * C, 9, 1.5, 0.3), w = random_vec(C, 10, 0.3, 1.0),
            b = random_vec(C, 11, 0.3), dout = random_vec(N * C, 12);
  Vec out(N * C), mean(N), rstd(N);
  shardlm::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                  b.data(), N, C);
  // Gradients accumulate: start from non-zero buffers and subtract them afterwards.
  const Vec dx0 = random_vec(N * C, 13), dw0 = random_vec(C, 14), db0 = random_vec(C, 15);
  Vec dx = dx0, dw = dw0, db = db0;
  shardlm::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                                   w.data(), mean.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) dx[i] -= dx0[i];
  for (int c = 0; c < C; ++c) dw[c] -= dw0[c], db[c] -= db0[c];

  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), g = to_double(dout);
  const DVec want_dx =
      finite_difference([&](const DVec& v) { return dot(g, layernorm_ref(v, wd, bd, N, C)); }, xd);
  const DVec want_dw =
      finite_difference([&](const DVec& v) { return dot(g, layernorm_ref(xd, v, bd, N, C)); }, wd);
  const DVec want_db =
      finite_difference([&](const DVec& v) { return dot(g, layernorm_ref(xd, wd, v, N, C)); }, bd);
  EXPECT_LT(relative_to_max_error(dx, want_dx), 1e-5);
  EXPECT_LT(relative_to_max_error(dw, want_dw), 1e-5);
  EXPECT_LT(relative_to_max_error(db, want_db), 1e-5);
}

// ---------------------------------------------------------------- gelu and bias

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, BiasGeluForwardMatchesNaiveDouble) {
  const int N = 9, M = 67;
  const Vec pre0 = random_vec(N * M, 16, 2.5), bias = random_vec(M, 17);
  Vec pre = pre0, out(N * M);
  shardlm::cpu::bias_gelu_forward(out.data(), pre.data(), pre.data(), bias.data(), N, M);
  DVec want_pre(N * M), want_out(N * M);
  for (int n = 0; n < N; ++n)
    for (int m = 0; m < M; ++m) {
      want_pre[n * M + m] = double(pre0[n * M + m]) + bias[m];
      want_out[n * M + m] = gelu_ref(want_pre[n * M + m]);
    }
  EXPECT_LT(relative_to_max_error(pre, want_pre), 1e-6);
  EXPECT_LT(relative_to_max_error(out, want_out), 1e-6);
  // Elementwise too: small outputs must be accurate, not just relative to the max.
  for (int i = 0; i < N * M; ++i) EXPECT_NEAR(out[i], want_out[i], 3e-7 * (1.0 + std::fabs(want_pre[i])));
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int count = 1001;  // not a multiple of the kernel's grain or vector width
  Vec pre = random_vec(count, 18, 3.0);
  pre[0] = 0.0f;
  pre[1] = 1e-4f;
  const Vec dout = random_vec(count, 19);
  Vec din(count);
  shardlm::cpu::gelu_backward(din.data(), dout.data(), pre.data(), count);
  DVec want(count);
  for (int i = 0; i < count; ++i) {
    const double h = 1e-6, x = pre[i];
    want[i] = dout[i] * (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
  }
  EXPECT_LT(relative_to_max_error(din, want), 1e-6);
  Vec in_place = dout;  // dinp may alias dout
  shardlm::cpu::gelu_backward(in_place.data(), in_place.data(), pre.data(), count);
  EXPECT_EQ(in_place, din);
}

TEST(Bias, AddResidualAndBackwardMatchNaive) {
  const int N = 13, M = 131;  // M spans three 64-column blocks, the last partial
  const Vec a = random_vec(N * M, 20), branch = random_vec(N * M, 21), bias = random_vec(M, 22);
  Vec out = a;
  shardlm::cpu::add_bias(out.data(), bias.data(), N, M);
  Vec res(N * M);
  shardlm::cpu::residual_add_bias(res.data(), a.data(), branch.data(), bias.data(), N, M);
  DVec want_out(N * M), want_res(N * M);
  for (int n = 0; n < N; ++n)
    for (int m = 0; m < M; ++m) {
      want_out[n * M + m] = double(a[n * M + m]) + bias[m];
      want_res[n * M + m] = double(a[n * M + m]) + branch[n * M + m] + bias[m];
    }
  EXPECT_LT(relative_to_max_error(out, want_out), 1e-7);
  EXPECT_LT(relative_to_max_error(res, want_res), 1e-7);

  const Vec db0 = random_vec(M, 23);
  Vec db = db0;
  shardlm::cpu::bias_backward(db.data(), branch.data(), N, M);
  DVec want_db(M);
  for (int m = 0; m < M; ++m) {
    want_db[m] = db0[m];
    for (int n = 0; n < N; ++n) want_db[m] += branch[n * M + m];
  }
  EXPECT_LT(relative_to_max_error(db, want_db), 1e-6);
}

// ---------------------------------------------------------------- embedding

TEST(Embedding, ForwardAndBackwardMatchNaive) {
  const int B = 3, T = 7, C = 67, V = 11;
  std::vector<int32_t> tokens(B * T);
  shardlm::Rng rng(24);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(5));  // many repeats
  const Vec wte = random_vec(V * C, 25), wpe = random_vec(T * C, 26), dout = random_vec(B * T * C, 27);
  Vec out(B * T * C);
  shardlm::cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  DVec want(B * T * C);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c)
      want[n * C + c] = double(wte[tokens[n] * C + c]) + wpe[(n % T) * C + c];
  EXPECT_LT(relative_to_max_error(out, want), 1e-7);

  const Vec dwte0 = random_vec(V * C, 28), dwpe0 = random_vec(T * C, 29);
  Vec dwte = dwte0, dwpe = dwpe0;
  shardlm::cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  DVec want_dwte = to_double(dwte0), want_dwpe = to_double(dwpe0);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c) {
      want_dwte[tokens[n] * C + c] += dout[n * C + c];
      want_dwpe[(n % T) * C + c] += dout[n * C + c];
    }
  EXPECT_LT(relative_to_max_error(dwte, want_dwte), 1e-6);
  EXPECT_LT(relative_to_max_error(dwpe, want_dwpe), 1e-6);
}

// Llama and Qwen have no position table: the rows are the token rows themselves
// (rounded to the value type), and the backward gives the token gradient it gives
// with a position table.
TEST(Embedding, WithoutPositionTableIsTheTokenRows) {
  const int B = 2, T = 37, C = 40, V = 9;
  std::vector<int32_t> tokens(B * T);
  shardlm::Rng rng(30);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(V));
  const Vec wte = random_vec(V * C, 31), wpe = random_vec(T * C, 32), dout = random_vec(B * T * C, 33);
  for (const shardlm::DType type : {shardlm::DType::fp32, shardlm::DType::bf16}) {
    Vec out(B * T * C);
    shardlm::cpu::embedding_forward(out.data(), tokens.data(), wte.data(), shardlm::ConstTypedPtr(),
                                    B, T, C, type);
    Vec want(B * T * C);
    for (int n = 0; n < B * T; ++n)
      for (int c = 0; c < C; ++c) want[n * C + c] = shardlm::round_to(type, wte[tokens[n] * C + c]);
    EXPECT_EQ(out, want) << shardlm::dtype_name(type);
  }
  const Vec dwte0 = random_vec(V * C, 34), dwpe0 = random_vec(T * C, 35);
  Vec with_positions = dwte0, dwpe = dwpe0, without = dwte0;
  shardlm::cpu::embedding_backward(with_positions.data(), dwpe.data(), dout.data(), tokens.data(),
                                   B, T, C);
  shardlm::cpu::embedding_backward(without.data(), nullptr, dout.data(), tokens.data(), B, T, C);
  EXPECT_EQ(without, with_positions);
  EXPECT_NE(without, dwte0);
}

// ---------------------------------------------------------------- attention

using naive_attention::AttentionShape;

// Naive causal attention in double with the full score matrix.
DVec attention_ref(const DVec& qkv, const AttentionShape& s, DVec* lse = nullptr) {
  return naive_attention::forward(qkv, s, lse);
}

// Naive analytic backward in double (softmax Jacobian written out).
DVec attention_backward_ref(const DVec& qkv, const DVec& dout, const AttentionShape& s) {
  DVec dqkv(qkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.hd));
  auto idx = [&](int b, int t, int group, int h, int d) {
    return naive_attention::qkv_index(s, b, t, group, h, d);
  };
  DVec p;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        naive_attention::softmax_row(qkv, s, b, h, i, p);
        const double* go = &dout[naive_attention::out_index(s, b, i, h, 0)];
        DVec dp(i + 1);
        double weighted = 0.0;
        for (int j = 0; j <= i; ++j) {
          for (int d = 0; d < s.hd; ++d) {
            dp[j] += go[d] * qkv[idx(b, j, 2, h, d)];
            dqkv[idx(b, j, 2, h, d)] += p[j] * go[d];
          }
          weighted += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - weighted) * scale;
          for (int d = 0; d < s.hd; ++d) {
            dqkv[idx(b, i, 0, h, d)] += ds * qkv[idx(b, j, 1, h, d)];
            dqkv[idx(b, j, 1, h, d)] += ds * qkv[idx(b, i, 0, h, d)];
          }
        }
      }
  return dqkv;
}

struct AttentionRun {
  Vec out, lse, dqkv;
};

AttentionRun run_attention(const Vec& qkv, const Vec& dout, const AttentionShape& s) {
  const int C = s.H * s.hd;
  AttentionRun r;
  r.out.assign(static_cast<size_t>(s.B) * s.T * C, 0.0f);
  r.lse.assign(static_cast<size_t>(s.B) * s.H * s.T, 0.0f);
  r.dqkv.assign(qkv.size(), 12345.0f);  // must be overwritten
  const shardlm::cpu::AttentionShape shape{s.B, s.T, s.H, s.H, s.hd};
  shardlm::cpu::attention_forward(r.out.data(), r.lse.data(), qkv.data(), shape);
  shardlm::cpu::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(),
                                   r.lse.data(), shape);
  return r;
}

Vec attention_input(const AttentionShape& s, uint64_t seed) {
  // Scale so scores spread over several units: a peaked, not uniform, softmax.
  return random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.H * s.hd, seed,
                    1.5 / std::pow(double(s.hd), 0.25));
}

TEST(Attention, ForwardMatchesNaiveDouble) {
  for (const AttentionShape s : {AttentionShape{2, 1, 2, 8}, AttentionShape{2, 7, 2, 8},
                                 AttentionShape{1, 13, 3, 8}, AttentionShape{2, 33, 2, 64},
                                 AttentionShape{1, 70, 1, 64}, AttentionShape{1, 130, 2, 8},
                                 AttentionShape{1, 67, 2, 24}, AttentionShape{1, 65, 1, 128}}) {
    const Vec qkv = attention_input(s, 30 + s.T);
    const int C = s.H * s.hd;
    Vec out(static_cast<size_t>(s.B) * s.T * C), lse(static_cast<size_t>(s.B) * s.H * s.T);
    shardlm::cpu::attention_forward(out.data(), lse.data(), qkv.data(), {s.B, s.T, s.H, s.H, s.hd});
    DVec want_lse(lse.size());
    const DVec want = attention_ref(to_double(qkv), s, &want_lse);
    EXPECT_LT(relative_to_max_error(out, want), 2e-6) << "T=" << s.T << " hd=" << s.hd;
    EXPECT_LT(relative_to_max_error(lse, want_lse), 2e-6) << "T=" << s.T << " hd=" << s.hd;
  }
}

TEST(Attention, NaiveBackwardReferenceMatchesFiniteDifferences) {
  const AttentionShape s{1, 6, 2, 4};
  const DVec qkv = to_double(attention_input(s, 40));
  const DVec g = to_double(random_vec(static_cast<size_t>(s.B) * s.T * s.H * s.hd, 41));
  const DVec want = finite_difference([&](const DVec& v) { return dot(g, attention_ref(v, s)); }, qkv);
  EXPECT_LT(relative_to_max_error(attention_backward_ref(qkv, g, s), want), 1e-8);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const AttentionShape s : {AttentionShape{2, 1, 2, 8}, AttentionShape{2, 7, 2, 8},
                                 AttentionShape{1, 13, 3, 8}, AttentionShape{1, 5, 1, 64}}) {
    const Vec qkv = attention_input(s, 50 + s.T);
    const Vec dout = random_vec(static_cast<size_t>(s.B) * s.T * s.H * s.hd, 51);
    const AttentionRun r = run_attention(qkv, dout, s);
    const DVec g = to_double(dout);
    const DVec want =
        finite_difference([&](const DVec& v) { return dot(g, attention_ref(v, s)); }, to_double(qkv));
    EXPECT_LT(relative_to_max_error(r.dqkv, want), 1e-5) << "T=" << s.T << " hd=" << s.hd;
  }
}

TEST(Attention, BackwardMatchesNaiveBackwardAcrossKeyBlocks) {
  for (const AttentionShape s : {AttentionShape{2, 33, 2, 64}, AttentionShape{1, 70, 1, 64},
                                 AttentionShape{1, 130, 2, 8}, AttentionShape{1, 128, 1, 64},
                                 AttentionShape{1, 67, 2, 24}, AttentionShape{1, 65, 1, 128}}) {
    const Vec qkv = attention_input(s, 60 + s.T);
    const Vec dout = random_vec(static_cast<size_t>(s.B) * s.T * s.H * s.hd, 61);
    const AttentionRun r = run_attention(qkv, dout, s);
    const DVec want = attention_backward_ref(to_double(qkv), to_double(dout), s);
    EXPECT_LT(relative_to_max_error(r.dqkv, want), 1e-5) << "T=" << s.T << " hd=" << s.hd;
  }
}

TEST(Attention, RejectsUnsupportedHeadDim) {
  std::vector<float> buf(3 * 256 * 2);
  EXPECT_THROW(shardlm::cpu::attention_forward(buf.data(), buf.data(), buf.data(), {1, 2, 1, 1, 256}),
               shardlm::Error);
}

// ---------------------------------------------------------------- fused LM head + loss

struct HeadCase {
  int N, C, V, Vp, chunk_rows;
};

// Per-row cross-entropy of logits = x W^T over the real vocabulary, in double.
DVec head_losses_ref(const DVec& x, const DVec& w, const std::vector<int32_t>& targets,
                     const HeadCase& c) {
  DVec losses(c.N, 0.0);
  for (int n = 0; n < c.N; ++n) {
    if (targets[n] < 0) continue;
    DVec logits(c.V);
    double mx = -1e300;
    for (int v = 0; v < c.V; ++v) {
      for (int k = 0; k < c.C; ++k) logits[v] += x[n * c.C + k] * w[v * c.C + k];
      mx = std::max(mx, logits[v]);
    }
    double sum = 0.0;
    for (double l : logits) sum += std::exp(l - mx);
    losses[n] = mx + std::log(sum) - logits[targets[n]];
  }
  return losses;
}

double sum_of(const DVec& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}

struct HeadInputs {
  Vec x, w;
  std::vector<int32_t> targets;
};

HeadInputs head_inputs(const HeadCase& c, uint64_t seed) {
  HeadInputs in;
  in.x = random_vec(static_cast<size_t>(c.N) * c.C, seed, 1.0);
  in.w = random_vec(static_cast<size_t>(c.Vp) * c.C, seed + 1, 0.5);
  // Padded rows hold garbage: they must not reach the loss or any gradient.
  for (size_t i = static_cast<size_t>(c.V) * c.C; i < in.w.size(); ++i) in.w[i] = 1000.0f;
  in.targets.resize(c.N);
  shardlm::Rng rng(seed + 2);
  for (int n = 0; n < c.N; ++n)
    in.targets[n] = rng.uniform() < 0.25 ? -1 : static_cast<int32_t>(rng.below(c.V));
  in.targets[0] = c.V - 1;  // the last real column
  return in;
}

struct HeadRun {
  Vec losses, dx, dw;
};

HeadRun run_head(const HeadInputs& in, const HeadCase& c, float grad_scale, const Vec& dw0,
                 bool want_grad) {
  HeadRun r;
  r.losses.assign(c.N, -1.0f);
  r.dx.assign(static_cast<size_t>(c.N) * c.C, 777.0f);  // must be overwritten
  r.dw = dw0;
  Vec scratch(static_cast<size_t>(c.chunk_rows) * c.Vp, 0.0f);
  shardlm::cpu::LmHeadLossArgs args;
  args.x = in.x.data();
  args.weight = in.w.data();
  args.targets = in.targets.data();
  args.N = c.N;
  args.C = c.C;
  args.V = c.V;
  args.grad_scale = grad_scale;
  args.logits_scratch = scratch.data();
  args.logits_stride = c.Vp;
  args.chunk_rows = c.chunk_rows;
  shardlm::cpu::lm_head_cross_entropy(args, r.losses.data(), want_grad ? r.dx.data() : nullptr,
                                      want_grad ? r.dw.data() : nullptr);
  return r;
}

TEST(LmHeadLoss, LossAndGradientsMatchFiniteDifferences) {
  const HeadCase c{6, 5, 7, 64, 4};  // two chunks, the second partial
  HeadInputs in = head_inputs(c, 70);
  in.targets[3] = -1;
  const float grad_scale = 0.37f;
  const Vec dw0 = random_vec(static_cast<size_t>(c.Vp) * c.C, 73);
  const HeadRun r = run_head(in, c, grad_scale, dw0, true);

  const DVec x = to_double(in.x), w = to_double(in.w);
  EXPECT_LT(relative_to_max_error(r.losses, head_losses_ref(x, w, in.targets, c)), 2e-6);
  auto scaled_loss_of_x = [&](const DVec& v) { return grad_scale * sum_of(head_losses_ref(v, w, in.targets, c)); };
  auto scaled_loss_of_w = [&](const DVec& v) { return grad_scale * sum_of(head_losses_ref(x, v, in.targets, c)); };
  EXPECT_LT(relative_to_max_error(r.dx, finite_difference(scaled_loss_of_x, x)), 1e-5);
  DVec dw_want = finite_difference(scaled_loss_of_w, w);
  for (size_t i = 0; i < dw_want.size(); ++i) dw_want[i] += dw0[i];
  EXPECT_LT(relative_to_max_error(r.dw, dw_want), 1e-5);
  for (int n = 0; n < c.N; ++n)
    if (in.targets[n] < 0) {
      EXPECT_EQ(r.losses[n], 0.0f);
      for (int k = 0; k < c.C; ++k) EXPECT_EQ(r.dx[n * c.C + k], 0.0f);
    }
  // Padded rows of the weight gradient are not touched.
  for (size_t i = static_cast<size_t>(c.V) * c.C; i < r.dw.size(); ++i) EXPECT_EQ(r.dw[i], dw0[i]);
}

// Naive gradients in double: dlogits = scale * (softmax - onehot) over the real vocabulary.
void head_grads_ref(const DVec& x, const DVec& w, const std::vector<int32_t>& targets,
                    const HeadCase& c, double scale, DVec& dx, DVec& dw) {
  dx.assign(static_cast<size_t>(c.N) * c.C, 0.0);
  for (int n = 0; n < c.N; ++n) {
    if (targets[n] < 0) continue;
    DVec logits(c.V, 0.0);
    double mx = -1e300, sum = 0.0;
    for (int v = 0; v < c.V; ++v) {
      for (int k = 0; k < c.C; ++k) logits[v] += x[n * c.C + k] * w[v * c.C + k];
      mx = std::max(mx, logits[v]);
    }
    for (int v = 0; v < c.V; ++v) sum += std::exp(logits[v] - mx);
    for (int v = 0; v < c.V; ++v) {
      const double g = scale * (std::exp(logits[v] - mx) / sum - (v == targets[n] ? 1.0 : 0.0));
      for (int k = 0; k < c.C; ++k) {
        dx[n * c.C + k] += g * w[v * c.C + k];
        dw[v * c.C + k] += g * x[n * c.C + k];
      }
    }
  }
}

TEST(LmHeadLoss, ChunkingIgnoredRowsAndPaddingMatchNaiveDouble) {
  // 37 rows: chunks of 16 leave a partial last chunk; rows 16..31 are all ignored so
  // one whole chunk is skipped; chunk sizes 5, 37 and 64 (> N) too.
  for (int chunk_rows : {16, 5, 37, 64}) {
    const HeadCase c{37, 24, 67, 128, chunk_rows};
    HeadInputs in = head_inputs(c, 80);
    for (int n = 16; n < 32; ++n) in.targets[n] = -1;
    const float grad_scale = 1.0f / 21.0f;
    const Vec dw0 = random_vec(static_cast<size_t>(c.Vp) * c.C, 83);
    const HeadRun r = run_head(in, c, grad_scale, dw0, true);
    const DVec x = to_double(in.x), w = to_double(in.w);
    DVec want_dx, want_dw = to_double(dw0);
    head_grads_ref(x, w, in.targets, c, grad_scale, want_dx, want_dw);
    EXPECT_LT(relative_to_max_error(r.losses, head_losses_ref(x, w, in.targets, c)), 2e-6)
        << "chunk " << chunk_rows;
    EXPECT_LT(relative_to_max_error(r.dx, want_dx), 2e-6) << "chunk " << chunk_rows;
    EXPECT_LT(relative_to_max_error(r.dw, want_dw), 2e-6) << "chunk " << chunk_rows;
    for (size_t i = static_cast<size_t>(c.V) * c.C; i < r.dw.size(); ++i)
      ASSERT_EQ(r.dw[i], dw0[i]) << "padded weight-gradient row touched, chunk " << chunk_rows;

    // Evaluation (no gradient) gives the same losses and touches no gradient.
    const HeadRun eval = run_head(in, c, grad_scale, dw0, false);
    EXPECT_EQ(eval.losses, r.losses) << "chunk " << chunk_rows;
    EXPECT_EQ(eval.dw, dw0);
  }
}

// The unfused head a framework would run: the full [N, V] logits from one GEMM,
// softmax and cross-entropy per row (double), dlogits = scale (softmax - onehot) as a
// full [N, V] fp32 tensor, then dx = dlogits W and dW += dlogits^T x as whole-batch
// GEMMs.
struct UnfusedHead {
  Vec losses, dx, dw;
};

UnfusedHead unfused_head(const HeadInputs& in, const HeadCase& c, float grad_scale, const Vec& dw0) {
  Vec logits(static_cast<size_t>(c.N) * c.V);
  shardlm::cpu::sgemm(false, true, c.N, c.V, c.C, 1.0f, in.x.data(), c.C, in.w.data(), c.C, 0.0f,
                      logits.data(), c.V);
  UnfusedHead r{Vec(c.N, 0.0f), Vec(static_cast<size_t>(c.N) * c.C), dw0};
  Vec dlogits(logits.size(), 0.0f);
  for (int n = 0; n < c.N; ++n) {
    if (in.targets[n] < 0) continue;
    const float* row = logits.data() + static_cast<size_t>(n) * c.V;
    double mx = -1e300, sum = 0.0;
    for (int v = 0; v < c.V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    for (int v = 0; v < c.V; ++v) sum += std::exp(row[v] - mx);
    r.losses[n] = static_cast<float>(mx + std::log(sum) - row[in.targets[n]]);
    for (int v = 0; v < c.V; ++v)
      dlogits[static_cast<size_t>(n) * c.V + v] = static_cast<float>(
          grad_scale * (std::exp(row[v] - mx) / sum - (v == in.targets[n] ? 1.0 : 0.0)));
  }
  shardlm::cpu::sgemm(false, false, c.N, c.C, c.V, 1.0f, dlogits.data(), c.V, in.w.data(), c.C,
                      0.0f, r.dx.data(), c.C);
  shardlm::cpu::sgemm(true, false, c.V, c.C, c.N, 1.0f, dlogits.data(), c.V, in.x.data(), c.C,
                      1.0f, r.dw.data(), c.C);
  return r;
}

TEST(LmHeadLoss, ChunkedFusedEqualsUnfusedFullLogitsWithin1e6Relative) {
  // 300 rows, a 2000-token vocabulary padded to 2048; chunks of 64 rows (the last
  // one partial) and of 7 rows. One chunk's logits are 64 x 2048 floats (512 KiB)
  // where the unfused head holds all 300 x 2000 (2.3 MiB) and as many dlogits.
  for (int chunk_rows : {64, 7}) {
    const HeadCase c{300, 64, 2000, 2048, chunk_rows};
    const HeadInputs in = head_inputs(c, 95);
    const float grad_scale = 1.0f / 225.0f;
    // The weight gradient starts at zero here (accumulation is checked above), so
    // the comparison measures the head, not the cancellation of a starting value.
    const Vec dw0(static_cast<size_t>(c.Vp) * c.C, 0.0f);
    const HeadRun fused = run_head(in, c, grad_scale, dw0, true);
    const UnfusedHead unfused = unfused_head(in, c, grad_scale, dw0);
    // Relative error of the total loss, and relative-to-max of each tensor.
    double fused_sum = 0.0, unfused_sum = 0.0;
    for (int n = 0; n < c.N; ++n) fused_sum += fused.losses[n], unfused_sum += unfused.losses[n];
    EXPECT_LT(std::fabs(fused_sum - unfused_sum) / unfused_sum, 1e-6) << "chunk " << chunk_rows;
    EXPECT_LT(relative_to_max_error(fused.losses, unfused.losses), 1e-6) << "chunk " << chunk_rows;
    EXPECT_LT(relative_to_max_error(fused.dx, unfused.dx), 1e-6) << "chunk " << chunk_rows;
    const Vec fused_dw(fused.dw.begin(), fused.dw.begin() + static_cast<int64_t>(c.V) * c.C);
    const Vec unfused_dw(unfused.dw.begin(), unfused.dw.begin() + static_cast<int64_t>(c.V) * c.C);
    EXPECT_LT(relative_to_max_error(fused_dw, unfused_dw), 1e-6) << "chunk " << chunk_rows;
    std::printf("chunk %d rows: loss rel. error %.2e, dx %.2e, dW %.2e; logits held %zu bytes "
                "instead of %zu\n",
                chunk_rows, std::fabs(fused_sum - unfused_sum) / unfused_sum,
                relative_to_max_error(fused.dx, unfused.dx),
                relative_to_max_error(fused_dw, unfused_dw),
                static_cast<size_t>(chunk_rows) * c.Vp * sizeof(float),
                static_cast<size_t>(c.N) * c.V * sizeof(float));
  }
}

// ---------------------------------------------------------------- thread-count invariance

TEST(Kernels, GradientsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  const AttentionShape s{2, 70, 3, 8};
  const int N = s.B * s.T, C = s.H * s.hd, V = 13;
  const Vec qkv = attention_input(s, 90), dout = random_vec(N * C, 91), x = random_vec(N * C, 92),
            w = random_vec(C, 93, 0.2, 1.0);
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = n % V;
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<Vec> results;
    results.push_back(run_attention(qkv, dout, s).dqkv);
    Vec mean(N), rstd(N), out(N * C), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    shardlm::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    w.data(), N, C);
    shardlm::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                                     w.data(), mean.data(), rstd.data(), N, C);
    Vec dbias(C, 0.0f), dwte(V * C, 0.0f), dwpe(s.T * C, 0.0f);
    shardlm::cpu::bias_backward(dbias.data(), dout.data(), N, C);
    shardlm::cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B,
                                     s.T, C);
    for (Vec* v : {&dx, &dw, &db, &dbias, &dwte, &dwpe}) results.push_back(*v);
    return results;
  };
  const auto one = run(1);
  const auto two = run(2);
  const auto three = run(3);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

}  // namespace
