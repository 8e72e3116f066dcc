// Planted bugs the CUDA stand-ins must catch, each failing with a message naming the call:
// an NCCL count in bytes, a wrong GEMM leading dimension, a freed buffer still used by a pending
// copy, a missing event wait, and a launch grid too small for its data. Each has a control that
// does the same thing correctly and passes.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/kernel_context.h"
#include "runtime/comm/nccl_process_group.h"
#include "runtime/device/cuda_device.h"
#include "runtime/engine/engine_kernels.h"
#include "tests/standin/kernel_twins.h"

using namespace zrt;
using Catch::Contains;

cudaError_t planted_double(float* x, long n, unsigned blocks, unsigned threads,
                           cudaStream_t stream);
cudaError_t planted_double_shared(float* x, long n, unsigned blocks, unsigned threads,
                                  size_t shared, cudaStream_t stream);
cudaError_t planted_allow_shared(int bytes);

namespace {

std::unique_ptr<Device> cuda_device() {
  DeviceOptions o;
  o.type = DeviceType::kCuda;
  return make_device(o);
}

Buffer upload(Device& d, Stream& s, const std::vector<float>& v) {
  Buffer b = d.allocate(static_cast<std::int64_t>(v.size() * 4), MemCategory::kOther, "test");
  d.copy_to_device(b.device<std::byte>(), v.data(), v.size() * 4, s);
  s.synchronize();
  return b;
}

// zrt_planted_double's twin: one thread per element, so a grid too small for n is an error.
void register_planted_double_twin() {
  zrt::standin::register_test_twin("zrt_planted_double(float*, long)",
                                   [](zrt::standin::KernelCall& k, void** args) {
                                     float* x = *static_cast<float**>(args[0]);
                                     const long n = *static_cast<long*>(args[1]);
                                     k.require_threads(n, "elements n");
                                     k.writes(x, n * 4, "x");
                                     k.run([=] {
                                       for (long i = 0; i < n; ++i) x[i] *= 2.0f;
                                     });
                                   });
}

}  // namespace

TEST_CASE("planted bug: a byte count passed as an NCCL element count") {
  auto device = cuda_device();
  auto stream = device->create_stream("comm");
  auto group = make_nccl_process_group(*device, MPI_COMM_WORLD, *stream, "bytes", CommOptions{});
  const int n = group->size();
  const std::int64_t count = 64;  // elements per rank
  Buffer in = device->allocate(count * 4, MemCategory::kComm, "in");
  Buffer out = device->allocate(n * count * 4, MemCategory::kComm, "out");
  device->fill_zero(in.device<std::byte>(), count * 4, *stream);
  // Control: the element count.
  group->all_gather(in.device<std::byte>(), out.device<std::byte>(), count, DType::kFloat32);
  stream->synchronize();
  // The bug: bytes as the count.
  CHECK_THROWS_WITH(
      group->all_gather(in.device<std::byte>(), out.device<std::byte>(), count * 4,
                        DType::kFloat32),
      Contains("ncclAllGather") && Contains("sendbuff") && Contains("runs past the end"));
}

TEST_CASE("planted bug: a wrong leading dimension to a GEMM") {
  auto device = cuda_device();
  auto stream = device->create_stream("compute");
  kernels::KernelContext ctx(*device, *stream);
  const int m = 4, n = 3, k = 2;  // c (m x n) = a (m x k) @ b (k x n), row-major
  Buffer a = upload(*device, *stream, std::vector<float>(m * k, 1.0f));
  Buffer b = upload(*device, *stream, std::vector<float>(k * n, 2.0f));
  Buffer c = upload(*device, *stream, std::vector<float>(m * n, 0.0f));
  const auto l = kernels::cuda::make_launch(*ctx.cuda(), nullptr);
  auto raw = [](Buffer& x) { return static_cast<void*>(device_access::raw(x.device<float>())); };
  // Control: lda = k, ldb = n, ldc = n; every element of c is k * 1 * 2.
  kernels::cuda::gemm(l, false, false, m, n, k, 1.0f, raw(a), CUDA_R_32F, k, raw(b), CUDA_R_32F, n,
                      0.0f, raw(c), CUDA_R_32F, n);
  std::vector<float> got(m * n);
  device->copy_to_host(got.data(), c.device<std::byte>(), got.size() * 4, *stream);
  stream->synchronize();
  for (float v : got) CHECK(v == 4.0f);
  // Too small: a row-major a (m x k) needs lda >= k; cuBLAS sees it as its B with ldb < k.
  CHECK_THROWS_WITH(kernels::cuda::gemm(l, false, false, m, n, k, 1.0f, raw(a), CUDA_R_32F, k - 1,
                                        raw(b), CUDA_R_32F, n, 0.0f, raw(c), CUDA_R_32F, n),
                    Contains("cublasGemmEx") && Contains("CUBLAS_STATUS_INVALID_VALUE") &&
                        Contains("ldb 1 < max(1, 2)"));
  // Too large: legal for cuBLAS but reads past the end of a.
  CHECK_THROWS_WITH(kernels::cuda::gemm(l, false, false, m, n, k, 1.0f, raw(a), CUDA_R_32F, k + 1,
                                        raw(b), CUDA_R_32F, n, 0.0f, raw(c), CUDA_R_32F, n),
                    Contains("cublasGemmEx") && Contains("runs past the end"));
}

TEST_CASE("planted bug: a freed buffer still used by a pending copy") {
  cudaStream_t copy = nullptr, other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  void* dev = nullptr;
  void* host = nullptr;
  REQUIRE(cudaMalloc(&dev, 4096) == cudaSuccess);
  REQUIRE(cudaHostAlloc(&host, 4096, cudaHostAllocDefault) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(dev, 0, 4096, copy) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(host, dev, 4096, cudaMemcpyDeviceToHost, copy) == cudaSuccess);
  // Freed on another stream that never waited for the copy reading it.
  CHECK(cudaFreeAsync(dev, other) == cudaErrorIllegalAddress);
  CHECK_THAT(cudaGetErrorString(cudaErrorIllegalAddress),
             Contains("cudaFreeAsync") && Contains("cudaMemcpyAsync") && Contains("not ordered"));
  // Pinned destination freed on the host while the copy into it may still be pending.
  CHECK(cudaFreeHost(host) == cudaErrorIllegalAddress);
  CHECK_THAT(cudaGetErrorString(cudaErrorIllegalAddress),
             Contains("cudaFreeHost") && Contains("cudaMemcpyAsync") && Contains("wrote bytes"));
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // as in CUDA: the last error, reset
  CHECK(cudaGetLastError() == cudaSuccess);
  // Control: wait for the copy through an event, then both frees are fine.
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(done, copy) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(other, done, 0) == cudaSuccess);
  CHECK(cudaFreeAsync(dev, other) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(done) == cudaSuccess);
  CHECK(cudaFreeHost(host) == cudaSuccess);
  CHECK(cudaStreamSynchronize(other) == cudaSuccess);
  cudaEventDestroy(done);
  cudaStreamDestroy(copy);
  cudaStreamDestroy(other);
}

TEST_CASE("planted bug: registered host memory unregistered under a pending copy, or misused") {
  cudaStream_t copy = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking) == cudaSuccess);
  std::vector<float> host(1024, 1.0f);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 4096) == cudaSuccess);
  REQUIRE(cudaHostRegister(host.data(), 4096, cudaHostRegisterDefault) == cudaSuccess);
  // Twice, or overlapping: CUDA's own error.
  CHECK(cudaHostRegister(host.data() + 512, 1024, cudaHostRegisterDefault) ==
        cudaErrorHostMemoryAlreadyRegistered);
  // Released as if cudaHostAlloc had made it.
  CHECK(cudaFreeHost(host.data()) == cudaErrorInvalidValue);
  CHECK_THAT(cudaGetErrorString(cudaErrorInvalidValue),
             Contains("registered with cudaHostRegister") && Contains("cudaHostUnregister"));
  REQUIRE(cudaMemcpyAsync(dev, host.data(), 4096, cudaMemcpyHostToDevice, copy) == cudaSuccess);
  // Unregistered on the host while the copy reading it may still be pending.
  CHECK(cudaHostUnregister(host.data()) == cudaErrorIllegalAddress);
  CHECK_THAT(cudaGetErrorString(cudaErrorIllegalAddress),
             Contains("cudaHostUnregister") && Contains("cudaMemcpyAsync"));
  cudaGetLastError();
  // Control: after the copy, unregistering is fine, once; the memory stays the program's.
  REQUIRE(cudaStreamSynchronize(copy) == cudaSuccess);
  CHECK(cudaHostUnregister(host.data()) == cudaSuccess);
  CHECK(cudaHostUnregister(host.data()) == cudaErrorHostMemoryNotRegistered);
  cudaGetLastError();
  CHECK(host[1023] == 1.0f);
  // Pageable again: an async copy from it is accepted (synchronous, as CUDA does).
  CHECK(cudaMemcpyAsync(dev, host.data(), 4096, cudaMemcpyHostToDevice, copy) == cudaSuccess);
  CHECK(cudaStreamSynchronize(copy) == cudaSuccess);
  CHECK(cudaFree(dev) == cudaSuccess);
  cudaStreamDestroy(copy);
}

TEST_CASE("planted bug: a missing event wait between a kernel and a copy") {
  auto device = cuda_device();
  auto compute = device->create_stream("compute");
  auto copier = device->create_stream("copy");
  Buffer x = upload(*device, *compute, std::vector<float>(1000, 3.0f));
  std::vector<float> host(1000);
  engine_kernels::scale(*device, *compute, x.device<std::byte>(), DType::kFloat32, 1000, 2.0f);
  // The bug: the copy stream reads x without waiting for the kernel that writes it.
  CHECK_THROWS_WITH(device->copy_to_host(host.data(), x.device<std::byte>(), 4000, *copier),
                    Contains("cudaMemcpyAsync") && Contains("scale_kernel") &&
                        Contains("missing cudaStreamWaitEvent"));
  // Control: with the wait the copy sees the kernel's result.
  auto written = device->create_event();
  written->record(*compute);
  copier->wait(*written);
  device->copy_to_host(host.data(), x.device<std::byte>(), 4000, *copier);
  copier->synchronize();
  for (float v : host) CHECK(v == 6.0f);
}

TEST_CASE("planted bug: a launch grid too small for its data") {
  register_planted_double_twin();
  auto device = cuda_device();
  auto stream = device->create_stream("s");
  Buffer x = upload(*device, *stream, std::vector<float>(100, 1.5f));
  float* p = device_access::raw(x.device<float>());
  const cudaStream_t s = cuda_stream_handle(*stream);
  // The bug: one block of 32 threads for 100 elements.
  CHECK(planted_double(p, 100, 1, 32, s) == cudaErrorInvalidConfiguration);
  CHECK_THAT(cudaGetErrorString(cudaErrorInvalidConfiguration),
             Contains("cudaLaunchKernel") && Contains("zrt_planted_double") &&
                 Contains("launch grid too small") && Contains("32 threads"));
  CHECK(cudaGetLastError() == cudaSuccess);  // planted_double already took it
  // Control: 4 blocks of 32 cover 100 elements.
  CHECK(planted_double(p, 100, 4, 32, s) == cudaSuccess);
  std::vector<float> got(100);
  device->copy_to_host(got.data(), x.device<std::byte>(), 400, *stream);
  stream->synchronize();
  for (float v : got) CHECK(v == 3.0f);
}

// A launch asking for more than 48 KiB of dynamic shared memory fails on a GPU unless
// cudaFuncSetAttribute raised the kernel's limit first (the pipelined attention kernels ask for
// 68-70 KiB): the stand-in fails it the same way, and refuses a limit no sm_90 block can have.
TEST_CASE("planted bug: dynamic shared memory above 48 KiB without raising the limit") {
  register_planted_double_twin();
  auto device = cuda_device();
  auto stream = device->create_stream("s");
  Buffer x = upload(*device, *stream, std::vector<float>(128, 1.5f));
  float* p = device_access::raw(x.device<float>());
  const cudaStream_t s = cuda_stream_handle(*stream);
  // The bug: 64 KiB without asking.
  CHECK(planted_double_shared(p, 128, 1, 128, 64 << 10, s) == cudaErrorInvalidValue);
  CHECK_THAT(cudaGetErrorString(cudaErrorInvalidValue),
             Contains("zrt_planted_double") && Contains("65536 B of dynamic shared memory") &&
                 Contains("cudaFuncSetAttribute"));
  CHECK(planted_allow_shared(228 << 10) == cudaErrorInvalidValue);  // above sm_90's opt-in
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // as in CUDA: the last call's error, reset
  CHECK(cudaGetLastError() == cudaSuccess);
  // Control: the limit raised first; 48 KiB never needed it.
  CHECK(planted_double_shared(p, 128, 1, 128, 48 << 10, s) == cudaSuccess);
  CHECK(planted_allow_shared(64 << 10) == cudaSuccess);
  CHECK(planted_double_shared(p, 128, 1, 128, 64 << 10, s) == cudaSuccess);
  std::vector<float> got(128);
  device->copy_to_host(got.data(), x.device<std::byte>(), 512, *stream);
  stream->synchronize();
  for (float v : got) CHECK(v == 6.0f);
}

// cudaEventElapsedTime (the CUDA trace's clock): the time between two records on a stream, and
// CUDA's errors for a timing-disabled or never-recorded event.
TEST_CASE("stand-in: cudaEventElapsedTime measures between records and rejects bad events") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  cudaEvent_t begin = nullptr, end = nullptr, untimed = nullptr, unrecorded = nullptr;
  REQUIRE(cudaEventCreate(&begin) == cudaSuccess);
  REQUIRE(cudaEventCreate(&end) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreate(&unrecorded) == cudaSuccess);
  REQUIRE(cudaEventRecord(begin, stream) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(
              stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); },
              nullptr) == cudaSuccess);
  REQUIRE(cudaEventRecord(end, stream) == cudaSuccess);
  REQUIRE(cudaEventRecord(untimed, stream) == cudaSuccess);
  REQUIRE(cudaEventSynchronize(end) == cudaSuccess);
  float ms = -1.f;
  REQUIRE(cudaEventElapsedTime(&ms, begin, end) == cudaSuccess);
  CHECK(ms >= 29.f);
  CHECK(ms < 5000.f);
  CHECK(cudaEventElapsedTime(&ms, begin, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventElapsedTime(&ms, begin, unrecorded) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  for (cudaEvent_t e : {begin, end, untimed, unrecorded}) CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}
