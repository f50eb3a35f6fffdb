#include "shardlm/comm/single_process_communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "shardlm/core/dtype.hpp"
#include "shardlm/core/timer.hpp"

namespace shardlm {

SingleProcessCommunicator::SingleProcessCommunicator(CommOptions options, std::string name)
    : Communicator(0, 1, std::move(name), options) {
  WaitPolicy policy;
  policy.who = "rank 0";
  policy.timeout_seconds = options.timeout_seconds;
  policy_ = std::make_shared<const WaitPolicy>(std::move(policy));
}

SingleProcessCommunicator::~SingleProcessCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

std::unique_ptr<Communicator> SingleProcessCommunicator::split(int color, int key,
                                                               std::string name) {
  SHARDLM_CHECK(color >= 0, "split '{}': color must be >= 0, got {}", name, color);
  (void)key;
  return std::make_unique<SingleProcessCommunicator>(options(), std::move(name));
}

void SingleProcessCommunicator::abort_job(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "rank 0: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

Work SingleProcessCommunicator::finish_copy(const void* from, void* to, size_t bytes,
                                            const Collective& c) {
  Stopwatch elapsed;
  if (from != to && bytes > 0) std::memcpy(to, from, bytes);
  counter_block()->add_seconds(c.info.kind, elapsed.seconds());
  auto state = std::make_shared<detail::WorkState>(c.info, counter_block(), policy_);
  state->complete();
  return Work(state);
}

Work SingleProcessCommunicator::start_all_reduce(float* data, size_t, ReduceOp,
                                                 const Collective& c) {
  return finish_copy(data, data, 0, c);
}

Work SingleProcessCommunicator::start_reduce_scatter(const float* send, float* recv,
                                                     size_t recv_count, ReduceOp,
                                                     WireType wire, const Collective& c) {
  if (wire == WireType::bf16) {  // the one contribution, as it would travel
    Stopwatch elapsed;
    for (size_t i = 0; i < recv_count; ++i) recv[i] = round_to(DType::bf16, send[i]);
    counter_block()->add_seconds(c.info.kind, elapsed.seconds());
    return finish_copy(recv, recv, 0, c);
  }
  return finish_copy(send, recv, recv_count * sizeof(float), c);
}

Work SingleProcessCommunicator::start_all_gather(const void* send, void* recv,
                                                 size_t bytes_per_rank, const Collective& c) {
  return finish_copy(send, recv, bytes_per_rank, c);
}

Work SingleProcessCommunicator::start_broadcast(void* data, size_t, int, const Collective& c) {
  return finish_copy(data, data, 0, c);
}

Work SingleProcessCommunicator::start_barrier(const Collective& c) {
  return finish_copy(nullptr, nullptr, 0, c);
}

Work SingleProcessCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr recv,
                                                 const AllToAllCounts& counts,
                                                 const Collective& c) {
  return finish_copy(send.data, recv.data, counts.send[0] * dtype_bytes(send.dtype), c);
}

Work SingleProcessCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  SHARDLM_ASSERT(p.to == 0 && p.from == 0);  // the base class allows nothing else at size 1
  return finish_copy(p.send.data, p.recv.data, p.send_count * dtype_bytes(p.send.dtype), c);
}

}  // namespace shardlm
