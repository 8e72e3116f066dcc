// No host synchronization inside a training step, through the CUDA stand-ins: zrt-train on
// "device": {"type": "cuda"} at every stage, with the stand-in counting each host wait that
// drains a stream (waits for everything the host has enqueued there, so that on a GPU the
// stream idles until the host enqueues more; tests/standin/standin_core.h). The stand-in decides
// by the order of API calls, not by timing, so the counts are exact:
// - a micro-batch's forward and backward drain nothing, on any stream;
// - a quiet step drains nothing: the step's global decision (the gradient norm: clipping and the
//   skip) is taken on the device and the optimizer kernel reads it there; the host reads the
//   norm at the next step, after that step's micro-batches are enqueued, and that wait for an
//   earlier point of the stream is not a drain (ZeroEngine::enqueue_step);
// - in fp16 the loss scaler's next scale is taken on the host before the next forward, so each
//   step drains the compute stream once for the decision (with optimizer offload, which waits
//   for the gradients' copies to the host instead, not at all);
// - a logged step drains the compute stream once more, where the trainer reads the losses of
//   the steps since the last log. Before the losses were read only on logged steps, every step
//   drained it twice; before the decision went to the device, every step once.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "config/config.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/data/token_shard.h"
#include "runtime/device/cuda_device.h"
#include "runtime/engine/zero_engine.h"
#include "train/trainer.h"

extern "C" int zrt_standin_visit_host_drains(void (*visit)(cudaStream_t stream, long long drains,
                                                           void* ctx),
                                             void* ctx);

using namespace zrt;

namespace {

using Drains = std::map<cudaStream_t, long long>;

// The calling thread's drain counts so far, by stream.
Drains drains_now() {
  Drains out;
  zrt_standin_visit_host_drains([](cudaStream_t stream, long long count,
                                   void* ctx) { (*static_cast<Drains*>(ctx))[stream] = count; },
                                &out);
  return out;
}

// What `after` counted beyond `before`, streams with none left out.
Drains since(const Drains& before, const Drains& after) {
  Drains out;
  for (const auto& [stream, count] : after) {
    const auto it = before.find(stream);
    const long long delta = count - (it == before.end() ? 0 : it->second);
    if (delta != 0) out[stream] = delta;
  }
  return out;
}

std::string describe(const Drains& d, cudaStream_t compute) {
  std::ostringstream out;
  for (const auto& [stream, count] : d) {
    if (stream == compute) {
      out << "compute stream: " << count << "; ";
    } else {
      out << "stream " << static_cast<const void*>(stream) << ": " << count << "; ";
    }
  }
  return d.empty() ? "nothing" : out.str();
}

// The registry's model, its forward_backward watched: what each call drained.
class DrainWatchingModel : public Model {
 public:
  DrainWatchingModel(std::unique_ptr<Model> inner, std::vector<Drains>* inside)
      : inner_(std::move(inner)), inside_(inside) {}
  const Model& inner() const { return *inner_; }

  const std::vector<ParamSpec>& parameters() const override { return inner_->parameters(); }
  int num_modules() const override { return inner_->num_modules(); }
  void init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                      float* out) const override {
    inner_->init_parameter(index, seed, begin, count, out);
  }
  void forward_backward(ParamAccess& access, const TokenBatch& batch, float loss_scale) override {
    const Drains before = drains_now();
    inner_->forward_backward(access, batch, loss_scale);
    inside_->push_back(since(before, drains_now()));
  }
  void forward(ParamAccess& access, const TokenBatch& batch) override {
    inner_->forward(access, batch);
  }
  DevicePtr<const float> loss() const override { return inner_->loss(); }
  DevicePtr<const std::byte> logits() const override { return inner_->logits(); }
  std::int64_t logits_row_stride() const override { return inner_->logits_row_stride(); }

 private:
  std::unique_ptr<Model> inner_;
  std::vector<Drains>* inside_;
};

std::string corpus_dir() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto dir = std::filesystem::temp_directory_path() / "zrt_standin_host_waits";
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    std::string text;
    for (int i = 0; i < 300; ++i) text += "In the beginning was the Word. ";
    std::vector<std::uint16_t> tokens(text.begin(), text.end());
    write_shard((dir / "w_train_000000.bin").string(), tokens.data(), tokens.size());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

}  // namespace

TEST_CASE(
    "a quiet training step on the CUDA backend drains no stream; fp16's decision drains the "
    "compute stream once, outside the micro-batches") {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = corpus_dir();
  // Steps 1, 3, 6 and 7 (the first, every third, the last) are logged.
  const int steps = 7, log_interval = 3;
  const auto logged = [&](int step) {
    return step == 1 || step % log_interval == 0 || step == steps;
  };
  // decision: the compute-stream drains of engine.step's decision: none where it is taken on
  // the device, one in fp16. With optimizer offload it waits for the gradients' copies to the
  // host, which the loss's accumulation (enqueued after the last backward) does not precede: it
  // drains the copy stream, not compute.
  struct Case {
    std::string name, zero, model;
    long long decision = 0;
    std::string precision = R"("bf16": {"enabled": true})";
  };
  const std::string gpt = R"({"preset": "gpt2-tiny", "seq_len": 32})";
  const std::vector<Case> cases = {
      {"stage0", R"({"stage": 0})", gpt},
      {"stage1", R"({"stage": 1})", gpt},
      {"stage2", R"({"stage": 2, "overlap_comm": true})", gpt},
      {"stage3", R"({"stage": 3, "stage3_param_persistence_threshold": 100})", gpt},
      {"stage3_llama", R"({"stage": 3, "stage3_param_persistence_threshold": 100})",
       R"({"type": "llama", "preset": "llama-tiny", "seq_len": 32})"},
      {"stage2_offload", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})", gpt, 0},
      // A scale low enough that no step overflows (a skipped step gets a logged row).
      {"stage1_fp16", R"({"stage": 1})", gpt, 1,
       R"("fp16": {"enabled": true, "initial_scale_power": 8})"},
  };
  for (const auto& [name, zero, model, decision, precision] : cases) {
    SECTION(name) {
      const std::string text = R"({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        )" + precision + R"(,
        "zero_optimization": )" +
                               zero + R"(,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
        "model": )" + model + R"(,
        "data": {"train": ")" + dir +
                               R"(/w_train_*.bin", "shuffle": false},
        "train": {"steps": )" + std::to_string(steps) +
                               R"(, "log_interval": )" + std::to_string(log_interval) +
                               R"(, "eval_interval": 0, "sample_tokens": 0},
        "device": {"type": "cuda"},
        "output_dir": ")" + dir +
                               "/" + name + R"("
      })";
      const Config config = parse_config_text(text, world, name + ".json");

      std::vector<Drains> inside;    // per forward_backward call
      std::vector<Drains> per_step;  // from one step's end to the next
      cudaStream_t compute = nullptr;
      train::ModelFactory factory = train::registry_model(config.model);
      const auto build = factory.build;
      factory.build = [&](kernels::KernelContext& ctx, const ModelOptions& options) {
        compute = cuda_stream_handle(ctx.stream());
        return std::make_unique<DrainWatchingModel>(build(ctx, options), &inside);
      };
      const auto initializer = factory.initializer;
      factory.initializer = [initializer](const Model& model, std::uint64_t seed,
                                          const std::string& init_from) {
        return initializer(static_cast<const DrainWatchingModel&>(model).inner(), seed, init_from);
      };
      Drains last;
      train::TrainHooks hooks;
      hooks.after_step = [&](std::int64_t, ZeroEngine&, const StepResult&) {
        const Drains now = drains_now();
        per_step.push_back(since(last, now));
        last = now;
      };
      const auto summary =
          train::run_training(config, train::RankInfo{rank, world, rank, world}, factory, hooks);
      REQUIRE(summary.losses.size() == static_cast<std::size_t>(steps));
      REQUIRE(summary.skipped == 0);
      REQUIRE(compute != nullptr);

      REQUIRE(inside.size() == static_cast<std::size_t>(2 * steps));
      for (std::size_t i = 0; i < inside.size(); ++i) {
        INFO(name << " micro-batch " << i << " drained " << describe(inside[i], compute));
        CHECK(inside[i].empty());
      }
      REQUIRE(per_step.size() == static_cast<std::size_t>(steps));
      for (int step = 2; step <= steps; ++step) {
        const Drains& d = per_step[static_cast<std::size_t>(step - 1)];
        const long long expected = decision + (logged(step - 1) ? 1 : 0);
        INFO(name << " step " << step << " (after a " << (logged(step - 1) ? "logged" : "quiet")
                  << " step) drained " << describe(d, compute));
        const auto it = d.find(compute);
        CHECK((it == d.end() ? 0 : it->second) == expected);
      }
    }
  }
}
