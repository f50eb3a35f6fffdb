#include "shardlm/ckpt/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "shardlm/core/error.hpp"

namespace shardlm::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this build assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, so that a
// corrupt length cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2}, {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1}};

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: renormalize
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3FFu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

template <typename T>
std::vector<T> copy_as(const std::vector<std::byte>& data) {
  std::vector<T> out(data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
  return out;
}

template <typename To, typename From>
std::vector<To> convert(const std::vector<std::byte>& data) {
  std::vector<From> raw = copy_as<From>(data);
  return std::vector<To>(raw.begin(), raw.end());
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t dtype_size(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

DType parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  throw Error(fmt::format("unknown safetensors dtype '{}' (expected F64, F32, F16, BF16, I64, "
                          "I32, I16, I8, U8 or BOOL)",
                          name));
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<float> Tensor::to_f32() const {
  switch (dtype) {
    case DType::F32: return copy_as<float>(data);
    case DType::F64: return convert<float, double>(data);
    case DType::F16: {
      std::vector<uint16_t> raw = copy_as<uint16_t>(data);
      std::vector<float> out(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) out[i] = half_to_float(raw[i]);
      return out;
    }
    case DType::BF16: {
      std::vector<uint16_t> raw = copy_as<uint16_t>(data);
      std::vector<float> out(raw.size());
      for (size_t i = 0; i < raw.size(); ++i)
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(raw[i]) << 16);
      return out;
    }
    default: break;
  }
  throw Error(fmt::format("tensor of dtype {} cannot be read as floats", dtype_name(dtype)));
}

std::vector<int64_t> Tensor::to_i64() const {
  switch (dtype) {
    case DType::I64: return copy_as<int64_t>(data);
    case DType::I32: return convert<int64_t, int32_t>(data);
    case DType::I16: return convert<int64_t, int16_t>(data);
    case DType::I8: return convert<int64_t, int8_t>(data);
    case DType::U8:
    case DType::BOOL: return convert<int64_t, uint8_t>(data);
    default: break;
  }
  throw Error(fmt::format("tensor of dtype {} cannot be read as integers", dtype_name(dtype)));
}

const Tensor& File::at(const std::string& name) const {
  auto it = tensors.find(name);
  SHARDLM_CHECK(it != tensors.end(), "{}: no tensor named '{}'", path, name);
  return it->second;
}

Reader::Reader(const std::string& path) : path_(path) {
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  SHARDLM_CHECK(!ec, "{}: cannot open safetensors file ({})", path, ec.message());
  stream_.open(path, std::ios::binary);
  SHARDLM_CHECK(stream_.good(), "{}: cannot open safetensors file for reading", path);
  SHARDLM_CHECK(file_size >= 8,
                "{}: truncated safetensors file ({} bytes; expected at least the 8-byte header "
                "length)",
                path, file_size);

  unsigned char length_bytes[8];
  stream_.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length_bytes[i];
  SHARDLM_CHECK(header_len <= kMaxHeaderBytes,
                "{}: corrupt safetensors file (header length {} exceeds the {} byte limit)", path,
                header_len, kMaxHeaderBytes);
  SHARDLM_CHECK(8 + header_len <= file_size,
                "{}: truncated safetensors file (header says {} bytes, file has {} after the "
                "length)",
                path, header_len, file_size - 8);

  std::string header(header_len, '\0');
  stream_.read(header.data(), static_cast<std::streamsize>(header_len));
  SHARDLM_CHECK(stream_.good(), "{}: could not read the safetensors header", path);
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: corrupt safetensors header (not valid JSON: {})", path, e.what()));
  }
  SHARDLM_CHECK(j.is_object(), "{}: corrupt safetensors header (expected a JSON object)", path);

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& value = it.value();
    if (name == kMetadataKey) {
      SHARDLM_CHECK(value.is_object(), "{}: corrupt safetensors header (__metadata__ must be an "
                    "object of strings)", path);
      for (auto m = value.begin(); m != value.end(); ++m) {
        SHARDLM_CHECK(m.value().is_string(),
                      "{}: corrupt safetensors header (metadata '{}' is not a string)", path,
                      m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return Error(fmt::format("{}: corrupt safetensors header (tensor '{}': {})", path, name, what));
    };
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets"))
      throw bad("expected an object with dtype, shape and data_offsets");
    const auto& dtype = value["dtype"];
    const auto& shape = value["shape"];
    const auto& offsets = value["data_offsets"];
    if (!dtype.is_string()) throw bad("dtype is not a string");
    Entry entry;
    try {
      entry.dtype = parse_dtype(dtype.get<std::string>());
    } catch (const Error& e) {
      throw bad(e.what());
    }
    if (!shape.is_array()) throw bad("shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      entry.shape.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(numel, dim, &numel)) throw bad("shape is too large");
    }
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, dtype_size(entry.dtype), &expected))
      throw bad("shape is too large");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      throw bad("data_offsets must be two non-negative integers");
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.end < entry.begin) throw bad("data_offsets end before they begin");
    if (entry.end > data_size)
      throw Error(fmt::format(
          "{}: truncated safetensors file (tensor '{}' ends at data byte {}, the file has {})",
          path, name, entry.end, data_size));
    if (entry.end - entry.begin != expected)
      throw bad(fmt::format("data_offsets span {} bytes, shape and dtype need {}",
                            entry.end - entry.begin, expected));
    ranges.emplace_back(entry.begin, entry.end);
    entries_.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    SHARDLM_CHECK(ranges[i].first >= ranges[i - 1].second,
                  "{}: corrupt safetensors header (tensor data ranges overlap)", path);
}

const Reader::Entry& Reader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  SHARDLM_CHECK(it != entries_.end(), "{}: no tensor named '{}'", path_, name);
  return it->second;
}

void Reader::read_into(const std::string& name, void* dst, size_t bytes) {
  const Entry& e = entry(name);
  SHARDLM_CHECK(bytes == e.end - e.begin, "{}: tensor '{}' has {} bytes, the destination {}",
                path_, name, e.end - e.begin, bytes);
  if (bytes == 0) return;
  stream_.clear();
  stream_.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  stream_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  SHARDLM_CHECK(stream_.good() && static_cast<size_t>(stream_.gcount()) == bytes,
                "{}: truncated safetensors file (could not read tensor '{}')", path_, name);
}

Tensor Reader::read(const std::string& name) {
  const Entry& e = entry(name);
  Tensor t;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.data.resize(e.end - e.begin);
  read_into(name, t.data.data(), t.data.size());
  return t;
}

File read_file(const std::string& path) {
  Reader reader(path);
  File file;
  file.path = path;
  file.metadata = reader.metadata();
  for (const auto& [name, entry] : reader.entries()) file.tensors.emplace(name, reader.read(name));
  return file;
}

void write_file(const std::string& path, std::span<const TensorView> tensors,
                const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = meta;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    SHARDLM_CHECK(t.name != kMetadataKey, "{}: '{}' is reserved and cannot name a tensor", path,
                  t.name);
    SHARDLM_CHECK(names.insert(t.name).second, "{}: tensor '{}' is listed twice", path, t.name);
    for (auto d : t.shape)
      SHARDLM_CHECK(d >= 0, "{}: tensor '{}' has a negative dimension", path, t.name);
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    SHARDLM_CHECK(bytes == 0 || t.data != nullptr, "{}: tensor '{}' has no data", path, t.name);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the reference
  // writer does), which lets readers map it and cast in place.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  SHARDLM_CHECK(out.good(), "{}: cannot open for writing", path);
  unsigned char length_bytes[8];
  uint64_t len = header_text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(length_bytes), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (bytes > 0) out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(bytes));
  }
  out.flush();
  SHARDLM_CHECK(out.good(), "{}: write failed (disk full or I/O error?)", path);
}

}  // namespace shardlm::safetensors
