#include "shardlm/ckpt/checkpoint_manifest.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "shardlm/backend/cpu/nf4.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/tensor_parallel/tensor_layout.hpp"

namespace shardlm {

nlohmann::json layout_to_manifest_units(const ParamLayout& layout, const ModelConfig& config) {
  nlohmann::json units = nlohmann::json::array();
  for (int t = 0; t < layout.tensor.size; ++t) {
    const ParamLayout tensor_rank = layout_of_tensor_rank(layout, config, t);
    for (const auto& unit : tensor_rank.units) {
      nlohmann::json params = nlohmann::json::array();
      for (const auto& p : unit.params) {
        nlohmann::json entry = {{"name", p.name}, {"offset", p.offset}, {"shape", p.shape}};
        // A quantized tensor's elements are its storage words (docs/checkpoint-format.md).
        if (p.storage == ParamStorage::nf4) entry["storage"] = "nf4";
        // A tensor-parallel piece: which rows or columns of the logical tensor these are.
        if (!p.piece.whole()) {
          entry["piece"] = {{"dim", p.piece.dim}, {"begin", p.piece.begin}, {"full", p.piece.full}};
          // A fused tensor's piece (gpt2's q|k|v): the range inside each of its groups.
          if (p.piece.groups > 1) entry["piece"]["groups"] = p.piece.groups;
        }
        params.push_back(std::move(entry));
      }
      nlohmann::json entry = {{"name", unit.name},
                              {"numel", unit.numel},
                              {"padded_numel", unit.padded_numel},
                              {"params", params}};
      if (layout.tensor.size > 1) entry["tensor_rank"] = t;
      units.push_back(std::move(entry));
    }
  }
  return units;
}

nlohmann::json manifest_to_json(const CheckpointInfo& info, const nlohmann::json& units,
                                const nlohmann::json& shards) {
  return {{"format", kCheckpointFormatName},
          {"format_version", kCheckpointFormatVersion},
          {"step", info.step},
          {"tokens_seen", info.tokens_seen},
          {"model", info.model.to_json()},
          {"tokenizer", info.tokenizer},
          {"strategy", info.strategy},
          {"world_size", info.world_size},
          {"train", info.train},
          {"units", units},
          {"shards", shards}};
}

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// Field access with one-line errors naming the manifest and the field's JSON path.
class ManifestFields {
 public:
  explicit ManifestFields(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("checkpoint manifest '{}': {}", path_, what));
  }
  void require(bool condition, const std::string& what) const {
    if (!condition) fail(what);
  }
  const nlohmann::json& at(const nlohmann::json& object, const std::string& where,
                           const char* key) const {
    require(object.is_object() && object.contains(key),
            fmt::format("{} has no field \"{}\"", where, key));
    return object.at(key);
  }
  int64_t integer(const nlohmann::json& object, const std::string& where, const char* key,
                  int64_t min, int64_t max = kMaxInt64) const {
    const auto& v = at(object, where, key);
    require(v.is_number_integer() && v.get<int64_t>() >= min && v.get<int64_t>() <= max,
            fmt::format("{}.{} is {}, expected an integer in [{}, {}]", where, key, v.dump(), min,
                        max));
    return v.get<int64_t>();
  }
  std::string string(const nlohmann::json& object, const std::string& where,
                     const char* key) const {
    const auto& v = at(object, where, key);
    require(v.is_string(), fmt::format("{}.{} is {}, expected a string", where, key, v.dump()));
    return v.get<std::string>();
  }
  const nlohmann::json& array(const nlohmann::json& object, const std::string& where,
                              const char* key) const {
    const auto& v = at(object, where, key);
    require(v.is_array(), fmt::format("{}.{} is not an array", where, key));
    return v;
  }

 private:
  const std::string& path_;
};

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

void parse_units(const nlohmann::json& m, const ManifestFields& f, CheckpointManifest& out) {
  const auto& units = f.array(m, "manifest", "units");
  f.require(!units.empty(), "units is empty");
  for (size_t u = 0; u < units.size(); ++u) {
    const std::string where = fmt::format("units[{}]", u);
    ManifestUnit unit;
    unit.name = f.string(units[u], where, "name");
    unit.numel = f.integer(units[u], where, "numel", 1);
    unit.padded_numel = f.integer(units[u], where, "padded_numel", unit.numel);
    if (units[u].contains("tensor_rank"))
      unit.tensor_rank = static_cast<int>(f.integer(units[u], where, "tensor_rank", 0, 1 << 20));
    int64_t previous_end = 0;
    const auto& params = f.array(units[u], where, "params");
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string pwhere = fmt::format("{}.params[{}]", where, i);
      ManifestTensor t;
      t.name = f.string(params[i], pwhere, "name");
      t.unit = static_cast<int>(u);
      t.tensor_rank = unit.tensor_rank;
      t.offset = f.integer(params[i], pwhere, "offset", previous_end, unit.numel);
      const auto& shape = f.at(params[i], pwhere, "shape");
      f.require(shape.is_array() && !shape.empty(), pwhere + ".shape is not a non-empty array");
      if (params[i].contains("storage")) {
        f.require(params[i].at("storage") == "nf4",
                  fmt::format("{}.storage is {}, expected \"nf4\" (or absent: fp32)", pwhere,
                              params[i].at("storage").dump()));
        t.storage = ParamStorage::nf4;
      }
      // An NF4 tensor of n values occupies nf4_storage_words(n) <= n elements (n >= 2).
      const int64_t max_values = t.storage == ParamStorage::nf4 ? 16 * unit.numel : unit.numel;
      t.numel = 1;
      for (const auto& d : shape) {
        f.require(d.is_number_integer() && d.get<int64_t>() >= 1 &&
                      d.get<int64_t>() <= max_values,
                  fmt::format("{}.shape holds {}, expected dimensions in [1, {}]", pwhere,
                              d.dump(), max_values));
        t.shape.push_back(d.get<int64_t>());
        t.numel *= d.get<int64_t>();
        f.require(t.numel <= max_values,
                  fmt::format("{}.shape [{}] is larger than its unit ({} elements)", pwhere,
                              fmt::join(t.shape, ", "), unit.numel));
      }
      if (t.storage == ParamStorage::nf4) t.numel = cpu::nf4_storage_words(t.numel);
      if (params[i].contains("piece")) {
        const auto& piece = params[i].at("piece");
        const std::string qwhere = pwhere + ".piece";
        t.piece.dim = static_cast<int>(f.integer(piece, qwhere, "dim", 0, static_cast<int64_t>(t.shape.size()) - 1));
        const int64_t extent = t.shape[static_cast<size_t>(t.piece.dim)];
        t.piece.full = f.integer(piece, qwhere, "full", extent, int64_t{1} << 40);
        if (piece.contains("groups")) {
          t.piece.groups = static_cast<int>(f.integer(piece, qwhere, "groups", 1, extent));
          f.require(extent % t.piece.groups == 0 && t.piece.full % t.piece.groups == 0,
                    fmt::format("{}.groups {} must divide the piece's extent {} and the tensor's {}",
                                qwhere, t.piece.groups, extent, t.piece.full));
        }
        t.piece.begin = f.integer(piece, qwhere, "begin", 0,
                                  (t.piece.full - extent) / t.piece.groups);
      }
      f.require(t.offset + t.numel <= unit.numel,
                fmt::format("{} '{}' ends at element {}, past its unit's {}", pwhere, t.name,
                            t.offset + t.numel, unit.numel));
      previous_end = t.offset + t.numel;
      out.tensors.push_back(std::move(t));
    }
    out.units.push_back(std::move(unit));
  }
}

// The recorded tensors must be exactly the recorded model's, in canonical order.
void check_tensors_match_model(const CheckpointManifest& m, const ManifestFields& f) {
  // Tensor parallelism: the units of tensor ranks 0, 1, ... in turn.
  f.require(m.units.front().tensor_rank == 0, "units[0] is not of tensor rank 0");
  for (size_t u = 1; u < m.units.size(); ++u)
    f.require(m.units[u].tensor_rank == m.units[u - 1].tensor_rank ||
                  m.units[u].tensor_rank == m.units[u - 1].tensor_rank + 1,
              fmt::format("units[{}] is of tensor rank {} after tensor rank {}", u,
                          m.units[u].tensor_rank, m.units[u - 1].tensor_rank));
  const int tensor_size = m.units.back().tensor_rank + 1;
  std::vector<ParamLayout> layouts;
  try {
    for (int t = 0; t < tensor_size; ++t)
      layouts.push_back(ParamLayout::build(m.info.model, 1, 0, {tensor_size, t}));
  } catch (const Error& e) {
    f.fail(fmt::format("its {} tensor ranks do not split the recorded model: {}", tensor_size, e.what()));
  }
  std::vector<const ParamInfo*> expected;
  for (const ParamLayout& layout : layouts)
    for (const ParamInfo* p : layout.all_params()) expected.push_back(p);
  f.require(expected.size() == m.tensors.size(),
            fmt::format("{} tensors listed, the recorded model has {}", m.tensors.size(),
                        expected.size()));
  for (size_t i = 0; i < expected.size(); ++i)
    f.require(expected[i]->name == m.tensors[i].name && expected[i]->shape == m.tensors[i].shape &&
                  expected[i]->storage == m.tensors[i].storage &&
                  expected[i]->piece == m.tensors[i].piece,
              fmt::format("tensor {} is '{}' [{}], the recorded model has '{}' [{}]", i,
                          m.tensors[i].name, fmt::join(m.tensors[i].shape, ", "),
                          expected[i]->name, fmt::join(expected[i]->shape, ", ")));
}

void parse_shards(const nlohmann::json& m, const ManifestFields& f, CheckpointManifest& out) {
  const auto& shards = f.array(m, "manifest", "shards");
  f.require(!shards.empty(), "shards is empty");
  std::set<int> ranks;
  std::set<std::string> files;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string where = fmt::format("shards[{}]", s);
    ManifestShard shard;
    shard.file = f.string(shards[s], where, "file");
    f.require(is_plain_file_name(shard.file),
              fmt::format("{}.file '{}' is not a file name inside the checkpoint", where,
                          shard.file));
    shard.rank = static_cast<int>(f.integer(shards[s], where, "rank", 0, out.info.world_size - 1));
    f.require(ranks.insert(shard.rank).second && files.insert(shard.file).second,
              fmt::format("{} repeats rank {} or file '{}'", where, shard.rank, shard.file));
    shard.bytes = f.integer(shards[s], where, "bytes", 0);
    shard.sha256 = f.string(shards[s], where, "sha256");
    f.require(shard.sha256.size() == 64 &&
                  shard.sha256.find_first_not_of("0123456789abcdef") == std::string::npos,
              fmt::format("{}.sha256 is not 64 hexadecimal digits", where));
    int64_t next_offset = 0;
    const auto& slices = f.array(shards[s], where, "slices");
    for (size_t i = 0; i < slices.size(); ++i) {
      const std::string swhere = fmt::format("{}.slices[{}]", where, i);
      ManifestSlice sl;
      sl.unit = static_cast<int>(
          f.integer(slices[i], swhere, "unit", 0, static_cast<int64_t>(out.units.size()) - 1));
      const int64_t padded = out.units[static_cast<size_t>(sl.unit)].padded_numel;
      sl.begin = f.integer(slices[i], swhere, "begin", 0, padded - 1);
      sl.end = f.integer(slices[i], swhere, "end", sl.begin + 1, padded);
      sl.file_offset = f.integer(slices[i], swhere, "offset", 0);
      f.require(sl.file_offset == next_offset,
                fmt::format("{}.offset is {}, but the slices before it end at byte {}", swhere,
                            sl.file_offset, next_offset));
      next_offset += (sl.end - sl.begin) * kCheckpointStates * static_cast<int64_t>(sizeof(float));
      shard.slices.push_back(sl);
    }
    f.require(next_offset == shard.bytes,
              fmt::format("{}.bytes is {}, but its slices hold {}", where, shard.bytes,
                          next_offset));
    out.shards.push_back(std::move(shard));
  }
}

// Every element of every unit is stored exactly once.
void check_coverage(const CheckpointManifest& m, const ManifestFields& f) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(m.units.size());
  for (const auto& shard : m.shards)
    for (const auto& sl : shard.slices)
      ranges[static_cast<size_t>(sl.unit)].emplace_back(sl.begin, sl.end);
  for (size_t u = 0; u < m.units.size(); ++u) {
    auto& r = ranges[u];
    std::sort(r.begin(), r.end());
    int64_t covered = 0;
    for (const auto& [begin, end] : r) {
      f.require(begin == covered,
                fmt::format("the shards {} elements [{}, {}) of unit {} ('{}')",
                            begin > covered ? "do not store" : "store twice",
                            std::min(begin, covered), std::max(begin, covered), u,
                            m.units[u].name));
      covered = end;
    }
    f.require(covered == m.units[u].padded_numel,
              fmt::format("the shards do not store elements [{}, {}) of unit {} ('{}')", covered,
                          m.units[u].padded_numel, u, m.units[u].name));
  }
}

}  // namespace

void check_manifest_format(const nlohmann::json& m, const std::string& path) {
  const ManifestFields f(path);
  f.require(m.is_object(), "not a JSON object");
  const std::string format = m.contains("format") && m.at("format").is_string()
                                 ? m.at("format").get<std::string>()
                                 : std::string();
  f.require(format == kCheckpointFormatName,
            fmt::format("format is '{}', expected '{}'", format, kCheckpointFormatName));
  const int version = static_cast<int>(f.integer(m, "manifest", "format_version", 1));
  f.require(version <= kCheckpointFormatVersion,
            fmt::format("format version {} is newer than this shardlm supports ({})", version,
                        kCheckpointFormatVersion));
  f.require(version == kCheckpointFormatVersion,
            fmt::format("format version {} was written by an older shardlm, without commit "
                        "markers; this shardlm reads version {}",
                        version, kCheckpointFormatVersion));
}

CheckpointManifest parse_checkpoint_manifest(const nlohmann::json& m, const std::string& path) {
  check_manifest_format(m, path);
  const ManifestFields f(path);
  CheckpointManifest out;
  CheckpointInfo& info = out.info;
  info.step = f.integer(m, "manifest", "step", 0);
  info.tokens_seen = f.integer(m, "manifest", "tokens_seen", 0);
  try {
    info.model = ModelConfig::from_json(f.at(m, "manifest", "model"));
  } catch (const Error& e) {
    f.fail(e.what());
  }
  info.tokenizer = f.string(m, "manifest", "tokenizer");
  info.strategy = f.string(m, "manifest", "strategy");
  info.world_size =
      static_cast<int>(f.integer(m, "manifest", "world_size", 1, std::numeric_limits<int>::max()));
  info.train = f.at(m, "manifest", "train");
  f.require(info.train.is_object(), "train is not an object");
  parse_units(m, f, out);
  check_tensors_match_model(out, f);
  parse_shards(m, f, out);
  check_coverage(out, f);
  return out;
}

}  // namespace shardlm
