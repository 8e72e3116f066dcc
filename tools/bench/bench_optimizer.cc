// zrt-bench optimizer: CpuAdam (AdamW, fp32 param/grad/m/v) with and without the fused bf16
// copy-out, next to a plain memory sweep over the same arrays in the same run (one pass reading
// 4 and writing 3 fp32 arrays: the floor an Adam step can reach) and, when python3 can import
// torch, torch.optim.AdamW on the same size. Times are medians over repeats of one step, the
// five passes (sweep, prefetching sweep, adamw, adamw + bf16, the bf16 copy alone)
// interleaved round by round. Bytes per parameter: 28 (read p, g, m, v; write p, m, v), 30 with
// the bf16 copy, 18 for the copy alone (read p, g, m, v; write the copy): optimizer offload's
// split step puts only that pass on the step's critical path (copy/+bf16: its share of the
// fused step's time).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "optimizers/cpu_adam.h"
#include "optimizers/cpu_slice_step.h"
#include "runtime/common/error.h"
#include "tools/bench/bench.h"

#ifndef ZRT_TORCH_BENCH_SCRIPT
#define ZRT_TORCH_BENCH_SCRIPT ""
#endif

namespace zrt::bench {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using HostArray = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
HostArray<T> allocate(std::int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(T) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  ZRT_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  return HostArray<T>(static_cast<T*>(p));
}

// "10M" -> 10'000'000 (decimal: parameter counts, not bytes).
std::int64_t parse_count(std::string text) {
  double scale = 1;
  switch (text.empty() ? '\0' : text.back()) {
    case 'K':
    case 'k':
      scale = 1e3;
      text.pop_back();
      break;
    case 'M':
    case 'm':
      scale = 1e6;
      text.pop_back();
      break;
    case 'G':
    case 'g':
      scale = 1e9;
      text.pop_back();
      break;
    default:
      break;
  }
  return static_cast<std::int64_t>(std::stod(text) * scale);
}

std::string count_name(std::int64_t n) {
  if (n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  if (n % 1000 == 0) return std::to_string(n / 1000) + "K";
  return std::to_string(n);
}

// Runs every function once per round, in turn, for one warm-up round and `repeats` timed
// rounds; returns each one's median seconds. Interleaving keeps the ratios between them honest
// when other work on the machine comes and goes during the run.
std::vector<double> time_interleaved(int repeats, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> samples(fns.size());
  for (int round = 0; round <= repeats; ++round) {
    for (std::size_t k = 0; k < fns.size(); ++k) {
      const auto start = std::chrono::steady_clock::now();
      fns[k]();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) samples[k].push_back(seconds);
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) medians.push_back(median(s));
  return medians;
}

// The reference sweeps: read p, g, m, v and write p, m, v once, with trivial arithmetic, split
// statically over `threads` like CpuAdam. The plain one is the compiler-vectorized loop; the
// other adds the software prefetch CpuAdam's kernels use (same distance), so the table shows the
// step against both the naive and the best simple streaming pass.
__attribute__((target_clones("avx512f", "avx2", "default"))) void sweep_plain(
    float* p, const float* g, float* m, float* v, std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float x = g[i];
    p[i] = p[i] + x;
    m[i] = m[i] + x;
    v[i] = v[i] + x;
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void sweep_prefetch(
    float* p, const float* g, float* m, float* v, std::int64_t begin, std::int64_t end) {
  constexpr std::int64_t kAhead = 512;
  for (std::int64_t b = begin; b < end; b += 16) {
    __builtin_prefetch(p + b + kAhead);
    __builtin_prefetch(g + b + kAhead);
    __builtin_prefetch(m + b + kAhead);
    __builtin_prefetch(v + b + kAhead);
    const std::int64_t stop = std::min(b + 16, end);
    for (std::int64_t i = b; i < stop; ++i) {
      const float x = g[i];
      p[i] = p[i] + x;
      m[i] = m[i] + x;
      v[i] = v[i] + x;
    }
  }
}

void sweep(float* p, const float* g, float* m, float* v, std::int64_t n, int threads,
           bool prefetch) {
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t begin = n * t / nt / 64 * 64;
    const std::int64_t end = t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64;
    if (prefetch) {
      sweep_prefetch(p, g, m, v, begin, end);
    } else {
      sweep_plain(p, g, m, v, begin, end);
    }
  }
}

std::string find_torch_script(const std::string& requested) {
  return requested.empty() ? find_script("torch_adamw_bench.py", ZRT_TORCH_BENCH_SCRIPT)
                           : requested;
}

// torch.optim.AdamW params/s at this size and thread count, or 0 if unavailable.
double torch_params_per_s(const std::string& python, const std::string& script, std::int64_t n,
                          int threads, int repeats) {
  const std::string line =
      run_capture(fmt::format("'{}' '{}' --numel {} --threads {} --repeats {} 2>/dev/null", python,
                              script, n, threads, repeats));
  const auto pos = line.find("params_per_s=");
  if (pos == std::string::npos) return 0.0;
  return std::stod(line.substr(pos + 13));
}

std::string cpu_model() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return "?";
  char buffer[512];
  std::string model = "?";
  while (std::fgets(buffer, sizeof buffer, f) != nullptr) {
    const std::string line = buffer;
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      if (!model.empty() && model.back() == '\n') model.pop_back();
      break;
    }
  }
  std::fclose(f);
  return model;
}

}  // namespace

int optimizer(int argc, char** argv) {
  Args args(argc, argv,
            {"sizes", "threads", "repeats", "isa", "no-torch", "python", "torch-script", "help"});
  if (args.has("help")) {
    std::printf(
        "zrt-bench optimizer [--sizes 10M,50M,100M,200M] [--threads 1,2] [--repeats 5]\n"
        "                    [--isa auto|avx512|avx2|scalar] [--no-torch] [--python PATH]\n"
        "                    [--torch-script PATH]\n"
        "CpuAdam (AdamW) params/s and GB/s, with and without the fused bf16 copy-out, next to a\n"
        "read-4/write-3 fp32 memory sweep and torch.optim.AdamW (when python3 has torch).\n");
    return 0;
  }
  std::vector<std::int64_t> sizes;
  for (const auto& s : split_list(args.get("sizes", "10M,50M,100M,200M"))) {
    sizes.push_back(parse_count(s));
  }
  std::vector<int> thread_counts;
  for (const auto& s : split_list(args.get("threads", "1,2")))
    thread_counts.push_back(std::stoi(s));
  const int repeats = static_cast<int>(args.get_double("repeats", 5));
  const std::string isa_name = args.get("isa", "auto");
  CpuIsa isa = CpuIsa::kAuto;
  for (CpuIsa candidate : {CpuIsa::kAuto, CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa_name == cpu_isa_name(candidate)) isa = candidate;
  }
  if (isa_name != cpu_isa_name(isa)) {
    ZRT_THROW(InvalidArgument, "--isa must be auto, avx512, avx2 or scalar, not '{}'", isa_name);
  }
  const std::string python = args.has("no-torch") ? "" : find_python(args.get("python", ""));
  const std::string script = find_torch_script(args.get("torch-script", ""));
  std::string torch_note = "not run (--no-torch)";
  if (!args.has("no-torch")) {
    torch_note = python.empty() ? "not available (no python3 with torch; apt-get install "
                                  "python3-torch)"
                                : "torch.optim.AdamW via " + python + " " + script;
  }

  AdamOptions options;
  options.weight_decay = 0.01;
  const CpuIsa resolved = isa == CpuIsa::kAuto ? best_cpu_isa() : isa;
  std::printf("# zrt-bench optimizer: AdamW step, fp32 param/grad/m/v, median of %d steps\n",
              repeats);
  std::printf("# cpu: %s; %d hardware threads; isa %s\n", cpu_model().c_str(), omp_get_num_procs(),
              cpu_isa_name(resolved));
  std::printf(
      "# sweep: read p,g,m,v + write p,m,v (28 B/param), plain loop; +pf: the same with software "
      "prefetch; adamw: same bytes; +bf16: also writes a bf16 copy (30 B/param); copy: the split "
      "step's first pass, the update computed and only the bf16 copy written (18 B/param)\n");
  std::printf("# torch: %s\n", torch_note.c_str());
  std::fflush(stdout);

  Table table({"params", "thr", "sweep_GB/s", "+pf_GB/s", "adamw_Gp/s", "adamw_GB/s", "%sweep",
               "+bf16_Gp/s", "+bf16_GB/s", "%sweep", "copy_Gp/s", "copy/+bf16", "torch_Gp/s",
               "x_torch"});
  for (const std::int64_t n : sizes) {
    // Per thread count, seconds of: sweep, prefetching sweep, adamw, adamw + bf16 copy, the
    // bf16 copy alone (StepWrites::kComputeCopyOnly, as optimizer offload's split step).
    std::vector<std::array<double, 5>> rates;
    {
      auto p = allocate<float>(n), g = allocate<float>(n), m = allocate<float>(n),
           v = allocate<float>(n);
      auto out = allocate<std::uint16_t>(n);
      // First touch in parallel, the way the steps will use the pages.
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        p[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
        g[i] = static_cast<float>(i % 37) * 1e-4f - 1.8e-3f;
        m[i] = 0.0f;
        v[i] = 0.0f;
        out[i] = 0;
      }
      AdamSlice slice;
      slice.param = p.get();
      slice.grad = g.get();
      slice.exp_avg = m.get();
      slice.exp_avg_sq = v.get();
      slice.numel = n;
      AdamSlice with_out = slice;
      with_out.param_out = out.get();
      with_out.out_dtype = DType::kBFloat16;
      const detail::AdamRangeKernel copy_only =
          detail::adam_range_kernel(resolved, StepWrites::kComputeCopyOnly);
      for (const int threads : thread_counts) {
        const CpuAdam adam(options, CpuAdamOptions{isa, threads});
        std::int64_t step = 0;
        const std::vector<double> t = time_interleaved(
            repeats, {[&] { sweep(p.get(), g.get(), m.get(), v.get(), n, threads, false); },
                      [&] { sweep(p.get(), g.get(), m.get(), v.get(), n, threads, true); },
                      [&] { adam.step(&slice, 1, ++step, 1e-3); },
                      [&] { adam.step(&with_out, 1, ++step, 1e-3); },
                      [&] {
                        detail::step_slices(&with_out, 1,
                                            adam_step_scalars(options, ++step, 1e-3, 1.0),
                                            copy_only, threads);
                      }});
        rates.push_back({t[0], t[1], t[2], t[3], t[4]});
      }
    }  // free before torch allocates its own copy
    for (std::size_t k = 0; k < thread_counts.size(); ++k) {
      const double nd = static_cast<double>(n);
      const auto [t_sweep, t_sweep_pf, t_adam, t_out, t_copy] = rates[k];
      const double sweep_gbs = 28.0 * nd / t_sweep / 1e9;
      const double sweep_pf_gbs = 28.0 * nd / t_sweep_pf / 1e9;
      const double adam_gbs = 28.0 * nd / t_adam / 1e9;
      const double out_gbs = 30.0 * nd / t_out / 1e9;
      const double torch_rate =
          python.empty() ? 0.0 : torch_params_per_s(python, script, n, thread_counts[k], repeats);
      table.add(
          {count_name(n), std::to_string(thread_counts[k]), fmt::format("{:.1f}", sweep_gbs),
           fmt::format("{:.1f}", sweep_pf_gbs), fmt::format("{:.3f}", nd / t_adam / 1e9),
           fmt::format("{:.1f}", adam_gbs), fmt::format("{:.0f}%", 100 * adam_gbs / sweep_gbs),
           fmt::format("{:.3f}", nd / t_out / 1e9), fmt::format("{:.1f}", out_gbs),
           fmt::format("{:.0f}%", 100 * out_gbs / sweep_gbs),
           fmt::format("{:.3f}", nd / t_copy / 1e9), fmt::format("{:.0f}%", 100 * t_copy / t_out),
           torch_rate > 0 ? fmt::format("{:.3f}", torch_rate / 1e9) : "-",
           torch_rate > 0 ? fmt::format("{:.1f}", nd / t_adam / torch_rate) : "-"});
      std::fprintf(stderr, "  done %s x %d threads\n", count_name(n).c_str(), thread_counts[k]);
    }
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "# Gp/s = 1e9 params/s; GB/s = 1e9 bytes/s; %%sweep = GB/s relative to the plain sweep at "
      "the same size and threads (goal >= 95%% at 2 threads); x_torch = adamw params/s over "
      "torch's\n");
  return 0;
}

}  // namespace zrt::bench
