// Tensor-parallel checkpoints stay in model space (llama-tiny and gpt2-tiny): each tensor rank writes its pieces,
// the manifest records which rows or columns of which logical tensor each holds, and a
// reader puts the logical tensors together. A checkpoint saved at T = 2 (alone, and as
// shard 2 x tensor 2 with ZeRO-style owned slices) has the weight and optimizer digests
// of the same values saved at T = 1, loads at T = 1 and at T = 4 with every element in
// its place, and a T = 1 checkpoint loads at T = 2. The vocabulary-parallel embedding
// and LM head are pieces too (rows of the padded vocabulary: 97 tokens in 128 rows, the
// padding on the last ranks), and a Hugging Face export (unpadded rows) imports into
// the pieces of T = 2 and T = 4 with every real row in its place and padding zero.
// QLoRA: each rank holds its NF4 base pieces as the NF4 tensors of their own values; a
// T = 2 checkpoint reads (words and digests) as the same values quantized whole at
// T = 1, loads at T = 1 and T = 4 word for word, and the dequantized base exported at
// T = 1 imports into the pieces of T = 2 and T = 4 as exactly those words.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/hf_export.hpp"
#include "shardlm/ckpt/hf_import.hpp"
#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/model/family.hpp"
#include "qlora_tensor_parallel_config.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

// llama-tiny with an untied head (GQA: T = 4 replicates its 2 key/value heads), or
// gpt2-tiny with its tied one (c_attn's pieces are three groups: q, k and v's columns).
ModelConfig tiny(const char* preset = "llama-tiny") {
  ModelConfig c = model_preset(preset);
  c.vocab_size = 97;
  c.max_seq_len = 32;
  c.n_layer = 2;
  if (c.family == "llama") c.tie_embeddings = false;
  return c;
}

// Owned slices [shard * S, (shard + 1) * S) of every unit, as plain vectors.
class SliceState final : public OwnedState {
 public:
  SliceState(const ParamLayout& layout, int shard) {
    for (const UnitLayout& u : layout.units) {
      const int64_t size = u.shard_numel(layout.world_size);
      begin_.push_back(shard * size);
      for (auto* v : {&master_, &m_, &v_}) v->emplace_back(static_cast<size_t>(size), 0.0f);
    }
  }
  OwnedSlice owned(int u) override {
    const size_t i = static_cast<size_t>(u);
    OwnedSlice s;
    s.begin = begin_[i];
    s.end = begin_[i] + static_cast<int64_t>(master_[i].size());
    s.master = master_[i].data();
    s.adam_m = m_[i].data();
    s.adam_v = v_[i].data();
    return s;
  }
  void after_load() override {}
  std::vector<std::vector<float>> master_, m_, v_;

 private:
  std::vector<int64_t> begin_;
};

// A value for every element of every logical tensor, from its name and its index in the
// full tensor (so a misplaced piece shows), written wherever the layout holds it.
float value_of(const std::string& name, int64_t full_index) {
  return static_cast<float>(std::hash<std::string>{}(name) % 1000) + 0.001f * static_cast<float>(full_index);
}

// An NF4 parameter's words: value_of() of its (piece's) elements, quantized as a
// QLoRA run quantizes its base (each piece as a tensor of its own).
std::vector<float> nf4_words_of(const ParamInfo& p) {
  std::vector<float> values(static_cast<size_t>(p.logical_numel())), words(static_cast<size_t>(p.numel));
  for (int64_t i = 0; i < p.logical_numel(); ++i)
    values[static_cast<size_t>(i)] = value_of(p.name, p.piece.full_index(p.shape, i));
  cpu::nf4_quantize(values.data(), p.logical_numel(), words.data());
  return words;
}

void fill(const ParamLayout& layout, SliceState& s) {
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice o = s.owned(u);
    for (const ParamInfo& p : layout.units[static_cast<size_t>(u)].params) {
      const std::vector<float> words = p.quantized() ? nf4_words_of(p) : std::vector<float>();
      for (int64_t i = 0; i < p.numel; ++i) {
        const int64_t at = p.offset + i;
        if (at < o.begin || at >= o.end) continue;
        // (A frozen NF4 weight has no optimizer state: zeros.)
        const float x = p.quantized() ? words[static_cast<size_t>(i)] : value_of(p.name, p.piece.full_index(p.shape, i));
        o.master[at - o.begin] = x;
        o.adam_m[at - o.begin] = p.quantized() ? 0.0f : -x;
        o.adam_v[at - o.begin] = p.quantized() ? 0.0f : 0.5f * x;
      }
    }
  }
}

// Bitwise (NF4 words are bytes: some are NaN patterns as floats).
bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

CheckpointInfo info_for(const ModelConfig& c, int world) {
  return {3, 300, c, "byte", "zero3", world, {{"options", {{"seed", 1}}}}};
}

// Saves fill()'s values from a job of shard x tensor ranks (tensor innermost).
std::string save_from(const ModelConfig& c, int shard, int tensor, const fs::path& dir) {
  InProcessJob job(shard * tensor);
  std::string saved;
  const auto errors = job.run([&](Communicator& comm) {
    const ParamLayout layout = ParamLayout::build(c, shard, 0, {tensor, comm.rank() % tensor});
    SliceState state(layout, comm.rank() / tensor);
    fill(layout, state);
    const std::string d = save_checkpoint(dir.string(), layout, state, info_for(c, shard * tensor), 0, comm);
    if (comm.rank() == 0) saved = d;
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return saved;
}

// Loads `ckpt` into every owned slice of a shard x tensor layout and compares with fill().
void expect_loads_at(const ModelConfig& c, const CheckpointReader& ckpt, int shard, int tensor) {
  SCOPED_TRACE(fmt::format("load at shard {} x tensor {}", shard, tensor));
  for (int t = 0; t < tensor; ++t)
    for (int s = 0; s < shard; ++s) {
      const ParamLayout layout = ParamLayout::build(c, shard, 0, {tensor, t});
      SliceState loaded(layout, s), expected(layout, s);
      ckpt.load_into(layout, loaded);
      fill(layout, expected);
      EXPECT_TRUE(same_bits(loaded.master_, expected.master_)) << "tensor rank " << t << " shard " << s;
      EXPECT_TRUE(same_bits(loaded.m_, expected.m_));
      EXPECT_TRUE(same_bits(loaded.v_, expected.v_));
    }
}

class TensorParallelCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardlm_tp_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

ModelConfig qlora() { return qlora_tensor_parallel_config(tiny()); }

// fill()'s values saved at T = 1, exported to Hugging Face (`lora` says what of a LoRA
// run) and imported into every tensor rank of each size in `tensors`:
// check(layout, T, rank, imported, fill()'s values of that layout) for each.
void for_each_import(const ModelConfig& c, const fs::path& dir, LoraExport lora, std::initializer_list<int> tensors,
                     const std::function<void(const ParamLayout&, int, int, SliceState&, SliceState&)>& check) {
  const CheckpointReader one(save_from(c, 1, 1, dir / "t1"));
  HfExportOptions options;
  options.out_dir = (dir / "hf").string();
  options.lora = lora;
  export_hugging_face(one, options);
  for (int tensor : tensors)
    for (int t = 0; t < tensor; ++t) {
      SCOPED_TRACE(fmt::format("tensor rank {} of {}", t, tensor));
      const ParamLayout layout = ParamLayout::build(c, 1, 0, {tensor, t});
      SliceState imported(layout, 0), expected(layout, 0);
      import_hugging_face(options.out_dir, c, layout, imported);
      fill(layout, expected);
      check(layout, tensor, t, imported, expected);
    }
}

void expect_saved_at_two_tensor_ranks_reads_as_the_logical_tensors(const ModelConfig& c, const fs::path& dir) {
  const CheckpointReader one(save_from(c, 1, 1, dir / "t1"));
  for (auto [shard, tensor] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 4}}) {
    const std::string saved_at = fmt::format("shard{}_tensor{}", shard, tensor);
    SCOPED_TRACE("saved at " + saved_at);
    const CheckpointReader ckpt(save_from(c, shard, tensor, dir / saved_at));
    EXPECT_EQ(ckpt.tensors(), one.tensors());  // logical names and full shapes, in order
    EXPECT_EQ(ckpt.weights_digest(), one.weights_digest());
    EXPECT_EQ(ckpt.optimizer_digest(), one.optimizer_digest());
    expect_loads_at(c, ckpt, 1, 1);
    expect_loads_at(c, ckpt, 2, 1);
    expect_loads_at(c, ckpt, 1, 4);  // key/value heads replicated over 2 ranks each
  }
  expect_loads_at(c, one, 2, 2);  // and an unsplit checkpoint loads split
}

TEST_F(TensorParallelCheckpoint, SavedAtTwoTensorRanksReadsAsTheLogicalTensors) {
  expect_saved_at_two_tensor_ranks_reads_as_the_logical_tensors(tiny(), dir_ / "llama");
  expect_saved_at_two_tensor_ranks_reads_as_the_logical_tensors(tiny("gpt2-tiny"), dir_ / "gpt2");
}

TEST_F(TensorParallelCheckpoint, QloraNf4PiecesReadAsTheWholeTensorQuantized) {
  const ModelConfig c = qlora();
  int64_t pieces = 0;
  for (const ParamInfo* p : ParamLayout::build(c, 1, 0, {2, 1}).all_params())
    pieces += p->quantized() && !p->piece.whole();
  EXPECT_EQ(pieces, 7 * c.n_layer);  // every NF4 weight is a piece at T = 2
  expect_saved_at_two_tensor_ranks_reads_as_the_logical_tensors(c, dir_);
}

// The dequantized base (export --base-only of the T = 1 checkpoint) imported with
// --quantize-base nf4 at T = 2 and 4: each rank quantizes its pieces' values, which
// gives back the words of fill() (a dequantized NF4 value code x absmax quantizes to
// its code again: the block's largest is +-absmax itself).
TEST_F(TensorParallelCheckpoint, QloraBaseImportsIntoNf4Pieces) {
  const ModelConfig c = qlora();
  for_each_import(c, dir_, LoraExport::base_only, {1, 2, 4},
                  [&](const ParamLayout& layout, int, int, SliceState& imported, SliceState& expected) {
      int compared = 0;
      for (size_t u = 0; u < layout.units.size(); ++u)
        for (const ParamInfo& p : layout.units[u].params) {
          if (!p.quantized()) continue;
          EXPECT_EQ(std::memcmp(imported.master_[u].data() + p.offset, expected.master_[u].data() + p.offset,
                                static_cast<size_t>(p.numel) * sizeof(float)), 0) << p.name;
          ++compared;
        }
      EXPECT_EQ(compared, 7 * c.n_layer);
    });
}

TEST_F(TensorParallelCheckpoint, HuggingFaceExportImportsIntoVocabularyPieces) {
  for (const ModelConfig& c : {tiny(), tiny("gpt2-tiny")}) {
  SCOPED_TRACE(c.family);
  for_each_import(c, dir_ / c.family, LoraExport::automatic, {2, 4},
                  [&](const ParamLayout& layout, int tensor, int t, SliceState& imported, SliceState& expected) {
      int64_t padding_rows = 0;
      for (size_t u = 0; u < layout.units.size(); ++u)
        for (const ParamInfo& p : layout.units[u].params) {
          if (p.valid_rows < 0) continue;
          const int64_t cols = p.shape[1];
          for (int64_t i = 0; i < p.numel; ++i)
            if (p.piece.full_index(p.shape, i) / cols >= p.valid_rows) {
              expected.master_[u][static_cast<size_t>(p.offset + i)] = 0.0f;
              padding_rows += i % cols == 0;
            }
        }
      // The embedding's padding rows, and an untied head's.
      EXPECT_EQ(padding_rows, t == tensor - 1 ? (c.tie_embeddings ? 1 : 2) * (128 - 97) : 0);
      EXPECT_EQ(imported.master_, expected.master_);
    });
  }
}

}  // namespace
}  // namespace shardlm
