// TensorBoard event files: CRC-32C against its published check value and known vectors,
// the TFRecord framing of a record byte by byte, and the scalars a step record gives.
// (tests/cli/tensorboard.sh reads a run's files back with PyPI tensorboard.)
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "shardlm/core/crc32c.hpp"
#include "shardlm/train/tensorboard_writer.hpp"
#include "tensorboard_event.pb.h"

namespace shardlm {
namespace {

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

TEST(Crc32c, PublishedCheckValueAndVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0x00000000u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xFF, and ascending 0..31.
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, MaskIsTfRecords) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TensorBoardRecord, FramesLengthCrcDataCrc) {
  const std::string data = "hello event";
  const std::string r = tensorboard_record(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(le32(r, 0), data.size());
  EXPECT_EQ(le32(r, 4), 0u);  // upper half of the uint64 length
  EXPECT_EQ(le32(r, 8), masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(le32(r, 12 + data.size()), masked_crc32c(data.data(), data.size()));
}

TEST(TensorBoardEvent, FieldNumbersAreTensorFlows) {
  // Bytes as tensorboard.compat.proto.event_pb2 serializes the same event:
  // Event{step=2 (field 2, varint), summary (field 5){value (field 1){tag (1) "a", simple_value (2) 1.0f}}}
  tensorboard::Event e;
  e.set_step(2);
  tensorboard::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag("a");
  v->set_simple_value(1.0f);
  const std::string bytes = e.SerializeAsString();
  const std::string want = std::string("\x10\x02\x2a\x0a\x0a\x08\x0a\x01" "a" "\x15\x00\x00\x80\x3f", 14);
  EXPECT_EQ(bytes, want);
}

TEST(TensorBoardScalars, FromAStepRecord) {
  const nlohmann::json record = {{"step", 3}, {"loss", 2.5}, {"lr", 1e-3}, {"grad_norm", nullptr},
                                 {"tokens_per_s", 1000.0}, {"step_ms", 12.0}, {"exposed_comm_ms", 0.5},
                                 {"mem", {{"peak", {{"params", 1024}, {"grads", 2048}}}}}};
  const auto scalars = tensorboard_scalars(record);
  std::map<std::string, double> got(scalars.begin(), scalars.end());
  EXPECT_EQ(got.size(), 7u);  // no val_loss, a null grad_norm left out
  EXPECT_EQ(got.at("train/loss"), 2.5);
  EXPECT_EQ(got.at("memory/grads"), 2048.0);
  EXPECT_EQ(got.count("train/grad_norm"), 0u);
}

}  // namespace
}  // namespace shardlm
