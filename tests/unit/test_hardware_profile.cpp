// Hardware profiles: JSON round trip, the errors a malformed profile gets (one line
// naming the field), which compute figures a plan uses, and the link presets.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/plan/hardware_profile.hpp"

using namespace shardlm;

namespace {

std::string error_of(const nlohmann::json& j) {
  try {
    HardwareProfile::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(HardwareProfile, BuiltInsSurviveAJsonRoundTrip) {
  for (const auto& name : builtin_profile_names()) {
    const HardwareProfile p = builtin_profile(name);
    const HardwareProfile q = HardwareProfile::from_json(p.to_json());
    EXPECT_EQ(q.to_json(), p.to_json()) << name;
    EXPECT_EQ(q.name, name);
    EXPECT_GT(q.rates("bf16", 8).gemm_flops_per_s, q.rates("fp32", 8).gemm_flops_per_s) << name;
  }
}

TEST(HardwareProfile, MalformedFieldsAreNamed) {
  const nlohmann::json good = builtin_profile("a100-80g").to_json();
  nlohmann::json j = good;
  j["intra_node"]["all_gather"]["bus_gb_per_s"] = -1;
  EXPECT_TRUE(contains(error_of(j), "intra_node.all_gather.bus_gb_per_s must be positive"))
      << error_of(j);
  j = good;
  j["compute"][0]["rates"]["bf16"].erase("attention_gflop_per_s");
  EXPECT_TRUE(contains(error_of(j), "compute[0].rates.bf16.attention_gflop_per_s is missing"))
      << error_of(j);
  j = good;
  j["inter_node"]["compute_share_during_comm"] = 1.5;
  EXPECT_TRUE(contains(error_of(j), "inter_node.compute_share_during_comm must be in (0, 1]"))
      << error_of(j);
  j = good;
  j["compute"] = nlohmann::json::array();
  EXPECT_TRUE(contains(error_of(j), "compute must be a non-empty array")) << error_of(j);
  EXPECT_TRUE(contains(error_of(nlohmann::json::array()), "expected a JSON object"));
}

TEST(HardwareProfile, FilesAndNamesLoadAndBadOnesSayWhatWasExpected) {
  const std::string path = testing::TempDir() + "/shardlm_profile_test.json";
  {
    std::ofstream out(path);
    out << builtin_profile("l4-24g").to_json().dump();
  }
  EXPECT_EQ(load_profile(path).to_json(), builtin_profile("l4-24g").to_json());
  {
    std::ofstream out(path);
    out << "{ not json";
  }
  try {
    load_profile(path);
    FAIL() << "accepted a broken file";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "is not valid JSON")) << e.what();
  }
  std::remove(path.c_str());
  try {
    load_profile("b200-nope");
    FAIL() << "accepted an unknown name";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "unknown profile 'b200-nope'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "h100-80g")) << e.what();
  }
}

TEST(HardwareProfile, RatesComeFromTheFiguresMeasuredWithTheNearestRankCount) {
  HardwareProfile p;
  p.name = "two";
  ComputeFigures one, two;
  one.ranks_per_node = 1;
  one.by_precision["fp32"].gemm_flops_per_s = 100;
  two.ranks_per_node = 2;
  two.by_precision["fp32"].gemm_flops_per_s = 40;
  p.compute = {one, two};
  EXPECT_EQ(p.rates("fp32", 1).gemm_flops_per_s, 100);
  EXPECT_EQ(p.rates("fp32", 2).gemm_flops_per_s, 40);
  EXPECT_EQ(p.rates("fp32", 8).gemm_flops_per_s, 40);
  try {
    p.rates("bf16", 2);
    FAIL() << "gave rates for a precision never measured";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "no compute figures for precision bf16")) << e.what();
  }
}

TEST(HardwareProfile, LinksAreTheirLineRateAsTcpGoodput) {
  EXPECT_DOUBLE_EQ(link_transport("1gbit", 0.7).all_gather.bus_bytes_per_s, 0.94 * 1e9 / 8);
  EXPECT_DOUBLE_EQ(link_transport("25gbit", 0.7).reduce_scatter.bus_bytes_per_s, 0.94 * 25e9 / 8);
  EXPECT_DOUBLE_EQ(link_transport("10gbit", 0.7).compute_share_during_comm, 0.7);
  try {
    link_transport("2gbit", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "unknown --link '2gbit'")) << e.what();
  }
}

TEST(HardwareProfile, ProfilesWrittenBeforeAllToAllAndSendRecvStillLoad) {
  // A calibrated profile of the earlier format: no all_to_all / send_recv figures.
  nlohmann::json j = builtin_profile("a100-80g").to_json();
  for (const char* t : {"intra_node", "inter_node"}) {
    j[t].erase("all_to_all");
    j[t].erase("send_recv");
  }
  const HardwareProfile p = HardwareProfile::from_json(j);
  // Both take the transport's all-gather figures until `calibrate` measures them.
  EXPECT_EQ(p.inter_node.all_to_all.bus_bytes_per_s, p.inter_node.all_gather.bus_bytes_per_s);
  EXPECT_EQ(p.intra_node.send_recv.latency_s, p.intra_node.all_gather.latency_s);
  EXPECT_EQ(&p.intra_node.rate(CollectiveKind::all_to_all_v), &p.intra_node.all_to_all);
  EXPECT_EQ(&p.intra_node.rate(CollectiveKind::recv), &p.intra_node.send_recv);
  // Present ones are read and checked like the others.
  j["intra_node"]["send_recv"] = {{"latency_us", 3.0}, {"bus_gb_per_s", -2.0}};
  EXPECT_TRUE(contains(error_of(j), "intra_node.send_recv.bus_gb_per_s must be positive"))
      << error_of(j);
}

TEST(HardwareProfile, BuiltInExchangesAcrossNodesAreBoundByEachRanksNic) {
  // A ring spreads over the node's 8 NICs; a rank's all-to-all and send/recv traffic
  // to other nodes leaves through its own (HDR 25 GB/s, NDR 50 GB/s, at 0.9).
  EXPECT_DOUBLE_EQ(builtin_profile("a100-80g").inter_node.all_to_all.bus_bytes_per_s, 0.9 * 25e9);
  EXPECT_DOUBLE_EQ(builtin_profile("h100-80g").inter_node.send_recv.bus_bytes_per_s, 0.9 * 50e9);
  EXPECT_DOUBLE_EQ(builtin_profile("h100-80g").intra_node.all_to_all.bus_bytes_per_s, 0.8 * 450e9);
  const HardwareProfile l4 = builtin_profile("l4-24g");
  EXPECT_DOUBLE_EQ(l4.inter_node.all_to_all.bus_bytes_per_s,
                   l4.inter_node.all_reduce.bus_bytes_per_s / 8);
}
