// safetensors reader and writer: round trip of every supported integer/float dtype
// and of metadata, a file written by an independent writer (the PyTorch fixture
// generator), F16/BF16 conversion against known bit patterns, and clear errors
// naming the file for truncated or corrupt input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardlm/ckpt/safetensors.hpp"
#include "shardlm/core/error.hpp"

namespace st = shardlm::safetensors;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardlm_safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A raw file: 8-byte little-endian length, header text, data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((len >> (8 * i)) & 0xFF);
  return bytes + header + data;
}

// Expects the call to throw shardlm::Error whose message contains the path and `what`.
template <typename F>
void expect_error(F&& f, const std::string& file, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error for " << file << " (expected '" << what << "')";
  } catch (const shardlm::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST_F(SafetensorsTest, RoundTripKeepsDtypesShapesBytesAndMetadata) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
  const std::vector<int32_t> i32 = {7, -1, 2147483647, -2147483647 - 1};
  const std::vector<int64_t> i64 = {1ll << 40, -5};
  const std::vector<double> f64 = {3.141592653589793};
  const std::vector<st::TensorView> tensors = {
      {"weights.f32", st::DType::F32, {2, 3}, f32.data()},
      {"ids", st::DType::I32, {4}, i32.data()},
      {"big", st::DType::I64, {1, 2}, i64.data()},
      {"scalar", st::DType::F64, {}, f64.data()},
      {"empty", st::DType::F32, {0, 3}, nullptr},
  };
  const std::map<std::string, std::string> metadata = {{"config", R"({"n_layer": 2})"},
                                                       {"format", "pt"}};
  const std::string file = path("round_trip.safetensors");
  st::write_file(file, tensors, metadata);

  // The data section starts 8-byte aligned.
  const std::string bytes = read_bytes(file);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + (6 * 4 + 4 * 4 + 2 * 8 + 8));

  const st::File read = st::read_file(file);
  EXPECT_EQ(read.metadata, metadata);
  ASSERT_EQ(read.tensors.size(), 5u);
  for (const auto& t : tensors) {
    const st::Tensor& got = read.at(t.name);
    EXPECT_EQ(got.dtype, t.dtype) << t.name;
    EXPECT_EQ(got.shape, t.shape) << t.name;
    const size_t n = static_cast<size_t>(st::shape_numel(t.shape)) * st::dtype_size(t.dtype);
    ASSERT_EQ(got.data.size(), n) << t.name;
    if (n > 0) {
      EXPECT_EQ(std::memcmp(got.data.data(), t.data, n), 0) << t.name;
    }
  }
  EXPECT_EQ(read.at("weights.f32").to_f32(), f32);
  EXPECT_EQ(read.at("ids").to_i64(), std::vector<int64_t>(i32.begin(), i32.end()));
  EXPECT_EQ(read.at("big").to_i64(), i64);
  EXPECT_THROW(read.at("ids").to_f32(), shardlm::Error);
  EXPECT_THROW(read.at("weights.f32").to_i64(), shardlm::Error);
  expect_error([&] { read.at("missing"); }, file, "missing");

  // The lazy reader reads single tensors into caller memory.
  st::Reader reader(file);
  std::vector<int32_t> ids(4);
  reader.read_into("ids", ids.data(), ids.size() * sizeof(int32_t));
  EXPECT_EQ(ids, i32);
  EXPECT_THROW(reader.read_into("ids", ids.data(), 3 * sizeof(int32_t)), shardlm::Error);
}

TEST_F(SafetensorsTest, HalfAndBfloat16ConvertToFloat) {
  // 1.0, -2.0, 65504 (max half), smallest subnormal 2^-24, +inf.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00};
  // 1.0, -0.5, 2^-126 (smallest normal).
  const std::vector<uint16_t> bf16 = {0x3F80, 0xBF00, 0x0080};
  const std::string file = path("half.safetensors");
  const std::vector<st::TensorView> tensors = {{"h", st::DType::F16, {5}, f16.data()},
                                               {"b", st::DType::BF16, {3}, bf16.data()}};
  st::write_file(file, tensors);
  const st::File read = st::read_file(file);
  const auto h = read.at("h").to_f32();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[4]) && h[4] > 0);
  const auto b = read.at("b").to_f32();
  EXPECT_EQ(b, (std::vector<float>{1.0f, -0.5f, std::ldexp(1.0f, -126)}));
}

TEST_F(SafetensorsTest, ReadsTheFileWrittenByThePythonFixtureGenerator) {
  const std::string file = std::string(SHARDLM_FIXTURE_DIR) + "/gpt2_fixture.safetensors";
  const st::File read = st::read_file(file);
  ASSERT_TRUE(read.metadata.count("config"));
  const st::Tensor& tokens = read.at("tokens");
  EXPECT_EQ(tokens.dtype, st::DType::I32);
  EXPECT_EQ(tokens.shape, (std::vector<int64_t>{2, 11}));
  const st::Tensor& wte = read.at("transformer.wte.weight");
  EXPECT_EQ(wte.dtype, st::DType::F32);
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{128, 16}));
}

TEST_F(SafetensorsTest, TruncatedFilesAreErrorsNamingTheFile) {
  const std::vector<float> values(100, 1.0f);
  const std::vector<st::TensorView> tensors = {{"a", st::DType::F32, {10, 10}, values.data()}};
  const std::string good = path("good.safetensors");
  st::write_file(good, tensors);
  const std::string bytes = read_bytes(good);
  const std::string bad = path("truncated.safetensors");

  write_bytes(bad, "");
  expect_error([&] { st::read_file(bad); }, bad, "truncated");
  write_bytes(bad, bytes.substr(0, 5));
  expect_error([&] { st::read_file(bad); }, bad, "truncated");
  write_bytes(bad, bytes.substr(0, 20));  // inside the header
  expect_error([&] { st::read_file(bad); }, bad, "truncated");
  write_bytes(bad, bytes.substr(0, bytes.size() - 1));  // last data byte missing
  expect_error([&] { st::read_file(bad); }, bad, "truncated");
  expect_error([&] { st::read_file(path("does_not_exist.safetensors")); },
               path("does_not_exist.safetensors"), "cannot open");
}

TEST_F(SafetensorsTest, CorruptHeadersAreErrorsNamingTheFile) {
  const std::string bad = path("corrupt.safetensors");
  const std::string data(16, '\0');
  const auto expect_corrupt = [&](const std::string& header, const std::string& what) {
    write_bytes(bad, raw_file(header, data));
    expect_error([&] { st::read_file(bad); }, bad, what);
  };
  expect_corrupt("{not json", "not valid JSON");
  expect_corrupt("[1, 2]", "expected a JSON object");
  expect_corrupt(R"({"a": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}})", "F33");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})",
                 "shape and dtype need 20");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})",
                 "non-negative");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 0]}})",
                 "end before");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [4]}})", "data_offsets");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                 R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                 "overlap");
  expect_corrupt(R"({"__metadata__": {"k": 3}})", "not a string");
  expect_corrupt(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})",
                 "too large");

  // A header length far beyond the file.
  std::string huge(8, '\0');
  huge[5] = 1;  // 2^40
  write_bytes(bad, huge + "{}");
  expect_error([&] { st::read_file(bad); }, bad, "header length");
}

TEST_F(SafetensorsTest, WriterRejectsDuplicatesAndUnwritablePaths) {
  const float x = 1.0f;
  const std::vector<st::TensorView> dup = {{"a", st::DType::F32, {1}, &x},
                                           {"a", st::DType::F32, {1}, &x}};
  expect_error([&] { st::write_file(path("dup.safetensors"), dup); }, path("dup.safetensors"),
               "twice");
  const std::vector<st::TensorView> one = {{"a", st::DType::F32, {1}, &x}};
  const std::string unwritable = path("no_such_dir/x.safetensors");
  expect_error([&] { st::write_file(unwritable, one); }, unwritable, "cannot open");
}

}  // namespace
