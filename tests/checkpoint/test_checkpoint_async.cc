// The Checkpointer's snapshot buffer and async failures, under mpirun (1 or 2 ranks):
//  - save(request, fill) allocates the snapshot buffer once and reuses it; each async save's
//    files hold exactly the state of its own step (the buffer is refilled only after the
//    previous save has committed), and match a synchronous save of the same state written from
//    an owned snapshot (every dataset and checksum);
//  - an async save of a ZeroEngine (CPU backend, stage 2, device-resident and offloaded state)
//    copies the state on the engine's stream, off the training thread: with the copy held back
//    300 ms and the next step's update issued at once, the file still holds the pre-step state
//    (equal to a sync save of it), so step() really waited; and training is bit-exact with a run
//    that never saved;
//  - a synchronous save (also one an async checkpointer is asked for) writes the engine's state
//    from where it lives (CPU backend, offload): no snapshot filled or allocated, the same files;
//  - a failed state copy fails the save on every rank (naming the copy) and commits nothing;
//  - a failed async save is logged by the writer thread at once, before the training loop asks
//    (the tag and the reason, naming the path), and the next wait() rethrows it on every rank.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <mpi.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/engine_state.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "tests/engine/engine_test_util.h"

using namespace zrt;
using namespace zrt::checkpoint;
namespace fs = std::filesystem;

namespace {

int mpi_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A fresh directory every rank sees (one machine); one per world size, since ctest runs the
// np1 and np2 jobs side by side.
fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("zrt_test_ckpt_async_np" + std::to_string(mpi_size())) / name;
  if (mpi_rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

std::vector<ParamSpec> model() {
  return {{"a.w", {300, 7}, {0}, false}, {"a.b", {7}, {0}, true}, {"b.w", {7, 1000}, {1}, false}};
}

PartitionPlan plan() {
  PartitionOptions o;
  o.stage = 2;
  o.world = mpi_size();
  o.bucket_elements = 4000;
  o.alignment = 4;
  o.num_modules = 2;
  return PartitionPlan(model(), o);
}

CheckpointIndex index_for(const PartitionPlan& p, std::int64_t step) {
  CheckpointIndex index;
  index.step = step;
  index.stage = 2;
  index.config_json = "{}";
  fill_tables(index, model(), p);
  return index;
}

// The state of a step: distinct per step, rank, array and element.
float value(std::int64_t step, int array, std::int64_t e) {
  return static_cast<float>(step * 100000 + mpi_rank() * 20000 + e) + 0.25f * array;
}

void fill_state(std::int64_t step, std::int64_t n, const std::vector<float*>& arrays) {
  REQUIRE(arrays.size() == 3);  // master, exp_avg, exp_avg_sq (Adam's, the index default)
  for (std::int64_t e = 0; e < n; ++e) {
    for (int a = 0; a < 3; ++a) arrays[static_cast<std::size_t>(a)][e] = value(step, a, e);
  }
}

// One training step of `run` on step `step`'s data (as test::train_engine's loop body).
void train_step(test::EngineRun& run, int step, const test::TrainSpec& spec) {
  const int rank = run.group->rank();
  std::vector<float> x = test::batch(step, std::int64_t{rank} * test::kRows, test::kRows, 0);
  std::vector<float> t = test::batch(step, std::int64_t{rank} * test::kRows, test::kRows, 1);
  float loss = 0.f;
  run.model.forward_backward(*run.engine, *run.compute, x.data(), t.data(), test::kRows,
                             run.engine->loss_scale(), &loss);
  run.results.push_back(run.engine->step(spec.lr));
  run.compute->synchronize();  // x and t are read by the stream
}

// Where the engine's optimizer state lives: device memory (stage 2), offloaded (stage 2,
// pageable), or split (stage 3, offload_optimizer.ratio 0.5: the copy takes both paths).
enum class StatePlace { kDevice, kOffloaded, kSplit };
constexpr StatePlace kStatePlaces[] = {StatePlace::kDevice, StatePlace::kOffloaded,
                                       StatePlace::kSplit};
const char* place_name(StatePlace place) {
  return place == StatePlace::kDevice      ? "device"
         : place == StatePlace::kOffloaded ? "offload"
                                           : "split";
}

EngineOptions state_options(StatePlace place) {
  EngineOptions options;
  options.stage = place == StatePlace::kSplit ? 3 : 2;
  options.offload_optimizer.enabled = place != StatePlace::kDevice;
  options.offload_optimizer.pin_memory = false;
  if (place == StatePlace::kSplit) options.offload_optimizer.ratio = 0.5;
  return options;
}

// The request to save `engine`'s state as step `step`.
SaveRequest engine_request(const ZeroEngine& engine, std::int64_t step) {
  SaveRequest request;
  request.tag = Checkpointer::tag_for_step(step);
  request.index.step = step;
  request.index.config_json = "{}";
  describe_engine(engine, request.index);
  return request;
}

std::vector<float> read_dataset(const fs::path& path, const char* name, std::int64_t n) {
  H5File f = H5File::open_read(path.string());
  H5Dataset ds(f, name, H5Elem::kFloat32, {n});
  std::vector<float> out(static_cast<std::size_t>(n));
  ds.read_all(out.data());  // verifies the checksums
  return out;
}

// Keeps every message logged while it is installed.
class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    text_.append(msg.payload.data(), msg.payload.size());
    text_ += "\n";
  }
  void flush_() override {}

 private:
  std::string text_;
};

}  // namespace

TEST_CASE("async saves reuse one snapshot buffer and write the state of their own step") {
  const fs::path dir = fresh_dir("reuse");
  const PartitionPlan p = plan();
  const std::int64_t n = p.total_shard();
  CheckpointConfig config;
  config.save_dir = (dir / "async").string();
  config.save_interval = 1;
  config.async = true;
  int allocations = 0;
  std::int64_t allocated = 0;
  {
    Checkpointer saver(config, 60.0);
    saver.set_host_allocator([&](std::int64_t bytes) {
      ++allocations;
      allocated = bytes;
      return std::shared_ptr<void>(std::shared_ptr<float[]>(new float[bytes / 4]));
    });
    for (std::int64_t step = 1; step <= 3; ++step) {
      SaveRequest request;
      request.tag = Checkpointer::tag_for_step(step);
      request.index = index_for(p, step);
      saver.save(std::move(request), [&](const std::vector<float*>& arrays) {
        // The buffer is refilled only once the previous save has committed.
        if (step > 1) {
          CHECK(read_latest(config.save_dir) == Checkpointer::tag_for_step(step - 1));
        }
        fill_state(step, n, arrays);
      });
    }
    saver.wait();
  }
  CHECK(allocations == 1);
  CHECK(allocated == 3 * 4 * n);

  // The same state of step 2 saved synchronously from an owned snapshot.
  CheckpointConfig sync_config = config;
  sync_config.save_dir = (dir / "sync").string();
  sync_config.async = false;
  {
    Checkpointer saver(sync_config, 60.0);
    SaveRequest request;
    request.tag = Checkpointer::tag_for_step(2);
    request.index = index_for(p, 2);
    request.snapshot.rank = mpi_rank();
    request.snapshot.assign(n);
    fill_state(2, n, request.snapshot.pointers());
    saver.save(std::move(request));
  }

  const std::string file = rank_file_name(mpi_rank());
  for (std::int64_t step = 1; step <= 3; ++step) {
    const fs::path path = fs::path(config.save_dir) / Checkpointer::tag_for_step(step) / file;
    H5File f = H5File::open_read(path.string());
    const std::vector<std::string> datasets = CheckpointIndex{}.state_datasets();
    for (int d = 0; d < 3; ++d) {
      const std::string& name = datasets[static_cast<std::size_t>(d)];
      INFO(path.string() << " " << name);
      H5Dataset ds(f, name, H5Elem::kFloat32, {n});
      std::vector<float> got(static_cast<std::size_t>(n));
      ds.read_all(got.data());  // verifies the checksums
      for (std::int64_t e = 0; e < n; ++e)
        REQUIRE(got[static_cast<std::size_t>(e)] == value(step, d, e));
    }
  }
  // Step 2, async from the reused buffer and sync from an owned copy: same data, same checksums.
  H5File a = H5File::open_read((fs::path(config.save_dir) / "global_step2" / file).string());
  H5File s = H5File::open_read((fs::path(sync_config.save_dir) / "global_step2" / file).string());
  for (const std::string& name : CheckpointIndex{}.state_datasets()) {
    INFO(name);
    H5Dataset da(a, name, H5Elem::kFloat32, {n});
    H5Dataset ds(s, name, H5Elem::kFloat32, {n});
    std::vector<float> va(static_cast<std::size_t>(n)), vs(static_cast<std::size_t>(n));
    da.read_all(va.data());
    ds.read_all(vs.data());
    CHECK(va == vs);
    H5Id ia(H5Dopen2(a.id(), name.c_str(), H5P_DEFAULT));
    H5Id is(H5Dopen2(s.id(), name.c_str(), H5P_DEFAULT));
    const std::int64_t blocks = (n * 4 + kTensorBlockBytes - 1) / kTensorBlockBytes;
    CHECK(read_attr_u32(ia.get(), "crc32c", name, blocks) ==
          read_attr_u32(is.get(), "crc32c", name, blocks));
  }
}

TEST_CASE("an async save of an engine copies off the training thread; the next step waits") {
  for (const StatePlace place : kStatePlaces) {
    INFO("optimizer state: " << place_name(place));
    const fs::path dir = fresh_dir(std::string("engine_") + place_name(place));
    const EngineOptions options = state_options(place);
    const test::TrainSpec spec;
    auto run = test::make_engine(options, spec);
    auto reference = test::make_engine(options, spec);  // never saves
    for (int step = 0; step < 2; ++step) {
      train_step(*run, step, spec);
      train_step(*reference, step, spec);
    }
    ZeroEngine& engine = *run->engine;
    auto request_for = [&](std::int64_t step) { return engine_request(engine, step); };
    CheckpointConfig config;
    config.save_dir = (dir / "sync").string();
    config.save_interval = 1;
    {  // The reference: the state after step 2, saved synchronously.
      Checkpointer saver(config, 60.0);
      saver.save(request_for(2),
                 [&](const std::vector<float*>& arrays) { snapshot_engine(engine, arrays); });
    }
    config.save_dir = (dir / "async").string();
    config.async = true;
    {
      Checkpointer saver(config, 60.0);
      bool filled = false;
      saver.save(
          request_for(2), [&](const std::vector<float*>&) { filled = true; },
          [&](const std::vector<float*>& arrays) {
            return snapshot_engine_async(engine, arrays, /*delay_ms=*/300);
          });
      CHECK_FALSE(filled);  // the training thread only issued the copy
      // The next step's update is issued while the copy is held back: it must wait for it.
      train_step(*run, 2, spec);
      train_step(*reference, 2, spec);
      saver.wait();
    }
    const std::int64_t n = engine.plan().total_shard();
    const std::string file = rank_file_name(mpi_rank());
    const fs::path sync_file = dir / "sync" / "global_step2" / file;
    const fs::path async_file = dir / "async" / "global_step2" / file;
    std::vector<float> now(static_cast<std::size_t>(3 * n));  // the state after step 3
    snapshot_engine(engine, {now.data(), now.data() + n, now.data() + 2 * n});
    const std::vector<std::string> datasets = CheckpointIndex{}.state_datasets();
    bool differs_from_now = false;  // so the file holds step 2's state, not step 3's
    for (int d = 0; d < 3; ++d) {
      const std::string& dataset = datasets[static_cast<std::size_t>(d)];
      INFO(dataset);
      const std::vector<float> want = read_dataset(sync_file, dataset.c_str(), n);
      REQUIRE(read_dataset(async_file, dataset.c_str(), n) == want);
      differs_from_now |= !std::equal(want.begin(), want.end(), now.begin() + d * n);
    }
    CHECK(differs_from_now);
    // Saving did not disturb training: bit-exact with the run that never saved.
    for (int p = 0; p < static_cast<int>(run->model.parameters().size()); ++p) {
      CHECK(engine.full_parameter(p) == reference->engine->full_parameter(p));
    }
  }
}

TEST_CASE("a synchronous save writes the engine's state in place: no copy, the same files") {
  for (const StatePlace place : kStatePlaces) {
    INFO("optimizer state: " << place_name(place));
    const fs::path dir = fresh_dir(std::string("in_place_") + place_name(place));
    const EngineOptions options = state_options(place);
    const test::TrainSpec spec;
    auto run = test::make_engine(options, spec);
    for (int step = 0; step < 2; ++step) train_step(*run, step, spec);
    ZeroEngine& engine = *run->engine;
    // The CPU backend's state (and offload's) is host memory: one run per unit and array.
    const auto view = engine_state_view(engine);
    REQUIRE(view.size() == 3);
    for (const auto& runs : view) CHECK(runs.size() == engine.plan().units().size());
    auto request_for = [&](bool synchronous) {
      SaveRequest request = engine_request(engine, 2);
      request.synchronous = synchronous;
      return request;
    };
    auto copy = [&](const std::vector<float*>& arrays) { snapshot_engine(engine, arrays); };
    CheckpointConfig config;
    config.save_interval = 1;
    config.save_dir = (dir / "copied").string();
    {  // The reference: copied into the snapshot buffer, then written.
      Checkpointer saver(config, 60.0);
      saver.save(request_for(false), copy);
    }
    // Sync, and an async checkpointer asked for a synchronous save (a preemption's): written
    // from the engine's memory, never filling or allocating the snapshot buffer.
    for (const bool async : {false, true}) {
      INFO("checkpoint.async " << async);
      config.async = async;
      config.save_dir = (dir / (async ? "in_place_async" : "in_place_sync")).string();
      Checkpointer saver(config, 60.0);
      int allocations = 0;
      saver.set_host_allocator([&](std::int64_t bytes) {
        ++allocations;
        return std::shared_ptr<void>(new float[static_cast<std::size_t>(bytes / 4)],
                                     std::default_delete<float[]>());
      });
      bool filled = false;
      saver.save(
          request_for(async), [&](const std::vector<float*>&) { filled = true; }, {},
          [&] { return engine_state_view(engine); });
      CHECK(fs::exists(fs::path(config.save_dir) / "global_step2" / "index.h5"));  // committed
      CHECK_FALSE(filled);
      CHECK(allocations == 0);
    }
    const std::int64_t n = engine.plan().total_shard();
    const std::string file = rank_file_name(mpi_rank());
    for (const std::string& dataset : CheckpointIndex{}.state_datasets()) {
      INFO(dataset);
      const std::vector<float> want =
          read_dataset(dir / "copied" / "global_step2" / file, dataset.c_str(), n);
      for (const char* sub : {"in_place_sync", "in_place_async"}) {
        INFO(sub);
        CHECK(read_dataset(dir / sub / "global_step2" / file, dataset.c_str(), n) == want);
      }
    }
  }
}

TEST_CASE("a failed async save is logged by the writer at once and rethrown by wait()") {
  const fs::path dir = fresh_dir("fail");
  // save_dir lies under a regular file: rank 0 cannot create it.
  const fs::path blocker = dir / "not_a_directory";
  if (mpi_rank() == 0) std::ofstream(blocker) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  const PartitionPlan p = plan();
  CheckpointConfig config;
  config.save_dir = (blocker / "ckpt").string();
  config.save_interval = 1;
  config.async = true;
  auto sink = std::make_shared<CaptureSink>();
  spdlog::default_logger()->sinks().push_back(sink);
  Checkpointer saver(config, 60.0);
  SaveRequest request;
  request.tag = "global_step5";
  request.index = index_for(p, 5);
  saver.save(std::move(request),
             [&](const std::vector<float*>& arrays) { fill_state(5, p.total_shard(), arrays); });
  // The training loop has not asked yet: the writer thread must report on its own.
  const auto start = std::chrono::steady_clock::now();
  while (sink->text().find("async save failed") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string logged = sink->text();
  spdlog::default_logger()->sinks().pop_back();
  INFO(logged);
  CHECK_THAT(logged, Catch::Contains("checkpoint global_step5: async save failed: "));
  CHECK_THAT(logged, Catch::Contains("global_step5: preparing the directory failed on rank"));
  // Every rank's message carries rank 0's reason, the directory and what went wrong.
  CHECK_THAT(logged, Catch::Contains("failed on rank 0: ") &&
                         Catch::Contains("cannot create " + config.save_dir + "/global_step5.tmp"));
  CHECK_THROWS_WITH(saver.wait(), Catch::Contains("global_step5: preparing the directory failed"));
  CHECK_NOTHROW(saver.wait());  // reported once
}

TEST_CASE("a failed state copy fails the async save on every rank and commits nothing") {
  const fs::path dir = fresh_dir("copy_fails");
  const PartitionPlan p = plan();
  CheckpointConfig config;
  config.save_dir = (dir / "ckpt").string();
  config.save_interval = 1;
  config.async = true;
  Checkpointer saver(config, 60.0);
  SaveRequest request;
  request.tag = "global_step7";
  request.index = index_for(p, 7);
  saver.save(
      std::move(request), [](const std::vector<float*>&) { FAIL("the filler must not run"); },
      [](const std::vector<float*>&) -> std::function<void()> {
        // Rank 0's copy fails (a stream error, say); the writer hears of it when it waits.
        return [] {
          if (mpi_rank() == 0) throw std::runtime_error("planted copy failure");
        };
      });
  // Every rank's error names rank 0 and carries its reason.
  CHECK_THROWS_WITH(saver.wait(), Catch::Contains("global_step7: writing the files failed on "
                                                  "rank 0: copying the state into the "
                                                  "snapshot: planted copy failure"));
  CHECK_FALSE(read_latest(config.save_dir).has_value());
  CHECK_FALSE(fs::exists(fs::path(config.save_dir) / "global_step7"));
}
