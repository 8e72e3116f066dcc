// Twins of the NCCL backend's reduction kernels (runtime/comm/cuda_reduce_kernels.cu): the MPI
// backend's reduce_blocks (runtime/comm/reduce_kernels.cc).
#include <cstdint>

#include "runtime/comm/reduce_kernels.h"
#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

const std::string kNs = "zrt::(anonymous namespace)::";

// `type`: the element type as the demangler spells it in the parameter list.
template <typename T>
void reduce_twin(const std::string& name, const std::string& type, DType dtype, bool is_float) {
  const std::string sig = fmt::format("({} const*, long, int, long, bool, {}*)", type, type);
  twin<const T*, long, int, long, bool, T*>(
      "void " + kNs + name + sig, [dtype, is_float](KernelCall& k, const T* blocks, long stride,
                                                    int nblocks, long count, bool flag, T* out) {
        k.require(nblocks >= 1 && stride >= count && count >= 0,
                  fmt::format("nblocks {} stride {} count {}", nblocks, stride, count));
        k.reads(blocks, ((nblocks - 1) * stride + count) * static_cast<long>(sizeof(T)), "blocks");
        k.writes(out, count * static_cast<long>(sizeof(T)), "out");
        const ReduceOp op = is_float ? (flag ? ReduceOp::kAvg : ReduceOp::kSum)
                                     : (flag ? ReduceOp::kMax : ReduceOp::kSum);
        k.run([=] { reduce_blocks(blocks, stride, nblocks, count, dtype, op, out); });
      });
}

}  // namespace

void register_comm_twins() {
  for (const char* format : {"F32", "Bf16", "Fp16"}) {
    const std::string f = kNs + format;
    const std::string name = "reduce_float_kernel<" + f + ">";
    if (std::string(format) == "F32") {
      reduce_twin<float>(name, f + "::T", DType::kFloat32, true);
    } else {
      reduce_twin<std::uint16_t>(name, f + "::T",
                                 std::string(format) == "Bf16" ? DType::kBFloat16 : DType::kFloat16,
                                 true);
    }
  }
  reduce_twin<std::int32_t>("reduce_int_kernel<int, unsigned int>", "int", DType::kInt32, false);
  reduce_twin<std::int64_t>("reduce_int_kernel<long, unsigned long>", "long", DType::kInt64, false);
}

}  // namespace zrt::standin
