#include "shardlm/model/moe/moe_routing.hpp"

#include <algorithm>
#include <cmath>

#include "shardlm/core/error.hpp"

namespace shardlm {

void route_tokens(const float* logits, const RouterShape& s, MoeRouting& r) {
  const int E = s.experts, k = s.top_k;
  SHARDLM_CHECK(k >= 1 && k <= E, "moe: top-k {} must be in [1, experts {}]", k, E);
  std::vector<int32_t> counts(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* z = logits + t * E;
    float* p = r.probs + t * E;
    float max = z[0];
    for (int e = 1; e < E; ++e) max = std::max(max, z[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - max));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(z[e] - max)) / sum);
    int32_t* top = r.top_expert + t * k;
    float* w = r.top_weight + t * k;
    // Selection of the k largest, stable: on equal probability the lower expert wins.
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int m = 0; m < j; ++m) taken = taken || top[m] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      top[j] = best;
      w[j] = p[best];
      ++counts[static_cast<size_t>(best)];
    }
    if (s.norm_topk_prob) {
      float total = 0;
      for (int j = 0; j < k; ++j) total += w[j];
      for (int j = 0; j < k; ++j) w[j] /= total;
    }
  }
  r.expert_begin[0] = 0;
  for (int e = 0; e < E; ++e) r.expert_begin[e + 1] = r.expert_begin[e] + counts[static_cast<size_t>(e)];
  std::vector<int32_t> next(r.expert_begin, r.expert_begin + E);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int j = 0; j < k; ++j) {
      const int32_t at = next[static_cast<size_t>(r.top_expert[t * k + j])]++;
      r.token[at] = static_cast<int32_t>(t);
      r.slot[at] = j;
    }
}

void LoadBalanceStats::reset(int experts) {
  count_.assign(static_cast<size_t>(experts), 0.0);
  prob_sum_.assign(static_cast<size_t>(experts), 0.0);
  rows_ = 0;
}

void LoadBalanceStats::add(const MoeRouting& r, const RouterShape& s) {
  const int E = s.experts;
  for (int e = 0; e < E; ++e)
    count_[static_cast<size_t>(e)] += r.expert_begin[e + 1] - r.expert_begin[e];
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int e = 0; e < E; ++e) prob_sum_[static_cast<size_t>(e)] += r.probs[t * E + e];
  rows_ += static_cast<double>(s.tokens);
}

std::vector<double> LoadBalanceStats::sums() const {
  std::vector<double> s(count_);
  s.insert(s.end(), prob_sum_.begin(), prob_sum_.end());
  s.push_back(rows_);
  return s;
}

void LoadBalanceStats::set_sums(const std::vector<double>& s) {
  const size_t E = count_.size();
  SHARDLM_CHECK(s.size() == 2 * E + 1, "internal: {} load-balancing sums for {} experts", s.size(), E);
  std::copy(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(E), count_.begin());
  std::copy(s.begin() + static_cast<std::ptrdiff_t>(E), s.end() - 1, prob_sum_.begin());
  rows_ = s.back();
}

double LoadBalanceStats::loss() const {
  if (rows_ == 0) return 0.0;
  double sum = 0;
  for (size_t e = 0; e < count_.size(); ++e) sum += (count_[e] / rows_) * (prob_sum_[e] / rows_);
  return static_cast<double>(count_.size()) * sum;
}

std::vector<float> LoadBalanceStats::prob_gradient(double weight) const {
  std::vector<float> g(count_.size(), 0.0f);
  if (rows_ == 0) return g;
  for (size_t e = 0; e < count_.size(); ++e)
    g[e] = static_cast<float>(weight * static_cast<double>(count_.size()) * count_[e] / (rows_ * rows_));
  return g;
}

}  // namespace shardlm
