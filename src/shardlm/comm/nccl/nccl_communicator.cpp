#include "shardlm/comm/nccl/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "shardlm/comm/device_watchdog.hpp"
#include "shardlm/comm/mpi_include.hpp"
#include "shardlm/comm/nccl/ordered_reduce.hpp"
#include "shardlm/comm/world.hpp"

namespace shardlm {

namespace {

void cuda_check(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess)
    throw Error(fmt::format("{}: {} ({})", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

void nccl_check(ncclResult_t result, std::string_view what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return;
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw Error(fmt::format("{}: {}{}{}", what, ncclGetErrorString(result),
                          last && *last ? "; " : "", last ? last : ""));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  throw Error(fmt::format("NCCL: unknown reduction operator {}", static_cast<int>(op)));
}

bool is_device_pointer(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; older runtimes fail on plain host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

// Device scratch for one collective, allocated and freed in stream order
// (cudaMallocAsync/cudaFreeAsync): the free is queued behind the kernels that use it,
// and neither blocks the host.
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) cuda_check(cudaMallocAsync(&data_, bytes, stream), "cudaMallocAsync (NCCL scratch)");
  }
  ~StreamScratch() {
    if (data_) (void)cudaFreeAsync(data_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  char* bytes() const { return static_cast<char*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) hash = (hash ^ ch) * 0x100000001b3ull;
  return hash;
}

}  // namespace

// One NCCL communicator, shared by the NcclCommunicator and the completion sources of
// its collectives in flight (which may outlive it). The mutex makes an abort (from
// the watchdog thread) exclusive with enqueueing and error queries on other threads.
struct NcclCommHandle {
  std::mutex mutex;
  ncclComm_t comm = nullptr;
  int device = 0;
  bool aborted = false;

  ~NcclCommHandle() {
    if (comm == nullptr || aborted) return;
    (void)cudaSetDevice(device);
    (void)ncclCommDestroy(comm);
  }
  void abort() {
    std::lock_guard lock(mutex);
    if (comm == nullptr || aborted) return;
    aborted = true;
    (void)cudaSetDevice(device);
    (void)ncclCommAbort(comm);
  }
  // Empty while healthy.
  std::string async_error() {
    std::lock_guard lock(mutex);
    if (aborted) return "its NCCL communicator was aborted";
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) state = query;
    if (state == ncclSuccess || state == ncclInProgress) return {};
    const char* last = ncclGetLastError(comm);
    return fmt::format("NCCL error: {}{}{}", ncclGetErrorString(state), last && *last ? "; " : "",
                       last ? last : "");
  }
};

// One per process: the GPU, the communication stream, the compute stream the
// collectives are ordered after, the watchdog and the deadline policy; shared by the
// world and its sub-communicators.
class NcclRuntime {
 public:
  NcclRuntime(int device, int world_rank, const CommOptions& options, const NcclOptions& nccl)
      : device(device), world_rank(world_rank), compute_stream(static_cast<cudaStream_t>(nccl.compute_stream)) {
    cuda_check(cudaSetDevice(device), fmt::format("rank {}: cudaSetDevice({})", world_rank, device));
    cuda_check(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags (communication stream)");
    cuda_check(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming),
               "cudaEventCreateWithFlags (compute stream ready)");
    WaitPolicy p;
    p.who = fmt::format("rank {}", world_rank);
    p.timeout_seconds = options.timeout_seconds;
    // Unless a test handles it: one line, then the whole job ends, as MpiCommunicator
    // does on a deadline.
    if (nccl.on_timeout)
      p.on_timeout = nccl.on_timeout;
    else
      p.on_timeout = [](const std::string& line) { print_line_and_end_job(line); };
    policy = std::make_shared<const WaitPolicy>(std::move(p));
    DeviceWatchdogOptions w;
    w.poll_interval_seconds = nccl.watchdog_poll_seconds;
    watchdog = std::make_unique<DeviceWatchdog>(w);
  }
  ~NcclRuntime() {
    watchdog->stop();
    (void)cudaSetDevice(device);
    (void)cudaEventDestroy(compute_ready);
    (void)cudaStreamDestroy(comm_stream);  // returns at once; freed when its work is done
  }
  NcclRuntime(const NcclRuntime&) = delete;
  NcclRuntime& operator=(const NcclRuntime&) = delete;

  const int device;
  const int world_rank;
  std::mutex issue_mutex;  // one collective enqueued at a time, in issue order
  cudaStream_t compute_stream;  // under issue_mutex
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t compute_ready = nullptr;
  std::shared_ptr<const WaitPolicy> policy;
  std::unique_ptr<DeviceWatchdog> watchdog;
};

namespace {

// A collective's completion: an event recorded on the communication stream after it
// (and one before it, for the seconds the counters report).
class EventCompletion final : public CompletionSource {
 public:
  EventCompletion(int device, std::shared_ptr<NcclCommHandle> comm)
      : device_(device), comm_(std::move(comm)) {
    cuda_check(cudaEventCreate(&start_), "cudaEventCreate (collective start)");
    const cudaError_t error = cudaEventCreate(&end_);
    if (error != cudaSuccess) (void)cudaEventDestroy(start_);
    cuda_check(error, "cudaEventCreate (collective end)");
  }
  ~EventCompletion() override {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(end_);
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t end() const { return end_; }

  CompletionPoll poll() override {
    CompletionPoll result;
    (void)cudaSetDevice(device_);  // the watchdog thread polls too
    const cudaError_t query = cudaEventQuery(end_);
    if (query == cudaSuccess) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, start_, end_) != cudaSuccess) (void)cudaGetLastError();
      result.status = CompletionStatus::done;
      result.seconds = ms / 1e3;
      return result;
    }
    if (query != cudaErrorNotReady) {
      result.status = CompletionStatus::failed;
      result.error = fmt::format("CUDA error: {} ({})", cudaGetErrorString(query), cudaGetErrorName(query));
      return result;
    }
    // Still running: did NCCL report a failure (a peer gone, a network error)?
    if (std::string error = comm_->async_error(); !error.empty()) {
      result.status = CompletionStatus::failed;
      result.error = std::move(error);
    }
    return result;
  }
  bool stream_wait(void* stream) override {
    (void)cudaSetDevice(device_);
    cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), end_, 0),
               "cudaStreamWaitEvent (consumer stream after a collective)");
    return true;
  }
  void abandon() override { comm_->abort(); }

 private:
  const int device_;
  const std::shared_ptr<NcclCommHandle> comm_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_world(CommOptions options,
                                                                 NcclOptions nccl) {
  return create(make_world_communicator(options), options, std::move(nccl));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(std::unique_ptr<Communicator> host,
                                                           CommOptions options, NcclOptions nccl) {
  SHARDLM_CHECK(host != nullptr, "NcclCommunicator::create: no host communicator");
  if (const char* ordered = std::getenv("SHARDLM_NCCL_ORDERED");
      ordered && std::string_view(ordered) == "1")
    nccl.ordered = true;
  const int rank = host->rank();
  const int size = host->size();
  // The world rank names this process in messages (the host world's rank here).
  int gpus = 0;
  const cudaError_t counted = cudaGetDeviceCount(&gpus);
  if (counted != cudaSuccess) (void)cudaGetLastError();
  // Local rank: this rank's index among the ranks on the same host (by host name).
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  const std::vector<uint64_t> hosts = host->all_gather_u64(fnv1a(hostname), "nccl: host names");
  int local_rank = 0;
  int local_size = 0;
  for (int r = 0; r < size; ++r) {
    if (hosts[r] != hosts[rank]) continue;
    if (r < rank) ++local_rank;
    ++local_size;
  }
  const int device = nccl.device >= 0 ? nccl.device : local_rank;
  SHARDLM_CHECK(gpus > 0, "rank {}: no CUDA device visible ({})", rank,
                counted == cudaSuccess ? "cudaGetDeviceCount reports 0" : cudaGetErrorString(counted));
  SHARDLM_CHECK(device < gpus,
                "rank {}: needs GPU {} but {} visible; NCCL needs one GPU per rank ({} ranks on {})",
                rank, device, gpus, local_size, hostname);

  ncclUniqueId id{};
  if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  host->broadcast(&id, sizeof(id), 0, "nccl unique id").wait();

  auto runtime = std::make_shared<NcclRuntime>(device, rank, options, nccl);
  auto handle = std::make_shared<NcclCommHandle>();
  handle->device = device;
  nccl_check(ncclCommInitRank(&handle->comm, size, id, rank),
             fmt::format("rank {}: ncclCommInitRank ({} ranks, GPU {})", rank, size, device));
  const std::string name = host->name();
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(runtime), std::move(handle), std::move(host), rank, size, name, options,
      nccl.ordered));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclRuntime> runtime,
                                   std::shared_ptr<NcclCommHandle> comm,
                                   std::unique_ptr<Communicator> host, int rank, int size,
                                   std::string name, CommOptions options, bool ordered)
    : Communicator(rank, size, std::move(name), options),
      runtime_(std::move(runtime)),
      comm_(std::move(comm)),
      host_(std::move(host)),
      ordered_(ordered) {
  cuda_check(cudaSetDevice(runtime_->device), "cudaSetDevice");
  cuda_check(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(float)),
             "cudaMalloc (barrier word)");
  // On the communication stream, which every barrier's all-reduce runs on, so the zero is
  // written before the first barrier reads it (cudaMemset would run on the legacy stream).
  cuda_check(cudaMemsetAsync(barrier_word_, 0, sizeof(float), runtime_->comm_stream),
             "cudaMemsetAsync (barrier word)");
}

NcclCommunicator::~NcclCommunicator() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  (void)cudaSetDevice(runtime_->device);
  (void)cudaFree(barrier_word_);
}

std::string NcclCommunicator::who() const { return fmt::format("rank {}", runtime_->world_rank); }

void NcclCommunicator::set_compute_stream(void* stream) {
  std::lock_guard lock(runtime_->issue_mutex);
  runtime_->compute_stream = static_cast<cudaStream_t>(stream);
}

void* NcclCommunicator::compute_stream() const {
  std::lock_guard lock(runtime_->issue_mutex);
  return runtime_->compute_stream;
}

void* NcclCommunicator::communication_stream() const { return runtime_->comm_stream; }

int NcclCommunicator::device() const { return runtime_->device; }

void NcclCommunicator::abort_nccl() { comm_->abort(); }

void NcclCommunicator::abort_job(const std::string& message) {
  comm_->abort();  // peers blocked in a collective with us fail instead of waiting
  host_->abort_job(message);
  std::_Exit(1);  // not reached (abort_job ends the job); tells the compiler so
}

void NcclCommunicator::finalize() {
  // Collectives in flight finish, or reach their deadline and are reported, before
  // their buffers can go away.
  runtime_->watchdog->wait_all();
  std::exception_ptr leak;
  try {
    Communicator::finalize();
  } catch (...) {
    leak = std::current_exception();
  }
  host_->finalize();
  if (leak) std::rethrow_exception(leak);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
  SHARDLM_CHECK(color >= 0, "split '{}': color must be >= 0, got {}", name, color);
  SHARDLM_CHECK(!finalized(), "split '{}' after finalize()", name);
  // The host split first: it has a deadline, so a rank that never splits is reported
  // there rather than hanging ncclCommSplit.
  std::unique_ptr<Communicator> host_child = host_->split(color, key, name);
  auto child = std::make_shared<NcclCommHandle>();
  child->device = runtime_->device;
  {
    std::lock_guard issue_lock(runtime_->issue_mutex);
    std::lock_guard comm_lock(comm_->mutex);
    SHARDLM_CHECK(!comm_->aborted, "{}: split '{}' of {} after its NCCL communicator was aborted",
                  who(), name, this->name());
    cuda_check(cudaSetDevice(runtime_->device), "cudaSetDevice");
    nccl_check(ncclCommSplit(comm_->comm, color, key, &child->comm, nullptr),
               fmt::format("{}: ncclCommSplit into '{}'", who(), name), comm_->comm);
  }
  int child_rank = 0;
  int child_size = 0;
  nccl_check(ncclCommUserRank(child->comm, &child_rank), "ncclCommUserRank", child->comm);
  nccl_check(ncclCommCount(child->comm, &child_size), "ncclCommCount", child->comm);
  SHARDLM_CHECK(child_rank == host_child->rank() && child_size == host_child->size(),
                "{}: split '{}': NCCL made rank {} of {}, the host communicator rank {} of {}",
                who(), name, child_rank, child_size, host_child->rank(), host_child->size());
  return std::unique_ptr<Communicator>(new NcclCommunicator(runtime_, std::move(child),
                                                            std::move(host_child), child_rank,
                                                            child_size, std::move(name), options(),
                                                            ordered_));
}

bool NcclCommunicator::on_device(const Collective& c,
                                 std::initializer_list<const void*> pointers) const {
  int device = 0;
  int host = 0;
  for (const void* p : pointers) {
    if (p == nullptr) continue;
    (is_device_pointer(p) ? device : host) += 1;
  }
  SHARDLM_CHECK(device == 0 || host == 0,
                "{}: {}: buffers must all be in device memory (NCCL) or all in host memory (the "
                "host communicator), not a mix",
                who(), describe(c.info));
  return device > 0;
}

Work NcclCommunicator::issue(const Collective& c,
                             const std::function<void(void* comm, void* stream)>& body) {
  NcclRuntime& rt = *runtime_;
  std::lock_guard issue_lock(rt.issue_mutex);
  try {
    cuda_check(cudaSetDevice(rt.device), "cudaSetDevice");
    auto source = std::make_shared<EventCompletion>(rt.device, comm_);
    // The communication stream waits for what the compute stream has queued so far
    // (it produced the buffers); the host does not.
    cuda_check(cudaEventRecord(rt.compute_ready, rt.compute_stream), "cudaEventRecord (compute stream)");
    cuda_check(cudaStreamWaitEvent(rt.comm_stream, rt.compute_ready, 0), "cudaStreamWaitEvent");
    cuda_check(cudaEventRecord(source->start(), rt.comm_stream), "cudaEventRecord (start)");
    {
      std::lock_guard comm_lock(comm_->mutex);
      SHARDLM_CHECK(!comm_->aborted, "its NCCL communicator was aborted after an earlier failure");
      body(comm_->comm, rt.comm_stream);
    }
    cuda_check(cudaEventRecord(source->end(), rt.comm_stream), "cudaEventRecord (end)");
    auto state = std::make_shared<detail::WorkState>(c.info, counter_block(), rt.policy,
                                                     std::move(source),
                                                     std::chrono::steady_clock::now());
    rt.watchdog->watch(state);
    return Work(state);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: {} could not start: {}", who(), describe(c.info), e.what()));
  }
}

Work NcclCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op,
                                        const Collective& c) {
  if (count == 0) return Work();
  if (!on_device(c, {data})) return host_->all_reduce(data, count, op, c.info.label);
  if (!ordered_)
    return issue(c, [=](void* comm, void* stream) {
      nccl_check(ncclAllReduce(data, data, count, ncclFloat32, nccl_op(op),
                               static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)),
                 "ncclAllReduce", static_cast<ncclComm_t>(comm));
    });
  // Ordered: every rank's whole buffer, then the left-to-right sum of the N copies.
  const int n = size();
  return issue(c, [=](void* comm_ptr, void* stream_ptr) {
    auto comm = static_cast<ncclComm_t>(comm_ptr);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    StreamScratch gathered(static_cast<size_t>(n) * count * sizeof(float), stream);
    nccl_check(ncclAllGather(data, gathered.bytes(), count, ncclFloat32, comm, stream),
               "ncclAllGather (ordered all_reduce)", comm);
    nccl::launch_ordered_reduce(gathered.bytes(), false, count, n, static_cast<int>(op), data,
                                stream);
  });
}

Work NcclCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_count,
                                            ReduceOp op, WireType wire, const Collective& c) {
  if (recv_count == 0) return Work();
  if (!on_device(c, {send, recv}))
    return host_->reduce_scatter(send, recv, recv_count, op, c.info.label, wire);
  if (!ordered_ && wire == WireType::fp32)
    return issue(c, [=](void* comm, void* stream) {
      nccl_check(ncclReduceScatter(send, recv, recv_count, ncclFloat32, nccl_op(op),
                                   static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)),
                 "ncclReduceScatter", static_cast<ncclComm_t>(comm));
    });
  // Ordered (and every bf16 wire): block r of every rank goes to rank r (all-to-all),
  // then rank r sums the N blocks it holds left to right in fp32.
  const int n = size();
  const int me = rank();
  const bool bf16 = wire == WireType::bf16;
  return issue(c, [=](void* comm_ptr, void* stream_ptr) {
    auto comm = static_cast<ncclComm_t>(comm_ptr);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    const size_t element = bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t block = recv_count * element;
    const ncclDataType_t type = bf16 ? ncclBfloat16 : ncclFloat32;
    StreamScratch rounded(bf16 ? static_cast<size_t>(n) * block : 0, stream);
    const char* outgoing = reinterpret_cast<const char*>(send);
    if (bf16) {
      nccl::launch_round_to_bf16(send, reinterpret_cast<uint16_t*>(rounded.bytes()),
                                 static_cast<size_t>(n) * recv_count, stream);
      outgoing = rounded.bytes();
    }
    StreamScratch blocks(static_cast<size_t>(n) * block, stream);
    if (n > 1) {
      nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
      ncclResult_t first_error = ncclSuccess;
      for (int peer = 0; peer < n && first_error == ncclSuccess; ++peer) {
        if (peer == me) continue;
        first_error = ncclSend(outgoing + peer * block, recv_count, type, peer, comm, stream);
        if (first_error == ncclSuccess)
          first_error = ncclRecv(blocks.bytes() + peer * block, recv_count, type, peer, comm, stream);
      }
      const ncclResult_t ended = ncclGroupEnd();
      nccl_check(first_error != ncclSuccess ? first_error : ended,
                 "ncclSend/ncclRecv (ordered reduce_scatter)", comm);
    }
    cuda_check(cudaMemcpyAsync(blocks.bytes() + me * block, outgoing + me * block, block,
                               cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync (own block)");
    nccl::launch_ordered_reduce(blocks.bytes(), bf16, recv_count, n, static_cast<int>(op), recv,
                                stream);
  });
}

Work NcclCommunicator::start_all_gather(const void* send, void* recv, size_t bytes_per_rank,
                                        const Collective& c) {
  if (bytes_per_rank == 0) return Work();
  if (!on_device(c, {send, recv}))
    return host_->all_gather_bytes(send, recv, bytes_per_rank, c.info.label);
  return issue(c, [=](void* comm, void* stream) {
    nccl_check(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, static_cast<ncclComm_t>(comm),
                             static_cast<cudaStream_t>(stream)),
               "ncclAllGather", static_cast<ncclComm_t>(comm));
  });
}

Work NcclCommunicator::start_broadcast(void* data, size_t bytes, int root, const Collective& c) {
  if (bytes == 0) return Work();
  if (!on_device(c, {data})) return host_->broadcast(data, bytes, root, c.info.label);
  return issue(c, [=](void* comm, void* stream) {
    nccl_check(ncclBroadcast(data, data, bytes, ncclUint8, root, static_cast<ncclComm_t>(comm),
                             static_cast<cudaStream_t>(stream)),
               "ncclBroadcast", static_cast<ncclComm_t>(comm));
  });
}

// A one-element all-reduce: done on every rank once every rank has reached it.
Work NcclCommunicator::start_barrier(const Collective& c) {
  float* word = barrier_word_;
  return issue(c, [=](void* comm, void* stream) {
    nccl_check(ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm),
                             static_cast<cudaStream_t>(stream)),
               "ncclAllReduce (barrier)", static_cast<ncclComm_t>(comm));
  });
}

Work NcclCommunicator::start_all_to_all(ConstTypedPtr send, TypedPtr recv,
                                        const AllToAllCounts& counts, const Collective& c) {
  if (c.bytes == 0 && std::all_of(counts.recv.begin(), counts.recv.end(),
                                  [](size_t n) { return n == 0; }))
    return Work();
  if (!on_device(c, {send.data, recv.data})) {
    if (c.info.kind == CollectiveKind::all_to_all)
      return host_->all_to_all(send, recv, counts.send[0], c.info.label);
    return host_->all_to_all_v(send, counts.send, recv, counts.recv, c.info.label);
  }
  const size_t element = dtype_bytes(send.dtype);
  const int n = size();
  const int me = rank();
  return issue(c, [=](void* comm_ptr, void* stream_ptr) {
    auto comm = static_cast<ncclComm_t>(comm_ptr);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    const auto* from = static_cast<const char*>(send.data);
    auto* to = static_cast<char*>(recv.data);
    size_t send_offset = 0, recv_offset = 0;
    size_t own_send = 0, own_recv = 0;
    nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
    ncclResult_t first_error = ncclSuccess;
    for (int peer = 0; peer < n; ++peer) {
      const size_t send_bytes = counts.send[peer] * element;
      const size_t recv_bytes = counts.recv[peer] * element;
      if (peer == me) {
        own_send = send_offset;
        own_recv = recv_offset;
      } else if (first_error == ncclSuccess) {
        // Bytes (ncclUint8): NCCL's counts are size_t, so no chunking is needed.
        first_error = ncclSend(from + send_offset, send_bytes, ncclUint8, peer, comm, stream);
        if (first_error == ncclSuccess)
          first_error = ncclRecv(to + recv_offset, recv_bytes, ncclUint8, peer, comm, stream);
      }
      send_offset += send_bytes;
      recv_offset += recv_bytes;
    }
    const ncclResult_t ended = ncclGroupEnd();
    nccl_check(first_error != ncclSuccess ? first_error : ended, "ncclSend/ncclRecv (all_to_all)",
               comm);
    const size_t own_bytes = counts.send[me] * element;
    if (own_bytes > 0)
      cuda_check(cudaMemcpyAsync(to + own_recv, from + own_send, own_bytes, cudaMemcpyDeviceToDevice,
                                 stream),
                 "cudaMemcpyAsync (own block)");
  });
}

Work NcclCommunicator::start_point_to_point(const PointToPoint& p, const Collective& c) {
  const bool sends = p.to >= 0;
  const bool receives = p.from >= 0;
  if (!on_device(c, {sends ? p.send.data : nullptr, receives ? p.recv.data : nullptr})) {
    switch (c.info.kind) {
      case CollectiveKind::send:
        return host_->send(p.send, p.send_count, p.to, c.info.label);
      case CollectiveKind::recv:
        return host_->recv(p.recv, p.recv_count, p.from, c.info.label);
      default:
        return host_->send_recv(p.send, p.send_count, p.to, p.recv, p.recv_count, p.from,
                                c.info.label);
    }
  }
  const size_t send_bytes = sends ? p.send_count * dtype_bytes(p.send.dtype) : 0;
  const size_t recv_bytes = receives ? p.recv_count * dtype_bytes(p.recv.dtype) : 0;
  const int me = rank();
  return issue(c, [=](void* comm_ptr, void* stream_ptr) {
    auto comm = static_cast<ncclComm_t>(comm_ptr);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (p.to == me) {  // a ring of one (the base class allows nothing else to itself)
      if (send_bytes > 0)
        cuda_check(cudaMemcpyAsync(p.recv.data, p.send.data, send_bytes, cudaMemcpyDeviceToDevice,
                                   stream),
                   "cudaMemcpyAsync (send_recv to itself)");
      return;
    }
    nccl_check(ncclGroupStart(), "ncclGroupStart", comm);
    ncclResult_t first_error = ncclSuccess;
    if (sends) first_error = ncclSend(p.send.data, send_bytes, ncclUint8, p.to, comm, stream);
    if (receives && first_error == ncclSuccess)
      first_error = ncclRecv(p.recv.data, recv_bytes, ncclUint8, p.from, comm, stream);
    const ncclResult_t ended = ncclGroupEnd();
    nccl_check(first_error != ncclSuccess ? first_error : ended, "ncclSend/ncclRecv", comm);
  });
}

}  // namespace shardlm
