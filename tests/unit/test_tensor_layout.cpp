// Tensor-parallel layout (model/tensor_parallel/tensor_layout.hpp): every parameter's
// piece on each tensor rank, checked against row and column ranges written out here
// from Megatron's rules (column-parallel q/k/v by head and gate/up by channel,
// row-parallel o_proj/down_proj, vocabulary-parallel embed_tokens/lm_head by rows of
// the padded vocabulary, the rest whole); each rank's init equals the unsplit
// init on its piece, bitwise; packing survives; bad shapes get one-line errors. A
// QLoRA base's NF4 pieces are the whole tensor's blocks (absmax and codes) word for word.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"
#include "shardlm/model/param_layout.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"
#include "qlora_tensor_parallel_config.hpp"

namespace shardlm {
namespace {

// Every parameter's values (init with `seed`), by name, and its info.
struct Values {
  std::map<std::string, std::vector<float>> by_name;
  std::map<std::string, ParamInfo> info;
};

Values init_values_of(const ModelConfig& config, TensorSplit split, uint64_t seed) {
  const ParamLayout layout = ParamLayout::build(config, 2, 0, split);
  Values v;
  for (const UnitLayout& unit : layout.units) {
    std::vector<float> buffer(static_cast<size_t>(unit.padded_numel));
    init_param_range(unit, seed, 0, unit.padded_numel, buffer.data());
    for (const ParamInfo& p : unit.params) {
      v.by_name[p.name].assign(buffer.begin() + p.offset, buffer.begin() + p.offset + p.numel);
      v.info[p.name] = p;
    }
  }
  return v;
}

// The expected piece, written out: rows [r0, r0 + rows) and columns [c0, c0 + cols)
// of a row-major [R, Ccols] tensor (1-D tensors: R = 1).
std::vector<float> block(const std::vector<float>& full, int64_t full_cols, int64_t r0, int64_t rows,
                         int64_t c0, int64_t cols) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t c = c0; c < c0 + cols; ++c) out.push_back(full[static_cast<size_t>(r * full_cols + c)]);
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checks every parameter of every rank of a T-way split of `config` against the rules.
void expect_megatron_pieces(const ModelConfig& config, int T) {
  SCOPED_TRACE(config.family + " T=" + std::to_string(T));
  const uint64_t seed = 1234;
  const Values full = init_values_of(config, {}, seed);
  const int64_t hd = config.head_dim(), I = config.mlp_width();
  const int64_t H = config.n_head, KV = config.kv_heads();
  for (int t = 0; t < T; ++t) {
    SCOPED_TRACE("tensor rank " + std::to_string(t));
    const Values local = init_values_of(config, {T, t}, seed);
    ASSERT_EQ(local.by_name.size(), full.by_name.size());
    // The key/value heads this rank holds: its own share, or the one its queries read.
    const int64_t kv_local = KV % T == 0 ? KV / T : 1;
    const int64_t kv_first = KV % T == 0 ? t * kv_local : (t * H / T) / (H / KV);
    for (const auto& [name, values] : local.by_name) {
      SCOPED_TRACE(name);
      const ParamInfo& p = local.info.at(name);
      const ParamInfo& f = full.info.at(name);
      const std::vector<float>& whole = full.by_name.at(name);
      const int64_t cols = f.shape.size() == 2 ? f.shape[1] : f.shape[0];
      const int64_t rows = f.shape.size() == 2 ? f.shape[0] : 1;
      std::vector<float> expected;
      std::vector<int64_t> shape;
      auto rows_of = [&](int64_t r0, int64_t n) {  // column-parallel: rows (1-D: entries)
        if (f.shape.size() == 1) {
          expected = block(whole, cols, 0, 1, r0, n);
          shape = {n};
        } else {
          expected = block(whole, cols, r0, n, 0, cols);
          shape = {n, cols};
        }
      };
      if (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias") ||
          ends_with(name, "q_proj.lora_B.weight")) {
        rows_of(t * (H / T) * hd, (H / T) * hd);
      } else if (ends_with(name, "k_proj.weight") || ends_with(name, "v_proj.weight") ||
                 ends_with(name, "k_proj.bias") || ends_with(name, "v_proj.bias") ||
                 ends_with(name, "k_proj.lora_B.weight") || ends_with(name, "v_proj.lora_B.weight")) {
        rows_of(kv_first * hd, kv_local * hd);
      } else if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight") ||
                 ends_with(name, "gate_proj.lora_B.weight") || ends_with(name, "up_proj.lora_B.weight")) {
        rows_of(t * (I / T), I / T);
      } else if (ends_with(name, "o_proj.weight") || ends_with(name, "o_proj.lora_A.weight")) {
        expected = block(whole, cols, 0, rows, t * (H / T) * hd, (H / T) * hd);
        shape = {rows, (H / T) * hd};  // C rows, or the adapter's rank
      } else if (ends_with(name, "down_proj.weight") || ends_with(name, "down_proj.lora_A.weight")) {
        expected = block(whole, cols, 0, rows, t * (I / T), I / T);
        shape = {rows, I / T};
      } else if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
        const int64_t vp = config.padded_vocab_size();  // padding rows on the last ranks
        EXPECT_EQ(rows, vp);
        rows_of(t * (vp / T), vp / T);
      } else {
        expected = whole;  // norms, o_proj's bias, the final norm, the other adapters: whole
        shape = f.shape;
        EXPECT_TRUE(p.piece.whole());
      }
      EXPECT_EQ(p.shape, shape);
      EXPECT_EQ(p.piece.full_shape(p.shape), f.shape);
      ASSERT_EQ(values.size(), expected.size());
      EXPECT_EQ(values, expected);  // bitwise: the same stream, the same elements
    }
  }
}

TEST(TensorLayout, LlamaPiecesFollowMegatronAndInitEqualsTheUnsplitRun) {
  ModelConfig c = model_preset("llama-tiny");  // 4 heads, 2 kv heads, MLP 160
  c.vocab_size = 97;
  c.max_seq_len = 32;
  expect_megatron_pieces(c, 2);
  expect_megatron_pieces(c, 4);  // kv heads replicated over 2 ranks each
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  expect_megatron_pieces(c, 2);
}

TEST(TensorLayout, Qwen2BiasesAndQwen3NormsSplitAsTheirProjections) {
  ModelConfig q2 = model_preset("qwen2-tiny");  // q/k/v biases
  q2.vocab_size = 97;
  expect_megatron_pieces(q2, 2);
  expect_megatron_pieces(q2, 4);
  ModelConfig q3 = model_preset("qwen3-tiny");  // per-head q/k norms: whole
  q3.vocab_size = 97;
  q3.n_head = 4;
  q3.n_kv_head = 2;
  expect_megatron_pieces(q3, 2);
  q3.tie_embeddings = false;
  expect_megatron_pieces(q3, 2);
}

TEST(TensorLayout, PackedProjectionsStayOneMatrixAndUnitsShrink) {
  const ModelConfig c = model_preset("llama-tiny");
  const ParamLayout full = ParamLayout::build(c, 4, 0);
  for (int T : {2, 4}) {
    const ParamLayout local = ParamLayout::build(c, 4, 0, {T, T - 1});
    EXPECT_EQ(local.tensor, (TensorSplit{T, T - 1}));
    const UnitLayout& layer = local.units[1];
    const int64_t q = layer.param("model.layers.0.self_attn.q_proj.weight").offset;
    const int64_t k = layer.param("model.layers.0.self_attn.k_proj.weight").offset;
    const int64_t v = layer.param("model.layers.0.self_attn.v_proj.weight").offset;
    const int64_t rows_q = c.n_head / T * c.head_dim();
    const int64_t rows_kv = tensor_local_kv_heads(c, T) * c.head_dim();
    EXPECT_EQ(k, q + rows_q * c.n_embd);
    EXPECT_EQ(v, k + rows_kv * c.n_embd);
    const int64_t g = layer.param("model.layers.0.mlp.gate_proj.weight").offset;
    EXPECT_EQ(layer.param("model.layers.0.mlp.up_proj.weight").offset, g + c.mlp_width() / T * c.n_embd);
    for (const ParamInfo& p : layer.params) {
      if (!p.packed_with_previous) {
        EXPECT_EQ(p.offset % ParamLayout::kParamAlignment, 0) << p.name;
      }
    }
    EXPECT_EQ(layer.padded_numel % (4 * ParamLayout::kParamAlignment), 0);
    EXPECT_LT(layer.numel, full.units[1].numel);
    EXPECT_EQ(local.units[0].numel, full.units[0].numel / T);  // rows of the vocabulary
  }
}

// QLoRA: each rank's NF4 words are the whole tensor's, block for block. Block k of a
// piece (its values [64k, 64k + 64)) is block f / 64 of the whole tensor, f the full
// index of its first value: the same absmax word, the same 8 words of codes.
TEST(TensorLayout, Nf4PiecesAreTheWholeTensorsBlocks) {
  const ModelConfig c = qlora_tensor_parallel_config(model_preset("llama-tiny"));
  const Values full = init_values_of(c, {}, 99);
  for (int T : {2, 4})
    for (int t = 0; t < T; ++t) {
      SCOPED_TRACE("T=" + std::to_string(T) + " rank " + std::to_string(t));
      const Values local = init_values_of(c, {T, t}, 99);
      int pieces = 0;
      for (const auto& [name, words] : local.by_name) {
        const ParamInfo& p = local.info.at(name);
        if (!p.quantized()) continue;
        ASSERT_FALSE(p.piece.whole()) << name;
        const std::vector<float>& whole = full.by_name.at(name);
        const int64_t blocks = p.logical_numel() / 64, full_blocks = full.info.at(name).logical_numel() / 64;
        ASSERT_EQ(static_cast<int64_t>(words.size()), blocks + 8 * blocks) << name;
        for (int64_t k = 0; k < blocks; ++k) {
          const int64_t f = p.piece.full_index(p.shape, 64 * k) / 64;
          ASSERT_EQ(std::memcmp(&words[static_cast<size_t>(k)], &whole[static_cast<size_t>(f)], 4), 0)
              << name << " absmax of block " << k;
          ASSERT_EQ(std::memcmp(&words[static_cast<size_t>(blocks + 8 * k)],
                                &whole[static_cast<size_t>(full_blocks + 8 * f)], 32), 0)
              << name << " codes of block " << k;
        }
        ++pieces;
      }
      EXPECT_EQ(pieces, 7 * c.n_layer);
    }
}

void expect_error(const ModelConfig& c, int T, const std::string& fragment) {
  try {
    check_tensor_parallel(c, T);
    ADD_FAILURE() << "no error for T=" << T << " (" << fragment << ")";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(TensorLayout, ShapesThatDoNotSplitGetOneLineErrors) {
  const ModelConfig llama = model_preset("llama-tiny");
  expect_error(llama, 0, "--tensor-parallel must be at least 1, got 0");
  expect_error(llama, 3, "--tensor-parallel 3 must divide the 4 attention heads");
  expect_error(model_preset("qwen3-tiny"), 2, "--tensor-parallel 2 must divide the 3 attention heads");
  ModelConfig odd_mlp = llama;
  odd_mlp.intermediate_size = 162;
  expect_error(odd_mlp, 4, "--tensor-parallel 4 must divide the MLP width 162");
  ModelConfig kv3 = llama;
  kv3.n_head = 12;
  kv3.head_dim_override = 8;
  kv3.n_kv_head = 3;
  expect_error(kv3, 4, "the model's 3 key/value heads must be a multiple of it");
  EXPECT_NO_THROW(check_tensor_parallel(model_preset("gpt2-tiny"), 4));
  expect_error(model_preset("gpt2-tiny"), 8, "--tensor-parallel 8 must divide the 4 attention heads");
  expect_error(model_preset("qwen3-moe-tiny"), 2, "the qwen3_moe family is not split");
  ModelConfig lora = llama;
  lora.lora.rank = 4;
  lora.lora.targets = {"q_proj", "v_proj"};
  EXPECT_NO_THROW(check_tensor_parallel(lora, 2));
  EXPECT_NO_THROW(check_tensor_parallel(lora, 4));  // key/value heads replicated
  lora.quantize_base = BaseQuant::nf4;  // o_proj's pieces: 48 of 96 columns a row
  expect_error(lora, 2, "--tensor-parallel 2 with --quantize-base nf4: tensor rank 0 would hold 48 "
               "of the 96 columns of model.layers.0.self_attn.o_proj.weight [96 x 96], runs of 48 "
               "values from value 0 of the tensor, which cut NF4's blocks of 64 values");
  ModelConfig qlora = qlora_tensor_parallel_config(llama);  // every run a multiple of 64 values
  EXPECT_NO_THROW(check_tensor_parallel(qlora, 2));
  EXPECT_NO_THROW(check_tensor_parallel(qlora, 4));
  qlora.intermediate_size = 320;  // down_proj at T = 2: 160 columns a row
  expect_error(qlora, 2, "160 of the 320 columns of model.layers.0.mlp.down_proj.weight [128 x 320]");
  ModelConfig qlora_70b = model_preset("llama-3.1-70b");  // head_dim 128: real shapes split
  qlora_70b.lora = lora.lora;
  qlora_70b.quantize_base = BaseQuant::nf4;
  EXPECT_NO_THROW(check_tensor_parallel(qlora_70b, 8));
  ModelConfig by3 = llama;  // 6 heads, 3 key/value heads, MLP 162: only the vocabulary
  by3.n_head = 6;
  by3.head_dim_override = 8;
  by3.n_kv_head = 3;
  by3.intermediate_size = 162;
  by3.vocab_size = 97;
  expect_error(by3, 3, "--tensor-parallel 3 must divide the model's vocabulary of 128 rows "
               "(97 tokens padded to a multiple of 64); use a divisor of 128");
  EXPECT_NO_THROW(check_tensor_parallel(model_preset("gpt2-tiny"), 1));
  EXPECT_NO_THROW(check_tensor_parallel(model_preset("llama-3.1-70b"), 8));
  // The layout refuses a rank outside the dimension.
  EXPECT_THROW(ParamLayout::build(llama, 1, 0, {2, 2}), Error);
}

}  // namespace
}  // namespace shardlm
