#include "shardlm/model/tensor_parallel/tensor_parallel_block.hpp"

#include "shardlm/comm/communicator.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

TensorParallelBlock::TensorParallelBlock(Communicator* tensor, const ModelConfig& config,
                                         void* stream)
    : tensor_(tensor), stream_(stream) {
  if (!active()) return;
  check_tensor_parallel(config, size());
  const int kv = config.kv_heads();
  if (kv % size() != 0) {
    // Ranks t with the same t / (T / kv) hold the same key/value head.
    const int replicas = size() / kv;
    kv_replicas_ = tensor_->split(rank() / replicas, rank(), tensor_->name() + ".kv_replicas");
    tensor_->count_with_parent(*kv_replicas_);  // a step's measured bytes include its all-reduces
  }
}

TensorParallelBlock::~TensorParallelBlock() = default;
TensorParallelBlock::TensorParallelBlock(TensorParallelBlock&&) noexcept = default;
TensorParallelBlock& TensorParallelBlock::operator=(TensorParallelBlock&&) noexcept = default;

int TensorParallelBlock::size() const { return tensor_ != nullptr ? tensor_->size() : 1; }
int TensorParallelBlock::rank() const { return tensor_ != nullptr ? tensor_->rank() : 0; }

void TensorParallelBlock::wait(Work& work) const {
  if (stream_ != nullptr)
    work.wait_on_stream(stream_);
  else
    work.wait();
}

void TensorParallelBlock::sum_partial(float* data, int64_t count, const std::string& label) const {
  Work work = start_sum_partial(data, count, label);
  wait(work);
}

Work TensorParallelBlock::start_sum_partial(float* data, int64_t count, const std::string& label) const {
  if (!active()) return Work();
  return tensor_->all_reduce(data, static_cast<size_t>(count), ReduceOp::sum, label);
}

void TensorParallelBlock::max_partial(float* data, int64_t count, const std::string& label) const {
  if (!active()) return;
  Work work = tensor_->all_reduce(data, static_cast<size_t>(count), ReduceOp::max, label);
  wait(work);
}

void TensorParallelBlock::gather(const float* send, float* recv, int64_t count,
                                 const std::string& label) const {
  SHARDLM_ASSERT(active());
  Work work = tensor_->all_gather(send, recv, static_cast<size_t>(count), label);
  wait(work);
}

void TensorParallelBlock::sum_scatter(const float* send, float* recv, int64_t count,
                                      const std::string& label) const {
  Work work = start_sum_scatter(send, recv, count, label);
  wait(work);
}

Work TensorParallelBlock::start_sum_scatter(const float* send, float* recv, int64_t count,
                                            const std::string& label) const {
  SHARDLM_ASSERT(active());
  return tensor_->reduce_scatter(send, recv, static_cast<size_t>(count), ReduceOp::sum, label);
}

void TensorParallelBlock::gather_in_place(TypedPtr data, int64_t count, const std::string& label) const {
  SHARDLM_ASSERT(active());
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(data.dtype);
  Work work = tensor_->all_gather_bytes(
      static_cast<std::byte*>(data.data) + static_cast<size_t>(rank()) * bytes, data.data, bytes, label);
  wait(work);
}

void TensorParallelBlock::sum_kv_replicas(float* data, int64_t count,
                                          const std::string& label) const {
  if (!replicates_kv()) return;
  Work work = kv_replicas_->all_reduce(data, static_cast<size_t>(count), ReduceOp::sum, label);
  wait(work);
}

}  // namespace shardlm
