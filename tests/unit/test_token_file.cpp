// Token files: the documented byte layout (docs/data-format.md), round trips,
// and one clear error per kind of bad file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardlm/core/error.hpp"
#include "shardlm/data/token_file.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardlm_tokfile_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::ostringstream content;
    content << in.rdbuf();
    return content.str();
  }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  }
  // A header built field by field from the documented layout, independently of the writer.
  static std::string header(const char* magic, uint32_t version, uint32_t token_bytes, uint64_t vocab,
                            uint64_t count) {
    std::string h(64, '\0');
    std::memcpy(h.data(), magic, 8);
    std::memcpy(h.data() + 8, &version, 4);
    std::memcpy(h.data() + 12, &token_bytes, 4);
    std::memcpy(h.data() + 16, &vocab, 8);
    std::memcpy(h.data() + 24, &count, 8);
    return h;
  }
  static std::string u16s(std::initializer_list<uint16_t> values) {
    std::string out;
    for (uint16_t v : values) out.append(reinterpret_cast<const char*>(&v), 2);
    return out;
  }
  // Expects an Error whose one-line message names the file and contains `phrase`.
  static void expect_open_error(const std::string& file, const std::string& phrase) {
    try {
      TokenFile tokens(file);
      ADD_FAILURE() << "opening " << file << " should fail with '" << phrase << "'";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(phrase), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  bool no_temp_files_left() const {
    for (const auto& entry : fs::directory_iterator(dir_))
      if (entry.path().string().find(".tmp") != std::string::npos) return false;
    return true;
  }

  fs::path dir_;
};

TEST_F(TokenFileTest, WriterProducesTheDocumentedLayout) {
  const std::vector<int32_t> tokens = {0, 1, 50256, 258, 7};
  write_token_file(path("a.bin"), 50257, tokens);
  const std::string expected = header("SHLMTOK\0", 1, 2, 50257, 5) + u16s({0, 1, 50256, 258, 7});
  EXPECT_EQ(read_bytes(path("a.bin")), expected);
  EXPECT_TRUE(no_temp_files_left());
}

TEST_F(TokenFileTest, ReadsAHandBuiltFile) {
  write_bytes(path("hand.bin"), header("SHLMTOK\0", 1, 2, 300, 3) + u16s({299, 0, 42}));
  TokenFile file(path("hand.bin"));
  EXPECT_EQ(file.size(), 3);
  EXPECT_EQ(file.vocab_size(), 300);
  EXPECT_EQ(file.token_bytes(), 2);
  EXPECT_EQ(file[0], 299);
  EXPECT_EQ(file[2], 42);
}

TEST_F(TokenFileTest, RoundTripsUint16AndUint32) {
  for (const int64_t vocab : {int64_t{256}, int64_t{50257}, int64_t{65536}, int64_t{65537}, int64_t{151936}}) {
    std::vector<int32_t> tokens(10007);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % vocab);
    tokens.back() = static_cast<int32_t>(vocab - 1);
    write_token_file(path("t.bin"), vocab, tokens);
    TokenFile file(path("t.bin"));
    EXPECT_EQ(file.token_bytes(), vocab <= 65536 ? 2 : 4) << vocab;
    EXPECT_EQ(fs::file_size(path("t.bin")), 64 + tokens.size() * file.token_bytes());
    ASSERT_EQ(file.size(), static_cast<int64_t>(tokens.size()));
    std::vector<int32_t> back(tokens.size());
    file.read(0, file.size(), back.data());
    EXPECT_EQ(back, tokens) << vocab;
    EXPECT_EQ(file[5], tokens[5]);
  }
}

TEST_F(TokenFileTest, ZeroTokensIsAValidFile) {
  write_token_file(path("empty_tokens.bin"), 256, {});
  TokenFile file(path("empty_tokens.bin"));
  EXPECT_EQ(file.size(), 0);
  EXPECT_EQ(fs::file_size(path("empty_tokens.bin")), 64u);
}

TEST_F(TokenFileTest, StreamingWriterAppendsAndCommitsOnlyAtTheEnd) {
  write_token_file(path("s.bin"), 256, std::vector<int32_t>{9});  // an old version
  {
    TokenFileWriter writer(path("s.bin"), 256);
    writer.append(std::vector<int32_t>{1, 2});
    writer.append(std::vector<int32_t>{3});
    writer.finish();
    EXPECT_EQ(TokenFile(path("s.bin")).size(), 1) << "visible before commit";
    writer.commit();
  }
  TokenFile file(path("s.bin"));
  ASSERT_EQ(file.size(), 3);
  EXPECT_EQ(file[2], 3);
  EXPECT_TRUE(no_temp_files_left());
}

TEST_F(TokenFileTest, FailedWriteLeavesTheOldFileAndNoTemporary) {
  write_token_file(path("keep.bin"), 256, std::vector<int32_t>{1, 2, 3});
  const std::string before = read_bytes(path("keep.bin"));
  EXPECT_THROW(write_token_file(path("keep.bin"), 256, std::vector<int32_t>{1, 256}), Error);
  EXPECT_THROW(write_token_file(path("keep.bin"), 256, std::vector<int32_t>{-1}), Error);
  {
    TokenFileWriter abandoned(path("keep.bin"), 256);
    abandoned.append(std::vector<int32_t>{7, 7, 7, 7});
  }
  EXPECT_EQ(read_bytes(path("keep.bin")), before);
  EXPECT_TRUE(no_temp_files_left());
}

TEST_F(TokenFileTest, ReadOutsideTheFileIsAnError) {
  write_token_file(path("r.bin"), 256, std::vector<int32_t>{1, 2, 3});
  TokenFile file(path("r.bin"));
  int32_t out[4];
  EXPECT_THROW(file.read(2, 2, out), Error);
  EXPECT_THROW(file.read(-1, 1, out), Error);
  file.read(1, 2, out);
  EXPECT_EQ(out[1], 3);
}

TEST_F(TokenFileTest, MovesKeepTheMapping) {
  write_token_file(path("m.bin"), 256, std::vector<int32_t>{5, 6});
  TokenFile a(path("m.bin"));
  TokenFile b(std::move(a));
  EXPECT_EQ(b[1], 6);
  TokenFile c(path("m.bin"));
  c = std::move(b);
  EXPECT_EQ(c[0], 5);
}

TEST_F(TokenFileTest, MissingFile) { expect_open_error(path("nope.bin"), "cannot open token file"); }

TEST_F(TokenFileTest, EmptyFile) {
  write_bytes(path("empty.bin"), "");
  expect_open_error(path("empty.bin"), "is empty");
}

TEST_F(TokenFileTest, ShorterThanHeader) {
  write_bytes(path("short.bin"), "SHLMTOK");
  expect_open_error(path("short.bin"), "only 7 bytes");
}

TEST_F(TokenFileTest, Directory) { expect_open_error(dir_.string(), "not a regular file"); }

TEST_F(TokenFileTest, BadMagic) {
  write_bytes(path("magic.bin"), header("GPT2TOK\0", 1, 2, 300, 1) + u16s({1}));
  expect_open_error(path("magic.bin"), "bad magic");
}

TEST_F(TokenFileTest, NewerFormatVersion) {
  write_bytes(path("v2.bin"), header("SHLMTOK\0", 2, 2, 300, 1) + u16s({1}));
  expect_open_error(path("v2.bin"), "format version 2");
}

TEST_F(TokenFileTest, TokenWidthNotMatchingVocab) {
  write_bytes(path("width.bin"), header("SHLMTOK\0", 1, 4, 300, 1) + u16s({1, 0}));
  expect_open_error(path("width.bin"), "expected 2 for vocab size 300");
}

TEST_F(TokenFileTest, TruncatedFile) {
  write_bytes(path("trunc.bin"), header("SHLMTOK\0", 1, 2, 300, 4) + u16s({1, 2, 3}));
  expect_open_error(path("trunc.bin"), "header says 4 tokens");
}

TEST_F(TokenFileTest, TrailingBytes) {
  write_bytes(path("long.bin"), header("SHLMTOK\0", 1, 2, 300, 2) + u16s({1, 2, 3}));
  expect_open_error(path("long.bin"), "header says 2 tokens");
}

TEST_F(TokenFileTest, TokenOutsideVocabulary) {
  write_bytes(path("oov.bin"), header("SHLMTOK\0", 1, 2, 300, 4) + u16s({1, 2, 300, 5}));
  expect_open_error(path("oov.bin"), "token 300 at position 2 is not below the vocab size 300");
}

}  // namespace
}  // namespace shardlm
