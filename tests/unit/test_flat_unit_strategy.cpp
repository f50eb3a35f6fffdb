// FlatUnitStrategy on 2 and 4 in-process ranks (threads), driven through its hooks the
// way the model drives it, with gradients whose sums are exact in float: owned slices,
// gradient reduction to the owners (with accumulation), DDP buckets, ZeRO-3's gather
// schedule and release, hybrid groups, identical weights across strategies, and what
// happens when a rank throws or never arrives. No model, no mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

namespace shardlm {
namespace {

ModelConfig tiny_config() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 2;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  return c;
}

// Where a model unit's parameters lie: (flat unit, begin, end) per parameter.
struct Range {
  int unit;
  int64_t begin, end;
};

std::vector<std::vector<Range>> model_unit_ranges(const ParamLayout& layout) {
  std::vector<std::vector<Range>> out(static_cast<size_t>(layout.num_model_units()));
  for (int m = 0; m < layout.num_model_units(); ++m) {
    const auto& place = layout.model_units[static_cast<size_t>(m)];
    int64_t end = layout.units[static_cast<size_t>(place.unit)].numel;
    for (const auto& other : layout.model_units)
      if (other.unit == place.unit && other.base > place.base) end = std::min(end, other.base);
    for (const auto& p : layout.units[static_cast<size_t>(place.unit)].params)
      if (p.offset >= place.base && p.offset < end)
        out[static_cast<size_t>(m)].push_back({place.unit, p.offset, p.offset + p.numel});
  }
  return out;
}

// Exact in float whatever the order of summation: multiples of 1/16 below 2^7.
float gradient(int rank, int micro_batch, int unit, int64_t e) {
  return static_cast<float>((rank + 1) * 3 + micro_batch * 5 + e % 11 + unit) / 16.0f;
}
float initial_weight(int unit, int64_t e) { return static_cast<float>(unit * 1000 + e % 997) / 64.0f; }

struct StepSetup {
  StrategyOptions options;
  int ranks = 2;
  int micro_batches = 1;
  int64_t min_unit_params = 0;
  double timeout = 60.0;
};

// What one rank's step saw and ended with.
struct RankResult {
  std::vector<std::vector<float>> owned_grad, owned_master;  // per flat unit
  std::vector<std::pair<int64_t, int64_t>> owned_range;
  std::vector<float> replicated;  // concatenated full units, when replicated
  CommCounters step_counters;
  int max_gathered = 0;
  int gathered_after_step = -1;
  bool params_were_full = true;
  bool writes_checkpoint = false;
};

class StrategyHarness {
 public:
  explicit StrategyHarness(const StepSetup& run)
      : run_(run),
        config_(tiny_config()),
        needs_(model_family("gpt2").unit_needs(config_)),
        layout_(ParamLayout::build(config_, partition_size(run.options, run.ranks),
                                   run.min_unit_params)),
        ranges_(model_unit_ranges(layout_)) {}

  const ParamLayout& layout() const { return layout_; }

  // Runs one step on every rank; `hook(rank, where)` is called at each model unit of
  // the backward pass (for failure tests). Returns per-rank errors.
  std::vector<std::string> step(std::vector<RankResult>& results, InProcessJob& job,
                                const std::function<void(Communicator&, int)>& in_backward = {},
                                float sgd_lr = 0.0f) {
    results.assign(static_cast<size_t>(run_.ranks), {});
    return job.run([&](Communicator& comm) {
      MemoryTracker tracker;
      FlatUnitStrategy s(layout_, needs_, comm, run_.options, tracker);
      RankResult& out = results[static_cast<size_t>(comm.rank())];
      for (int u = 0; u < layout_.num_units(); ++u) {
        OwnedSlice o = s.owned(u);
        for (int64_t i = 0; i < o.size(); ++i) o.master[i] = 0.0f;
        for (const auto& p : layout_.units[static_cast<size_t>(u)].params)
          for (int64_t e = std::max(p.offset, o.begin); e < std::min(p.offset + p.numel, o.end); ++e)
            o.master[e - o.begin] = initial_weight(u, e);
      }
      s.after_load();
      comm.take_counters();
      s.begin_step(run_.micro_batches);
      const int M = layout_.num_model_units();
      for (int k = 0; k < run_.micro_batches; ++k) {
        for (int m = 0; m < M; ++m) {
          s.before_forward(m, true);
          check_params(s, m, out);
          if (m == M - 1)  // the tied head writes the embedding's gradient in its forward
            for (int v : needs_[static_cast<size_t>(m)])
              if (v != m) add_gradient(s, v, comm.rank(), k, 0.5f);
          s.after_forward(m);
          out.max_gathered = std::max(out.max_gathered, s.gathered_units());
        }
        for (int m = M - 1; m >= 0; --m) {
          s.before_backward(m);
          check_params(s, m, out);
          if (in_backward) in_backward(comm, m);
          add_gradient(s, m, comm.rank(), k, 1.0f);
          s.after_backward(m, k);
          out.max_gathered = std::max(out.max_gathered, s.gathered_units());
        }
      }
      s.finish_gradients();
      out.step_counters = comm.take_counters();
      for (int u = 0; u < layout_.num_units(); ++u) {
        OwnedSlice o = s.owned(u);
        out.owned_range.emplace_back(o.begin, o.end);
        out.owned_grad.emplace_back(o.grad, o.grad + o.size());
        for (int64_t i = 0; i < o.size(); ++i) o.master[i] -= sgd_lr * o.grad[i];
      }
      s.after_step();
      s.synchronize();
      out.gathered_after_step = s.gathered_units();
      for (int u = 0; u < layout_.num_units(); ++u) {
        OwnedSlice o = s.owned(u);
        out.owned_master.emplace_back(o.master, o.master + o.size());
        if (const float* full = s.replicated_params(u))
          out.replicated.insert(out.replicated.end(), full,
                                full + layout_.units[static_cast<size_t>(u)].padded_numel);
      }
      out.writes_checkpoint = s.writes_checkpoint();
    });
  }

  // The gradient every owner must end with: the sum over ranks and micro-batches.
  float expected_gradient(int unit, int64_t e) const {
    float sum = 0.0f;
    for (int m = 0; m < layout_.num_model_units(); ++m)
      for (const auto& r : ranges_[static_cast<size_t>(m)])
        if (r.unit == unit && e >= r.begin && e < r.end)
          for (int rank = 0; rank < run_.ranks; ++rank)
            for (int k = 0; k < run_.micro_batches; ++k) {
              sum += gradient(rank, k, unit, e);
              if (unit == layout_.model_units[0].unit && m == 0) sum += 0.5f * gradient(rank, k, unit, e);
            }
    return sum;
  }

 private:
  void add_gradient(FlatUnitStrategy& s, int m, int rank, int k, float scale) {
    float* g = s.grads()[static_cast<size_t>(m)];
    const int64_t base = layout_.model_units[static_cast<size_t>(m)].base;
    for (const auto& r : ranges_[static_cast<size_t>(m)])
      for (int64_t e = r.begin; e < r.end; ++e) g[e - base] += scale * gradient(rank, k, r.unit, e);
  }
  // Every parameter model unit m reads is the full unit's, as the owners hold it.
  void check_params(FlatUnitStrategy& s, int m, RankResult& out) {
    for (int v : needs_[static_cast<size_t>(m)]) {
      const ConstTypedPtr p = s.params()[static_cast<size_t>(v)];
      if (p.data == nullptr) {
        out.params_were_full = false;
        continue;
      }
      const float* w = p.f32();
      const int64_t base = layout_.model_units[static_cast<size_t>(v)].base;
      for (const auto& r : ranges_[static_cast<size_t>(v)])
        for (int64_t e = r.begin; e < r.end; ++e)
          if (w[e - base] != initial_weight(r.unit, e)) out.params_were_full = false;
    }
  }

  const StepSetup run_;
  const ModelConfig config_;
  const std::vector<std::vector<int>> needs_;
  const ParamLayout layout_;
  const std::vector<std::vector<Range>> ranges_;
};

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

StrategyOptions options(StrategyKind kind) {
  StrategyOptions o;
  o.kind = kind;
  if (kind == StrategyKind::hybrid) o.shard_group_size = 2;
  return o;
}

const StrategyKind kAll[] = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                             StrategyKind::zero3, StrategyKind::hybrid};

TEST(FlatUnitStrategy, OwnedSlicesTileEveryUnitAndGradientsReachTheirOwners) {
  for (StrategyKind kind : kAll)
    for (int micro_batches : {1, 2})
      for (int64_t min_unit : {int64_t{0}, int64_t{1} << 20}) {  // one unit per model unit, or merged
        StepSetup run{options(kind), kind == StrategyKind::hybrid ? 4 : 2, micro_batches, min_unit};
        StrategyHarness h(run);
        InProcessJob job(run.ranks);
        std::vector<RankResult> results;
        expect_no_errors(h.step(results, job));
        const auto& layout = h.layout();
        const std::string where = fmt::format("{} micro-batches {} min-unit {}", to_string(kind),
                                              micro_batches, min_unit);
        for (int u = 0; u < layout.num_units(); ++u) {
          const int64_t P = layout.units[static_cast<size_t>(u)].padded_numel;
          std::vector<int> owners(static_cast<size_t>(P), 0);
          for (int r = 0; r < run.ranks; ++r) {
            const RankResult& res = results[static_cast<size_t>(r)];
            EXPECT_TRUE(res.params_were_full) << where << " rank " << r;
            const auto [begin, end] = res.owned_range[static_cast<size_t>(u)];
            const int shard_rank = kind == StrategyKind::hybrid ? r % 2 : r;
            const int64_t S = kind == StrategyKind::ddp ? P : P / (kind == StrategyKind::hybrid ? 2 : run.ranks);
            ASSERT_EQ(begin, kind == StrategyKind::ddp ? 0 : shard_rank * S) << where;
            ASSERT_EQ(end, begin + S) << where;
            if (kind != StrategyKind::hybrid || r < 2)
              for (int64_t e = begin; e < end; ++e) ++owners[static_cast<size_t>(e)];
            for (int64_t e = begin; e < end; ++e)
              ASSERT_EQ(res.owned_grad[static_cast<size_t>(u)][static_cast<size_t>(e - begin)],
                        h.expected_gradient(u, e))
                  << where << " rank " << r << " unit " << u << " element " << e;
          }
          const int copies = kind == StrategyKind::ddp ? run.ranks : 1;
          for (int64_t e = 0; e < P; ++e) ASSERT_EQ(owners[static_cast<size_t>(e)], copies) << where;
        }
      }
}

TEST(FlatUnitStrategy, DdpBucketsAreWholeUnitsInBackwardOrderAndCommunicateOncePerStep) {
  for (int micro_batches : {1, 3}) {
    StrategyOptions o = options(StrategyKind::ddp);
    o.bucket_mb = 0.02;  // ~20 KiB: several buckets for this model
    StepSetup run{o, 2, micro_batches};
    StrategyHarness h(run);
    InProcessJob job(2);
    std::vector<RankResult> results;
    expect_no_errors(h.step(results, job));
    // The buckets, as the strategy forms them.
    InProcessJob again(2);
    std::vector<std::vector<int>> buckets;
    expect_no_errors(again.run([&](Communicator& comm) {
      FlatUnitStrategy s(h.layout(), model_family("gpt2").unit_needs(tiny_config()), comm, o);
      if (comm.rank() == 0) buckets = s.buckets();
    }));
    ASSERT_GE(buckets.size(), 2u);
    std::vector<int> order;
    for (const auto& b : buckets) order.insert(order.end(), b.begin(), b.end());
    std::vector<int> backward(static_cast<size_t>(h.layout().num_units()));
    for (size_t i = 0; i < backward.size(); ++i) backward[i] = static_cast<int>(backward.size() - 1 - i);
    EXPECT_EQ(order, backward);
    for (size_t b = 0; b + 1 < buckets.size(); ++b) {
      double bytes = 0;
      for (int u : buckets[b]) bytes += 4.0 * static_cast<double>(h.layout().units[static_cast<size_t>(u)].padded_numel);
      EXPECT_GE(bytes, o.bucket_mb * 1024 * 1024) << "bucket " << b << " closed early";
      double without_last = bytes - 4.0 * static_cast<double>(h.layout().units[static_cast<size_t>(buckets[b].back())].padded_numel);
      EXPECT_LT(without_last, o.bucket_mb * 1024 * 1024) << "bucket " << b << " overfull";
    }
    // no_sync: one reduce-scatter and one all-gather per unit per step, whatever the
    // number of micro-batches.
    const auto& c = results[0].step_counters;
    EXPECT_EQ(c[CollectiveKind::reduce_scatter].calls, static_cast<uint64_t>(h.layout().num_units()));
    EXPECT_EQ(c[CollectiveKind::all_gather].calls, static_cast<uint64_t>(h.layout().num_units()));
  }
}

TEST(FlatUnitStrategy, Zero3GathersFullUnitsOnScheduleAndReleasesThem) {
  for (bool reshard : {true, false})
    for (int prefetch : {0, 1, 2}) {
      StrategyOptions o = options(StrategyKind::zero3);
      o.reshard_after_forward = reshard;
      o.prefetch = prefetch;
      StepSetup run{o, 2, 2};
      StrategyHarness h(run);
      InProcessJob job(2);
      std::vector<RankResult> results;
      expect_no_errors(h.step(results, job));
      const StrategyBufferPlan plan = FlatUnitStrategy::plan_buffers(
          h.layout(), model_family("gpt2").unit_needs(tiny_config()), o);
      int per_micro_batch = 0;
      for (int g : plan.gathers_per_micro_batch) per_micro_batch += g;
      int shared = 0;
      for (bool b : plan.shared_unit) shared += b;
      const std::string where = fmt::format("reshard {} prefetch {}", reshard, prefetch);
      for (const auto& res : results) {
        EXPECT_TRUE(res.params_were_full) << where;
        EXPECT_EQ(res.step_counters[CollectiveKind::all_gather].calls,
                  static_cast<uint64_t>(per_micro_batch * run.micro_batches))
            << where;
        EXPECT_LE(res.max_gathered, plan.param_pool + shared) << where;
        EXPECT_EQ(res.gathered_after_step, 0) << where;
      }
      if (reshard) {
        EXPECT_GT(per_micro_batch, h.layout().num_units()) << "backward re-gathers";
      }
    }
}

TEST(FlatUnitStrategy, HybridReducesOverAllRanksAndOnlyTheFirstReplicaWrites) {
  StepSetup run{options(StrategyKind::hybrid), 4, 1};
  StrategyHarness h(run);
  InProcessJob job(4);
  std::vector<RankResult> results;
  expect_no_errors(h.step(results, job, {}, 0.125f));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[static_cast<size_t>(r)].writes_checkpoint, r < 2) << r;
    // Replica groups {0, 2} and {1, 3} hold the same slices with the same values.
    EXPECT_EQ(results[static_cast<size_t>(r)].owned_master, results[static_cast<size_t>(r % 2)].owned_master);
  }
}

TEST(FlatUnitStrategy, EveryStrategyEndsWithTheSameWeights) {
  // Four ranks for all (hybrid: two groups of two), one SGD step on the owned slices.
  std::map<std::string, std::vector<float>> weights;  // every parameter, canonical order
  for (StrategyKind kind : kAll) {
    StepSetup run{options(kind), 4, 2};
    StrategyHarness h(run);
    InProcessJob job(run.ranks);
    std::vector<RankResult> results;
    expect_no_errors(h.step(results, job, {}, 0.125f));
    std::vector<float> full;  // the padded units, from the owners
    std::vector<float>& params = weights[to_string(kind)];
    for (int u = 0; u < h.layout().num_units(); ++u) {
      const UnitLayout& unit = h.layout().units[static_cast<size_t>(u)];
      std::vector<float> values(static_cast<size_t>(unit.padded_numel), -1.0f);
      for (const auto& res : results) {
        const auto [begin, end] = res.owned_range[static_cast<size_t>(u)];
        std::copy(res.owned_master[static_cast<size_t>(u)].begin(),
                  res.owned_master[static_cast<size_t>(u)].end(), values.begin() + begin);
      }
      full.insert(full.end(), values.begin(), values.end());
      for (const auto& p : unit.params)
        params.insert(params.end(), values.begin() + p.offset, values.begin() + p.offset + p.numel);
    }
    for (const auto& res : results) {
      if (!res.replicated.empty()) {
        EXPECT_EQ(res.replicated, full) << to_string(kind) << " replicas";
      }
    }
  }
  for (const auto& [name, w] : weights) EXPECT_EQ(w, weights["ddp"]) << name;
}

TEST(FlatUnitStrategy, ARankThatThrowsTakesTheOthersDownThroughAbort) {
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero3}) {
    StepSetup run{options(kind), 2, 1};
    run.timeout = 120.0;  // far longer than the test: the abort, not the deadline, ends it
    StrategyHarness h(run);
    InProcessJob job(2, CommOptions{.timeout_seconds = run.timeout});
    std::vector<RankResult> results;
    const auto errors = h.step(results, job, [](Communicator& comm, int model_unit) {
      if (comm.rank() != 1 || model_unit != 1) return;
      try {
        throw Error("cannot allocate 4 GiB for activations");
      } catch (const std::exception& e) {
        comm.abort_job(std::string("error: ") + e.what());  // what run_training does
      }
    });
    for (const auto& e : errors) {
      EXPECT_EQ(e, "rank 1: error: cannot allocate 4 GiB for activations") << to_string(kind);
    }
  }
}

TEST(FlatUnitStrategy, ARankThatNeverArrivesMakesTheDeadlineNameTheCollective) {
  StepSetup run{options(StrategyKind::zero2), 2, 1};
  StrategyHarness h(run);
  InProcessJob job(2, CommOptions{.timeout_seconds = 0.3});
  job.inject({.rank = 1, .label = "reduce_scatter grads unit h.0"});
  std::vector<RankResult> results;
  const auto errors = h.step(results, job);
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_EQ(e.rfind(fmt::format("rank {}: timed out after 0.3 s waiting for reduce_scatter "
                                  "'reduce_scatter grads unit h.0' (#", r),
                      0),
              0u)
        << e;
    EXPECT_NE(e.find(" on world)"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace shardlm
