#include "shardlm/train/finite_state.hpp"

#include <string>

#include "shardlm/core/error.hpp"
#include "shardlm/core/finite.hpp"
#include "shardlm/parallel/owned_params.hpp"

namespace shardlm {

void check_state_finite(const ParamLayout& layout, OwnedState& state, Communicator& comm,
                        int64_t step) {
  static const char* const kStates[] = {"the weights", "the AdamW first moment",
                                        "the AdamW second moment"};
  // 0: finite; else 1 + unit * 3 + state of the first non-finite state found.
  uint64_t found = 0;
  for (int u = 0; u < layout.num_units() && found == 0; ++u) {
    // A raw unit's words are quantized bytes (and frozen: never updated).
    if (layout.units[static_cast<size_t>(u)].raw) continue;
    const OwnedSlice s = state.owned(u);
    bool weights_finite = true;
    for_each_owned_params(s, [&](int64_t, int64_t n, const float* values) {
      weights_finite = weights_finite && all_finite(values, n);
    });
    if (!weights_finite) found = 1 + static_cast<uint64_t>(u) * 3;
    const float* moments[] = {s.adam_m, s.adam_v};
    for (uint64_t k = 1; k < 3 && found == 0; ++k)
      if (moments[k - 1] != nullptr && !all_finite(moments[k - 1], s.size())) found = 1 + static_cast<uint64_t>(u) * 3 + k;
  }
  const std::vector<uint64_t> all = comm.all_gather_u64(found, "finite state check");
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) continue;
    const uint64_t unit = (all[r] - 1) / 3;
    throw Error(fmt::format(
        "training diverged at step {}: after the update {} of unit '{}' on rank {} are not "
        "finite; nothing was saved (the last checkpoint is kept; try a lower --lr, a lower "
        "--weight-decay or a higher --warmup)",
        step, kStates[(all[r] - 1) % 3], layout.units[unit].name, r));
  }
}

}  // namespace shardlm
