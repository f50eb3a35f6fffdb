#include "shardlm/train/command_record.hpp"

#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace shardlm {
namespace {

// CLI11's TOML reader cuts a line at '#' (quoted or not) and strips one pair of outer
// quotes without unescaping, so a value is written bare when it is a number or a
// boolean, else in the quote character it does not contain.
bool representable(const std::string& v) {
  return v.find_first_of("\n\r#") == std::string::npos &&
         (v.find('"') == std::string::npos || v.find('\'') == std::string::npos);
}

std::string toml_scalar(const std::string& v) {
  static const std::regex bare("[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?|true|false");
  if (std::regex_match(v, bare)) return v;
  const char quote = v.find('"') == std::string::npos ? '"' : '\'';
  return quote + v + quote;
}

}  // namespace

std::string command_flags_toml(const std::string& command, const std::vector<CommandFlag>& flags) {
  std::string out = fmt::format(
      "# shardlm {}: the flags this run was started with (command line and --config file).\n"
      "# Run it again with `shardlm {} --config THIS_FILE --out NEW_RUN` (flags on the command\n"
      "# line override the file). Commented lines are the defaults it ran with.\n",
      command, command);
  for (const CommandFlag& f : flags) {
    bool ok = true;
    for (const std::string& v : f.values) ok = ok && representable(v);
    if (!ok) {
      out += fmt::format("# {}: a value a config file cannot hold (a newline, '#' or both quotes); "
                         "pass it on the command line\n",
                         f.name);
      continue;
    }
    std::string value;
    if (f.list || f.values.size() != 1) {
      for (const std::string& v : f.values) value += (value.empty() ? "" : ", ") + toml_scalar(v);
      value = "[" + value + "]";
    } else {
      value = toml_scalar(f.values.front());
    }
    // A rerun goes into a new run directory: resuming is this invocation's, not the job's.
    const bool resume = f.name == "resume" || f.name == "resume-if-exists";
    if (f.given && !resume)
      out += fmt::format("{} = {}\n", f.name, value);
    else if (!f.values.empty())
      out += fmt::format("# {} = {}\n", f.name, value);
  }
  return out;
}

nlohmann::json command_flags_json(const std::vector<CommandFlag>& flags) {
  nlohmann::json j = nlohmann::json::object();
  for (const CommandFlag& f : flags)
    if (f.given)
      j[f.name] = f.list || f.values.empty() ? nlohmann::json(f.values) : nlohmann::json(f.values.back());
  return j;
}

}  // namespace shardlm
