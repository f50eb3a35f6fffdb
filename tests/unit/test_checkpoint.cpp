// Checkpoint save/load in model space: round trip, reading under another world
// size's layout, corruption and truncation detection, failed saves leave nothing.
// (Manifest integrity and the recovery rule: test_checkpoint_integrity.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/rng.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny_config() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  return c;
}

// Fills master/m/v with values that encode (state, tensor element) so any misplaced
// element is detected; padding stays zero.
void fill_distinct(const ParamLayout& layout, OwnedState& s) {
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice o = s.owned(u);
    for (const auto& p : layout.units[static_cast<size_t>(u)].params)
      for (int64_t i = 0; i < p.numel; ++i) {
        float base = static_cast<float>(u * 100000 + (p.offset + i));
        o.master[p.offset + i] = base;
        o.adam_m[p.offset + i] = -base;
        o.adam_v[p.offset + i] = base * 0.5f;
      }
  }
}

SingleProcessCommunicator& comm() {
  static SingleProcessCommunicator c;
  return c;
}

std::vector<std::vector<int>> identity_needs(const ParamLayout& layout) {
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < layout.num_model_units(); ++m) needs.push_back({m});
  return needs;
}

// The world-size-1 strategy (ddp over a single-process communicator).
struct SingleStrategy : FlatUnitStrategy {
  explicit SingleStrategy(const ParamLayout& layout)
      : FlatUnitStrategy(layout, identity_needs(layout), comm(), StrategyOptions{}) {}
};

CheckpointInfo info_for(const ModelConfig& c, int64_t step) {
  return {step, step * 100, c, "byte", "single", 1, {{"options", {{"seed", 1}}}}};
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardlm_ckpt_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(CheckpointTest, RoundTripAndLatestPointer) {
  ModelConfig c = tiny_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  SingleStrategy saved(layout);
  fill_distinct(layout, saved);
  save_checkpoint(dir_.string(), layout, saved, info_for(c, 5), 0, comm());
  std::string path = save_checkpoint(dir_.string(), layout, saved, info_for(c, 10), 0, comm());
  std::ifstream latest(dir_ / "checkpoints" / "latest");
  std::string latest_name;
  latest >> latest_name;
  EXPECT_EQ(latest_name, "step_00000010");
  EXPECT_EQ(open_checkpoint(dir_.string(), [](const std::string& w) { FAIL() << w; })->dir(), path);

  CheckpointReader reader(path);
  EXPECT_EQ(reader.info().step, 10);
  EXPECT_EQ(reader.info().model, c);
  SingleStrategy loaded(layout);
  reader.load_into(layout, loaded);
  for (int u = 0; u < layout.num_units(); ++u) {
    OwnedSlice a = saved.owned(u), b = loaded.owned(u);
    for (int64_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a.master[i], b.master[i]);
      ASSERT_EQ(a.adam_m[i], b.adam_m[i]);
      ASSERT_EQ(a.adam_v[i], b.adam_v[i]);
    }
  }
}

TEST_F(CheckpointTest, ReadsTensorsWhateverTheWritingLayout) {
  ModelConfig c = tiny_config();
  ParamLayout layout1 = ParamLayout::build(c, 1);
  SingleStrategy saved(layout1);
  fill_distinct(layout1, saved);
  std::string path = save_checkpoint(dir_.string(), layout1, saved, info_for(c, 1), 0, comm());
  CheckpointReader reader(path);
  // Every tensor read by name comes back with the values it was written with.
  for (const auto* p : layout1.all_params()) {
    auto [unit, info] = layout1.find(p->name);
    std::vector<float> got(static_cast<size_t>(p->numel));
    reader.read(p->name, StateKind::adam_m, 0, p->numel, got.data());
    for (int64_t i = 0; i < p->numel; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], -static_cast<float>(unit * 100000 + p->offset + i));
  }
}

TEST_F(CheckpointTest, DetectsCorruptionTruncationAndMissingShard) {
  ModelConfig c = tiny_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  SingleStrategy s(layout);
  fill_distinct(layout, s);
  std::string path = save_checkpoint(dir_.string(), layout, s, info_for(c, 1), 0, comm());
  fs::path shard = fs::path(path) / "rank_00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  try {
    CheckpointReader reader(path);
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sha256"), std::string::npos) << e.what();
  }
  fs::resize_file(shard, 64);
  try {
    CheckpointReader reader(path);
    FAIL() << "truncation not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove(shard);
  EXPECT_THROW(CheckpointReader reader(path), Error);
}

TEST_F(CheckpointTest, RejectsNewerFormatAndShapeMismatch) {
  ModelConfig c = tiny_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  SingleStrategy s(layout);
  std::string path = save_checkpoint(dir_.string(), layout, s, info_for(c, 1), 0, comm());
  {
    ModelConfig wider = c;
    wider.n_embd = 64;
    ParamLayout other = ParamLayout::build(wider, 1);
    SingleStrategy target(other);
    CheckpointReader reader(path);
    EXPECT_THROW(reader.load_into(other, target), Error);
  }
  fs::path manifest = fs::path(path) / "manifest.json";
  std::ifstream in(manifest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  auto pos = text.find("\"format_version\": 2");
  ASSERT_NE(pos, std::string::npos);
  text.replace(pos, 19, "\"format_version\": 99");
  std::ofstream(manifest) << text;
  try {
    CheckpointReader reader(path);
    FAIL() << "newer format accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, KeepPrunesOldestAfterCommit) {
  ModelConfig c = tiny_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  SingleStrategy s(layout);
  for (int step = 1; step <= 4; ++step) save_checkpoint(dir_.string(), layout, s, info_for(c, step), 2, comm());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "checkpoints"))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

TEST_F(CheckpointTest, FailureAtAnyCommitStageLeavesPreviousCheckpointLatest) {
  ModelConfig c = tiny_config();
  ParamLayout layout = ParamLayout::build(c, 1);
  SingleStrategy s(layout);
  fill_distinct(layout, s);
  std::string good = save_checkpoint(dir_.string(), layout, s, info_for(c, 1), 1, comm());
  const std::string digest = CheckpointReader(good).weights_digest();
  for (const char* point : {"ckpt_after_shard_files", "ckpt_before_rename",
                            "ckpt_before_commit_marker", "ckpt_before_latest"}) {
    ::setenv("SHARDLM_FAULT", point, 1);
    EXPECT_THROW(save_checkpoint(dir_.string(), layout, s, info_for(c, 2), 1, comm()), Error) << point;
    ::unsetenv("SHARDLM_FAULT");
    EXPECT_EQ(list_checkpoints(dir_.string()), std::vector<std::string>{good}) << point;
    ASSERT_EQ(open_newest_valid_checkpoint(dir_.string(), [](const std::string&) {})->dir(), good)
        << point;
    CheckpointReader reader(good);  // still verifies (sizes, sha256)
    EXPECT_EQ(reader.weights_digest(), digest) << point;
  }
  // No temporary directory is left behind after a failed save.
  for (const auto& e : fs::directory_iterator(dir_ / "checkpoints"))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
}
