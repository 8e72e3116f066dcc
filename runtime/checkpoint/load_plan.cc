#include "runtime/checkpoint/load_plan.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "global_step3, global_step6" (the last few when there are many).
std::string tag_list(const std::vector<std::string>& tags) {
  std::string out;
  const std::size_t first = tags.size() > 4 ? tags.size() - 4 : 0;
  if (first > 0) out = fmt::format("{} more, ..., ", first);
  for (std::size_t i = first; i < tags.size(); ++i) out += (i > first ? ", " : "") + tags[i];
  return out;
}

}  // namespace

std::int64_t step_of_tag(const std::string& name) {
  const std::string prefix = "global_step";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  std::int64_t v = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<std::string> list_checkpoints(const std::string& save_dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  // Error codes rather than exceptions: with checkpoint.overwrite, rank 0 may be removing
  // entries while other ranks list them; a vanished entry is simply not a checkpoint.
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return {};
  for (fs::directory_iterator it(save_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::int64_t step = step_of_tag(name);
    std::error_code type_ec;
    if (step >= 0 && it->is_directory(type_ec)) found.emplace_back(step, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [step, name] : found) tags.push_back(std::move(name));
  return tags;
}

std::vector<std::string> remove_checkpoints(const std::string& save_dir) {
  std::vector<std::string> removed = list_checkpoints(save_dir);
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return removed;
  // `latest` first: a run killed half-way through leaves no pointer to a half-deleted tag.
  fs::remove(fs::path(save_dir) / "latest");
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    std::string tag = name;
    for (const char* suffix : {".tmp", ".old"}) {
      if (ends_with(name, suffix)) tag = name.substr(0, name.size() - std::string(suffix).size());
    }
    if (step_of_tag(tag) >= 0 && entry.is_directory()) fs::remove_all(entry.path());
  }
  return removed;
}

LoadPlan plan_load(const CheckpointConfig& config) {
  LoadPlan plan;
  const std::string& save_dir = config.save_dir;
  std::string tag = config.load;
  if (config.loads_latest()) {
    const auto latest = read_latest(save_dir);
    if (latest) {
      tag = *latest;
      plan.note = fmt::format("checkpoint.load is \"{}\" and {} names {}: resuming from it",
                              config.load, (fs::path(save_dir) / "latest").string(), tag);
    } else {
      tag.clear();
      plan.note =
          fmt::format("checkpoint.load is \"{}\" and {} holds no checkpoint: starting fresh",
                      config.load, save_dir);
    }
  } else if (config.loads_nothing()) {
    tag.clear();
    plan.note = "checkpoint.load is \"none\": starting fresh";
  }
  if (!tag.empty()) {
    const fs::path dir = fs::path(save_dir) / tag;
    std::error_code ec;
    if (!fs::exists(dir, ec) && !fs::exists(fs::path(save_dir) / (tag + ".old"), ec)) {
      const std::vector<std::string> there = list_checkpoints(save_dir);
      ZRT_THROW(InvalidArgument, "checkpoint.load: no checkpoint {} in {}{} ({}){}", tag, save_dir,
                config.loads_latest() ? " although 'latest' names it" : "",
                there.empty() ? std::string("it holds none") : "it holds " + tag_list(there),
                config.loads_latest() ? "" : "; name one of them, or \"auto\" for the newest");
    }
    if (!fs::exists(dir / "index.h5")) {
      // Re-saving a tag moves the previous copy to <tag>.old, then the new one in: a job killed
      // between the two renames leaves the complete previous copy there.
      const fs::path old = fs::path(save_dir) / (tag + ".old");
      const std::string hint =
          fs::exists(old / "index.h5")
              ? fmt::format(
                    " ({} holds the tag's previous copy, complete, left by a save "
                    "interrupted while replacing it: rename it to {} to resume from it)",
                    old.string(), dir.string())
              : std::string();
      ZRT_THROW(InvalidArgument,
                "checkpoint.load: {} is not a complete checkpoint (no index.h5){}{}", dir.string(),
                config.loads_latest() ? " although 'latest' names it" : "", hint);
    }
    if (plan.note.empty())
      plan.note = fmt::format("checkpoint.load names {}: resuming from it", tag);
    plan.dir = dir.string();
    return plan;
  }
  // A fresh start. Its saves would replace `latest` and same-numbered tags of another run:
  // also a run that saves only when preempted (zrt-train saves then, save_interval 0 or not),
  // and in the same output_dir its metrics.jsonl would replace the history of the checkpoints
  // left there.
  const std::vector<std::string> existing = list_checkpoints(save_dir);
  if (existing.empty()) return plan;
  if (!config.overwrite) {
    // Said without a source location: this is the user's decision to make, not a bug.
    const std::string fix =
        config.loads_latest()
            ? fmt::format(
                  "There is no 'latest' file naming one of them; to continue that run, "
                  "set checkpoint.load to one of their tags")
            : "To continue that run, set checkpoint.load to \"auto\"";
    throw InvalidArgument(fmt::format(
        "checkpoint.save_dir {} already holds checkpoints ({}) and this run starts fresh "
        "(checkpoint.load is \"{}\"), so its saves would overwrite them{}. {}; to keep both, "
        "choose another checkpoint.save_dir (or output_dir); to replace them, set "
        "checkpoint.overwrite to true",
        save_dir, tag_list(existing), config.load,
        config.saves() ? "" : " (a preemption saves, whatever save_interval says)", fix));
  }
  plan.clear_save_dir = true;
  plan.note += fmt::format(" (checkpoint.overwrite: the checkpoints in {} are removed: {})",
                           save_dir, tag_list(existing));
  return plan;
}

}  // namespace zrt::checkpoint
