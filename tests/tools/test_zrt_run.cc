// tools/zrt-run builds the mpirun command line this machine needs (checked with --dry-run).
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

namespace {
// Runs `env_prefix script args` through the shell; returns stdout and stderr together.
std::string run_script(const std::string& env_prefix, const std::string& script,
                       const std::string& args, int* status = nullptr) {
  const std::string cmd = env_prefix + " " + script + " " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 256> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int rc = pclose(pipe.release());
  if (status != nullptr) *status = WEXITSTATUS(rc);
  return out;
}
std::string run_env(const std::string& env, const std::string& args, int* status = nullptr) {
  return run_script("env " + env, ZRT_RUN_SCRIPT, args, status);
}
std::string run(const std::string& args, int* status = nullptr) {
  return run_script("", ZRT_RUN_SCRIPT, args, status);
}
}  // namespace

TEST_CASE("zrt-run adds binding, threads, root and oversubscription flags") {
  const unsigned cores = std::thread::hardware_concurrency();
  const std::string two = run("--dry-run -n 2 ./prog --flag");
  CHECK_THAT(two, Catch::StartsWith("mpirun -n 2 --bind-to none"));
  CHECK_THAT(two, Catch::Contains("-x OPENBLAS_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive"));
  CHECK_THAT(two, Catch::EndsWith("./prog --flag\n"));
  if (getuid() == 0) CHECK_THAT(two, Catch::Contains("--allow-run-as-root"));
  const std::string many = run("--dry-run -n " + std::to_string(cores + 1) + " ./prog");
  CHECK_THAT(many, Catch::Contains("--oversubscribe"));
  CHECK_THAT(many, Catch::Contains("OMP_NUM_THREADS=1"));
  const std::string tcp = run("--dry-run --tcp -n 2 ./prog");
  CHECK_THAT(tcp, Catch::Contains("--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo"));
}

TEST_CASE("zrt-run sets OpenMPI's out-of-band keep-alive so a lost host ends mpirun") {
  CHECK_THAT(run("--dry-run -n 2 ./prog"),
             Catch::Contains("--mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1 "
                             "--mca oob_tcp_keepalive_probes 3"));
  CHECK_THAT(run_env("ZRT_RUN_KEEPALIVE=30,5,3", "--dry-run -n 2 ./prog"),
             Catch::Contains("--mca oob_tcp_keepalive_time 30 --mca oob_tcp_keepalive_intvl 5 "
                             "--mca oob_tcp_keepalive_probes 3"));
  CHECK_THAT(run_env("ZRT_RUN_KEEPALIVE=soon", "--dry-run -n 2 ./prog"),
             Catch::Contains("ZRT_RUN_KEEPALIVE must be TIME,INTERVAL,PROBES"));
}

TEST_CASE("zrt-run rejects bad usage") {
  int status = 0;
  CHECK_THAT(run("./prog", &status), Catch::Contains("-n N is required"));
  CHECK(status == 2);
  CHECK_THAT(run("-n zero ./prog", &status), Catch::Contains("-n needs a positive integer"));
  CHECK_THAT(run("--hostfile /nonexistent -n 2 ./prog", &status),
             Catch::Contains("cannot read hostfile"));
  CHECK(run("--help", &status).find("zrt-run -n N CONFIG.json") != std::string::npos);
  CHECK(status == 0);
  // An option without its value, a hostfile with no host: usage errors, not bash's.
  CHECK_THAT(run("-n", &status), Catch::Contains("zrt-run: -n needs 1 value(s)"));
  CHECK(status == 2);
  CHECK_THAT(run("--mca x", &status), Catch::Contains("zrt-run: --mca needs 2 value(s)"));
  CHECK(status == 2);
  const std::string empty_hosts =
      (std::filesystem::temp_directory_path() / "zrt_test_run_empty_hosts").string();
  std::ofstream(empty_hosts) << "# only a comment\n\n";
  CHECK_THAT(run("--hostfile " + empty_hosts + " -n 2 ./prog", &status),
             Catch::Contains("lists no host"));
  CHECK(status == 2);
}

// GNU nproc counts OMP_NUM_THREADS when it is set: zrt-run counts the cores (more ranks than
// cores must still oversubscribe), and --dry-run's line is quoted to paste back.
TEST_CASE("zrt-run counts cores whatever OMP_NUM_THREADS says; --dry-run quotes") {
  const unsigned cores = std::thread::hardware_concurrency();
  const std::string many = run_env("OMP_NUM_THREADS=" + std::to_string(4 * cores),
                                   "--dry-run -n " + std::to_string(cores + 1) + " ./prog");
  CHECK_THAT(many, Catch::Contains("--oversubscribe"));
  CHECK_THAT(run("--dry-run -n 1 './my prog' 'a b'"), Catch::EndsWith("./my\\ prog a\\ b\n"));
}

// mpirun kills the ranks on SIGTERM / SIGINT (a preemption's save cut short) and forwards
// SIGUSR1: zrt-run turns the first into the second and exits with mpirun's status. The rank
// here is a shell that exits 75 on SIGUSR1 (zrt-train's preemption status after its save).
TEST_CASE("zrt-run turns SIGTERM into SIGUSR1 for the ranks and exits with their status") {
  const auto dir = std::filesystem::temp_directory_path() / "zrt_test_run_signal";
  std::filesystem::create_directories(dir);
  const std::string rank = (dir / "rank.sh").string();
  {
    std::ofstream f(rank);
    f << "#!/bin/bash\ntrap 'echo got-usr1; exit 75' USR1\ntouch " << (dir / "ready").string()
      << "\nfor i in $(seq 300); do sleep 0.1; done\nexit 9\n";
  }
  std::filesystem::permissions(rank, std::filesystem::perms::owner_all);
  std::filesystem::remove(dir / "ready");
  const std::string pid_file = (dir / "pid").string();
  // zrt-run in the background; its pid, then SIGTERM once the rank runs.
  const std::string cmd = "( " + std::string(ZRT_RUN_SCRIPT) + " -n 1 " + rank + " & echo $! > " +
                          pid_file + "; wait $! ) 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  for (int i = 0; i < 300 && !std::filesystem::exists(dir / "ready"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(std::filesystem::exists(dir / "ready"));
  int pid = 0;
  std::ifstream(pid_file) >> pid;
  REQUIRE(pid > 0);
  REQUIRE(::kill(pid, SIGTERM) == 0);
  std::string out;
  std::array<char, 256> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int rc = pclose(pipe.release());
  INFO(out);
  CHECK_THAT(out, Catch::Contains("got-usr1"));
  CHECK(WEXITSTATUS(rc) == 75);
}

TEST_CASE("zrt-run finds zrt-train for a config file, from the source tree or a build") {
  // The build this test belongs to, named the way tools/test names it.
  const std::string build = ZRT_BUILD_DIR_FOR_TEST;
  CHECK_THAT(run_env("ZRT_BUILD_DIR=" + build,
                     "--dry-run -n 4 configs/demo.json --train.steps 5 --seed=3"),
             Catch::EndsWith(
                 build + "/bin/zrt-train --config configs/demo.json --train.steps 5 --seed=3\n"));

  // A source tree laid out as a user has it: tools/zrt-run and build/bin/zrt-train.
  const std::filesystem::path tree =
      std::filesystem::temp_directory_path() / ("zrt_run_test_" + std::to_string(getpid()));
  std::filesystem::remove_all(tree);
  std::filesystem::create_directories(tree / "tools");
  std::filesystem::create_directories(tree / "build" / "bin");
  std::filesystem::copy_file(ZRT_RUN_SCRIPT, tree / "tools" / "zrt-run");
  const auto fake_train = tree / "build" / "bin" / "zrt-train";
  std::ofstream(fake_train) << "#!/bin/sh\n";
  std::filesystem::permissions(fake_train, std::filesystem::perms::owner_all);
  const std::string script = (tree / "tools" / "zrt-run").string();
  const std::string clean_path = "env -u ZRT_BUILD_DIR PATH=/usr/bin:/bin";
  CHECK_THAT(run_script(clean_path, script, "--dry-run -n 2 c.json"),
             Catch::EndsWith(fake_train.string() + " --config c.json\n"));
  // The copy in build/bin (what the build installs there) finds its neighbour.
  std::filesystem::copy_file(ZRT_RUN_SCRIPT, tree / "build" / "bin" / "zrt-run");
  CHECK_THAT(run_script(clean_path, (tree / "build" / "bin" / "zrt-run").string(),
                        "--dry-run -n 2 c.json"),
             Catch::EndsWith(fake_train.string() + " --config c.json\n"));
  // Nowhere: the places looked in and the fix, exit 2.
  std::filesystem::remove(fake_train);
  int status = 0;
  const std::string missing = run_script(clean_path, script, "--dry-run -n 2 c.json", &status);
  CHECK(status == 2);
  CHECK_THAT(missing, Catch::Contains("zrt-train not found; looked in:") &&
                          Catch::Contains((tree / "build" / "bin").string()) &&
                          Catch::Contains("tools/build"));
  std::filesystem::remove_all(tree);
}

TEST_CASE("zrt-run passes every ZRT_ variable to the ranks") {
  const std::string out = run_env("ZRT_CPU_ISA=avx2 ZRT_LOG_LEVEL=error", "--dry-run -n 2 ./prog");
  CHECK_THAT(out, Catch::Contains("-x ZRT_CPU_ISA") && Catch::Contains("-x ZRT_LOG_LEVEL"));
}

TEST_CASE("zrt-run gives the ranks OpenBLAS's kernels for this CPU where it would fall back") {
  // Given by the user: passed through as it is.
  const std::string given = run_env("OPENBLAS_CORETYPE=Haswell", "--dry-run -n 2 ./prog");
  CHECK_THAT(given, Catch::Contains("-x OPENBLAS_CORETYPE ./prog"));
  // Not given: what zrt-train's OpenBLAS picks on this machine decides (it prints its choice at
  // load with OPENBLAS_VERBOSE=2): generic kernels on a CPU with AVX2 get the CPU's own.
  const std::string train = std::string(ZRT_BUILD_DIR_FOR_TEST) + "/bin/zrt-train";
  // (The test's own environment may set OPENBLAS_CORETYPE: cleared for these runs.)
  const std::string load =
      run_script("env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2", train, "--help");
  const auto at = load.find("Core: ");
  REQUIRE(at != std::string::npos);
  std::string core = load.substr(at + 6, load.find('\n', at) - at - 6);
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags, vendor;
  while (std::getline(cpuinfo, line) && (flags.empty() || vendor.empty())) {
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line + " ";
    if (line.rfind("vendor_id", 0) == 0 && vendor.empty()) vendor = line;
  }
  auto has = [&](const char* flag) {
    return flags.find(std::string(" ") + flag + " ") != std::string::npos;
  };
  std::string expected;
  const bool wide = core == "haswell" || core == "zen" || core == "skylakex" ||
                    core == "cooperlake" || core == "sapphirerapids" || core == "excavator";
  if (!wide && has("avx512f") && has("avx512bw") && has("avx512vl")) {
    expected = "SkylakeX";
  } else if (!wide && has("avx2") && has("fma")) {
    expected = vendor.find("AuthenticAMD") != std::string::npos ? "Zen" : "Haswell";
  }
  INFO("OpenBLAS core here: " << core << "; expected " << (expected.empty() ? "none" : expected));
  const std::string unset_core = "-u OPENBLAS_CORETYPE ZRT_BUILD_DIR=";
  const std::string out =
      run_env(unset_core + std::string(ZRT_BUILD_DIR_FOR_TEST), "--dry-run -n 2 ./prog");
  if (expected.empty()) {
    CHECK_THAT(out, !Catch::Contains("OPENBLAS_CORETYPE"));
  } else {
    CHECK_THAT(out, Catch::Contains("-x OPENBLAS_CORETYPE=" + expected + " ./prog"));
  }
  // With a hostfile the other hosts may be other CPUs, lacking that core's instructions: not set.
  const std::string hostfile =
      (std::filesystem::temp_directory_path() / "zrt_test_zrt_run_hosts").string();
  std::ofstream(hostfile) << "localhost slots=2\n";
  const std::string hosts = run_env(unset_core + std::string(ZRT_BUILD_DIR_FOR_TEST),
                                    "--dry-run -n 2 --hostfile " + hostfile + " ./prog");
  CHECK_THAT(hosts, !Catch::Contains("OPENBLAS_CORETYPE"));
  std::filesystem::remove(hostfile);
}
