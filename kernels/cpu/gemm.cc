#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <mutex>
#include <set>
#include <type_traits>

#include <spdlog/fmt/fmt.h>

#include "runtime/common/cpu_isa.h"

namespace zrt::kernels::cpu {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

std::string suggested_blas_core() {
  // OpenBLAS cores with AVX2 and FMA kernels (its names, any case it prints them in).
  static const std::set<std::string> wide = {
      "haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator", "power9"};
  std::string core = blas_core_name();
  std::transform(core.begin(), core.end(), core.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const CpuIsa hardware = hardware_cpu_isa();
  if (hardware == CpuIsa::kScalar || core.empty() || wide.count(core) > 0) return "";
  if (hardware == CpuIsa::kAvx512) return "SkylakeX";
  // AVX2: AMD's kernels on AMD, Intel's elsewhere.
  bool amd = false;
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::string(line).rfind("vendor_id", 0) == 0) {
        amd = std::string(line).find("AuthenticAMD") != std::string::npos;
        break;
      }
    }
    std::fclose(f);
  }
  return amd ? "Zen" : "Haswell";
}

std::string blas_core_warning() {
  const std::string better = suggested_blas_core();
  if (better.empty()) return "";
  std::string version = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 "
  version.erase(0, version.find_first_not_of(' '));
  version.erase(version.find_last_not_of(' ') + 1);
  return fmt::format(
      "{} runs its generic '{}' kernels on this CPU ({}; it does not know the model), "
      "several times slower than its '{}' kernels: start the program with "
      "OPENBLAS_CORETYPE={} (zrt-run sets it for its ranks)",
      version, blas_core_name(), cpu_isa_name(hardware_cpu_isa()), better, better);
}

namespace {

// Output tile of one BLAS call in gemm(). Large enough that re-packing operands per tile costs
// little (on 1024 x 2304 x 768, 128 x 512 tiles ran ~35% below one big OpenBLAS call, 512 x 1024
// ~15%), small enough that two threads get balanced work on every GPT-2 124M GEMM.
constexpr int kTileM = 512;
constexpr int kTileN = 1024;

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

template <typename A>
void blas_call(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda,
               const A* b, int ldb, A beta, A* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<A, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace

template <typename A>
void gemm_serial(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda,
                 const A* b, int ldb, A beta, A* c, int ldc) {
  single_threaded_blas();
  blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename A>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda, const A* b,
          int ldb, A beta, A* c, int ldc) {
  single_threaded_blas();
  const int tiles_m = (m + kTileM - 1) / kTileM;
  const int tiles_n = (n + kTileN - 1) / kTileN;
  const int tiles = tiles_m * tiles_n;
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < tiles; ++t) {
    const int i0 = (t / tiles_n) * kTileM;
    const int j0 = (t % tiles_n) * kTileN;
    const int mi = std::min(kTileM, m - i0);
    const int nj = std::min(kTileN, n - j0);
    // Row block i0 of op(a) and column block j0 of op(b), in their stored layouts.
    const A* a_blk = trans_a ? a + i0 : a + static_cast<std::int64_t>(i0) * lda;
    const A* b_blk = trans_b ? b + static_cast<std::int64_t>(j0) * ldb : b + j0;
    blas_call(trans_a, trans_b, mi, nj, k, alpha, a_blk, lda, b_blk, ldb, beta,
              c + static_cast<std::int64_t>(i0) * ldc + j0, ldc);
  }
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int,
                          float, float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*,
                           int, double, double*, int);
template void gemm_serial<float>(bool, bool, int, int, int, float, const float*, int, const float*,
                                 int, float, float*, int);
template void gemm_serial<double>(bool, bool, int, int, int, double, const double*, int,
                                  const double*, int, double, double*, int);

}  // namespace zrt::kernels::cpu
