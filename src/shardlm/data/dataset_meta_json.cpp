#include "shardlm/data/dataset_meta_json.hpp"

#include <filesystem>

#include "shardlm/core/error.hpp"
#include "shardlm/core/file_util.hpp"

namespace shardlm {
namespace {

bool is_count(const nlohmann::json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; }

}  // namespace

DatasetMetaJson::DatasetMetaJson(const std::string& dir)
    : path_((std::filesystem::path(dir) / "meta.json").string()) {
  const std::string text = read_text_file(path_, "meta.json written by `shardlm prepare`");
  try {
    json_ = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(fmt::format("{} is not valid JSON at byte {} (expected meta.json written by `shardlm prepare`)",
                            path_, e.byte));
  }
  SHARDLM_CHECK(json_.is_object(), "{} is not a JSON object (expected meta.json written by `shardlm prepare`)", path_);
}

void DatasetMetaJson::require(bool ok, const char* name, const nlohmann::json* value, const char* expected) const {
  if (ok) return;
  if (value == nullptr) throw Error(fmt::format("{}: missing field \"{}\" (expected {})", path_, name, expected));
  throw Error(fmt::format("{}: field \"{}\" is {} (expected {})", path_, name, value->dump(), expected));
}

std::string DatasetMetaJson::kind() const {
  if (!json_.contains("kind")) return "text";
  return field("kind", [](const nlohmann::json& v) { return v == "text" || v == "sft"; }, "\"text\" or \"sft\"")
      .get<std::string>();
}

int DatasetMetaJson::format_version(int newest) const {
  const int version = field("format_version", is_count, "an integer").get<int>();
  SHARDLM_CHECK(version >= 1 && version <= newest,
                "{}: format_version {} (this build reads versions 1..{}; a newer shardlm wrote it)", path_, version,
                newest);
  return version;
}

std::string DatasetMetaJson::tokenizer() const {
  return field("tokenizer", [](const nlohmann::json& v) { return v.is_string(); }, "a tokenizer spec string")
      .get<std::string>();
}

int64_t DatasetMetaJson::vocab_size() const {
  const int64_t size = field("vocab_size", is_count, "a positive integer").get<int64_t>();
  SHARDLM_CHECK(size > 0, "{}: vocab_size is 0 (expected a positive integer)", path_);
  return size;
}

std::optional<int32_t> DatasetMetaJson::end_of_text() const {
  const nlohmann::json& eot =
      field("end_of_text", [](const nlohmann::json& v) { return v.is_null() || v.is_number_integer(); },
            "a token id or null");
  return eot.is_null() ? std::nullopt : std::optional<int32_t>(eot.get<int32_t>());
}

int64_t DatasetMetaJson::count(const char* name) const { return field(name, is_count, "a count").get<int64_t>(); }

const nlohmann::json& DatasetMetaJson::array(const char* name) const {
  return field(name, [](const nlohmann::json& v) { return v.is_array(); }, "an array");
}

std::string DatasetMetaJson::string(const char* name) const {
  return field(name, [](const nlohmann::json& v) { return v.is_string(); }, "a string").get<std::string>();
}

std::optional<double> DatasetMetaJson::optional_number(const char* name) const {
  const nlohmann::json& value =
      field(name, [](const nlohmann::json& v) { return v.is_null() || v.is_number(); }, "a number or null");
  return value.is_null() ? std::nullopt : std::optional<double>(value.get<double>());
}

}  // namespace shardlm
