// Tensor-parallel GPT-2 blocks (tensor_layout.hpp's gpt2 rules) against the unsplit model
// on one rank (tensor_parallel_support.hpp: loss and logits, every gradient on each rank's
// piece within 1e-5 of its norm, replicated gradients bitwise equal across tensor ranks):
// c_attn split by heads inside each of q, k and v (a piece of three groups), c_fc by MLP
// channel, both c_proj weights by their input rows with their outputs summed over the
// group before the (whole) bias; wte and the LM head vocabulary-parallel, wpe whole and
// added after the lookup's sum. gpt2-tiny: 4 heads of 32, C = 128, vocabulary 97 padded
// to 128 (T = 4: the last rank holds one real row). Tied head (gpt2's own) and untied,
// with and without activation checkpointing and sequence parallelism; generation with
// a KV cache of this rank's heads.
#include "tensor_parallel_support.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {
namespace {

using tensor_parallel_test::expect_tensor_parallel_equals_one_rank;
using tensor_parallel_test::tiny;

TEST(TensorParallelGpt2, TwoAndFourRanksEqualOneRank) {
  const ModelConfig c = tiny("gpt2-tiny");
  ASSERT_TRUE(c.tie_embeddings);
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, false);
  expect_tensor_parallel_equals_one_rank(c, 2, true);
}

TEST(TensorParallelGpt2, UntiedHeadEqualsOneRank) {
  ModelConfig c = tiny("gpt2-tiny");
  c.tie_embeddings = false;
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, true);
}

// c_attn's columns are q | k | v, each [C] wide: tensor rank t of T holds columns
// [t C/T, (t+1) C/T) of each, side by side as the attention kernels read them.
TEST(TensorParallelGpt2, QkvPieceHoldsItsHeadsOfEachOfQKV) {
  const ModelConfig c = tiny("gpt2-tiny");
  const int C = c.n_embd, T = 4, t = 1, A = C / T;
  const LocalPiece w = tensor_piece_of(c, "transformer.h.0.attn.c_attn.weight", {C, 3 * C}, {T, t});
  ASSERT_EQ(w.extent, 3 * A);
  const std::vector<int64_t> local = {C, 3 * A};
  for (int part = 0; part < 3; ++part)
    for (int j : {0, A - 1}) {
      const int64_t column = part * A + j;  // row 2 of the piece
      EXPECT_EQ(w.piece.full_index(local, 2 * 3 * A + column), 2 * 3 * C + part * C + t * A + j)
          << "part " << part << " column " << j;
    }
  // Runs stop at each group's end: a row of the piece is three runs.
  int runs = 0;
  w.piece.for_each_run(local, 0, 3 * A, [&](int64_t full, int64_t at, int64_t n) {
    EXPECT_EQ(n, A);
    EXPECT_EQ(full, runs * C + t * A);
    EXPECT_EQ(at, runs * A);
    ++runs;
  });
  EXPECT_EQ(runs, 3);
}

// Sequence parallelism: the residual stream, the LayerNorms and the residual adds on
// N / T tokens (24 tokens: 12 or 6 a rank), the embedding's sum reduce-scattered (wpe
// added to the rows here), the final norm's output gathered for the head; the
// LayerNorms' weight and bias gradients summed over the group, the c_proj biases'
// from every token's gradient.
TEST(TensorParallelGpt2, SequenceParallelEqualsOneRank) {
  ModelConfig c = tiny("gpt2-tiny");
  expect_tensor_parallel_equals_one_rank(c, 2, false, true);
  expect_tensor_parallel_equals_one_rank(c, 4, true, true);
  c.tie_embeddings = false;
  expect_tensor_parallel_equals_one_rank(c, 2, true, true);
}

// Generation with a KV cache at T = 2: each rank caches its own heads' keys and values;
// a 7-token prompt in one step, then 3 one-token steps: every step's logits (gathered
// over the group) within 1e-5 of the unsplit model's. With sequence parallelism the
// cache is refused (it does not split its tokens).
TEST(TensorParallelGpt2, KvCacheGenerationEqualsOneRank) {
  const ModelConfig c = tiny("gpt2-tiny");
  const std::vector<int32_t> tokens = {5, 17, 3, 96, 40, 2, 61, 8, 33, 70};
  auto generate = [&](TensorSplit split, Communicator* tensor) {
    const ParamLayout layout = ParamLayout::build(c, 1, 0, split);
    tensor_parallel_test::RankParams rank = tensor_parallel_test::make_params(layout);
    ModelOptions options;
    options.parallel_groups.tensor = tensor;
    MemoryTracker tracker;
    auto model = model_family(c.family).make_model(c, layout, 1, 16, options, tracker);
    KvCache cache = model->make_kv_cache(16);
    std::vector<std::vector<float>> steps;
    for (auto [begin, count] : {std::pair{0, 7}, std::pair{7, 1}, std::pair{8, 1}, std::pair{9, 1}}) {
      const MicroBatch batch{tokens.data() + begin, nullptr, 1, count};
      for (int u = 0; u < model->num_units(); ++u) model->forward_unit_cached(u, rank.param_ptrs, cache, batch);
      steps.emplace_back(static_cast<size_t>(c.vocab_size));
      model->logits_at(rank.param_ptrs, count - 1, steps.back().data());
    }
    return steps;
  };
  const std::vector<std::vector<float>> whole = generate({}, nullptr);
  std::vector<std::vector<std::vector<float>>> ranks(2);
  InProcessJob job(2);
  for (const std::string& e : job.run([&](Communicator& comm) {
         ranks[static_cast<size_t>(comm.rank())] = generate({2, comm.rank()}, &comm);
       }))
    ASSERT_EQ(e, "");
  for (size_t step = 0; step < whole.size(); ++step) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < whole[step].size(); ++i) {
      diff += (ranks[0][step][i] - whole[step][i]) * (ranks[0][step][i] - whole[step][i]);
      norm += whole[step][i] * whole[step][i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-5) << "step " << step;
    EXPECT_EQ(ranks[1][step], ranks[0][step]) << "step " << step;
  }
  InProcessJob sequence_parallel_job(2);
  const std::vector<std::string> errors = sequence_parallel_job.run([&](Communicator& comm) {
    ModelOptions options;
    options.parallel_groups.tensor = &comm;
    options.sequence_parallel = true;
    MemoryTracker tracker;
    const ParamLayout layout = ParamLayout::build(c, 1, 0, {2, comm.rank()});
    auto model = model_family(c.family).make_model(c, layout, 1, 16, options, tracker);
    KvCache cache = model->make_kv_cache(16);
    tensor_parallel_test::RankParams rank = tensor_parallel_test::make_params(layout);
    const MicroBatch batch{tokens.data(), nullptr, 1, 4};
    model->forward_unit_cached(0, rank.param_ptrs, cache, batch);
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("generation with a KV cache does not split its tokens"), std::string::npos) << e;
}

TEST(TensorParallelGpt2, HeadsThatDoNotSplitAreRefused) {
  try {
    check_tensor_parallel(tiny("gpt2-tiny"), 8);
    FAIL() << "8 tensor ranks over 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel 8 must divide the 4 attention heads"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
