// TensorParallelBlock: the collectives a tensor-parallel decoder layer adds to its
// computation (Megatron-core's column-/row-parallel linear layers), over the tensor group
// of ModelOptions::parallel_groups. With no group (one tensor rank) every call is a no-op,
// so the unsplit model runs exactly as before.
//
//   forward:  o_proj and down_proj (row-parallel) leave partial sums: sum_partial(branch)
//             before the residual add (one all-reduce per block half)
//   backward: the input gradients of q|k|v and gate|up (column-parallel) are partial
//             sums: sum_partial(dln) before the norm's backward (one all-reduce per half);
//             qwen3's per-head q/k norm weights are whole but see only this rank's heads:
//             their gradient is summed too (sum_partial on a small scratch)
//   vocabulary-parallel embedding and head (vocab_parallel.hpp): the lookup's sum, the
//             softmax's row maxima (max_partial) and sums, the head's input gradient
//   GQA with more tensor ranks than key/value heads: each rank holds the head its queries
//             read, replicated; the head's weight gradient is the sum of its replicas'
//             (sum_kv_replicas over the ranks that hold the same head)
//
// On a device the group is the device communicator's (NCCL on its communication stream):
// "waited for" then means the backend's stream waits for the collective (wait()), so the
// next kernel reads its result while the host goes on issuing; where kernels run on the
// calling thread (CPU, emulated: no stream) it is a host wait.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardlm/comm/work.hpp"
#include "shardlm/core/dtype.hpp"
#include "shardlm/model/config.hpp"

namespace shardlm {

class Communicator;

class TensorParallelBlock {
 public:
  TensorParallelBlock() = default;
  // `tensor`: the tensor group or null. Splits it (a collective over the group) into the
  // key/value-head replica groups when the model has fewer key/value heads than ranks.
  // stream: the model backend's stream_handle() (null where kernels run on the host).
  TensorParallelBlock(Communicator* tensor, const ModelConfig& config, void* stream);
  ~TensorParallelBlock();
  TensorParallelBlock(TensorParallelBlock&&) noexcept;
  TensorParallelBlock& operator=(TensorParallelBlock&&) noexcept;

  int size() const;   // tensor ranks (1 without a group)
  int rank() const;   // this rank's tensor coordinate
  bool active() const { return tensor_ != nullptr && size() > 1; }
  bool replicates_kv() const { return kv_replicas_ != nullptr; }

  // data[0, count) becomes the sum over the tensor ranks (waited for: the next kernel reads it).
  void sum_partial(float* data, int64_t count, const std::string& label) const;
  // The same started, for the caller to compute meanwhile and wait() on the Work before
  // reading data (a finished no-op without a group).
  Work start_sum_partial(float* data, int64_t count, const std::string& label) const;
  // The kernels issued after this call see the collective's result: the backend's stream
  // waits for it, or (no stream) the host does.
  void wait(Work& work) const;
  // data[0, count) becomes the maximum over the tensor ranks (the vocabulary-parallel
  // softmax's row maxima).
  void max_partial(float* data, int64_t count, const std::string& label) const;
  // recv [size() x count] holds every rank's send [count], in rank order (with a group).
  void gather(const float* send, float* recv, int64_t count, const std::string& label) const;
  // Sequence parallelism: recv [count] = block rank() of the sum over the ranks of send
  // [size() x count] (recv may be send + rank() * count), and the all-gather of each
  // rank's block [count] of data (its own at data + rank() * count) into data [size() x
  // count], in place.
  void sum_scatter(const float* send, float* recv, int64_t count, const std::string& label) const;
  Work start_sum_scatter(const float* send, float* recv, int64_t count, const std::string& label) const;
  void gather_in_place(TypedPtr data, int64_t count, const std::string& label) const;
  // Sum over the ranks holding this rank's key/value head (no-op unless replicates_kv()).
  void sum_kv_replicas(float* data, int64_t count, const std::string& label) const;

 private:
  Communicator* tensor_ = nullptr;
  std::unique_ptr<Communicator> kv_replicas_;
  void* stream_ = nullptr;
};

}  // namespace shardlm
