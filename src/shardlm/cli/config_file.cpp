#include "shardlm/cli/config_file.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "shardlm/core/error.hpp"

namespace shardlm::cli {
namespace {

constexpr const char* kConfigFlag = "--config";

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

std::string unquoted(std::string s) {
  if (s.size() > 1 && (s.front() == '"' || s.front() == '\'') && s.front() == s.back())
    s = s.substr(1, s.size() - 2);
  return s;
}

// The option a key names: "--lora-rank" for lora-rank or lora_rank (TOML's usual
// spelling), a flag spelt with underscores (an alias) as it is.
const CLI::Option* option_for_key(const CLI::App& cmd, const std::string& key) {
  if (const CLI::Option* o = cmd.get_option_no_throw("--" + key)) return o;
  std::string dashed = key;
  for (char& c : dashed)
    if (c == '_') c = '-';
  return cmd.get_option_no_throw("--" + dashed);
}

// The top app's formatter: checks every key of the file against the subcommand that is
// being run (naming file and line), then lets CLI11's TOML reader read it and routes
// each item into that subcommand under the option's own name.
class SubcommandConfigFile : public CLI::ConfigTOML {
 public:
  explicit SubcommandConfigFile(const CLI::App& top) : top_(top) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::vector<CLI::App*> running = top_.get_subcommands();
    SHARDLM_CHECK(running.size() == 1 && running.front()->get_option_no_throw(kConfigFlag) != nullptr,
                  "--config applies to train, sft, plan and bench (after the subcommand: shardlm train "
                  "--config FILE)");
    const CLI::App& cmd = *running.front();
    const std::string file = top_.get_config_ptr()->as<std::string>();
    const std::string text{std::istreambuf_iterator<char>(input), std::istreambuf_iterator<char>()};

    std::map<std::string, std::string> option_of_key;  // key as written -> option name
    std::map<std::string, int> line_of_option;
    std::istringstream lines(text);
    std::string raw;
    int line_no = 0;
    bool in_array = false;  // a multi-line array's continuation lines
    while (std::getline(lines, raw)) {
      ++line_no;
      const std::string line = trimmed(raw);
      if (in_array) {
        const std::string value = trimmed(line.substr(0, line.find('#')));
        in_array = value.empty() || value.back() != ']';
        continue;
      }
      if (line.size() < 3 || line.front() == '#' || line.front() == ';') continue;  // as CLI11 skips
      const auto where = [&] { return fmt::format("{}:{}", file, line_no); };
      SHARDLM_CHECK(line.front() != '[', "{}: sections are not read ({}): write `shardlm {}`'s flags as keys at "
                    "the top of the file", where(), line, cmd.get_name());
      const size_t eq = line.find('=');
      const std::string key = unquoted(trimmed(eq == std::string::npos ? line.substr(0, line.find('#'))
                                                                         : line.substr(0, eq)));
      if (eq != std::string::npos) {
        const std::string value = trimmed(line.substr(eq + 1, line.find('#', eq) - eq - 1));
        in_array = value.size() > 1 && value.front() == '[' && value.back() != ']';
      }
      const CLI::Option* option = option_for_key(cmd, key);
      SHARDLM_CHECK(option != nullptr,
                    "{}: unknown key '{}' for `shardlm {}` (keys are its flags without the leading "
                    "dashes, e.g. lr = 3e-4; `shardlm {} --help` lists them)",
                    where(), key, cmd.get_name(), cmd.get_name());
      SHARDLM_CHECK(option->get_configurable() && option != cmd.get_help_ptr() &&
                        option != cmd.get_help_all_ptr() && key != "config",
                    "{}: '{}' cannot be set in a config file", where(), key);
      const std::string name = option->get_lnames().empty() ? option->get_name() : option->get_lnames().front();
      const auto [first, fresh] = line_of_option.emplace(name, line_no);
      SHARDLM_CHECK(fresh, "{}: key '{}' sets --{} again (line {} set it already)", where(), key, name,
                    first->second);
      option_of_key[key] = name;
    }

    std::istringstream again(text);
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(again);
    for (CLI::ConfigItem& item : items) {
      const auto it = option_of_key.find(item.name);
      SHARDLM_CHECK(it != option_of_key.end() && item.parents.empty(),
                    "{}: could not read key '{}' (expected KEY = VALUE lines)", file, item.fullname());
      item.name = it->second;
      item.parents = {cmd.get_name()};
    }
    return items;
  }

 private:
  const CLI::App& top_;
};

}  // namespace

void enable_config_files(CLI::App& app) {
  app.config_formatter(std::make_shared<SubcommandConfigFile>(app));
  // Hidden: users give --config after the subcommand, which hands it here.
  app.set_config(kConfigFlag, "", "Read flags from a TOML file")->group("");
}

void add_config_flag(CLI::App& cmd) {
  CLI::App* top = cmd.get_parent();
  cmd.add_option_function<std::string>(
         kConfigFlag,
         [top](const std::string& path) {
           SHARDLM_CHECK(std::filesystem::is_regular_file(path),
                         "--config {}: no such file (expected a TOML file of KEY = VALUE lines)", path);
           CLI::Option* config = top->get_config_ptr();
           config->clear();
           config->add_result(path);
         },
         "Read flags from a TOML file: KEY = VALUE lines, keys are the flags without their dashes "
         "(lr = 3e-4, lora-rank = 8, dataset = [\"a.jsonl\"], resume = true); flags on the command line "
         "override it. A run writes RUN/config.toml, which --config reads back")
      ->trigger_on_parse()
      ->configurable(false);
}

std::vector<CommandFlag> command_flags(const CLI::App& cmd) {
  std::vector<CommandFlag> out;
  for (const CLI::Option* option : cmd.get_options()) {
    if (option == cmd.get_help_ptr() || option == cmd.get_help_all_ptr() || option->get_lnames().empty() ||
        option->get_lnames().front() == "config" || !option->get_configurable())
      continue;
    CommandFlag f;
    f.name = option->get_lnames().front();
    f.given = option->count() > 0;
    f.list = option->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
    if (f.given) {
      f.values = option->results();
      if (!f.list && !f.values.empty()) f.values = {f.values.back()};  // TakeLast
    } else if (!option->get_default_str().empty()) {
      f.values = {option->get_default_str()};
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace shardlm::cli
