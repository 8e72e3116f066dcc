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

namespace zrt::kernels::cpu {

template <typename A>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda, const A* b,
          int ldb, A beta, A* c, int ldc);

template <typename A>
void gemm_serial(bool trans_a, bool trans_b, int m, int n, int k, A alpha, const A* a, int lda,
                 const A* b, int ldb, A beta, A* c, int ldc);

}  // namespace zrt::kernels::cpu
