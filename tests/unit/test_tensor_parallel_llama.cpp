// Tensor-parallel Llama layers (model/tensor_parallel/): T ranks of an in-process job,
// each holding its pieces (ParamLayout with a TensorSplit) and computing over its tensor
// group, against the unsplit model on one rank: the loss and every gradient, on each
// rank's piece of it, equal within a relative 1e-5 of the norm (fp32: the all-reduce of
// T partial sums adds in another order than one GEMM over the whole inner dimension;
// measured below ~1e-6), and the gradients of whole (replicated) parameters bitwise
// the same on every tensor rank, which is what keeps their copies equal. Two
// accumulating micro-batches with ignored targets, with and without activation
// checkpointing; llama (GQA; T = 4 replicates its 2 key/value heads), qwen2 (q/k/v
// biases), qwen3 (per-head q/k norms, untied head); LoRA adapters on every module. The embedding and the LM head are
// vocabulary-parallel (rows of the padded vocabulary of 128 for 97 tokens: at T = 4 the
// last rank holds one real row and 31 padding rows); the tied head's gradient is the
// lookup's and the head's on each rank's rows. The vocabulary-parallel head's logits
// chunk is 1 / T of the unsplit head's (VocabParallelHead's carve, qwen2.5's vocabulary).
// QLoRA: the NF4 base split block for block, its adapters' gradients as LoRA's. Every
// gradient is also held to 1e-5 of its tensor's largest element.
#include "tensor_parallel_support.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "qlora_tensor_parallel_config.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"
#include "shardlm/model/tensor_parallel/vocab_parallel.hpp"

namespace shardlm {
namespace {

using tensor_parallel_test::expect_tensor_parallel_equals_one_rank;
using tensor_parallel_test::tiny;

TEST(TensorParallelLlama, LlamaTwoAndFourRanksEqualOneRank) {
  const ModelConfig c = tiny("llama-tiny");
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, false);  // 2 kv heads over 4 ranks: replicated
  expect_tensor_parallel_equals_one_rank(c, 2, true);
}

TEST(TensorParallelLlama, Qwen2BiasesEqualOneRank) {
  const ModelConfig c = tiny("qwen2-tiny");
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, true);
}

TEST(TensorParallelLlama, Qwen3QkNormsAndUntiedHeadEqualOneRank) {
  ModelConfig c = tiny("qwen3-tiny");
  c.n_head = 4;
  c.n_kv_head = 2;
  c.tie_embeddings = false;
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, false);
}

// Sequence parallelism: the residual stream, norms and residual adds on N / T tokens
// (2 x 12 = 24 tokens: 12 or 6 a rank), all-gathers and reduce-scatters instead of the
// all-reduces; the norm weights' gradients summed over the group.
TEST(TensorParallelLlama, SequenceParallelEqualsOneRank) {
  expect_tensor_parallel_equals_one_rank(tiny("llama-tiny"), 2, false, true);
  expect_tensor_parallel_equals_one_rank(tiny("llama-tiny"), 4, true, true);
  expect_tensor_parallel_equals_one_rank(tiny("qwen2-tiny"), 2, true, true);  // tied, biases
  ModelConfig q3 = tiny("qwen3-tiny");
  q3.n_head = 4;
  q3.n_kv_head = 2;
  expect_tensor_parallel_equals_one_rank(q3, 4, false, true);
  ModelConfig lora = tiny("llama-tiny");
  lora.lora.rank = 4;
  lora.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  expect_tensor_parallel_equals_one_rank(lora, 2, false, true);
}

TEST(TensorParallelLlama, TiedLlamaHeadEqualsOneRank) {
  ModelConfig c = tiny("llama-tiny");  // llama-tiny's own head is untied
  c.tie_embeddings = true;
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 4, true);
}

// LoRA on every module (B and the norms perturbed away from their zero / one init, so
// every adapter gradient is nonzero): a column-parallel base's B and a row-parallel
// base's A are pieces, the other matrix whole; the frozen base has no gradient.
TEST(TensorParallelLlama, LoraAdaptersEqualOneRank) {
  ModelConfig c = tiny("llama-tiny");
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 2, true);
  // 2 key/value heads over 4 ranks are replicated: k_proj's and v_proj's B take every
  // replica's gradient, the input gradient this rank's share.
  expect_tensor_parallel_equals_one_rank(c, 4, false);
  expect_tensor_parallel_equals_one_rank(c, 4, true);
  ModelConfig q2 = tiny("qwen2-tiny");  // tied head, q/k/v biases (frozen)
  q2.lora.rank = 2;
  q2.lora.targets = {"q_proj", "v_proj", "down_proj"};
  expect_tensor_parallel_equals_one_rank(q2, 2, false);
}

// QLoRA: the frozen base's linear weights NF4, split like the fp32 ones, each piece
// stored as the NF4 tensor of its own values (blocks of 64 values: head_dim 64 and an
// MLP of 256 make every split run a multiple of 64, so each rank's blocks are the whole
// tensor's); every rank dequantizes its pieces to the values the unsplit model
// dequantizes there, and the adapters' gradients equal the unsplit run's.
TEST(TensorParallelLlama, QloraAdaptersEqualOneRank) {
  ModelConfig c = qlora_tensor_parallel_config(tiny("llama-tiny"));
  c.n_layer = 2;
  expect_tensor_parallel_equals_one_rank(c, 2, false);
  expect_tensor_parallel_equals_one_rank(c, 2, true, true);
  expect_tensor_parallel_equals_one_rank(c, 4, false);  // key/value heads replicated
}

TEST(TensorParallelLlama, VocabularyParallelLogitsChunkIsATthOfTheUnsplitOne) {
  const int vocab = 151936, padded = 151936, C = 896;  // qwen2.5-0.5b
  const int64_t n = 4 * 1024;
  ArenaCarver unsplit;
  LmHead head;
  head.carve(unsplit, n, vocab, padded, C, DType::fp32);
  const int64_t chunk = static_cast<int64_t>(LmHead::chunk_rows_for(n, padded)) * padded * 4;
  for (int T : {2, 4}) {
    ArenaCarver split;
    VocabParallelHead vhead;
    vhead.carve(split, n, VocabShard::of(vocab, padded, {T, T - 1}), padded, C, DType::fp32);
    EXPECT_EQ(vhead.chunk_rows(), head.chunk_rows());
    // The chunk shrinks by (T - 1) / T; the row statistics add 3 floats a chunk row.
    const int64_t saved = unsplit.bytes() - split.bytes();
    EXPECT_GE(saved, chunk * (T - 1) / T - 3 * 4 * head.chunk_rows() - 3 * 64);
    std::printf("head arrays (a logits chunk of %d rows x %d): %.1f MiB unsplit, %.1f MiB per rank at T=%d\n",
                head.chunk_rows(), padded, static_cast<double>(unsplit.bytes()) / (1 << 20),
                static_cast<double>(split.bytes()) / (1 << 20), T);
  }
}

// A rank's activation arena (what the model allocates, by the tracker) shrinks by the
// logits' share: llama-tiny's shape with Llama 2's 32000-token vocabulary, 2 x 32 tokens.
// And as plan_memory counts it, for qwen2.5-0.5b at 1 x 4096 tokens (T = 2; its 14 heads
// do not split 4 ways).
TEST(TensorParallelLlama, ActivationsPerRankShrinkByTheLogitsShare) {
  ModelConfig c = tiny("llama-tiny");
  c.vocab_size = 32000;
  const ModelConfig qwen = model_preset("qwen2.5-0.5b");
  auto activations = [&](int T) {
    std::vector<int64_t> bytes(2);
    auto measure = [&](Communicator* tensor, int rank) {
      ModelOptions options;
      options.parallel_groups.tensor = tensor;
      MemoryTracker tracker;
      const ParamLayout layout = ParamLayout::build(c, 1, 0, {T, rank});
      auto model = model_family(c.family).make_model(c, layout, 2, 32, options, tracker);
      if (rank != 0) return;
      bytes[0] = static_cast<int64_t>(tracker.current(MemCategory::activations));
      // (qwen2.5-0.5b's 14 heads do not split 4 ways.)
      if (qwen.n_head % T == 0)
        bytes[1] = model_family(qwen.family).plan_memory(qwen, 1, 4096, options, false).activations;
    };
    if (T == 1) {
      measure(nullptr, 0);
    } else {
      InProcessJob job(T);
      for (const std::string& e : job.run([&](Communicator& comm) { measure(&comm, comm.rank()); }))
        EXPECT_EQ(e, "");
    }
    return bytes;
  };
  const std::vector<int64_t> one = activations(1);
  const int64_t logits = static_cast<int64_t>(LmHead::chunk_rows_for(64, c.padded_vocab_size())) *
                         c.padded_vocab_size() * 4;
  for (int T : {2, 4}) {
    const std::vector<int64_t> split = activations(T);
    EXPECT_GE(one[0] - split[0], logits * (T - 1) / T) << "T=" << T;
    std::printf("activations per rank at T=%d: llama-tiny-shaped (vocab 32000, 64 tokens) %.2f MiB "
                "(T=1: %.2f MiB, logits chunk %.2f MiB)\n",
                T, split[0] / 1048576.0, one[0] / 1048576.0, logits / 1048576.0);
    if (T == 2) {
      EXPECT_LT(split[1], one[1]);
      std::printf("activations per rank at T=2 as planned: qwen2.5-0.5b 4096 tokens %.1f MiB (T=1: %.1f MiB)\n",
                  split[1] / 1048576.0, one[1] / 1048576.0);
    }
  }
}

TEST(TensorParallelLlama, ALayoutOfAnotherSplitIsRefused) {
  const ModelConfig c = tiny("llama-tiny");
  const ParamLayout unsplit = ParamLayout::build(c, 1, 0);
  InProcessJob job(2);
  const std::vector<std::string> errors = job.run([&](Communicator& comm) {
    ModelOptions options;
    options.parallel_groups.tensor = &comm;
    MemoryTracker tracker;
    model_family(c.family).make_model(c, unsplit, 1, 8, options, tracker);
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("the layout holds tensor rank 0 of 1, the model's tensor group is rank"), std::string::npos) << e;
}

}  // namespace
}  // namespace shardlm
