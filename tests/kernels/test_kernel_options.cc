// KernelOptions read from the environment: ZRT_CUDA_ATTENTION picks which shapes take the fused
// attention kernels on the CUDA backend, and whether pipelined (kernels/kernel_context.h); a value
// it does not know is an error that names the ones it does.
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

// "pipelined": the fused kernels wherever they take the shape, on their pipelined variant; every
// other value (unset included) keeps the staged one, the default until a GPU has timed both.
TEST_CASE("ZRT_CUDA_ATTENTION=pipelined picks the pipelined fused kernels", "[kernels][options]") {
  {
    ScopedAttentionEnv env("pipelined");
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
    CHECK(attention_pipelined_from_env());
    const KernelOptions options;
    CHECK(options.cuda_fused_attention == FusedAttention::kAll);
    CHECK(options.cuda_attention_pipelined);
  }
  for (const char* value : {static_cast<const char*>(nullptr), "", "fused", "hs64", "batched"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << (value == nullptr ? "(unset)" : value));
    CHECK_FALSE(attention_pipelined_from_env());
    CHECK_FALSE(KernelOptions{}.cuda_attention_pipelined);
  }
}

// "cudnn" and "cudnn-nondeterministic": cuDNN's attention first (the fused kernels for the calls
// it declines), with its deterministic backward unless the value says otherwise; every other
// value (unset included) leaves cuDNN out.
TEST_CASE("ZRT_CUDA_ATTENTION=cudnn picks cuDNN's attention", "[kernels][options]") {
  for (const auto& [value, deterministic] :
       {std::pair{"cudnn", true}, std::pair{"cudnn-nondeterministic", false}}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << value);
    CHECK(fused_attention_from_env() == FusedAttention::kAll);
    CHECK(attention_cudnn_from_env());
    CHECK(attention_cudnn_deterministic_from_env() == deterministic);
    const KernelOptions options;
    CHECK(options.cuda_attention_cudnn);
    CHECK(options.cuda_attention_cudnn_deterministic == deterministic);
    CHECK_FALSE(options.cuda_attention_pipelined);
  }
  for (const char* value :
       {static_cast<const char*>(nullptr), "", "fused", "hs64", "batched", "pipelined"}) {
    ScopedAttentionEnv env(value);
    INFO("ZRT_CUDA_ATTENTION=" << (value == nullptr ? "(unset)" : value));
    CHECK_FALSE(KernelOptions{}.cuda_attention_cudnn);
    CHECK(KernelOptions{}.cuda_attention_cudnn_deterministic);
  }
}

// zrt-train's log line on a CUDA device says which attention kernels the options choose.
TEST_CASE("the attention kernels' description follows ZRT_CUDA_ATTENTION", "[kernels][options]") {
  auto described = [](const char* value) {
    ScopedAttentionEnv env(value);
    return cuda::describe(cuda::attention_kernels(KernelOptions{}));
  };
  CHECK(described(nullptr) ==
        "fused mma.sync kernels (staged) at head sizes 64 and 128 (bf16/fp16, T a multiple of "
        "64), batched cuBLAS GEMMs elsewhere");
  CHECK_THAT(described("pipelined"), Catch::StartsWith("fused mma.sync kernels (pipelined) at "
                                                       "head sizes 64 and 128"));
  CHECK_THAT(described("hs64"), Catch::StartsWith("fused mma.sync kernels (staged) at head size "
                                                  "64 (bf16/fp16"));
  CHECK(described("batched") == "batched cuBLAS GEMMs for every shape");
  CHECK(described("cudnn") ==
        "cuDNN's fused attention (deterministic backward) for bf16/fp16 without packed documents "
        "where cuDNN takes the shape; otherwise fused mma.sync kernels (staged) at head sizes 64 "
        "and 128 (bf16/fp16, T a multiple of 64), batched cuBLAS GEMMs elsewhere");
  CHECK_THAT(described("cudnn-nondeterministic"),
             Catch::StartsWith("cuDNN's fused attention (non-deterministic backward)"));
  KernelOptions wmma;
  wmma.cuda_fused_attention = FusedAttention::kAll;
  wmma.cuda_attention_wmma = true;
  CHECK_THAT(cuda::describe(cuda::attention_kernels(wmma)),
             Catch::StartsWith("fused WMMA kernels at head size 64, fused mma.sync kernels "));
}

TEST_CASE("an unknown ZRT_CUDA_ATTENTION is an error naming the values", "[kernels][options]") {
  ScopedAttentionEnv env("flash");
  CHECK_THROWS_AS(fused_attention_from_env(), InvalidArgument);
  CHECK_THROWS_WITH(fused_attention_from_env(),
                    Catch::Contains("ZRT_CUDA_ATTENTION=flash") && Catch::Contains("fused") &&
                        Catch::Contains("hs64") && Catch::Contains("batched") &&
                        Catch::Contains("pipelined") && Catch::Contains("cudnn") &&
                        Catch::Contains("cudnn-nondeterministic"));
  CHECK_THROWS_AS(KernelOptions{}, InvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels
