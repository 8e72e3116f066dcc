// Twins of the NCCL backend's reduction kernels (runtime/comm/cuda_reduce_kernels.cu): the MPI
// backend's reduce_blocks (runtime/comm/reduce_kernels.cc); and of the int8 block quantization
// kernels (runtime/comm/cuda_quantize_kernels.cu): runtime/comm/quantize.cc.
#include <cstdint>

#include "runtime/comm/quantize.h"
#include "runtime/comm/reduce_kernels.h"
#include "tests/standin/kernel_twins.h"

namespace zrt::standin {

namespace {

const std::string kNs = "zrt::(anonymous namespace)::";  // the kernels'
const std::string kFormats = "zrt::cuda_formats::";      // their storage formats

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

// `f`: the Format's name ("F32"...), `type`: its T as the demangler spells it.
template <typename T>
void quantize_twins(const std::string& f, DType dtype) {
  const std::string t = kFormats + f + "::T";
  twin<const T*, long, long, std::int8_t*, float*>(
      fmt::format("void {}quantize_kernel<{}{}>({} const*, long, long, signed char*, float*)", kNs,
                  kFormats, f, t),
      [dtype](KernelCall& k, const T* in, long n, long block, std::int8_t* q, float* scales) {
        k.require(n >= 0 && block >= 1, fmt::format("n {} block {}", n, block));
        k.require_block(256);
        k.reads(in, n * static_cast<long>(sizeof(T)), "in");
        k.writes(q, n, "q");
        k.writes(scales, quantized_block_count(n, block) * 4, "scales");
        k.run([=] { quantize_int8_blocks(in, dtype, n, block, q, scales); });
      });
  twin<const std::int8_t*, const float*, long, long, T*>(
      fmt::format(
          "void {}dequantize_kernel<{}{}>(signed char const*, float const*, long, long, {}*)", kNs,
          kFormats, f, t),
      [dtype](KernelCall& k, const std::int8_t* q, const float* scales, long n, long block,
              T* out) {
        k.require(n >= 0 && block >= 1, fmt::format("n {} block {}", n, block));
        k.reads(q, n, "q");
        k.reads(scales, quantized_block_count(n, block) * 4, "scales");
        k.writes(out, n * static_cast<long>(sizeof(T)), "out");
        k.run([=] { dequantize_int8_blocks(q, scales, n, block, dtype, out); });
      });
  twin<const float*, long, float, T*>(
      fmt::format("void {}narrow_kernel<{}{}>(float const*, long, float, {}*)", kNs, kFormats, f,
                  t),
      [dtype](KernelCall& k, const float* acc, long n, float divisor, T* out) {
        k.reads(acc, n * 4, "acc");
        k.writes(out, n * static_cast<long>(sizeof(T)), "out");
        k.run([=] { narrow_fp32(acc, n, divisor, dtype, out); });
      });
}

}  // namespace

void register_comm_twins() {
  quantize_twins<float>("F32", DType::kFloat32);
  quantize_twins<std::uint16_t>("Bf16", DType::kBFloat16);
  quantize_twins<std::uint16_t>("Fp16", DType::kFloat16);
  twin<const std::int8_t*, const float*, long, long, float*, bool>(
      // Not a template: the demangled name carries no return type.
      kNs + "dequantize_add_kernel(signed char const*, float const*, long, long, float*, bool)",
      [](KernelCall& k, const std::int8_t* q, const float* scales, long n, long block, float* acc,
         bool add) {
        k.require(n >= 0 && block >= 1, fmt::format("n {} block {}", n, block));
        k.reads(q, n, "q");
        k.reads(scales, quantized_block_count(n, block) * 4, "scales");
        if (add) k.reads(acc, n * 4, "acc");
        k.writes(acc, n * 4, "acc");
        k.run([=] { dequantize_int8_blocks_add(q, scales, n, block, acc, add); });
      });
  for (const char* format : {"F32", "Bf16", "Fp16"}) {
    const std::string f = kFormats + format;
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
