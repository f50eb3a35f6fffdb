// Deterministic random numbers defined by this code alone (not by a standard
// library's distribution implementation), so init weights and data order are the
// same on every platform, world size and rank.
#pragma once

#include <cmath>
#include <cstdint>

namespace shardlm {

// splitmix64: a well-mixed 64-bit hash, used to derive independent stream seeds.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// xoshiro256**: fast generator with 256-bit state; state is plain data so it can be
// checkpointed.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : state_) {
      x = splitmix64(x);
      s = x;
    }
    has_spare_normal_ = false;
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (Lemire's method, unbiased).
  uint64_t below(uint64_t n) {
    __uint128_t m = static_cast<__uint128_t>(next_u64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<__uint128_t>(next_u64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Standard normal by Box-Muller (pairs cached).
  double normal() {
    if (has_spare_normal_) {
      has_spare_normal_ = false;
      return spare_normal_;
    }
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double radius = std::sqrt(-2.0 * std::log(u1));
    double angle = 2.0 * M_PI * u2;
    spare_normal_ = radius * std::sin(angle);
    has_spare_normal_ = true;
    return radius * std::cos(angle);
  }

  struct State {
    uint64_t s[4];
    bool has_spare_normal;
    double spare_normal;
  };
  State state() const {
    return {{state_[0], state_[1], state_[2], state_[3]}, has_spare_normal_, spare_normal_};
  }
  void set_state(const State& st) {
    for (int i = 0; i < 4; ++i) state_[i] = st.s[i];
    has_spare_normal_ = st.has_spare_normal;
    spare_normal_ = st.spare_normal;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

}  // namespace shardlm
