#include "shardlm/ckpt/checkpoint_values.hpp"

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/ckpt/safetensors.hpp"

namespace shardlm {

std::vector<float> read_tensor_values(const CheckpointReader& checkpoint, const ParamInfo& param) {
  std::vector<int64_t> shape = param.shape;
  if (param.valid_rows >= 0) shape[0] = param.valid_rows;  // padded rows come last
  const int64_t numel = safetensors::shape_numel(shape);
  std::vector<float> values(static_cast<size_t>(numel));
  if (param.storage == ParamStorage::nf4) {
    std::vector<float> words(static_cast<size_t>(param.numel));
    checkpoint.read(param.name, StateKind::master, 0, param.numel, words.data());
    cpu::nf4_dequantize(words.data(), numel, values.data());
  } else {
    checkpoint.read(param.name, StateKind::master, 0, numel, values.data());
  }
  return values;
}

}  // namespace shardlm
