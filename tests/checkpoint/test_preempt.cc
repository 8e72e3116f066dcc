// Preemption and storage faults end to end, in real processes (mpirun -n 2 zrt-train, a new job
// per run; tools/zrt_train.cc, train/checkpoint_policy.cc, docs/launching.md):
//  - SIGTERM to every rank in the middle of a step's gradient accumulation, SIGUSR1 to one rank
//    only, SIGUSR1 to mpirun (which forwards it), SIGTERM during an async save: exit status 75
//    within the grace period, `latest` names a checkpoint of the step reached, and that
//    checkpoint, the resumed run's last one and the losses of every step are bit for bit those
//    of one uninterrupted run;
//  - a second signal during the save, and checkpoint.preempt_grace_s running out during a slow
//    save: exit status 76, `latest` still the previous checkpoint, which resumes bit-exactly;
//  - checkpoint.save_interval_minutes: wall-clock saves on (nearly) every step with a short
//    interval, none but the last with a long one, each bit-identical to the uninterrupted run's;
//  - [storage] (hidden: its own ctest entry) a full disk (a 600 KiB tmpfs as save_dir; skipped with
//  status 77 where mount is
//    not permitted) and a directory the run may not write (EACCES): an error naming the file
//    and the errno text, no crash, `latest` intact and identical to the uninterrupted run's
//    checkpoint; checkpoint.on_save_error "continue" trains on to the end.
// The signals come from the processes themselves (ZRT_FAULT_INJECT sigterm / sigusr1 at
// fault points, runtime/common/fault.h) except the one sent to mpirun from here.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/data/token_shard.h"
#include "tests/checkpoint/compare_runs.h"

using namespace zrt;
using zrt::test::latest_dir;
using zrt::test::metrics_losses;
using zrt::test::require_identical_state;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSteps = 8;
constexpr int kExitPreempted = 75;
constexpr int kExitPreemptedUnsaved = 76;

// A directory per process (ctest runs the [storage] cases beside the others), removed at exit.
const fs::path& root() {
  struct Removed {
    fs::path dir;
    ~Removed() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  };
  static const Removed removed{fs::temp_directory_path() /
                               ("zrt_test_preempt_" + std::to_string(getpid()))};
  static const fs::path dir = [] {
    const fs::path d = removed.dir;
    fs::remove_all(d);
    fs::create_directories(d);
    std::string text;
    for (int i = 0; i < 400; ++i) text += "And the evening and the morning were the first day. ";
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((d / "t_train_000000.bin").string(), tokens.data(), tokens.size());
    return d;
  }();
  return dir;
}

// One zrt-train job: 2 ranks, ZeRO stage 2, 2 micro-batches per step (a signal can land
// mid-accumulation), one metrics row per step.
struct Job {
  std::string name;
  int steps = kSteps;
  nlohmann::json checkpoint = nlohmann::json::object();  // the block's keys besides save_dir
  std::string save_dir;                                  // default <output>/ckpt
  std::string env;                                       // "NAME=value ..."
  double latency_us = 0;  // comm.simulated_latency_us: slower steps, same numbers
  bool keep_output = false;
};

fs::path out_of(const Job& job) {
  return root() / job.name;
}

std::string save_dir_of(const Job& job) {
  return job.save_dir.empty() ? (out_of(job) / "ckpt").string() : job.save_dir;
}

std::string command(const Job& job) {
  const fs::path out = out_of(job);
  if (!job.keep_output) fs::remove_all(out);
  fs::create_directories(out);
  nlohmann::json k = job.checkpoint;
  k["save_dir"] = save_dir_of(job);
  if (!k.contains("preempt_grace_s")) k["preempt_grace_s"] = 60;
  const nlohmann::json c = {
      {"train_batch_size", 8},
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}, {"warmup_max_lr", 0.003}}}}},
      {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 20000}}},
      {"model", {{"preset", "gpt2-tiny"}, {"seq_len", 32}}},
      {"data", {{"train", (root() / "t_train_*.bin").string()}, {"shuffle", true}}},
      {"train", {{"steps", job.steps}, {"log_interval", 1}}},
      {"device", {{"type", "cpu"}}},
      {"comm", {{"simulated_latency_us", job.latency_us}}},
      {"checkpoint", k},
      {"output_dir", out.string()},
  };
  std::ofstream(out / "run.json") << c.dump(2);
  return job.env + " exec " + ZRT_MPIEXEC + " -n 2 --oversubscribe --bind-to none " + ZRT_TRAIN +
         " --config " + (out / "run.json").string() + " > " + (out / "log.txt").string() + " 2>&1";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A job started in the background, in a session of its own (so it can always be cleaned up).
struct Started {
  pid_t pid = -1;
  Clock::time_point at;
};

Started start_shell(const std::string& cmd) {
  Started s;
  s.at = Clock::now();
  s.pid = fork();
  REQUIRE(s.pid >= 0);
  if (s.pid == 0) {
    setsid();
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return s;
}

Started start(const Job& job) {
  return start_shell(command(job));
}

// Waits for the job (at most `limit_s`; then it is killed and the test fails); returns its exit
// status (128 + n for a signal n).
int finish(const Started& s, double limit_s = 240) {
  int status = 0;
  while (true) {
    const pid_t r = waitpid(s.pid, &status, WNOHANG);
    if (r == s.pid) break;
    if (std::chrono::duration<double>(Clock::now() - s.at).count() > limit_s) {
      kill(-s.pid, SIGKILL);
      waitpid(s.pid, &status, 0);
      FAIL("the job did not end within " << limit_s << " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run(const Job& job, std::string* log = nullptr) {
  const int status = finish(start(job));
  if (log != nullptr) *log = read_text(out_of(job) / "log.txt");
  return status;
}

// The uninterrupted run every other run is compared with: kSteps steps, a checkpoint after each.
const std::string& reference_save_dir() {
  static const std::string dir = [] {
    Job whole;
    whole.name = "whole";
    whole.checkpoint = {{"save_interval", 1}};
    std::string log;
    const int status = run(whole, &log);
    INFO(log);
    REQUIRE(status == 0);
    REQUIRE(metrics_losses(out_of(whole) / "metrics.jsonl").size() == kSteps);
    return save_dir_of(whole);
  }();
  return dir;
}

std::string reference_checkpoint(std::int64_t step) {
  return reference_save_dir() + "/global_step" + std::to_string(step);
}

std::int64_t latest_step(const std::string& save_dir) {
  const auto tag = checkpoint::read_latest(save_dir);
  REQUIRE(tag.has_value());
  return checkpoint::open_index(fs::path(save_dir) / *tag).step;
}

// After a stop at `step` (`latest` names it): a new job resumes (checkpoint.load "auto") and
// runs to kSteps; the checkpoint at the stop, the last one and every step's loss (one history in
// metrics.jsonl) must be the uninterrupted run's, bit for bit.
void require_resume_bit_exact(Job job, std::int64_t step) {
  const std::string save_dir = save_dir_of(job);
  REQUIRE(latest_step(save_dir) == step);
  require_identical_state(latest_dir(save_dir), reference_checkpoint(step));
  job.env = "";
  job.keep_output = true;
  job.checkpoint["async"] = false;
  std::string log;
  const int status = run(job, &log);
  INFO(log);
  REQUIRE(status == 0);
  CHECK_THAT(log, Catch::Contains("resumed from") &&
                      Catch::Contains("global_step" + std::to_string(step)));
  REQUIRE(latest_step(save_dir) == kSteps);
  require_identical_state(latest_dir(save_dir), reference_checkpoint(kSteps));
  const auto want = metrics_losses(fs::path(reference_save_dir()).parent_path() / "metrics.jsonl");
  const auto got = metrics_losses(out_of(job) / "metrics.jsonl");
  REQUIRE(got.size() == kSteps);
  for (std::int64_t s = 1; s <= kSteps; ++s) {
    INFO("step " << s);
    CHECK(got.at(s) == want.at(s));  // bit for bit
  }
}

// A preempted job: exit status 75 and a checkpoint of the step it stopped at, which must be in
// [first, last] (a signal from the async writer thread lands while training goes on), then the
// resume is bit-exact. Returns the step.
std::int64_t preempt_case(const Job& job, std::int64_t first, std::int64_t last) {
  reference_save_dir();
  std::string log;
  const int status = run(job, &log);
  INFO(job.name << ":\n" << log);
  CHECK(status == kExitPreempted);
  const std::int64_t step = latest_step(save_dir_of(job));
  CHECK(step >= first);
  CHECK(step <= last);
  CHECK_THAT(log, Catch::Contains("stop requested") &&
                      Catch::Contains("preempted at step " + std::to_string(step)));
  require_resume_bit_exact(job, step);
  return step;
}

}  // namespace

TEST_CASE("SIGTERM to every rank mid-accumulation: save at that step, exit 75, exact resume",
          "[preempt]") {
  Job job;
  job.name = "sigterm_all";
  job.checkpoint = {{"save_interval", 2}};
  // Step 3's first micro-batch is done when every rank signals itself.
  job.env = "ZRT_FAULT_INJECT=sigterm:step=3";
  preempt_case(job, 3, 3);
}

TEST_CASE("SIGUSR1 reaching one rank stops every rank at the same step", "[preempt]") {
  Job job;
  job.name = "sigusr1_rank1";
  job.checkpoint = {{"save_interval", 3}};
  job.env = "ZRT_FAULT_INJECT=sigusr1:rank=1:step=5";
  preempt_case(job, 5, 5);
}

TEST_CASE("SIGTERM during an async save: that save completes, then the stop's save", "[preempt]") {
  Job job;
  job.name = "sigterm_async";
  job.checkpoint = {{"save_interval", 2}, {"async", true}};
  // Raised on the writer threads as step 2's files are about to be written.
  job.env = "ZRT_FAULT_INJECT=sigterm:point=checkpoint.write:step=2";
  job.latency_us = 5000;  // steps long enough for the stop to come before the last one
  // The stop comes at the first step boundary after the signal: step 3 or later.
  preempt_case(job, 3, kSteps - 1);
  require_identical_state(save_dir_of(job) + "/global_step2", reference_checkpoint(2));
}

TEST_CASE("SIGUSR1 to mpirun: forwarded to the ranks, saved and exited within the grace",
          "[preempt]") {
  reference_save_dir();
  Job job;
  job.name = "sigusr1_mpirun";
  job.checkpoint = {{"save_interval", 100}, {"preempt_grace_s", 30}};
  job.latency_us = 20000;  // slower steps (a sleep per collective), the same arithmetic
  const Started s = start(job);
  // Signal once step 2 is logged.
  const fs::path metrics = out_of(job) / "metrics.jsonl";
  while (metrics_losses(metrics).size() < 2 &&
         std::chrono::duration<double>(Clock::now() - s.at).count() < 120) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(kill(s.pid, SIGUSR1) == 0);
  const auto signalled = Clock::now();
  const int status = finish(s);
  const double took = std::chrono::duration<double>(Clock::now() - signalled).count();
  const std::string log = read_text(out_of(job) / "log.txt");
  INFO(log);
  CHECK(status == kExitPreempted);
  INFO("signal to exit: " << took << " s");
  CHECK(took < 30.0);
  const std::int64_t step = latest_step(save_dir_of(job));
  CHECK(step >= 2);
  REQUIRE(step < kSteps);
  require_resume_bit_exact(job, step);
}

TEST_CASE("a second signal during the save exits 76 at once; the previous checkpoint resumes",
          "[preempt]") {
  reference_save_dir();
  Job job;
  job.name = "second_signal";
  job.checkpoint = {{"save_interval", 2}};
  job.env = "ZRT_FAULT_INJECT=sigterm:step=3,sigterm:point=checkpoint.write:step=3";
  std::string log;
  const int status = run(job, &log);
  INFO(log);
  CHECK(status == kExitPreemptedUnsaved);
  CHECK_THAT(log, Catch::Contains("a second preemption signal"));
  CHECK(fs::exists(save_dir_of(job) + "/global_step3.tmp"));  // abandoned mid-save
  require_resume_bit_exact(job, 2);
}

TEST_CASE("checkpoint.preempt_grace_s running out during a slow save exits 76", "[preempt]") {
  reference_save_dir();
  Job job;
  job.name = "grace_out";
  job.checkpoint = {{"save_interval", 2}, {"preempt_grace_s", 1}};
  // Only the stop's save (step 3) is slow: 60 s, against a grace of 1 s. The whole job ends
  // well before that save could have (start-up and steps take a few seconds, ~25 s on a loaded
  // CI machine), so the bound holds without timing the rest of the job.
  job.env =
      "ZRT_FAULT_INJECT=sigterm:step=3 ZRT_TEST_CKPT_WRITE_DELAY_MS=60000 "
      "ZRT_TEST_CKPT_WRITE_DELAY_STEP=3";
  std::string log;
  const auto t = Clock::now();
  const int status = run(job, &log);
  INFO(log);
  CHECK(status == kExitPreemptedUnsaved);
  CHECK_THAT(log, Catch::Contains("checkpoint.preempt_grace_s ran out"));
  const double took = std::chrono::duration<double>(Clock::now() - t).count();
  INFO("whole job: " << took << " s");
  CHECK(took < 60.0);
  require_resume_bit_exact(job, 2);
}

// checkpoint.on_save_error "continue" trains on through a failed save, but a stop request's
// save has no training after it: the run ends unsaved (76), saying so, and the previous
// checkpoint resumes.
TEST_CASE("a stop's save that fails under on_save_error continue exits 76", "[preempt]") {
  reference_save_dir();
  Job job;
  job.name = "stop_save_fails";
  job.checkpoint = {{"save_interval", 2}, {"on_save_error", "continue"}};
  job.env = "ZRT_FAULT_INJECT=sigterm:step=3,throw:point=checkpoint.write:rank=1:step=3";
  std::string log;
  const int status = run(job, &log);
  INFO(log);
  CHECK(status == kExitPreemptedUnsaved);
  CHECK_THAT(log, Catch::Contains("fault injected at checkpoint.write (rank 1, step 3)"));
  CHECK_THAT(log, Catch::Contains("the run stops unsaved (checkpoint.on_save_error "
                                  "\"continue\"), latest is global_step2"));
  CHECK_THAT(log, !Catch::Contains("training goes on"));
  require_resume_bit_exact(job, 2);
}

// ---- storage faults ------------------------------------------------------------------------

namespace {

// A tmpfs of `size` mounted at `dir`, unmounted at the end; exits 77 (ctest: skipped) where the
// test may not mount.
struct SmallTmpfs {
  fs::path dir;
  SmallTmpfs(fs::path where, const std::string& size) : dir(std::move(where)) {
    umount2(dir.c_str(), MNT_DETACH);
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string options = "size=" + size;
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      std::printf("SKIPPED: cannot mount a %s tmpfs at %s (%s): run as root to test a full disk\n",
                  size.c_str(), dir.c_str(), std::strerror(errno));
      std::exit(77);
    }
  }
  ~SmallTmpfs() { umount2(dir.c_str(), MNT_DETACH); }
};

}  // namespace

TEST_CASE("a full disk: the error names the file and ENOSPC, latest stays loadable", "[.storage]") {
  reference_save_dir();
  // Room for one checkpoint (2 rank files and the index, about 1.4 MB for this model), not for
  // two: 1.6 times the uninterrupted run's first checkpoint.
  std::int64_t one = 0;
  for (const auto& entry : fs::directory_iterator(reference_checkpoint(1))) {
    one += static_cast<std::int64_t>(entry.file_size());
  }
  SmallTmpfs tmpfs(root() / "full", std::to_string(one * 16 / 10 / 1024) + "k");
  for (const bool keep_going : {false, true}) {
    const std::string save_dir = (tmpfs.dir / (keep_going ? "continue" : "stop")).string();
    Job job;
    job.name = keep_going ? "enospc_continue" : "enospc_stop";
    job.save_dir = save_dir;
    job.checkpoint = {{"save_interval", 1}, {"on_save_error", keep_going ? "continue" : "stop"}};
    fs::remove_all(tmpfs.dir / "stop");  // the second pass gets the whole tmpfs
    std::string log;
    const int status = run(job, &log);
    INFO(log);
    CHECK_THAT(log, Catch::Contains("No space left on device") &&
                        Catch::Contains(save_dir + "/global_step2.tmp/"));
    if (keep_going) {
      // Every step trained, but the last step's save failed too: no checkpoint holds the
      // result, so the run ends in an error naming what is lost (it ended with 0 before).
      CHECK(status == 1);
      CHECK_THAT(log,
                 Catch::Contains("training goes on") && Catch::Contains("latest is global_step1"));
      CHECK_THAT(log, Catch::Contains("that was the run's last step"));
      CHECK_THAT(log, Catch::Contains("training reached step " + std::to_string(kSteps) +
                                      ", but no checkpoint holds it: " +
                                      std::to_string(kSteps - 1) + " save(s) failed"));
      CHECK(metrics_losses(out_of(job) / "metrics.jsonl").size() == kSteps);
    } else {
      CHECK(status == 1);  // an error, not a crash (139: SIGSEGV)
    }
    REQUIRE(latest_step(save_dir) == 1);
    require_identical_state(latest_dir(save_dir), reference_checkpoint(1));
    CHECK_FALSE(fs::exists(save_dir + "/global_step2"));
  }
}

TEST_CASE("zrt-ckpt on a full disk: the earlier export stays whole, no partial file is left",
          "[.storage]") {
  const std::string checkpoint = reference_checkpoint(1);
  const std::string tool = ZRT_CKPT;
  const auto ckpt = [&](const std::string& args, std::string* out) {
    const Started s =
        start_shell(tool + " " + args + " > " + (root() / "ckpt.txt").string() + " 2>&1");
    const int status = finish(s, 120);
    *out = read_text(root() / "ckpt.txt");
    return status;
  };
  // The sizes of the two exports, measured on the ordinary disk.
  std::string out;
  std::map<std::string, std::int64_t> size;
  for (const std::string dtype : {"bf16", "fp32"}) {
    const fs::path dir = root() / ("export-" + dtype);
    fs::remove_all(dir);
    REQUIRE(ckpt("export " + checkpoint + " --hf " + dir.string() + " --dtype " + dtype, &out) ==
            0);
    size[dtype] = static_cast<std::int64_t>(fs::file_size(dir / "model.safetensors"));
  }
  // Room for the bf16 export and half of the fp32 one: the fp32 export over the bf16 one cannot
  // be written whole beside it.
  SmallTmpfs tmpfs(root() / "full-export",
                   std::to_string((size["bf16"] + size["fp32"] / 2) / 1024 + 64) + "k");
  const fs::path hf = tmpfs.dir / "hf";
  REQUIRE(ckpt("export " + checkpoint + " --hf " + hf.string() + " --dtype bf16", &out) == 0);
  const std::string before = read_text(hf / "model.safetensors");
  const std::string config_before = read_text(hf / "config.json");
  const int status = ckpt("export " + checkpoint + " --hf " + hf.string() + " --dtype fp32", &out);
  INFO(out);
  CHECK(status == 1);
  CHECK_THAT(out, Catch::Contains("No space left on device"));
  // The earlier export as it was: its weights and its config (the new config is written after
  // the weights), and nothing half-written beside it.
  CHECK(read_text(hf / "model.safetensors") == before);
  CHECK(read_text(hf / "config.json") == config_before);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(hf)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names ==
        std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"});
  // consolidate's output file, and export --safetensors's, do not fit either: their partial
  // files go too.
  const std::string h5 = (tmpfs.dir / "model.h5").string();
  CHECK(ckpt("consolidate " + checkpoint + " --out " + h5, &out) == 1);
  CHECK_THAT(out, Catch::Contains("No space left on device"));
  const std::string single = (tmpfs.dir / "model.safetensors").string();
  CHECK(ckpt("export " + checkpoint + " --safetensors " + single, &out) == 1);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmpfs.dir)) {
    left.push_back(e.path().filename().string());
  }
  CHECK(left == std::vector<std::string>{"hf"});
}

TEST_CASE("a save_dir the run may not write: EACCES named, latest stays loadable", "[.storage]") {
  reference_save_dir();
  Job job;
  job.name = "eacces";
  job.checkpoint = {{"save_interval", 2}};
  job.steps = 2;
  std::string log;
  REQUIRE(run(job, &log) == 0);
  const std::string save_dir = save_dir_of(job);
  fs::permissions(save_dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read |
                                fs::perms::others_exec);
  // Root ignores permission bits: then the job runs without the capabilities that let it.
  const auto run_without_write = [&](const std::string& on_save_error) {
    job.steps = 4;
    job.keep_output = true;
    job.checkpoint = {{"save_interval", 2}, {"on_save_error", on_save_error}};
    std::string cmd = command(job);
    if (geteuid() == 0)
      cmd = "exec capsh --drop=cap_dac_override,cap_dac_read_search -- -c '" + cmd + "'";
    const int status = finish(start_shell(cmd));
    log = read_text(out_of(job) / "log.txt");
    return status;
  };
  // "stop": refused at the start, before any step is trained (the first save would end it).
  int status = run_without_write("stop");
  {
    INFO(log);
    CHECK(status == 1);
    CHECK_THAT(log, Catch::Contains("checkpoint.save_dir " + save_dir + " cannot be written (") &&
                        Catch::Contains("Permission denied"));
    // The job would resume at step 2: its first step logged would be 3.
    CHECK_THAT(log, !Catch::Contains("step      3/4") && !Catch::Contains("resumed from"));
  }
  // "continue": trained through, each save failing with EACCES named; the last one too, so the
  // run ends in an error.
  status = run_without_write("continue");
  fs::permissions(save_dir, fs::perms::owner_all, fs::perm_options::add);
  INFO(log);
  CHECK(status == 1);
  CHECK_THAT(
      log, Catch::Contains("Permission denied") && Catch::Contains(save_dir + "/global_step4.tmp"));
  CHECK_THAT(log, Catch::Contains("training reached step 4, but no checkpoint holds it"));
  CHECK_THAT(log, Catch::Contains("step      3/4"));  // what "stop" must not have logged
  REQUIRE(latest_step(save_dir) == 2);
  require_identical_state(latest_dir(save_dir), reference_checkpoint(2));
}

TEST_CASE("checkpoint.save_interval_minutes saves by rank 0's clock on every rank", "[preempt]") {
  for (const double minutes : {0.001, 60.0}) {
    Job job;
    job.name = minutes < 1 ? "minutes_short" : "minutes_long";
    // No step interval; steps of about 0.1 s (a sleep per collective) against 60 ms.
    job.checkpoint = {{"save_interval_minutes", minutes}};
    job.latency_us = 5000;
    std::string log;
    const int status = run(job, &log);
    INFO(log);
    REQUIRE(status == 0);
    std::vector<std::int64_t> saved;
    for (std::int64_t s = 1; s <= kSteps; ++s) {
      if (fs::exists(save_dir_of(job) + "/global_step" + std::to_string(s) + "/index.h5")) {
        saved.push_back(s);
      }
    }
    INFO("checkpoints at steps " << saved.size());
    REQUIRE_FALSE(saved.empty());
    CHECK(saved.back() == kSteps);  // and after the last step, as with save_interval
    if (minutes < 1) {
      CHECK(saved.size() >= 3);  // a wall-clock save on (nearly) every step
    } else {
      CHECK(saved.size() == 1);
    }
    for (const std::int64_t s : saved) {
      require_identical_state(save_dir_of(job) + "/global_step" + std::to_string(s),
                              reference_checkpoint(s));
    }
  }
}
