#include "shardlm/core/dtype.hpp"

#include "shardlm/core/error.hpp"

namespace shardlm {

size_t dtype_bytes(DType dtype) { return dtype == DType::fp32 ? 4 : 2; }

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "fp32") return DType::fp32;
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::fp16;
  throw Error(fmt::format("{} '{}' is not a precision; expected fp32, bf16 or fp16", what, name));
}

float* TypedPtr::f32() const {
  SHARDLM_CHECK(dtype == DType::fp32, "internal: a {} tensor was read as fp32", dtype_name(dtype));
  return static_cast<float*>(data);
}

const float* ConstTypedPtr::f32() const {
  SHARDLM_CHECK(dtype == DType::fp32, "internal: a {} tensor was read as fp32", dtype_name(dtype));
  return static_cast<const float*>(data);
}

}  // namespace shardlm
