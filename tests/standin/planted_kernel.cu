// A kernel written one thread per element (no grid-stride loop), for the planted-bug test of
// launch geometry: launched with too few threads it would leave elements untouched.
#include <cuda_runtime.h>

__global__ void zrt_planted_double(float* x, long n) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.0f;
}

cudaError_t planted_double(float* x, long n, unsigned blocks, unsigned threads,
                           cudaStream_t stream) {
  zrt_planted_double<<<blocks, threads, 0, stream>>>(x, n);
  return cudaGetLastError();
}

// The same kernel launched with `shared` bytes of dynamic shared memory (which it does not use),
// and the call that raises its limit above the 48 KiB a kernel gets without asking.
cudaError_t planted_double_shared(float* x, long n, unsigned blocks, unsigned threads,
                                  size_t shared, cudaStream_t stream) {
  zrt_planted_double<<<blocks, threads, shared, stream>>>(x, n);
  return cudaGetLastError();
}

cudaError_t planted_allow_shared(int bytes) {
  return cudaFuncSetAttribute(zrt_planted_double, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}
