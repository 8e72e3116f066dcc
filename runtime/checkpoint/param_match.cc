#include "runtime/checkpoint/param_match.h"

#include <algorithm>
#include <unordered_map>

#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace {

std::vector<std::string> name_parts(const std::string& name) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t dot = name.find('.', begin);
    parts.push_back(name.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

std::string join_parts(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ".") + p;
  return out;
}

bool is_index(const std::string& part) {
  return !part.empty() && part.size() < 9 &&
         part.find_first_not_of("0123456789") == std::string::npos;
}

std::string shape_text(const std::vector<std::int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

std::int64_t row_elements(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

}  // namespace

ParamSources find_params(const CheckpointIndex& index, const std::vector<ParamSpec>& params,
                         const std::string& path) {
  std::unordered_map<std::string, int> row;
  for (std::size_t q = 0; q < index.params.size(); ++q) {
    if (!row.emplace(index.params[q].name, static_cast<int>(q)).second) {
      ZRT_THROW(InvalidArgument, "{}: dataset '/param_name': parameter '{}' is listed twice", path,
                index.params[q].name);
    }
  }
  auto find = [&](const std::string& name) -> const ParamEntry* {
    const auto it = row.find(name);
    return it == row.end() ? nullptr : &index.params[static_cast<std::size_t>(it->second)];
  };
  auto row_of = [&](const ParamEntry* e) { return static_cast<int>(e - index.params.data()); };
  ParamSources out;
  for (const ParamSpec& want : params) {
    const std::int64_t numel = want.numel();
    if (const ParamEntry* e = find(want.name)) {
      if (e->shape != want.shape) {
        ZRT_THROW(InvalidArgument,
                  "{}: dataset '/param_name': parameter '{}' is {} in the checkpoint but {} in "
                  "the model (another model?)",
                  path, want.name, shape_text(e->shape), shape_text(want.shape));
      }
      out.push_back({ParamSource{0, numel, row_of(e), 0}});
      continue;
    }
    const std::vector<std::string> parts = name_parts(want.name);
    std::vector<ParamSource> found;
    // An expert's own parameter "A.<e>.B": row e of the stacked "A.B".
    for (std::size_t k = parts.size(); k-- > 1 && found.empty();) {
      if (!is_index(parts[k])) continue;
      std::vector<std::string> stacked = parts;
      stacked.erase(stacked.begin() + static_cast<std::ptrdiff_t>(k));
      const ParamEntry* e = find(join_parts(stacked));
      if (e == nullptr) continue;
      const std::int64_t expert = std::stoll(parts[k]);
      std::vector<std::int64_t> shape = want.shape;
      if (e->shape.empty() ||
          std::vector<std::int64_t>(e->shape.begin() + 1, e->shape.end()) != shape) {
        ZRT_THROW(InvalidArgument,
                  "{}: parameter '{}' {} of the model is not a row of the checkpoint's stacked "
                  "'{}' {}",
                  path, want.name, shape_text(want.shape), e->name, shape_text(e->shape));
      }
      if (expert >= e->shape.front()) {
        ZRT_THROW(InvalidArgument,
                  "{}: the model's parameter '{}' is expert {}, but the checkpoint's '{}' {} "
                  "stacks {} (another model?)",
                  path, want.name, expert, e->name, shape_text(e->shape), e->shape.front());
      }
      found.push_back(ParamSource{0, numel, row_of(e), expert * numel});
    }
    // A stacked parameter "A.B" of shape [E] + S: the rows "A.<e>.B", e < E.
    for (std::size_t k = parts.size(); k-- > 1 && found.empty() && !want.shape.empty();) {
      const std::vector<std::int64_t> row_shape(want.shape.begin() + 1, want.shape.end());
      auto row_name = [&](std::int64_t e) {
        std::vector<std::string> own = parts;
        own.insert(own.begin() + static_cast<std::ptrdiff_t>(k), std::to_string(e));
        return join_parts(own);
      };
      const ParamEntry* first = find(row_name(0));
      if (first == nullptr || first->shape != row_shape) continue;
      const std::int64_t n = row_elements(row_shape);
      for (std::int64_t e = 0; e < want.shape.front(); ++e) {
        const ParamEntry* own = find(row_name(e));
        if (own == nullptr || own->shape != row_shape) {
          ZRT_THROW(InvalidArgument,
                    "{}: the model's parameter '{}' {} stacks {} experts, but the checkpoint has "
                    "no '{}' {} (another model, or fewer experts?)",
                    path, want.name, shape_text(want.shape), want.shape.front(), row_name(e),
                    shape_text(row_shape));
        }
        found.push_back(ParamSource{e * n, n, row_of(own), 0});
      }
    }
    if (found.empty()) {
      ZRT_THROW(InvalidArgument,
                "{}: the model's parameter '{}' {} is not in the checkpoint, which holds {} "
                "parameters (another model, or experts it does not hold?)",
                path, want.name, shape_text(want.shape), index.params.size());
    }
    out.push_back(std::move(found));
  }
  return out;
}

std::vector<float> assemble_param(const std::vector<ParamSource>& sources,
                                  const std::vector<std::vector<float>>& values) {
  std::int64_t numel = 0;
  for (const ParamSource& s : sources) numel = std::max(numel, s.first + s.count);
  std::vector<float> out(static_cast<std::size_t>(numel));
  for (const ParamSource& s : sources) {
    const std::vector<float>& from = values[static_cast<std::size_t>(s.row)];
    std::copy(from.begin() + s.at, from.begin() + s.at + s.count, out.begin() + s.first);
  }
  return out;
}

}  // namespace zrt::checkpoint
