#include "train/frozen_parameters.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "runtime/common/error.h"
#include "runtime/common/name_pattern.h"

namespace zrt::train {
namespace {

bool matches_any(const std::vector<std::string>& patterns, const std::string& name,
                 std::vector<std::int64_t>& matches) {
  bool any = false;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    if (name_matches_pattern(patterns[i], name)) {
      ++matches[i];
      any = true;
    }
  }
  return any;
}

const char* key_of(const ModelConfig& model) {
  return model.trainable.empty() ? "model.frozen" : "model.trainable";
}

const std::vector<std::string>& patterns_of(const ModelConfig& model) {
  return model.trainable.empty() ? model.frozen : model.trainable;
}

// The model's names with every layer index written N, each once, in order: the shape of the
// names a pattern must match ("model.layers.N.mlp.up_proj.weight").
std::string name_shapes(const std::vector<ParamSpec>& params) {
  std::vector<std::string> shapes;
  for (const ParamSpec& p : params) {
    const std::string& name = p.pattern_name();
    std::string shape;
    std::size_t i = 0;
    while (i < name.size()) {
      const bool component_start = i == 0 || name[i - 1] == '.';
      std::size_t j = i;
      while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
      if (component_start && j > i && (j == name.size() || name[j] == '.')) {
        shape += 'N';
        i = j;
      } else {
        shape += name[i++];
      }
    }
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
  }
  return fmt::format("{}", fmt::join(shapes, ", "));
}

std::string elements_text(std::int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.1f}M", static_cast<double>(n) / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}

}  // namespace

FrozenMarks mark_frozen_parameters(const ModelConfig& model, std::vector<ParamSpec>& params) {
  const std::vector<std::string>& patterns = patterns_of(model);
  const bool listing_trainable = !model.trainable.empty();
  FrozenMarks marks;
  marks.matches.assign(patterns.size(), 0);
  for (ParamSpec& p : params) {
    const bool matched = matches_any(patterns, p.pattern_name(), marks.matches);
    p.frozen = listing_trainable ? !matched : matched;
    ++marks.total_params;
    marks.total_elements += p.numel();
    if (p.frozen) {
      ++marks.frozen_params;
      marks.frozen_elements += p.numel();
    }
  }
  return marks;
}

void check_frozen_patterns(const ModelConfig& model,
                           const std::vector<std::int64_t>& matches_anywhere,
                           std::int64_t trained_anywhere, const std::vector<ParamSpec>& params,
                           const std::string& model_description) {
  const std::vector<std::string>& patterns = patterns_of(model);
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    if (matches_anywhere[i] > 0) continue;
    problems.push_back(fmt::format("{}[{}] '{}' matches no parameter of {}", key_of(model), i,
                                   patterns[i], model_description));
  }
  if (!problems.empty()) {
    // Once, after the last of them: how patterns match, and the names they can match.
    problems.back() += fmt::format(
        " (a pattern with a '.' must match a whole name, one without a component of it; the "
        "names, layer indices written N: {})",
        name_shapes(params));
  }
  if (!patterns.empty() && trained_anywhere == 0) {
    problems.push_back(
        fmt::format("{} leaves no parameter of {} to train", key_of(model), model_description));
  }
  if (problems.empty()) return;
  ZRT_THROW(InvalidArgument, "{}", fmt::join(problems, "\n"));
}

std::string describe_backward_stop(const std::vector<ParamSpec>& params, int first_backward_module,
                                   int num_modules) {
  if (first_backward_module <= 0) return "";
  const auto lowest = std::find_if(params.begin(), params.end(), [&](const ParamSpec& p) {
    return !p.frozen && !p.modules.empty() && p.modules.front() == first_backward_module;
  });
  const bool one = first_backward_module == 1;
  return fmt::format(
      "backward ends at module {} of {}{}: {} below {} frozen parameters only and {} no backward",
      first_backward_module, num_modules,
      lowest != params.end() ? fmt::format(" ({} is the lowest trained parameter)", lowest->name)
                             : std::string(),
      one ? std::string("the module") : fmt::format("the {} modules", first_backward_module),
      one ? "holds" : "hold", one ? "runs" : "run");
}

std::string describe_frozen(const ModelConfig& model, const FrozenMarks& marks) {
  if (marks.frozen_params == 0) return "";
  return fmt::format(
      "frozen by {}: {} of {} parameters, {} of {} elements ({:.1f}%): their gradients are "
      "dropped and the optimizer leaves them as they are",
      key_of(model), marks.frozen_params, marks.total_params, elements_text(marks.frozen_elements),
      elements_text(marks.total_elements),
      100.0 * static_cast<double>(marks.frozen_elements) /
          static_cast<double>(std::max<std::int64_t>(marks.total_elements, 1)));
}

}  // namespace zrt::train
