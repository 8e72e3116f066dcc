#include "runtime/common/log.h"

#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "runtime/common/error.h"

namespace zrt {

spdlog::level::level_enum parse_log_level(const std::string& name) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [n, level] : kLevels) {
    if (name == n) return level;
  }
  ZRT_THROW(InvalidArgument, "unknown log level '{}'; use trace, debug, info, warn, error or off",
            name);
}

namespace {

void configure_logger(const std::string& prefix, const std::string& level) {
  // ZRT_LOG_LEVEL wins over the level given (the config's log_level), as documented: one
  // switch for a whole job, without editing its file.
  const char* env = std::getenv("ZRT_LOG_LEVEL");
  const std::string chosen = env != nullptr && *env != '\0' ? env : level.empty() ? "info" : level;
  auto logger = spdlog::get("zrt");
  if (!logger) {
    logger = spdlog::stderr_color_mt("zrt");
    spdlog::set_default_logger(logger);
  }
  logger->set_pattern(prefix + " [%^%l%$] %v");
  logger->set_level(parse_log_level(chosen));
}

}  // namespace

void init_logging(int rank, const std::string& level) {
  configure_logger(fmt::format("[rank {}]", rank), level);
}

void init_tool_logging(const std::string& tool, const std::string& level) {
  configure_logger(tool + ":", level);
}

}  // namespace zrt
