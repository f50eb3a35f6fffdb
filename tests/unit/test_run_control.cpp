// The stop and save-now flags ride in the step's target-count all-reduce
// (train/run_control.hpp): sums of packed terms unpack to the sum of the counts and the
// OR of the flags, at any world size, and counts that could carry into a flag are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "shardlm/core/error.hpp"
#include "shardlm/train/run_control.hpp"

namespace shardlm {
namespace {

struct RankTerm {
  int64_t targets;
  bool stop;
  bool save_now;
};

UnpackedTargetCount all_reduce(const std::vector<RankTerm>& ranks) {
  int64_t sum = 0;
  const int world = static_cast<int>(ranks.size());
  for (const RankTerm& r : ranks) sum += pack_target_count(r.targets, {r.stop, r.save_now}, world);
  return unpack_target_count(sum);
}

TEST(RunControl, NoFlagsLeaveTheCountAsItWas) {
  const UnpackedTargetCount u = all_reduce({{1000, false, false}, {24, false, false}});
  EXPECT_EQ(u.target_count, 1024);
  EXPECT_FALSE(u.control.stop);
  EXPECT_FALSE(u.control.save_now);
  EXPECT_EQ(pack_target_count(777, {}, 1), 777);  // the wire value of a run with no flags
}

TEST(RunControl, AStopOnAnyRankStopsEveryRank) {
  for (int asking = 0; asking < 4; ++asking) {
    std::vector<RankTerm> ranks(4, RankTerm{5, false, false});
    ranks[static_cast<size_t>(asking)].stop = true;
    const UnpackedTargetCount u = all_reduce(ranks);
    EXPECT_TRUE(u.control.stop) << "rank " << asking;
    EXPECT_FALSE(u.control.save_now);
    EXPECT_EQ(u.target_count, 20);
  }
  const UnpackedTargetCount all = all_reduce(std::vector<RankTerm>(8, RankTerm{3, true, false}));
  EXPECT_TRUE(all.control.stop);
  EXPECT_EQ(all.target_count, 24);
}

TEST(RunControl, SaveNowFromRankZero) {
  const UnpackedTargetCount u = all_reduce({{7, false, true}, {9, true, false}});
  EXPECT_TRUE(u.control.save_now);
  EXPECT_TRUE(u.control.stop);
  EXPECT_EQ(u.target_count, 16);
}

TEST(RunControl, LargestCountsStayInTheirField) {
  const int64_t limit = (int64_t{1} << kTargetCountBits) / 4 - 1;  // per rank at world 4
  const UnpackedTargetCount u = all_reduce(std::vector<RankTerm>(4, RankTerm{limit, true, false}));
  EXPECT_EQ(u.target_count, 4 * limit);
  EXPECT_TRUE(u.control.stop);
  EXPECT_FALSE(u.control.save_now);
  EXPECT_THROW(pack_target_count(limit + 1, {}, 4), Error);
  EXPECT_THROW(pack_target_count(-1, {}, 1), Error);
  EXPECT_THROW(pack_target_count(1, {}, 1 << kStopCountBits), Error);
  EXPECT_THROW(unpack_target_count(-5), Error);
}

}  // namespace
}  // namespace shardlm
