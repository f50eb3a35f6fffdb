// on_all_ranks: run a step that may fail on some ranks only, and agree on the outcome,
// so that no rank goes on to a collective a failed peer will never issue.
#pragma once

#include <exception>
#include <span>
#include <string>

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/error.hpp"

namespace shardlm {

// Runs `action` on this rank, then agrees with every rank (one small all-reduce
// labelled `what`) on whether all succeeded: a failure anywhere becomes an Error
// everywhere, carrying the failing rank's own message where it failed and "<what>
// failed on N other rank(s)" elsewhere.
template <typename Action>
void on_all_ranks(Communicator& comm, const std::string& what, Action&& action) {
  std::string error;
  try {
    action();
  } catch (const std::exception& e) {
    error = e.what();
  }
  int64_t failed = error.empty() ? 0 : 1;
  comm.all_reduce_blocking(std::span<int64_t>(&failed, 1), ReduceOp::sum, what);
  if (!error.empty()) throw Error(error);
  SHARDLM_CHECK(failed == 0, "{} failed on {} other rank(s) (see their messages)", what, failed);
}

}  // namespace shardlm
