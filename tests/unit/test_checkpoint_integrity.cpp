// What a resume trusts is checked before anything is loaded: every byte of the
// manifest (through the commit marker's sha256), every field of it (even when the
// checksum was made to match), the commit rule (a directory without its marker is
// never loaded; `latest` is only a hint), and the commit itself (it fails when a
// writing rank's shard is missing). Damage makes the recovery rule fall back to the
// newest older checkpoint that verifies, with a warning naming the damaged one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "shardlm/ckpt/checkpoint.hpp"
#include "shardlm/ckpt/checkpoint_commit.hpp"
#include "shardlm/comm/in_process_communicator.hpp"
#include "shardlm/comm/single_process_communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/parallel/flat_unit_strategy.hpp"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

SingleProcessCommunicator& comm() {
  static SingleProcessCommunicator c;
  return c;
}

ModelConfig tiny_config() {
  ModelConfig c = model_preset("gpt2-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  return c;
}

std::vector<std::vector<int>> identity_needs(const ParamLayout& layout) {
  std::vector<std::vector<int>> needs;
  for (int m = 0; m < layout.num_model_units(); ++m) needs.push_back({m});
  return needs;
}

struct SingleStrategy : FlatUnitStrategy {
  explicit SingleStrategy(const ParamLayout& layout)
      : FlatUnitStrategy(layout, identity_needs(layout), comm(), StrategyOptions{}) {}
};

// Says it writes checkpoints when the ranks count the writers, then writes nothing:
// a rank whose shard never arrived.
struct ShardLosingStrategy : SingleStrategy {
  using SingleStrategy::SingleStrategy;
  bool writes_checkpoint() const override { return calls_++ == 0; }
  mutable int calls_ = 0;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Rewrites a checkpoint's manifest and makes its commit marker match: damage that no
// checksum can see, which only the manifest's own checks can catch.
void rewrite_consistently(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json m = nlohmann::json::parse(read_file(dir / "manifest.json"));
  edit(m);
  const std::string text = m.dump(1);
  write_file(dir / "manifest.json", text);
  write_commit_marker(dir.string(), {m.at("step").get<int64_t>(), sha256_hex(text.data(), text.size())});
}

// What a writer that lost track of its elements would produce: slices edited, then
// laid out back to back again with the byte counts to match.
void relayout(nlohmann::json& m) {
  for (auto& shard : m["shards"]) {
    int64_t offset = 0;
    for (auto& slice : shard["slices"]) {
      slice["offset"] = offset;
      offset += (slice["end"].get<int64_t>() - slice["begin"].get<int64_t>()) * 12;
    }
    shard["bytes"] = offset;
  }
}

// The first 2-D tensor's shape, transposed: same size, another tensor.
void transpose_first_matrix(nlohmann::json& m) {
  for (auto& unit : m["units"])
    for (auto& p : unit["params"])
      if (p["shape"].size() == 2 && p["shape"][0] != p["shape"][1]) {
        p["shape"] = {p["shape"][1], p["shape"][0]};
        return;
      }
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class CheckpointIntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardlm_ckpt_integrity_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    layout_ = ParamLayout::build(tiny_config(), 1);
    strategy_ = std::make_unique<SingleStrategy>(layout_);
    for (int u = 0; u < layout_.num_units(); ++u) {
      OwnedSlice o = strategy_->owned(u);
      for (int64_t i = 0; i < o.size(); ++i) o.master[i] = 0.001f * static_cast<float>(u + i);
    }
    older_ = save(1);
    newest_ = save(2);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(int64_t step) {
    CheckpointInfo info{step, step * 64, tiny_config(), "byte", "ddp", 1, {{"options", {{"seed", 1}}}}};
    return save_checkpoint(dir_.string(), layout_, *strategy_, info, 0, comm());
  }
  // The recovery rule's choice, and the warnings it gave.
  std::string recover(std::string* warnings = nullptr) {
    std::string lines;
    auto reader = open_newest_valid_checkpoint(dir_.string(),
                                               [&](const std::string& w) { lines += w + "\n"; });
    if (warnings) *warnings = lines;
    return reader ? reader->dir() : "";
  }

  fs::path dir_;
  ParamLayout layout_;
  std::unique_ptr<SingleStrategy> strategy_;
  std::string older_, newest_;
};

}  // namespace

TEST_F(CheckpointIntegrityTest, ChangingAnyNumberInTheManifestIsRefusedAndFallsBack) {
  const fs::path manifest = fs::path(newest_) / "manifest.json";
  const std::string original = read_file(manifest);
  const std::regex number("[0-9]+");
  int fields = 0;
  for (auto it = std::sregex_iterator(original.begin(), original.end(), number);
       it != std::sregex_iterator(); ++it, ++fields) {
    std::string damaged = original;
    const size_t at = static_cast<size_t>(it->position());
    damaged[at] = damaged[at] == '9' ? '1' : static_cast<char>(damaged[at] + 1);
    write_file(manifest, damaged);
    const std::string error = error_of([&] { CheckpointReader reader(newest_); });
    ASSERT_NE(error, "") << "accepted a manifest with '" << it->str() << "' changed at byte " << at;
    std::string warnings;
    ASSERT_EQ(recover(&warnings), older_) << error;
    ASSERT_NE(warnings.find("skipping checkpoint '" + newest_ + "'"), std::string::npos) << warnings;
  }
  write_file(manifest, original);
  EXPECT_GT(fields, 100);  // offsets, begins, ends, bytes, shapes, step, sizes, digests ...
  EXPECT_EQ(recover(), newest_);
}

TEST_F(CheckpointIntegrityTest, AnyByteOfTheManifestOrCommitMarkerIsCovered) {
  for (const char* file : {"manifest.json", kCommitMarkerName}) {
    const fs::path path = fs::path(newest_) / file;
    const std::string original = read_file(path);
    // Every byte of the marker; every 11th of the (much longer) manifest, which the
    // test above already covers number by number.
    const size_t stride = file == std::string(kCommitMarkerName) ? 1 : 11;
    for (size_t at = 0; at < original.size(); at += stride) {
      std::string damaged = original;
      damaged[at] = static_cast<char>(damaged[at] ^ 0x04);
      write_file(path, damaged);
      ASSERT_NE(error_of([&] { CheckpointReader reader(newest_); }), "")
          << file << ": byte " << at << " flipped and still accepted";
    }
    write_file(path, original);
  }
  EXPECT_NO_THROW(CheckpointReader reader(newest_));
}

TEST_F(CheckpointIntegrityTest, EveryFieldIsCheckedEvenWhenTheChecksumMatches) {
  const fs::path dir = newest_;
  const std::string manifest = read_file(dir / "manifest.json");
  const std::string marker = read_file(dir / kCommitMarkerName);
  using Edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<const char*, Edit>> cases = {
      {"shards[0].slices[0].offset is 4, but the slices before it end at byte 0",
       [](nlohmann::json& m) { m["shards"][0]["slices"][0]["offset"] = 4; }},
      {"shards[0].bytes is", [](nlohmann::json& m) { m["shards"][0]["bytes"] = 12; }},
      {"the shards do not store elements [0, 16) of unit 1",
       [](nlohmann::json& m) { m["shards"][0]["slices"][1]["begin"] = 16; relayout(m); }},
      {"the shards do not store elements",
       [](nlohmann::json& m) { m["shards"][0]["slices"].erase(1); relayout(m); }},
      {"the shards store twice elements",
       [](nlohmann::json& m) {
         m["shards"][0]["slices"].push_back(m["shards"][0]["slices"][0]);
         relayout(m);
       }},
      {"the recorded model has", transpose_first_matrix},
      {"units[1].params[1].offset is 0, expected an integer in",
       [](nlohmann::json& m) { m["units"][1]["params"][1]["offset"] = 0; }},
      {"units[0].padded_numel is 1", [](nlohmann::json& m) { m["units"][0]["padded_numel"] = 1; }},
      {"shards[0].rank is 1, expected an integer in [0, 0]",
       [](nlohmann::json& m) { m["shards"][0]["rank"] = 1; }},
      {"is not a file name inside the checkpoint",
       [](nlohmann::json& m) { m["shards"][0]["file"] = "../x.bin"; }},
      {"sha256 is not 64", [](nlohmann::json& m) { m["shards"][0]["sha256"] = "00"; }},
      {"tokens_seen is -1", [](nlohmann::json& m) { m["tokens_seen"] = -1; }},
      {"world_size is 0", [](nlohmann::json& m) { m["world_size"] = 0; }},
      {"n_layer must be positive", [](nlohmann::json& m) { m["model"]["n_layer"] = 0; }},
      {"has no field \"tokens_seen\"", [](nlohmann::json& m) { m.erase("tokens_seen"); }},
  };
  for (const auto& [expected, edit] : cases) {
    rewrite_consistently(dir, edit);
    const std::string error = error_of([&] { CheckpointReader reader(newest_); });
    EXPECT_NE(error.find("checkpoint manifest '" + newest_ + "/manifest.json': "), std::string::npos)
        << error;
    EXPECT_NE(error.find(expected), std::string::npos)
        << "expected '" << expected << "', got '" << error << "'";
    write_file(dir / "manifest.json", manifest);
    write_file(dir / kCommitMarkerName, marker);
  }
  // A shard whose bytes no longer match the digest the manifest records.
  rewrite_consistently(dir, [](nlohmann::json& m) { m["shards"][0]["sha256"] = std::string(64, '0'); });
  EXPECT_NE(error_of([&] { CheckpointReader reader(newest_); }).find("fails its sha256 check"),
            std::string::npos);
  write_file(dir / "manifest.json", manifest);
  // A consistent manifest for another step under this step's name is not this step.
  rewrite_consistently(dir, [](nlohmann::json& m) { m["step"] = 1; });
  std::string warnings;
  EXPECT_EQ(recover(&warnings), older_);
  EXPECT_NE(warnings.find("not the step its name says"), std::string::npos) << warnings;
}

TEST_F(CheckpointIntegrityTest, DamageOnlyALoadWouldMeetFallsBackBeforeLoading) {
  // The slices no longer cover a unit: once found by load_into, now found on open.
  rewrite_consistently(newest_, [](nlohmann::json& m) { 
    m["shards"][0]["slices"][2]["end"] = 32;
    relayout(m);
  });
  std::string warnings;
  EXPECT_EQ(recover(&warnings), older_);
  EXPECT_NE(warnings.find("skipping checkpoint '" + newest_ + "': checkpoint manifest '" +
                          newest_ + "/manifest.json': the shards do not store elements"),
            std::string::npos)
      << warnings;
}

TEST_F(CheckpointIntegrityTest, DamagedLatestIsOnlyAHint) {
  const fs::path latest = dir_ / "checkpoints" / "latest";
  for (const std::string content : {"step_000\n", "\x01\xff garbage", "", "step_00000001\n"}) {
    write_file(latest, content);
    std::string warnings;
    EXPECT_EQ(recover(&warnings), newest_) << content;
    EXPECT_NE(warnings.find("latest is only a hint"), std::string::npos) << warnings;
  }
  fs::remove(latest);
  std::string warnings;
  EXPECT_EQ(recover(&warnings), newest_);
  EXPECT_NE(warnings.find("checkpoints/latest is missing"), std::string::npos) << warnings;
  EXPECT_EQ(open_checkpoint(dir_.string(), [](const std::string&) {})->dir(), newest_);
}

TEST_F(CheckpointIntegrityTest, ADirectoryWithoutItsCommitMarkerIsNeverLoaded) {
  fs::remove(fs::path(newest_) / kCommitMarkerName);
  std::string warnings;
  EXPECT_EQ(recover(&warnings), older_);
  EXPECT_NE(warnings.find("ignoring '" + newest_ + "': never committed"), std::string::npos)
      << warnings;
  EXPECT_NE(error_of([&] { CheckpointReader reader(newest_); }).find("never committed"),
            std::string::npos);
  // Nothing committed at all: no checkpoint (a fresh start), not an error.
  fs::remove(fs::path(older_) / kCommitMarkerName);
  EXPECT_EQ(recover(), "");
}

TEST_F(CheckpointIntegrityTest, CommittedButAllDamagedIsAnErrorNotAFreshStart) {
  for (const auto& dir : {older_, newest_})
    rewrite_consistently(dir, [](nlohmann::json& m) { m["shards"][0]["bytes"] = 0; });
  EXPECT_NE(error_of([&] { recover(); }).find("has 2 committed checkpoint(s) but none is valid"),
            std::string::npos);
}

TEST_F(CheckpointIntegrityTest, OlderFormatWithoutCommitMarkerIsNamed) {
  rewrite_consistently(newest_, [](nlohmann::json& m) { m["format_version"] = 1; });
  fs::remove(fs::path(newest_) / kCommitMarkerName);
  EXPECT_NE(error_of([&] { CheckpointReader reader(newest_); }).find("format version 1 was written by an older shardlm"),
            std::string::npos);
}

TEST_F(CheckpointIntegrityTest, CommitFailsWhenAWritingRanksShardIsMissing) {
  ShardLosingStrategy losing(layout_);
  CheckpointInfo info{3, 192, tiny_config(), "byte", "ddp", 1, {{"options", {{"seed", 1}}}}};
  const std::string error =
      error_of([&] { save_checkpoint(dir_.string(), layout_, losing, info, 0, comm()); });
  EXPECT_NE(error.find("rank 0's shard"), std::string::npos) << error;
  EXPECT_NE(error.find("is missing; not committing"), std::string::npos) << error;
  EXPECT_EQ(list_checkpoints(dir_.string()), (std::vector<std::string>{newest_, older_}));
  EXPECT_EQ(recover(), newest_);
}

TEST_F(CheckpointIntegrityTest, NextSaveRemovesWhatInterruptedSavesLeft) {
  const fs::path root = dir_ / "checkpoints";
  fs::create_directories(root / ".tmp-step_00000002");
  write_file(root / ".tmp-step_00000002" / "rank_00000.bin", "partial");
  write_file(root / "latest.tmp.4242", "step_");
  fs::remove(fs::path(older_) / kCommitMarkerName);  // a save killed before its commit
  const std::string third = save(3);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000002", "step_00000003"}));
  EXPECT_EQ(recover(), third);
}

namespace {

// A strategy on one of several in-process ranks whose shard may get lost.
struct RankStrategy : FlatUnitStrategy {
  RankStrategy(const ParamLayout& layout, Communicator& comm, bool loses_shard)
      : FlatUnitStrategy(layout, identity_needs(layout), comm,
                         StrategyOptions{.kind = StrategyKind::zero3}),
        loses_shard_(loses_shard) {}
  bool writes_checkpoint() const override { return !loses_shard_ || calls_++ == 0; }
  bool loses_shard_;
  mutable int calls_ = 0;
};

float weight_of(int unit, int64_t e) { return static_cast<float>(unit * 1000 + e % 991) / 128.0f; }

}  // namespace

TEST(CheckpointAcrossRanks, TwoRankShardsLoadIntoOneRankAndALostShardFailsTheCommit) {
  const fs::path dir = fs::temp_directory_path() / "shardlm_ckpt_integrity_two_ranks";
  fs::remove_all(dir);
  const ModelConfig config = tiny_config();
  const ParamLayout layout2 = ParamLayout::build(config, 2);
  const CheckpointInfo info{1, 64, config, "byte", "zero3", 2, {{"options", {{"seed", 1}}}}};
  for (bool lose : {false, true}) {
    InProcessJob job(2);
    const auto errors = job.run([&](Communicator& comm) {
      RankStrategy s(layout2, comm, lose && comm.rank() == 1);
      for (int u = 0; u < layout2.num_units(); ++u) {
        OwnedSlice o = s.owned(u);
        for (int64_t i = 0; i < o.size(); ++i) o.master[i] = weight_of(u, o.begin + i);
      }
      save_checkpoint(dir.string(), layout2, s, info, 0, comm);
    });
    if (!lose) {
      EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
      continue;
    }
    EXPECT_NE(errors[0].find("rank 1's shard"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("is missing; not committing"), std::string::npos) << errors[0];
    EXPECT_EQ(errors[1], "checkpoint: commit failed on 1 other rank(s) (see their messages)");
  }
  // The lost shard's save committed nothing; the complete one reads back anywhere.
  auto reader = open_checkpoint(dir.string(), [](const std::string& w) { ADD_FAILURE() << w; });
  const ParamLayout layout1 = ParamLayout::build(config, 1);
  SingleStrategy single(layout1);
  reader->load_into(layout1, single);
  for (int u = 0; u < layout1.num_units(); ++u) {
    OwnedSlice o = single.owned(u);
    for (const auto& p : layout1.units[static_cast<size_t>(u)].params)
      for (int64_t e = p.offset; e < p.offset + p.numel; ++e)
        ASSERT_EQ(o.master[e], weight_of(u, e)) << p.name;
  }
  fs::remove_all(dir);
}
