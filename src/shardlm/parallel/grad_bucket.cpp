#include "shardlm/parallel/grad_bucket.hpp"

#include <utility>

#include "shardlm/core/error.hpp"

namespace shardlm {

GradBucket::GradBucket(std::vector<int> units) : units_(std::move(units)) {
  SHARDLM_ASSERT(!units_.empty());
}

void GradBucket::start_reduce(std::vector<FlatUnit>& flat_units, Communicator& shard,
                              WireType wire, bool all_gather_after) {
  for (int unit : units_) {
    FlatUnit& flat = flat_units[static_cast<size_t>(unit)];
    works_.push_back(flat.start_reduce_in_place(shard, wire));
    if (all_gather_after) works_.push_back(flat.start_gather_reduced(shard));
  }
}

void GradBucket::finish_reduce() {
  for (auto& work : works_) work.wait();
  works_.clear();
}

int GradBucket::pending() const {
  int n = 0;
  for (const auto& work : works_) n += work.is_done() ? 0 : 1;
  return n;
}

}  // namespace shardlm
