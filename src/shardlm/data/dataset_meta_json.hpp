// Reading a dataset's meta.json (text datasets: prepare.hpp; SFT datasets:
// sft_prepare.hpp): every problem is one line naming the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace shardlm {

class DatasetMetaJson {
 public:
  // Reads and parses DIR/meta.json; Error when unreadable, not JSON or not an object.
  explicit DatasetMetaJson(const std::string& dir);

  const std::string& path() const { return path_; }
  const nlohmann::json& json() const { return json_; }
  // "sft" for SFT datasets, "text" for text ones (meta.json written before SFT
  // datasets existed has no "kind").
  std::string kind() const;

  // The fields every dataset has: format_version (1..newest), tokenizer,
  // vocab_size (> 0), end_of_text (id or null).
  int format_version(int newest) const;
  std::string tokenizer() const;
  int64_t vocab_size() const;
  std::optional<int32_t> end_of_text() const;

  int64_t count(const char* name) const;                     // an integer >= 0
  const nlohmann::json& array(const char* name) const;       // an array
  std::string string(const char* name) const;                // a string
  std::optional<double> optional_number(const char* name) const;  // a number or null
  // A field that must be present and pass `is_type`, else Error naming it and `expected`.
  template <typename IsType>
  const nlohmann::json& field(const char* name, IsType&& is_type, const char* expected) const {
    require(json_.contains(name), name, nullptr, expected);
    const nlohmann::json& value = json_.at(name);
    require(is_type(value), name, &value, expected);
    return value;
  }

 private:
  void require(bool ok, const char* name, const nlohmann::json* value, const char* expected) const;
  std::string path_;
  nlohmann::json json_;
};

}  // namespace shardlm
