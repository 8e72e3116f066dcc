// Kernel launches on the stand-in: each __global__ function nvcc registers (by its mangled name,
// through __cudaRegisterFunction) is run by the CPU twin registered for its demangled name.
//
// A twin is a function (KernelCall&, kernel arguments...): it receives the launch's arguments
// unpacked by the kernel's parameter types, declares what the launch must cover (threads or
// blocks for the data) and which memory it reads and writes, and sets the body that computes the
// kernel's result on the CPU. The dispatcher checks the geometry and every access (live device
// memory, in bounds, stream order) before it enqueues the body on the launch's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "tests/standin/standin_core.h"

namespace zrt::standin {

class KernelCall {
 public:
  KernelCall(std::string name, dim3 grid, dim3 block)
      : name_(std::move(name)), grid_(grid), block_(block) {}

  const std::string& name() const { return name_; }
  dim3 grid() const { return grid_; }
  dim3 block() const { return block_; }
  std::int64_t threads_x() const { return std::int64_t{grid_.x} * block_.x; }

  // Memory the kernel touches (null or zero-byte ranges are skipped).
  void reads(const void* p, std::int64_t bytes, const char* arg) { add(p, bytes, false, arg); }
  void writes(const void* p, std::int64_t bytes, const char* arg) { add(p, bytes, true, arg); }

  // Geometry requirements: fail the launch, naming the kernel, if not met.
  void require_block(unsigned threads);                                // blockDim == (threads,1,1)
  void require_threads(std::int64_t n, const char* what);              // gridDim.x*blockDim.x >= n
  void require_blocks(std::int64_t n, const char* what);               // gridDim.x >= n
  void require_blocks_y(std::int64_t n, const char* what);             // gridDim.y >= n
  void require_rows(std::int64_t n, int per_block, const char* what);  // gridDim.x*per_block >= n
  void require(bool ok, const std::string& message);

  void run(std::function<void()> body) { body_ = std::move(body); }

  const std::vector<Access>& accesses() const { return accesses_; }
  std::function<void()>& body() { return body_; }

 private:
  void add(const void* p, std::int64_t bytes, bool write, const char* arg);
  std::string name_;
  dim3 grid_, block_;
  std::vector<Access> accesses_;
  std::function<void()> body_;
};

// The launch rule of a row-pieces kernel of width nv (kernels/cuda/row_pieces.cuh): C a multiple
// of 8 in (256 * below, 256 * nv], where `below` is the next smaller width (0 for the first),
// and every row pointer 16-byte aligned (null ones skipped).
inline void require_row_pieces(KernelCall& k, int C, int nv, int below,
                               std::initializer_list<const void*> rows) {
  k.require(C % 8 == 0 && C <= 256 * nv && C > 256 * below,
            fmt::format("C {} is not a multiple of 8 in (256 x {}, 256 x {}]", C, below, nv));
  for (const void* p : rows) {
    k.require(p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
              "a row pointer is not 16-byte aligned");
  }
}

using TwinAdapter = std::function<void(KernelCall&, void** args)>;

// Registers the twin of the kernel whose demangled name is `name`.
void register_twin(const std::string& name, TwinAdapter adapter);

namespace unpack_detail {
template <typename... Args, typename F, std::size_t... I>
void unpack(F& f, KernelCall& call, void** args, std::index_sequence<I...>) {
  f(call, *static_cast<Args*>(args[I])...);
}
}  // namespace unpack_detail

// twin<float*, const float*, long>(name, f): f(KernelCall&, float*, const float*, long).
template <typename... Args, typename F>
void twin(const std::string& name, F f) {
  register_twin(name, [f](KernelCall& call, void** args) mutable {
    unpack_detail::unpack<Args...>(f, call, args, std::index_sequence_for<Args...>{});
  });
}

// For tests: registers a twin for a test's own kernel (exported from the stand-in library).
void register_test_twin(const std::string& name, TwinAdapter adapter);

// Called once by the launch dispatcher: registers every twin (twins_*.cc).
void register_engine_twins();
void register_comm_twins();
void register_optimizer_twins();
void register_gpt_twins();
void register_flash_attention_twins();
void register_llama_twins();
void register_ulysses_twins();
void register_moe_twins();

}  // namespace zrt::standin
