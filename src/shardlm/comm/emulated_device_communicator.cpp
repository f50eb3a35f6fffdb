#include "shardlm/comm/emulated_device_communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "shardlm/backend/emulated/emulated_backend.hpp"

namespace shardlm {

namespace {

// Device memory untagged; host memory as it is.
template <typename T>
T* carried(T* p) {
  return emulated::is_device_pointer(p) ? emulated::host_view(p, "a collective") : p;
}
ConstTypedPtr carried(ConstTypedPtr p) { return {carried(p.data), p.dtype}; }
TypedPtr carried(TypedPtr p) { return {carried(p.data), p.dtype}; }

}  // namespace

EmulatedDeviceCommunicator::EmulatedDeviceCommunicator(Communicator& host,
                                                       std::unique_ptr<Communicator> owned)
    : Communicator(host.rank(), host.size(), host.name(), host.options()),
      host_(host),
      owned_(std::move(owned)) {}

EmulatedDeviceCommunicator::~EmulatedDeviceCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank(), e.what());
  }
}

std::unique_ptr<Communicator> EmulatedDeviceCommunicator::split(int color, int key,
                                                                std::string name) {
  std::unique_ptr<Communicator> sub = host_.split(color, key, std::move(name));
  Communicator& carrier = *sub;
  return std::make_unique<EmulatedDeviceCommunicator>(carrier, std::move(sub));
}

void EmulatedDeviceCommunicator::abort_job(const std::string& message) {
  host_.abort_job(message);
  std::abort();  // not reached: the host's abort_job ends the job
}

void EmulatedDeviceCommunicator::finalize() {
  Communicator::finalize();
  if (owned_) owned_->finalize();  // a split's carrier; the world's belongs to its owner
}

Work EmulatedDeviceCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                                  const Collective& c) {
  return host_.all_reduce(carried(data), count, op, c.info.label);
}

Work EmulatedDeviceCommunicator::start_reduce_scatter(const float* send, float* recv,
                                                      size_t recv_count, ReduceOp op,
                                                      WireType wire, const Collective& c) {
  return host_.reduce_scatter(carried(send), carried(recv), recv_count, op, c.info.label, wire);
}

Work EmulatedDeviceCommunicator::start_all_gather(const void* send, void* recv,
                                                  size_t bytes_per_rank, const Collective& c) {
  return host_.all_gather_bytes(carried(send), carried(recv), bytes_per_rank, c.info.label);
}

Work EmulatedDeviceCommunicator::start_broadcast(void* data, size_t bytes, int root,
                                                 const Collective& c) {
  return host_.broadcast(carried(data), bytes, root, c.info.label);
}

Work EmulatedDeviceCommunicator::start_barrier(const Collective& c) {
  return host_.barrier(c.info.label);
}

Work EmulatedDeviceCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr recv,
                                                  const AllToAllCounts& counts,
                                                  const Collective& c) {
  if (c.info.kind == CollectiveKind::all_to_all)
    return host_.all_to_all(carried(send), carried(recv), counts.send[0], c.info.label);
  return host_.all_to_all_v(carried(send), counts.send, carried(recv), counts.recv, c.info.label);
}

Work EmulatedDeviceCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  switch (c.info.kind) {
    case CollectiveKind::send:
      return host_.send(carried(p.send), p.send_count, p.to, c.info.label);
    case CollectiveKind::recv:
      return host_.recv(carried(p.recv), p.recv_count, p.from, c.info.label);
    default:
      return host_.send_recv(carried(p.send), p.send_count, p.to, carried(p.recv), p.recv_count,
                             p.from, c.info.label);
  }
}

}  // namespace shardlm
