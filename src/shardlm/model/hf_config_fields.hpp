// HfConfigFields: reads a Hugging Face config.json for a family so that every field is
// accounted for: honoured (read into the ModelConfig), checked against the one value
// shardlm computes, or known not to change the computation (ids, versions, caching,
// generation settings). finish() refuses whatever is left, by name, so a field that
// would silently make a different model is never ignored.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm {

class HfConfigFields {
 public:
  // family names the model in errors ("config.json (qwen2): ...").
  HfConfigFields(const nlohmann::json& config, std::string family);

  int require_int(const std::string& field);
  int optional_int(const std::string& field, int fallback);
  double optional_number(const std::string& field, double fallback);
  bool optional_bool(const std::string& field, bool fallback);
  // The field's JSON value (null when absent), marked as read.
  const nlohmann::json& optional(const std::string& field);

  // Absent, or equal to what shardlm computes; Error naming the field otherwise.
  void expect_bool(const std::string& field, bool computed);
  void expect_number(const std::string& field, double computed);
  void expect_int_or_null(const std::string& field, int computed);
  void expect_string(const std::string& field, const std::vector<std::string>& computed);
  // Dropout is not implemented: absent or 0.
  void expect_no_dropout(const std::string& field);
  // Fields that do not change what the model computes (beyond the common ones).
  void ignore(std::initializer_list<const char*> fields);

  // Error naming the first field that was neither read, checked nor ignored.
  void finish() const;

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& expected) const;
  const nlohmann::json& config_;
  std::string family_;
  std::set<std::string> seen_;
};

}  // namespace shardlm
