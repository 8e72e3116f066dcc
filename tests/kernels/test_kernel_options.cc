// KernelOptions read from the environment: ZRT_CUDA_ATTENTION picks cuDNN's attention, zrt's
// fused kernels (pipelined or staged) or the batched path on the CUDA backend
// (kernels/kernel_context.h); a value it does not know is an error that names the ones it does.
// And cuDNN's workspace as planning counts it.
#include <cstdint>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "kernels/cuda/attention_plan.h"
#include "kernels/kernel_context.h"
#include "runtime/common/error.h"

namespace zrt::kernels {
namespace {

// Sets ZRT_CUDA_ATTENTION for one scope (unset when `value` is null), restoring what was there.
class ScopedAttentionEnv {
 public:
  explicit ScopedAttentionEnv(const char* value) {
    if (const char* old = std::getenv(kName)) {
      old_ = old;
      had_ = true;
    }
    if (value == nullptr) {
      unsetenv(kName);
    } else {
      setenv(kName, value, 1);
    }
  }
  ~ScopedAttentionEnv() {
    if (had_) {
      setenv(kName, old_.c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  ScopedAttentionEnv(const ScopedAttentionEnv&) = delete;
  ScopedAttentionEnv& operator=(const ScopedAttentionEnv&) = delete;

 private:
  static constexpr const char* kName = "ZRT_CUDA_ATTENTION";
  std::string old_;
  bool had_ = false;
};

TEST_CASE("ZRT_CUDA_ATTENTION picks the fused attention kernels' shapes", "[kernels][options]") {
  {
    ScopedAttentionEnv env(nullptr);
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
    CHECK(KernelOptions{}.cuda_fused_attention == FusedAttention::kAll);
  }
  {
    ScopedAttentionEnv env("");
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
  }
  {
    ScopedAttentionEnv env("fused");
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
  }
  {
    ScopedAttentionEnv env("hs64");
    CHECK(fused_attention_from_env() == FusedAttention::kHeadSize64);
    CHECK(KernelOptions{}.cuda_fused_attention == FusedAttention::kHeadSize64);
  }
  {
    ScopedAttentionEnv env("batched");
    CHECK(fused_attention_from_env() == FusedAttention::kNone);
    CHECK(KernelOptions{}.cuda_fused_attention == FusedAttention::kNone);
  }
}

// zrt's mma kernels run pipelined (the staged kernels' bits, faster) under every value but the
// ones naming the staged kernels: fused, hs64 (and batched, which runs none).
TEST_CASE("ZRT_CUDA_ATTENTION runs zrt's kernels pipelined unless it names the staged ones",
          "[kernels][options]") {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto", "pipelined", "cudnn",
                            "cudnn-nondeterministic"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << (value == nullptr ? "(unset)" : value));
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
    CHECK(attention_pipelined_from_env());
    CHECK(KernelOptions{}.cuda_attention_pipelined);
  }
  for (const char* value : {"fused", "hs64", "batched"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << value);
    CHECK_FALSE(attention_pipelined_from_env());
    CHECK_FALSE(KernelOptions{}.cuda_attention_pipelined);
  }
}

// "auto" (unset, empty): cuDNN's attention first where the build has it, not required, within
// the automatic workspace limit. "cudnn" and "cudnn-nondeterministic": required, no limit, the
// deterministic backward unless the value says otherwise. The values naming zrt's kernels or
// the batched path leave cuDNN out.
TEST_CASE("ZRT_CUDA_ATTENTION chooses cuDNN's attention by default and by name",
          "[kernels][options]") {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << (value == nullptr ? "(unset)" : value));
    const KernelOptions options;
    CHECK(options.cuda_attention_cudnn);
    CHECK_FALSE(options.cuda_attention_cudnn_required);
    CHECK(options.cuda_attention_cudnn_deterministic);
    CHECK(options.cuda_attention_cudnn_workspace_limit == kCudnnAttentionAutoWorkspaceLimit);
    CHECK(kCudnnAttentionAutoWorkspaceLimit == std::int64_t{8} << 30);
  }
  for (const auto& [value, deterministic] :
       {std::pair{"cudnn", true}, std::pair{"cudnn-nondeterministic", false}}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << value);
    CHECK(attention_cudnn_from_env());
    CHECK(attention_cudnn_required_from_env());
    CHECK(attention_cudnn_deterministic_from_env() == deterministic);
    const KernelOptions options;
    CHECK(options.cuda_attention_cudnn);
    CHECK(options.cuda_attention_cudnn_required);
    CHECK(options.cuda_attention_cudnn_deterministic == deterministic);
    CHECK(options.cuda_attention_cudnn_workspace_limit == 0);
  }
  for (const char* value : {"fused", "hs64", "batched", "pipelined"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << value);
    const KernelOptions options;
    CHECK_FALSE(options.cuda_attention_cudnn);
    CHECK_FALSE(options.cuda_attention_cudnn_required);
    CHECK(options.cuda_attention_cudnn_deterministic);
  }
}

// zrt-train's log line on a CUDA device says which attention kernels the options choose.
TEST_CASE("the attention kernels' description follows ZRT_CUDA_ATTENTION", "[kernels][options]") {
  auto described = [](const char* value) {
    ScopedAttentionEnv env(value);
    return cuda::describe(cuda::attention_kernels(KernelOptions{}));
  };
  CHECK(described(nullptr) ==
        "cuDNN's fused attention (deterministic backward) for bf16/fp16 without packed documents "
        "where cuDNN takes the shape and its workspace is at most 8.0 GiB; otherwise fused "
        "mma.sync kernels (pipelined) at head sizes 64 and 128 (bf16/fp16, T a multiple of 64), "
        "batched cuBLAS GEMMs elsewhere");
  CHECK(described("auto") == described(nullptr));
  CHECK(described("fused") ==
        "fused mma.sync kernels (staged) at head sizes 64 and 128 (bf16/fp16, T a multiple of "
        "64), batched cuBLAS GEMMs elsewhere");
  CHECK_THAT(described("pipelined"), Catch::StartsWith("fused mma.sync kernels (pipelined) at "
                                                       "head sizes 64 and 128"));
  CHECK_THAT(described("hs64"), Catch::StartsWith("fused mma.sync kernels (staged) at head size "
                                                  "64 (bf16/fp16"));
  CHECK(described("batched") == "batched cuBLAS GEMMs for every shape");
  CHECK(described("cudnn") ==
        "cuDNN's fused attention (deterministic backward) for bf16/fp16 without packed documents "
        "where cuDNN takes the shape; otherwise fused mma.sync kernels (pipelined) at head sizes "
        "64 and 128 (bf16/fp16, T a multiple of 64), batched cuBLAS GEMMs elsewhere");
  CHECK_THAT(described("cudnn-nondeterministic"),
             Catch::StartsWith("cuDNN's fused attention (non-deterministic backward)"));
  KernelOptions wmma;
  wmma.cuda_fused_attention = FusedAttention::kAll;
  wmma.cuda_attention_cudnn = false;
  wmma.cuda_attention_pipelined = false;
  wmma.cuda_attention_wmma = true;
  CHECK_THAT(cuda::describe(cuda::attention_kernels(wmma)),
             Catch::StartsWith("fused WMMA kernels at head size 64, fused mma.sync kernels "));
}

// cuDNN's workspace requests for planning against what cuDNN 9.19 asked for on an H200 (the
// run logs' "built ... (workspace N bytes)" lines, BENCHMARKS.md): every shape timed there, to
// the byte.
TEST_CASE("cuDNN attention's planned workspace is what cuDNN asked for on an H200",
          "[kernels][options]") {
  struct Seen {
    int B, T, NH, NKV, hs;
    bool deterministic;
    std::int64_t bytes;
  };
  for (const Seen& s : {
           Seen{8, 1024, 12, 12, 64, true, 201720064},  // GPT-2 124M, 8 x 1024
           Seen{8, 1024, 12, 12, 64, false, 25559296}, Seen{4, 1024, 32, 32, 128, true, 268960000},
           Seen{4, 1024, 32, 32, 128, false, 67633408},
           Seen{1, 4096, 32, 32, 128, true, 1074266368},
           Seen{1, 4096, 32, 32, 128, false, 67633408},
           Seen{1, 8192, 32, 32, 128, true, 4296016128},
           Seen{1, 8192, 32, 32, 128, false, 135266560},
           Seen{1, 8192, 32, 8, 128, true, 4430233856},  // Llama-3.1-8B's heads
           Seen{1, 8192, 32, 8, 128, false, 269484288},
           Seen{1, 2048, 32, 8, 128, true, 302252288},  // the 8B run's step
       }) {
    INFO("B " << s.B << " T " << s.T << " heads " << s.NH << "/" << s.NKV << " hs " << s.hs
              << (s.deterministic ? " deterministic" : " non-deterministic"));
    CHECK(cuda::cudnn_attention_workspace_estimate(s.B, s.T, s.NH, s.NKV, s.hs, true,
                                                   s.deterministic) == s.bytes);
    CHECK(cuda::cudnn_attention_workspace_estimate(s.B, s.T, s.NH, s.NKV, s.hs, false,
                                                   s.deterministic) == 256);
  }
}

// Planning counts cuDNN's request where the calls would take cuDNN (bf16/fp16, no documents,
// within the limit or below what zrt's kernels would ask for) and zrt's kernels' elsewhere: one
// 8192-token sequence of 32 heads fits the automatic limit (4.3 GB), two of them do not (8.6 GB
// > 8 GiB) unless zrt's kernels would need still more (their batched path's T^2 scratch), and a
// named cudnn has no limit.
TEST_CASE("planning counts cuDNN's attention where the calls take it", "[kernels][options]") {
  ScopedAttentionEnv env(nullptr);
  const cuda::AttentionKernels automatic = cuda::attention_kernels(KernelOptions{});
  const DType bf16 = DType::kBFloat16;
  const std::int64_t row_term = std::int64_t{2} * 32 * 8192 * 4;  // the fused kernels' backward
  const std::int64_t two =
      cuda::cudnn_attention_workspace_estimate(2, 8192, 32, 32, 128, true, true);
  CHECK(two > kCudnnAttentionAutoWorkspaceLimit);
  CHECK(cuda::cudnn_attention_planned(automatic, bf16, false, 1, 8192, 32, 32, 128, true, 0));
  CHECK_FALSE(
      cuda::cudnn_attention_planned(automatic, bf16, false, 2, 8192, 32, 32, 128, true, row_term));
  CHECK(cuda::cudnn_attention_planned(automatic, bf16, false, 2, 8192, 32, 32, 128, true, two));
  CHECK(cuda::cudnn_attention_planned(automatic, bf16, false, 2, 8192, 32, 32, 128, false, 0));
  CHECK_FALSE(cuda::cudnn_attention_planned(automatic, bf16, true, 1, 1024, 32, 32, 128, true, 0));
  CHECK_FALSE(cuda::cudnn_attention_planned(automatic, DType::kFloat32, false, 1, 1024, 32, 32, 128,
                                            true, 0));
  CHECK(cuda::cudnn_attention_within_limit(automatic, kCudnnAttentionAutoWorkspaceLimit, 0));
  CHECK_FALSE(cuda::cudnn_attention_within_limit(automatic, kCudnnAttentionAutoWorkspaceLimit + 1,
                                                 kCudnnAttentionAutoWorkspaceLimit));
  cuda::AttentionKernels named = automatic;
  named.cudnn_workspace_limit = 0;
  CHECK(cuda::cudnn_attention_planned(named, bf16, false, 2, 8192, 32, 32, 128, true, row_term));
  cuda::AttentionKernels own = automatic;
  own.cudnn = false;
  CHECK_FALSE(cuda::cudnn_attention_planned(own, bf16, false, 1, 1024, 32, 32, 128, true, 0));
}

TEST_CASE("an unknown ZRT_CUDA_ATTENTION is an error naming the values", "[kernels][options]") {
  ScopedAttentionEnv env("flash");
  CHECK_THROWS_AS(fused_attention_from_env(), InvalidArgument);
  CHECK_THROWS_WITH(fused_attention_from_env(),
                    Catch::Contains("ZRT_CUDA_ATTENTION=flash") && Catch::Contains("fused") &&
                        Catch::Contains("hs64") && Catch::Contains("batched") &&
                        Catch::Contains("pipelined") && Catch::Contains("cudnn") &&
                        Catch::Contains("cudnn-nondeterministic") && Catch::Contains("auto"));
  CHECK_THROWS_AS(KernelOptions{}, InvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels
