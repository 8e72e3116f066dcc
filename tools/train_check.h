// zrt-train --check: validates a training config (with its command-line overrides) for a world
// size and prints it resolved (the batch rule solved, defaults filled in, warnings), then
// zrt-mem's memory estimate for its model, setting and world size. Needs no mpirun. Also reads
// the config document both modes of zrt-train start from.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace zrt::cli {

// The config file with the command-line overrides applied, and the paths they set.
struct ConfigDocument {
  nlohmann::json json;
  std::vector<std::string> command_line_paths;
};

// Reads `config_path` and applies `overrides` (apply_overrides). Throws InvalidArgument for an
// unreadable file or a bad override.
ConfigDocument read_config_document(const std::string& config_path,
                                    const ConfigOverrides& overrides);

// The model's own problems (what its build, sequence and expert parallelism and model.frozen
// would refuse) for a config that has problems of its own, checked on the config as read when
// every one of those is about a key the model's checks do not read; "" when there are none or
// the checks cannot run. Every problem at once: not the model's only after the config's are
// fixed. Lines without "file:line:"; the caller prefixes them ("FILE: model: ").
std::string model_problems_beside(const ConfigDocument& d, int world,
                                  const std::string& config_path);

struct CheckArguments {
  std::string config_path;
  ConfigOverrides overrides;
  // The ranks to check for; unset: the file's train_batch_size / (micro-batch x accumulation)
  // when it gives all three numbers, else 1.
  std::optional<int> world;
};

// Prints the report on stdout. Returns the exit status: 0 if the config is valid and its
// setting fits the device, 1 if not.
int check_training_config(const CheckArguments& args);

}  // namespace zrt::cli
