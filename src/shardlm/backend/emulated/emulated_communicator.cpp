#include "shardlm/backend/emulated/emulated_communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "shardlm/backend/emulated/emulated_backend.hpp"

namespace shardlm::emulated {

namespace {

// Device memory untagged; host memory as it is.
template <typename T>
T* carried(T* p) {
  return is_device_pointer(p) ? host_view(p, "a collective") : p;
}

}  // namespace

DeviceCommunicator::DeviceCommunicator(Communicator& host, std::unique_ptr<Communicator> owned)
    : Communicator(host.rank(), host.size(), host.name(), host.options()),
      host_(host),
      owned_(std::move(owned)) {}

DeviceCommunicator::~DeviceCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank(), e.what());
  }
}

std::unique_ptr<Communicator> DeviceCommunicator::split(int color, int key, std::string name) {
  std::unique_ptr<Communicator> sub = host_.split(color, key, std::move(name));
  Communicator& carrier = *sub;
  return std::make_unique<DeviceCommunicator>(carrier, std::move(sub));
}

void DeviceCommunicator::abort_job(const std::string& message) {
  host_.abort_job(message);
  std::abort();  // not reached: the host's abort_job ends the job
}

void DeviceCommunicator::finalize() {
  Communicator::finalize();
  if (owned_) owned_->finalize();  // a split's carrier; the world's belongs to its owner
}

Work DeviceCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                          const Collective& c) {
  return host_.all_reduce(carried(data), count, op, c.info.label);
}

Work DeviceCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_count,
                                              ReduceOp op, WireType wire, const Collective& c) {
  return host_.reduce_scatter(carried(send), carried(recv), recv_count, op, c.info.label, wire);
}

Work DeviceCommunicator::start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                          const Collective& c) {
  return host_.all_gather_bytes(carried(send), carried(recv), bytes_per_rank, c.info.label);
}

Work DeviceCommunicator::start_broadcast(void* data, size_t bytes, int root, const Collective& c) {
  return host_.broadcast(carried(data), bytes, root, c.info.label);
}

Work DeviceCommunicator::start_barrier(const Collective& c) { return host_.barrier(c.info.label); }

}  // namespace shardlm::emulated
