// shardlm: one binary, one subcommand per job. Each subcommand's logic lives in its
// room; this file only parses flags (CLI11) and turns errors into one line + exit 1.
#include <CLI/CLI.hpp>

#include <omp.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "shardlm/cli/commands.hpp"
#include "shardlm/cli/config_file.hpp"
#include "shardlm/cli/swift_flags.hpp"
#include "shardlm/core/error.hpp"
#include "shardlm/model/family.hpp"

namespace shardlm::cli {

void apply_threads_flag(const std::optional<int>& threads) {
  SHARDLM_CHECK(!threads || *threads >= 1, "--threads must be >= 1, got {}", threads.value_or(0));
  if (threads) omp_set_num_threads(*threads);
}

namespace {

// "GPT-2, Llama, Qwen2, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral": the families model/family.hpp registers, as their
// model cards spell them.
std::string trained_families_text() {
  std::string names;
  for (const std::string& family : model_family_names()) {
    const std::string name = family == "gpt2"    ? "GPT-2"
                             : family == "llama" ? "Llama"
                             : family == "qwen2" ? "Qwen2"
                             : family == "qwen3" ? "Qwen3"
                             : family == "qwen3_moe" ? "Qwen3-MoE"
                             : family == "qwen2_moe" ? "Qwen2-MoE"
                             : family == "mixtral"   ? "Mixtral"
                                                     : family;
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

}  // namespace

}  // namespace shardlm::cli

int main(int argc, char** argv) {
  CLI::App app{"shardlm: train and fine-tune decoder-only language models (" +
               shardlm::cli::trained_families_text() + ") on one or many processes"};
  app.require_subcommand(1);
  shardlm::cli::enable_config_files(app);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  // What was built, for a machine the binary was carried to (scripts/gpu_check.sh).
  app.set_version_flag("--version", "shardlm (CPU kernels -march=" SHARDLM_BUILD_MARCH ", "
                                    SHARDLM_BUILD_CUDA ")");
  shardlm::cli::register_prepare(app);
  shardlm::cli::register_train(app);
  shardlm::cli::register_sft(app);
  shardlm::cli::register_sample(app);
  shardlm::cli::register_chat(app);
  shardlm::cli::register_inspect(app);
  shardlm::cli::register_launch(app);
  shardlm::cli::register_export(app);
  shardlm::cli::register_eval(app);
  shardlm::cli::register_plan(app);
  shardlm::cli::register_calibrate(app);
  shardlm::cli::register_bench(app);
  shardlm::cli::register_report(app);
  try {
    // sft reads ms-swift's spellings of its flags too (cli/swift_flags.hpp).
    std::vector<std::string> args(argv, argv + argc);
    if (argc > 1 && args[1] == "sft") {
      const std::vector<std::string> rest = shardlm::cli::rewrite_swift_flags({args.begin() + 2, args.end()});
      args.resize(2);
      args.insert(args.end(), rest.begin(), rest.end());
    }
    std::vector<char*> rewritten;
    for (auto& a : args) rewritten.push_back(a.data());
    app.parse(static_cast<int>(rewritten.size()), rewritten.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const shardlm::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", e.what());
    return 1;
  }
  return 0;
}
