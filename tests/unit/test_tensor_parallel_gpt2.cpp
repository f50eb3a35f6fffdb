// Tensor-parallel GPT-2 blocks (tensor_layout.hpp's gpt2 rules) against the unsplit model
// on one rank (tensor_parallel_support.hpp: loss and logits, every gradient on each rank's
// piece within 1e-5 of its norm, replicated gradients bitwise equal across tensor ranks):
// c_attn split by heads inside each of q, k and v (a piece of three groups), c_fc by MLP
// channel, both c_proj weights by their input rows with their outputs summed over the
// group before the (whole) bias; wte and the LM head vocabulary-parallel, wpe whole and
// added after the lookup's sum. gpt2-tiny: 4 heads of 32, C = 128, vocabulary 97 padded
// to 128 (T = 4: the last rank holds one real row). Tied head (gpt2's own) and untied,
// with and without activation checkpointing.
#include "tensor_parallel_support.hpp"

#include <string>

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

TEST(TensorParallelGpt2, HeadsOrSequenceParallelThatDoNotSplitAreRefused) {
  const ModelConfig c = tiny("gpt2-tiny");
  try {
    check_tensor_parallel(c, 8);
    FAIL() << "8 tensor ranks over 4 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-parallel 8 must divide the 4 attention heads"),
              std::string::npos) << e.what();
  }
  InProcessJob job(2);
  const std::vector<std::string> errors = job.run([&](Communicator& comm) {
    ModelOptions options;
    options.parallel_groups.tensor = &comm;
    options.sequence_parallel = true;
    MemoryTracker tracker;
    const ParamLayout layout = ParamLayout::build(c, 1, 0, {2, comm.rank()});
    model_family(c.family).make_model(c, layout, 1, 8, options, tracker);
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("--sequence-parallel is implemented for the llama, qwen2 and qwen3 families"),
              std::string::npos) << e;
}

}  // namespace
}  // namespace shardlm
