// Row-major GEMM on the CPU through OpenBLAS (cblas), for float and double:
//   c = alpha * op(a) @ op(b) + beta * c,  op(a) (m x k), op(b) (k x n), c (m x n).
//
// gemm() splits c into fixed tiles (their size depends on the shape only) and runs one
// single-threaded BLAS call per tile in an OpenMP loop, so every element of c is computed by
// the same call sequence whatever the number of threads: results do not depend on the thread
// count. gemm_serial() is one single-threaded BLAS call, for use inside parallel regions.
// OpenBLAS's own thread pool is switched off (openblas_set_num_threads(1)) on first use:
// OpenMP drives all CPU kernel parallelism.
#pragma once

#include <cstdint>
#include <string>

namespace zrt::kernels::cpu {

// The kernels OpenBLAS chose for this CPU when it was loaded (openblas_get_corename():
// "SkylakeX", "Haswell", "Zen", ...).
std::string blas_core_name();
// Empty, or why OpenBLAS runs far below this CPU: a build that does not know the CPU (Debian 12's
// 0.3.21 and Emerald Rapids, say) falls back to its generic kernels ("Prescott": SSE3, no FMA)
// on a CPU with AVX2 or AVX-512; the message names the OPENBLAS_CORETYPE that gives them back
// (it is read when the library loads, so it must be set before the program starts). The
// products then also round differently (no FMA) and give a row different bits at different row
// counts.
std::string blas_core_warning();
// The OPENBLAS_CORETYPE blas_core_warning() suggests, or empty.
std::string suggested_blas_core();

template <typename A>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda, const A* b,
          int ldb, A beta, A* c, int ldc);

template <typename A>
void gemm_serial(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda,
                 const A* b, int ldb, A beta, A* c, int ldc);

}  // namespace zrt::kernels::cpu
