// safetensors: the Hugging Face tensor file format, read and written without
// third-party code.
//
// Layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// (padded with spaces to a multiple of 8), then the raw little-endian data;
// offsets are relative to the first byte after the header.
//
// Every malformed or truncated input throws shardlm::Error naming the file and
// what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::safetensors {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

std::string_view dtype_name(DType dtype);  // "F32", ...
size_t dtype_size(DType dtype);            // bytes per element
DType parse_dtype(std::string_view name);  // throws Error on an unknown name

int64_t shape_numel(const std::vector<int64_t>& shape);

// A tensor held in memory: dtype, shape and the raw little-endian bytes.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  int64_t numel() const { return shape_numel(shape); }
  // Values converted to float (from F32, F64, F16 or BF16); throws Error otherwise.
  std::vector<float> to_f32() const;
  // Values converted to int64 (from I64, I32, I16, I8, U8 or BOOL); throws otherwise.
  std::vector<int64_t> to_i64() const;
};

// A whole file in memory.
struct File {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  // Throws Error naming the file and the tensor if it is absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
};

// Reads the header at construction, tensors on demand: for files too large to hold
// twice (Hugging Face checkpoints).
class Reader {
 public:
  struct Entry {
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets into the data section
    uint64_t end = 0;
  };

  explicit Reader(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const Entry& entry(const std::string& name) const;  // throws Error if absent

  // Copies tensor `name`'s bytes into dst, which must hold exactly `bytes` bytes.
  void read_into(const std::string& name, void* dst, size_t bytes);
  Tensor read(const std::string& name);

 private:
  std::string path_;
  std::ifstream stream_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

File read_file(const std::string& path);

// A tensor to write: the data pointer must cover numel(shape) * dtype_size(dtype) bytes.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes the tensors in the given order, with the metadata as "__metadata__".
// Throws Error naming the file if it cannot be written, or on a duplicate name.
void write_file(const std::string& path, std::span<const TensorView> tensors,
                const std::map<std::string, std::string>& metadata = {});

}  // namespace shardlm::safetensors
