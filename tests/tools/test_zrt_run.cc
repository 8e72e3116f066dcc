// tools/zrt-run builds the mpirun command line this machine needs (checked with --dry-run).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

namespace {
std::string run(const std::string& args, int* status = nullptr,
                const std::string& environment = "") {
  const std::string cmd = environment + " " + std::string(ZRT_RUN_SCRIPT) + " " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 256> buf{};
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int rc = pclose(pipe.release());
  if (status != nullptr) *status = WEXITSTATUS(rc);
  return out;
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

TEST_CASE("zrt-run runs zrt-train for a config file and rejects bad usage") {
  CHECK_THAT(run("--dry-run -n 4 configs/demo.json"),
             Catch::Contains("zrt-train --config configs/demo.json") ||
                 Catch::Contains("zrt-train not found"));
  // Arguments after the config pass through: zrt-train's config overrides (zrt-train found
  // on PATH, as where it is installed).
  const std::string train_dir = std::filesystem::path(ZRT_TRAIN_EXE).parent_path().string();
  CHECK_THAT(run("--dry-run -n 4 configs/demo.json --train.steps 5 --seed=3", nullptr,
                 "PATH=" + train_dir + ":$PATH"),
             Catch::EndsWith(train_dir +
                             "/zrt-train --config configs/demo.json --train.steps 5 --seed=3\n"));
  int status = 0;
  CHECK_THAT(run("./prog", &status), Catch::Contains("-n N is required"));
  CHECK(status == 2);
  CHECK_THAT(run("-n zero ./prog", &status), Catch::Contains("-n needs a positive integer"));
  CHECK_THAT(run("--hostfile /nonexistent -n 2 ./prog", &status),
             Catch::Contains("cannot read hostfile"));
}
