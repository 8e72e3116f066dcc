// checkpoint.load against what save_dir holds (runtime/checkpoint/load_plan.h), without a run:
// "auto" resumes from `latest` or starts fresh; "none" refuses to save over existing
// checkpoints unless overwrite is true (and then clears them); "latest" and a tag keep their
// meaning. zrt-train end to end: test_checkpoint_train ([overwrite]).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <optional>

#include "runtime/checkpoint/load_plan.h"
#include "runtime/checkpoint/save_dir_lock.h"
#include "runtime/common/error.h"

using namespace zrt;
using namespace zrt::checkpoint;
namespace fs = std::filesystem;

namespace {

// A save_dir with complete-looking checkpoints at `steps` (an index.h5 each) and `latest`.
fs::path save_dir_with(const std::string& name, std::initializer_list<int> steps,
                       const std::string& latest) {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_load_plan" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const int step : steps) {
    const fs::path tag = dir / ("global_step" + std::to_string(step));
    fs::create_directories(tag);
    std::ofstream(tag / "index.h5") << "x";
  }
  if (!latest.empty()) std::ofstream(dir / "latest") << latest << "\n";
  return dir;
}

CheckpointConfig config_for(const fs::path& dir, const std::string& load, bool saves = true) {
  CheckpointConfig c;
  c.save_dir = dir.string();
  c.load = load;
  c.save_interval = saves ? 10 : 0;
  return c;
}

std::string error_of(const CheckpointConfig& c) {
  try {
    plan_load(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the default is auto: resume from latest when there is one", "[load-plan]") {
  CHECK(CheckpointConfig{}.load == "auto");
  const fs::path dir = save_dir_with("auto", {2, 4}, "global_step4");
  const LoadPlan plan = plan_load(config_for(dir, "auto"));
  REQUIRE(plan.dir.has_value());
  CHECK(*plan.dir == (dir / "global_step4").string());
  CHECK_THAT(plan.note, Catch::Contains("names global_step4: resuming from it"));
  CHECK_FALSE(plan.clear_save_dir);
  // "latest" means the same.
  CHECK(*plan_load(config_for(dir, "latest")).dir == *plan.dir);
  // A tag resumes from that tag.
  CHECK(*plan_load(config_for(dir, "global_step2")).dir == (dir / "global_step2").string());
}

TEST_CASE("auto without checkpoints starts fresh", "[load-plan]") {
  const fs::path empty = save_dir_with("auto_empty", {}, "");
  const LoadPlan plan = plan_load(config_for(empty, "auto"));
  CHECK_FALSE(plan.dir.has_value());
  CHECK_THAT(plan.note, Catch::Contains("holds no checkpoint: starting fresh"));
  // A save_dir that does not exist yet is the usual first run.
  CHECK_FALSE(plan_load(config_for(empty / "not_yet", "auto")).dir.has_value());
}

TEST_CASE("none refuses to save over existing checkpoints, naming the dir and the fixes",
          "[load-plan]") {
  const fs::path dir = save_dir_with("none", {3, 6}, "global_step6");
  const std::string message = error_of(config_for(dir, "none"));
  CHECK_THAT(message, Catch::Contains("checkpoint.save_dir " + dir.string() +
                                      " already holds checkpoints (global_step3, global_step6)"));
  CHECK_THAT(message, Catch::Contains("set checkpoint.load to \"auto\""));
  CHECK_THAT(message, Catch::Contains("set checkpoint.overwrite to true"));
  CHECK_THAT(message, Catch::Contains("choose another checkpoint.save_dir"));
  // A run with no save_interval too: a preemption saves (and in the same output_dir its
  // metrics.jsonl would replace the history of the checkpoints kept there).
  CHECK_THAT(error_of(config_for(dir, "none", /*saves=*/false)),
             Catch::Contains("already holds checkpoints (global_step3, global_step6)") &&
                 Catch::Contains("(a preemption saves, whatever save_interval says)"));
  // Nothing was touched.
  CHECK(list_checkpoints(dir.string()) == std::vector<std::string>{"global_step3", "global_step6"});
}

TEST_CASE("none with overwrite clears the save_dir", "[load-plan]") {
  const fs::path dir = save_dir_with("overwrite", {3, 6}, "global_step6");
  fs::create_directories(dir / "global_step9.tmp");  // an abandoned save
  std::ofstream(dir / "notes.txt") << "mine";
  CheckpointConfig c = config_for(dir, "none");
  c.overwrite = true;
  const LoadPlan plan = plan_load(c);
  CHECK_FALSE(plan.dir.has_value());
  CHECK(plan.clear_save_dir);
  CHECK(remove_checkpoints(dir.string()) ==
        std::vector<std::string>{"global_step3", "global_step6"});
  CHECK(list_checkpoints(dir.string()).empty());
  CHECK_FALSE(fs::exists(dir / "latest"));
  CHECK_FALSE(fs::exists(dir / "global_step9.tmp"));
  CHECK(fs::exists(dir / "notes.txt"));  // not a checkpoint: left alone
}

TEST_CASE("checkpoints without latest are not overwritten by a fresh auto start", "[load-plan]") {
  const fs::path dir = save_dir_with("no_latest", {5}, "");
  CHECK_THAT(error_of(config_for(dir, "auto")),
             Catch::Contains("no 'latest' file naming one of them"));
}

TEST_CASE("a tag or latest that is not a complete checkpoint is an error", "[load-plan]") {
  const fs::path dir = save_dir_with("missing", {2}, "global_step7");
  // No such directory: said so, with the tags there are.
  CHECK_THAT(error_of(config_for(dir, "auto")),
             Catch::Contains("checkpoint.load: no checkpoint global_step7 in " + dir.string() +
                             " although 'latest' names it (it holds global_step2)"));
  CHECK_THAT(error_of(config_for(dir, "global_step3")),
             Catch::Contains("no checkpoint global_step3 in " + dir.string() +
                             " (it holds global_step2); name one of them, or \"auto\" for the "
                             "newest"));
  // A directory without its index: a save that did not complete.
  fs::create_directories(dir / "global_step7");
  fs::create_directories(dir / "global_step3");
  CHECK_THAT(error_of(config_for(dir, "auto")),
             Catch::Contains("global_step7 is not a complete checkpoint (no index.h5) although "
                             "'latest' names it"));
  CHECK_THAT(error_of(config_for(dir, "global_step3")),
             Catch::Contains("global_step3 is not a complete checkpoint"));
}

TEST_CASE("step tags", "[load-plan]") {
  CHECK(step_of_tag("global_step12") == 12);
  CHECK(step_of_tag("global_step") == -1);
  CHECK(step_of_tag("global_step1x") == -1);
  CHECK(step_of_tag("latest") == -1);
}

// Re-saving a tag moves the old copy to <tag>.old before the new one goes in: a job killed in
// between leaves `latest` naming a missing tag; the error points at the complete .old copy.
TEST_CASE("latest naming a tag whose re-save was interrupted points at its .old copy",
          "[load-plan]") {
  const fs::path dir = save_dir_with("interrupted_resave", {4}, "global_step8");
  fs::create_directories(dir / "global_step8.old");
  std::ofstream(dir / "global_step8.old" / "index.h5") << "x";
  CHECK_THAT(error_of(config_for(dir, "auto")),
             Catch::Contains("global_step8 is not a complete checkpoint (no index.h5) although "
                             "'latest' names it") &&
                 Catch::Contains((dir / "global_step8.old").string() +
                                 " holds the tag's previous copy, complete") &&
                 Catch::Contains("rename it to " + (dir / "global_step8").string()));
}

// One job per save_dir: a second lock on it is refused, naming the directory, until the first
// is released (flock: the kernel drops it when the holder's process ends, however it ends).
TEST_CASE("a save_dir another job holds is refused; released, it is free", "[save-dir-lock]") {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_load_plan" / "locked";
  fs::remove_all(dir);
  std::optional<SaveDirLock> first(std::in_place, dir.string());
  REQUIRE(first->held());  // a local file system has flock
  CHECK_THROWS_WITH(SaveDirLock(dir.string()),
                    Catch::Contains("checkpoint.save_dir " + dir.string() +
                                    " is in use by another running job") &&
                        Catch::Contains("give this run its own save_dir"));
  first.reset();
  const SaveDirLock again(dir.string());
  CHECK(again.held());
  // The lock file is not a checkpoint: listing and clearing the directory leave it be.
  CHECK(list_checkpoints(dir.string()).empty());
}

// The start-up write probe: a file of its own, created and removed; a name another process
// left is stepped past (and kept); the failure names the path, the reason and the remedy.
TEST_CASE("why_not_writable probes with a file of its own and says what to fix",
          "[save-dir-lock]") {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_load_plan" / "probe";
  fs::remove_all(dir);
  CHECK(why_not_writable((dir / "made").string(), "host-1-rank0").empty());
  CHECK(fs::is_directory(dir / "made"));  // created on the way
  CHECK(fs::is_empty(dir / "made"));      // the probe removed
  // A probe left by a killed process with the same name: not reused, not removed.
  std::ofstream(dir / "made" / ".write-probe-host-1-rank0") << "left";
  CHECK(why_not_writable((dir / "made").string(), "host-1-rank0").empty());
  CHECK(fs::exists(dir / "made" / ".write-probe-host-1-rank0"));
  CHECK_FALSE(fs::exists(dir / "made" / ".write-probe-host-1-rank0.1"));
  // A path through a regular file.
  std::ofstream(dir / "file") << "not a directory";
  CHECK_THAT(why_not_writable((dir / "file" / "ckpt").string(), "x"),
             Catch::Contains((dir / "file" / "ckpt").string() + ": Not a directory") &&
                 Catch::Contains("fix the path"));
  CHECK_THAT(why_not_writable((dir / "made").string(), "x", /*simulate_denied=*/true),
             Catch::Contains((dir / "made" / ".write-probe-x").string() +
                             ": Permission denied; the run's user may not write there"));
}
