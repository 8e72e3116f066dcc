// Rank-prefixed logging through spdlog. The logger is the one piece of global mutable state zrt
// allows: call init_logging() once per process after the rank is known.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace zrt {

// Configures the default spdlog logger so every line reads "[rank R] [level] message".
// The threshold is ZRT_LOG_LEVEL from the environment when it is set and not empty (it wins
// over `level`, so a job's verbosity can change without editing its config); otherwise `level`
// (trace|debug|info|warn|error|off), "info" when empty. Safe to call again (e.g. when the
// config's level becomes known).
void init_logging(int rank, const std::string& level = "");

// The same for a single-process tool (zrt-ckpt, zrt-mem): lines read "TOOL: [level] message",
// on stderr like every log line, so a tool's own output on stdout (JSON, tables) stays clean.
void init_tool_logging(const std::string& tool, const std::string& level = "");

// Parses a level name; throws InvalidArgument naming the valid ones.
spdlog::level::level_enum parse_log_level(const std::string& name);

}  // namespace zrt
