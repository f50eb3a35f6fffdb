// Registration of each subcommand's flags and callback on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace shardlm::cli {

void register_prepare(CLI::App& app);
void register_train(CLI::App& app);
void register_sample(CLI::App& app);
void register_inspect(CLI::App& app);
void register_launch(CLI::App& app);
void register_export(CLI::App& app);
void register_eval(CLI::App& app);

}  // namespace shardlm::cli
