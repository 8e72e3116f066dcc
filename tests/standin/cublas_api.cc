// cuBLAS and cuBLASLt stand-ins: the GEMMs zrt calls, computed by OpenBLAS (cblas_sgemm on fp32
// copies, one rounding to the output type) in stream order, with cuBLAS's column-major,
// transpose and leading-dimension rules. Arguments cuBLAS rejects return its status
// (CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED) and the message names the call and the argument
// (cublasGetStatusString gives it on the calling thread).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cblas.h>

#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "kernels/cpu/gelu.h"
#include "runtime/common/dtype.h"
#include "tests/standin/standin_core.h"

using zrt::standin::Access;
using zrt::standin::ApiError;
using zrt::standin::MemKind;
using zrt::standin::Runtime;

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  int device = 0;
};

namespace {

struct LtHandle {
  int device = 0;
};
struct LtDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // GELU_AUX_BIAS: the GELU input written; DGELU: read
  std::int64_t aux_ld = 0;
};
struct LtLayout {
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct LtPref {
  std::uint64_t max_workspace = 0;
};

// A status cuBLAS itself returns (distinct from the CUDA-side ApiError of pointer checks).
class BlasError : public std::runtime_error {
 public:
  BlasError(cublasStatus_t status, const std::string& message)
      : std::runtime_error(message), status(status) {}
  cublasStatus_t status;
};

thread_local std::string t_blas_detail;
thread_local int t_blas_status = 0;

[[noreturn]] void blas_fail(cublasStatus_t status, const std::string& call,
                            const std::string& what) {
  throw BlasError(status, call + ": " + what);
}

cublasStatus_t blas_api(const char* call, const std::function<void()>& body) {
  if (auto sticky = Runtime::get().sticky()) {
    t_blas_status = CUBLAS_STATUS_EXECUTION_FAILED;
    t_blas_detail =
        fmt::format("{}: the CUDA context has a sticky error: {}", call, sticky->second);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  try {
    body();
    return CUBLAS_STATUS_SUCCESS;
  } catch (const BlasError& e) {
    spdlog::warn("cuBLAS stand-in: {}", e.what());
    t_blas_status = e.status;
    t_blas_detail = e.what();
    return e.status;
  } catch (const ApiError& e) {
    // A CUDA-side failure (pointer checks, hazards): on a GPU the GEMM kernel would fault.
    spdlog::warn("cuBLAS stand-in: {}", e.what());
    t_blas_status = CUBLAS_STATUS_EXECUTION_FAILED;
    t_blas_detail = e.what();
    return CUBLAS_STATUS_EXECUTION_FAILED;
  } catch (const std::exception& e) {
    t_blas_status = CUBLAS_STATUS_INTERNAL_ERROR;
    t_blas_detail = fmt::format("{}: {}", call, e.what());
    return CUBLAS_STATUS_INTERNAL_ERROR;
  }
}

std::size_t type_size(cudaDataType_t t, const std::string& call, const char* arg) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                fmt::format("{} type {} is not supported", arg, static_cast<int>(t)));
  }
}

const char* op_name(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? "N" : op == CUBLAS_OP_T ? "T" : "C";
}

// A column-major operand as stored: `rows` x `cols` with leading dimension `ld`.
struct Operand {
  const void* ptr;
  cudaDataType_t type;
  std::int64_t rows, cols, ld;
  const char* name;
  std::size_t bytes(std::size_t elem) const {  // the span, padding between columns included
    if (rows == 0 || cols == 0) return 0;
    return static_cast<std::size_t>((cols - 1) * ld + rows) * elem;
  }
  std::size_t moved(std::size_t elem) const {  // the elements themselves
    return static_cast<std::size_t>(rows * cols) * elem;
  }
};

// Loads a stored column-major matrix into fp32 (same layout, ld kept).
std::vector<float> to_float(const Operand& m, std::size_t count) {
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    switch (m.type) {
      case CUDA_R_32F:
        out[i] = static_cast<const float*>(m.ptr)[i];
        break;
      case CUDA_R_16BF:
        out[i] = zrt::to_float(static_cast<const zrt::bf16*>(m.ptr)[i]);
        break;
      default:
        out[i] = zrt::to_float(static_cast<const zrt::fp16*>(m.ptr)[i]);
        break;
    }
  }
  return out;
}

void store(void* p, cudaDataType_t type, std::size_t i, float v) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDA_R_16BF:
      static_cast<zrt::bf16*>(p)[i] = zrt::to_bf16(v);
      break;
    default:
      static_cast<zrt::fp16*>(p)[i] = zrt::to_fp16(v);
      break;
  }
}

// C (m x n, ldc) = alpha op(A) op(B) + beta C [+ bias[row]], column-major, in fp32.
struct GemmArgs {
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha, beta;
  Operand a, b;
  const void* c_in;  // C read (may equal d)
  void* d;
  cudaDataType_t c_type;
  std::int64_t ldc;
  const void* bias = nullptr;  // length m, of c_type
  // cuBLASLt's GELU epilogues (the tanh approximation, on the fp32 result): GELU_AUX_BIAS
  // stores the biased result (the GELU's input) to aux and the GELU of it to D; DGELU stores
  // gelu'(aux) * result to D. aux is m x n of c_type with leading dimension aux_ld.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  // BGRADA: bias_grad (m) = op(A) summed over k; BGRADB: bias_grad (n) = op(B) summed over k;
  // unscaled by alpha, overwritten, of c_type (cuBLASLt's bias-gradient epilogues).
  void* bias_grad = nullptr;
  std::int64_t bias_grad_length() const { return epilogue == CUBLASLT_EPILOGUE_BGRADA ? m : n; }
};

void run_gemm(const GemmArgs& g) {
  const std::size_t a_count = g.a.bytes(1), b_count = g.b.bytes(1);
  std::vector<float> a = to_float(g.a, a_count), b = to_float(g.b, b_count);
  std::vector<float> c(static_cast<std::size_t>((g.n - 1) * g.ldc + g.m), 0.0f);
  if (g.beta != 0.0f) c = to_float(Operand{g.c_in, g.c_type, g.m, g.n, g.ldc, "C"}, c.size());
  if (g.k > 0) {
    cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha,
                a.empty() ? nullptr : a.data(), static_cast<int>(g.a.ld),
                b.empty() ? nullptr : b.data(), static_cast<int>(g.b.ld), g.beta, c.data(),
                static_cast<int>(g.ldc));
  } else {
    for (float& v : c) v *= g.beta;
  }
  if (g.bias_grad != nullptr) {
    const bool from_a = g.epilogue == CUBLASLT_EPILOGUE_BGRADA;
    const std::vector<float>& src = from_a ? a : b;
    const std::int64_t ld = from_a ? g.a.ld : g.b.ld;
    const bool transposed = (from_a ? g.ta : g.tb) == CUBLAS_OP_T;
    // op(X)[row, col] of a column-major X: X[row + col * ld], or X[col + row * ld] transposed.
    auto op_at = [&](std::int64_t row, std::int64_t col) {
      return src[static_cast<std::size_t>(transposed ? col + row * ld : row + col * ld)];
    };
    for (std::int64_t i = 0; i < g.bias_grad_length(); ++i) {
      float sum = 0.0f;  // op(A)'s row i (m x k) or op(B)'s column i (k x n), over k
      for (int kk = 0; kk < g.k; ++kk) sum += from_a ? op_at(i, kk) : op_at(kk, i);
      store(g.bias_grad, g.c_type, static_cast<std::size_t>(i), sum);
    }
  }
  std::vector<float> bias;
  if (g.bias != nullptr)
    bias = to_float(Operand{g.bias, g.c_type, g.m, 1, g.m, "bias"}, static_cast<std::size_t>(g.m));
  const bool gelu = g.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = g.epilogue == CUBLASLT_EPILOGUE_DGELU;
  std::vector<float> column(static_cast<std::size_t>(g.m)), local(column.size());
  for (int j = 0; j < g.n; ++j) {
    for (int i = 0; i < g.m; ++i) {
      const std::size_t at = static_cast<std::size_t>(j) * g.ldc + i;
      column[static_cast<std::size_t>(i)] =
          bias.empty() ? c[at] : c[at] + bias[static_cast<std::size_t>(i)];
    }
    const std::size_t aux_at = static_cast<std::size_t>(j) * g.aux_ld;
    if (gelu) {
      for (int i = 0; i < g.m; ++i) store(g.aux, g.c_type, aux_at + i, column[i]);
      zrt::kernels::cpu::gelu_forward<float>(local.data(), column.data(), g.m);
      column.swap(local);
    } else if (dgelu) {
      // gelu_backward accumulates: from zero it gives gelu'(x) * result.
      const std::vector<float> x = to_float(
          Operand{static_cast<const std::byte*>(g.aux) + aux_at * type_size(g.c_type, "", ""),
                  g.c_type, g.m, 1, g.m, "aux"},
          column.size());
      std::fill(local.begin(), local.end(), 0.0f);
      zrt::kernels::cpu::gelu_backward<float>(local.data(), x.data(), column.data(), g.m);
      column.swap(local);
    }
    for (int i = 0; i < g.m; ++i) {
      store(g.d, g.c_type, static_cast<std::size_t>(j) * g.ldc + i, column[i]);
    }
  }
}

// Validates a GEMM as cuBLAS does and returns the stored operand shapes.
void check_gemm(const std::string& call, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                int k, Operand& a, Operand& b, std::int64_t ldc, cudaDataType_t c_type) {
  auto invalid = [&](const std::string& what) {
    blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, what);
  };
  if (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T)
    invalid(fmt::format("transa {} unsupported", static_cast<int>(ta)));
  if (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)
    invalid(fmt::format("transb {} unsupported", static_cast<int>(tb)));
  if (m < 0 || n < 0 || k < 0)
    invalid(fmt::format("m {} n {} k {}: dimensions must be >= 0", m, n, k));
  // Stored shapes: op(A) is m x k, op(B) is k x n.
  a.rows = ta == CUBLAS_OP_N ? m : k;
  a.cols = ta == CUBLAS_OP_N ? k : m;
  b.rows = tb == CUBLAS_OP_N ? k : n;
  b.cols = tb == CUBLAS_OP_N ? n : k;
  if (a.ld < std::max<std::int64_t>(1, a.rows)) {
    invalid(fmt::format("lda {} < max(1, {}) (A is {} x {} as stored, transa {}, m {} n {} k {})",
                        a.ld, a.rows, a.rows, a.cols, op_name(ta), m, n, k));
  }
  if (b.ld < std::max<std::int64_t>(1, b.rows)) {
    invalid(fmt::format("ldb {} < max(1, {}) (B is {} x {} as stored, transb {}, m {} n {} k {})",
                        b.ld, b.rows, b.rows, b.cols, op_name(tb), m, n, k));
  }
  if (ldc < std::max(1, m)) invalid(fmt::format("ldc {} < max(1, m = {})", ldc, m));
  // CUBLAS_COMPUTE_32F type combinations zrt uses: equal A/B types, C of that type or fp32.
  if (a.type != b.type || (c_type != a.type && c_type != CUDA_R_32F)) {
    blas_fail(
        CUBLAS_STATUS_NOT_SUPPORTED, call,
        fmt::format("type combination A {} B {} C {} is not supported with CUBLAS_COMPUTE_32F",
                    static_cast<int>(a.type), static_cast<int>(b.type), static_cast<int>(c_type)));
  }
}

// Checks pointers, records accesses and enqueues the GEMM(s) on `stream`.
void enqueue_gemms(const std::string& call, cudaStream_t stream, std::vector<GemmArgs> gemms) {
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  auto* s = rt.stream(stream, call);
  std::vector<Access> accesses;
  for (const GemmArgs& g : gemms) {
    const std::size_t ea = type_size(g.a.type, call, "A"), eb = type_size(g.b.type, call, "B"),
                      ec = type_size(g.c_type, call, "C");
    const auto dev = {MemKind::kDevice};
    rt.check_range(call, "A", g.a.ptr, g.a.bytes(ea), dev);
    rt.check_range(call, "B", g.b.ptr, g.b.bytes(eb), dev);
    const std::size_t c_bytes = Operand{g.d, g.c_type, g.m, g.n, g.ldc, "C"}.bytes(ec);
    rt.check_range(call, "C", g.d, c_bytes, dev);
    if (g.bias != nullptr)
      rt.check_range(call, "bias", g.bias, static_cast<std::size_t>(g.m) * ec, dev);
    accesses.push_back({g.a.ptr, g.a.bytes(ea), false, "A", g.a.moved(ea)});
    accesses.push_back({g.b.ptr, g.b.bytes(eb), false, "B", g.b.moved(eb)});
    if (g.bias != nullptr)
      accesses.push_back({g.bias, static_cast<std::size_t>(g.m) * ec, false, "bias"});
    if (g.bias_grad != nullptr) {
      const std::size_t bytes = static_cast<std::size_t>(g.bias_grad_length()) * ec;
      rt.check_range(call, "bias gradient", g.bias_grad, bytes, dev);
      accesses.push_back({g.bias_grad, bytes, true, "bias gradient"});
    }
    if (g.aux != nullptr) {
      const Operand aux{g.aux, g.c_type, g.m, g.n, g.aux_ld, "aux"};
      const std::size_t aux_bytes = aux.bytes(ec);
      rt.check_range(call, "aux", g.aux, aux_bytes, dev);
      accesses.push_back(
          {g.aux, aux_bytes, g.epilogue != CUBLASLT_EPILOGUE_DGELU, "aux", aux.moved(ec)});
    }
    const Operand c{g.d, g.c_type, g.m, g.n, g.ldc, "C"};
    // beta != 0 reads C (c_in is d then: cublasLtMatmul refuses C != D with beta != 0).
    if (g.beta != 0.0f) accesses.push_back({g.c_in, c_bytes, false, "C", c.moved(ec)});
    accesses.push_back({g.d, c_bytes, true, "C", c.moved(ec)});
  }
  const std::string what =
      fmt::format("{} ({} GEMM{} m {} n {} k {})", call, gemms.size(), gemms.size() == 1 ? "" : "s",
                  gemms.front().m, gemms.front().n, gemms.front().k);
  rt.enqueue(*s, call, what, accesses, [gemms = std::move(gemms)] {
    for (const GemmArgs& g : gemms) run_gemm(g);
  });
}

float scalar(const void* p, const std::string& call, const char* arg) {
  if (p == nullptr) blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, fmt::format("{} is null", arg));
  return *static_cast<const float*>(p);  // CUBLAS_POINTER_MODE_HOST, fp32 scale type
}

cublasHandle_t check_handle(cublasHandle_t h, const std::string& call) {
  if (h == nullptr) blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, call, "handle is null");
  return h;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  return blas_api("cublasCreate", [&] {
    if (handle == nullptr) blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "handle is null");
    auto* h = new cublasContext();
    h->device = Runtime::get().current_device();
    *handle = h;
  });
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  return blas_api("cublasDestroy", [&] { delete check_handle(handle, "cublasDestroy"); });
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  return blas_api("cublasSetStream", [&] {
    check_handle(handle, "cublasSetStream");
    std::lock_guard<std::mutex> lock(Runtime::get().mutex());
    Runtime::get().stream(stream, "cublasSetStream");  // must be a live stream
    handle->stream = stream;
  });
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  return blas_api("cublasSetMathMode", [&] {
    check_handle(handle, "cublasSetMathMode");
    handle->math = mode;
  });
}

const char* cublasGetStatusString(cublasStatus_t status) {
  const char* base = "CUBLAS_STATUS_UNKNOWN";
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      base = "CUBLAS_STATUS_NOT_INITIALIZED";
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      base = "CUBLAS_STATUS_INVALID_VALUE";
      break;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      base = "CUBLAS_STATUS_NOT_SUPPORTED";
      break;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      base = "CUBLAS_STATUS_EXECUTION_FAILED";
      break;
    case CUBLAS_STATUS_INTERNAL_ERROR:
      base = "CUBLAS_STATUS_INTERNAL_ERROR";
      break;
    default:
      break;
  }
  if (t_blas_status != status || t_blas_detail.empty()) return base;
  thread_local std::string text;
  text = fmt::format("{} [cuBLAS stand-in: {}]", base, t_blas_detail);
  return text.c_str();
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t /*algo*/) {
  return blas_api("cublasGemmEx", [&] {
    const std::string call = "cublasGemmEx";
    check_handle(handle, call);
    if (computeType != CUBLAS_COMPUTE_32F) {
      blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                fmt::format("computeType {}", static_cast<int>(computeType)));
    }
    GemmArgs g{transa,
               transb,
               m,
               n,
               k,
               scalar(alpha, call, "alpha"),
               scalar(beta, call, "beta"),
               Operand{A, Atype, 0, 0, lda, "A"},
               Operand{B, Btype, 0, 0, ldb, "B"},
               C,
               C,
               Ctype,
               ldc};
    check_gemm(call, transa, transb, m, n, k, g.a, g.b, ldc, Ctype);
    if (m == 0 || n == 0) return;
    enqueue_gemms(call, handle->stream, {g});
  });
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t /*algo*/) {
  return blas_api("cublasGemmStridedBatchedEx", [&] {
    const std::string call = "cublasGemmStridedBatchedEx";
    check_handle(handle, call);
    if (computeType != CUBLAS_COMPUTE_32F) {
      blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                fmt::format("computeType {}", static_cast<int>(computeType)));
    }
    if (batchCount < 0)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, fmt::format("batchCount {} < 0", batchCount));
    GemmArgs g{transa,
               transb,
               m,
               n,
               k,
               scalar(alpha, call, "alpha"),
               scalar(beta, call, "beta"),
               Operand{A, Atype, 0, 0, lda, "A"},
               Operand{B, Btype, 0, 0, ldb, "B"},
               C,
               C,
               Ctype,
               ldc};
    check_gemm(call, transa, transb, m, n, k, g.a, g.b, ldc, Ctype);
    if (m == 0 || n == 0 || batchCount == 0) return;
    const std::size_t ea = type_size(Atype, call, "A"), eb = type_size(Btype, call, "B"),
                      ec = type_size(Ctype, call, "C");
    // Outputs of different batch entries must not overlap (cuBLAS computes them in parallel).
    const std::int64_t c_extent = (static_cast<std::int64_t>(n) - 1) * ldc + m;
    if (batchCount > 1 && strideC < c_extent) {
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call,
                fmt::format("strideC {} < the {} elements of one C (m {} n {} ldc {}): batch "
                            "outputs overlap",
                            strideC, c_extent, m, n, ldc));
    }
    std::vector<GemmArgs> gemms;
    for (int i = 0; i < batchCount; ++i) {
      GemmArgs gi = g;
      gi.a.ptr = static_cast<const char*>(A) + i * strideA * static_cast<long long>(ea);
      gi.b.ptr = static_cast<const char*>(B) + i * strideB * static_cast<long long>(eb);
      gi.d = static_cast<char*>(C) + i * strideC * static_cast<long long>(ec);
      gi.c_in = gi.d;
      gemms.push_back(gi);
    }
    enqueue_gemms(call, handle->stream, std::move(gemms));
  });
}

// ---- cuBLASLt ----------------------------------------------------------------------------------

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  return blas_api("cublasLtCreate", [&] {
    if (handle == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "handle is null");
    *handle = reinterpret_cast<cublasLtHandle_t>(new LtHandle{Runtime::get().current_device()});
  });
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  return blas_api("cublasLtDestroy", [&] {
    if (handle == nullptr)
      blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "handle is null");
    delete reinterpret_cast<LtHandle*>(handle);
  });
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  return blas_api("cublasLtMatmulDescCreate", [&] {
    if (desc == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "desc is null");
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) {
      blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate",
                "only CUBLAS_COMPUTE_32F with fp32 scale");
    }
    *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new LtDesc{compute, scale});
  });
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return blas_api("cublasLtMatmulDescDestroy", [&] { delete reinterpret_cast<LtDesc*>(desc); });
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  return blas_api("cublasLtMatmulDescSetAttribute", [&] {
    const std::string call = "cublasLtMatmulDescSetAttribute";
    auto* d = reinterpret_cast<LtDesc*>(desc);
    if (d == nullptr || buf == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "null desc or buffer");
    auto need = [&](size_t bytes) {
      if (size != bytes) {
        blas_fail(CUBLAS_STATUS_INVALID_VALUE, call,
                  fmt::format("attribute {}: {} B given, {} B expected", static_cast<int>(attr),
                              size, bytes));
      }
    };
    switch (attr) {
      case CUBLASLT_MATMUL_DESC_TRANSA:
        need(sizeof(int32_t));
        std::memcpy(&d->transa, buf, size);
        break;
      case CUBLASLT_MATMUL_DESC_TRANSB:
        need(sizeof(int32_t));
        std::memcpy(&d->transb, buf, size);
        break;
      case CUBLASLT_MATMUL_DESC_EPILOGUE:
        need(sizeof(uint32_t));
        std::memcpy(&d->epilogue, buf, size);
        break;
      case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        need(sizeof(void*));
        std::memcpy(&d->bias, buf, size);
        break;
      case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        need(sizeof(void*));
        std::memcpy(&d->aux, buf, size);
        break;
      case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        need(sizeof(int64_t));
        std::memcpy(&d->aux_ld, buf, size);
        break;
      default:
        blas_fail(
            CUBLAS_STATUS_NOT_SUPPORTED, call,
            fmt::format("attribute {} not supported by the stand-in", static_cast<int>(attr)));
    }
  });
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  return blas_api("cublasLtMatrixLayoutCreate", [&] {
    if (layout == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "layout is null");
    type_size(type, "cublasLtMatrixLayoutCreate", "layout");
    *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{type, rows, cols, ld});
  });
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return blas_api("cublasLtMatrixLayoutDestroy",
                  [&] { delete reinterpret_cast<LtLayout*>(layout); });
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return blas_api("cublasLtMatmulPreferenceCreate", [&] {
    if (pref == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "pref is null");
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new LtPref{});
  });
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return blas_api("cublasLtMatmulPreferenceDestroy",
                  [&] { delete reinterpret_cast<LtPref*>(pref); });
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  return blas_api("cublasLtMatmulPreferenceSetAttribute", [&] {
    const std::string call = "cublasLtMatmulPreferenceSetAttribute";
    auto* p = reinterpret_cast<LtPref*>(pref);
    if (p == nullptr || buf == nullptr)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "null preference or buffer");
    switch (attr) {
      case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (size != sizeof(uint64_t))
          blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "workspace size must be uint64_t");
        std::memcpy(&p->max_workspace, buf, size);
        break;
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (size != sizeof(uint32_t))
          blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "alignment must be uint32_t");
        break;
      default:
        blas_fail(
            CUBLAS_STATUS_NOT_SUPPORTED, call,
            fmt::format("attribute {} not supported by the stand-in", static_cast<int>(attr)));
    }
  });
}

namespace {
// The GEMM a matmul describes (D = op(A) op(B) + bias), validated against the layouts.
GemmArgs lt_gemm(const std::string& call, const LtDesc& d, const LtLayout& a, const LtLayout& b,
                 const LtLayout& c, const LtLayout& dl) {
  auto invalid = [&](const std::string& what) {
    blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, what);
  };
  for (const auto* l : {&a, &b, &c, &dl}) {
    if (l->ld < static_cast<std::int64_t>(std::max<std::uint64_t>(1, l->rows))) {
      invalid(fmt::format("a layout's ld {} < its rows {} (column-major)", l->ld, l->rows));
    }
  }
  const auto m = static_cast<int>(d.transa == CUBLAS_OP_N ? a.rows : a.cols);
  const auto k = static_cast<int>(d.transa == CUBLAS_OP_N ? a.cols : a.rows);
  const auto kb = static_cast<int>(d.transb == CUBLAS_OP_N ? b.rows : b.cols);
  const auto n = static_cast<int>(d.transb == CUBLAS_OP_N ? b.cols : b.rows);
  if (k != kb) invalid(fmt::format("op(A) is {} x {} but op(B) is {} x {}", m, k, kb, n));
  if (static_cast<int>(dl.rows) != m || static_cast<int>(dl.cols) != n || c.rows != dl.rows ||
      c.cols != dl.cols) {
    invalid(fmt::format("D is {} x {}, C {} x {}, but op(A) op(B) is {} x {}", dl.rows, dl.cols,
                        c.rows, c.cols, m, n));
  }
  const bool gelu_aux = d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = d.epilogue == CUBLASLT_EPILOGUE_DGELU;
  const bool bgrad =
      d.epilogue == CUBLASLT_EPILOGUE_BGRADA || d.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_BIAS &&
      !gelu_aux && !dgelu && !bgrad) {
    blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
              fmt::format("epilogue {}", static_cast<int>(d.epilogue)));
  }
  if ((d.epilogue == CUBLASLT_EPILOGUE_BIAS || gelu_aux || bgrad) && d.bias == nullptr)
    invalid("BIAS or BGRAD epilogue without a bias pointer");
  // The bias-gradient epilogues sum an operand as stored untransposed (A) or transposed (B);
  // other layouts are declined (NVIDIA's nvmath-python states and works around the same rule).
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA && d.transa != CUBLAS_OP_N) {
    blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "BGRADA needs A untransposed");
  }
  if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB && d.transb != CUBLAS_OP_T) {
    blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "BGRADB needs B transposed");
  }
  if (gelu_aux || dgelu) {
    // cublasLtMatmulDescAttributes_t: the GELU input matrix's leading dimension "must be
    // divisible by 8 and be no less than the number of rows in the output matrix".
    if (d.aux == nullptr)
      invalid("GELU epilogue without CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER");
    if (d.aux_ld % 8 != 0 || d.aux_ld < static_cast<std::int64_t>(dl.rows)) {
      invalid(fmt::format("EPILOGUE_AUX_LD {} is not a multiple of 8 >= D's {} rows", d.aux_ld,
                          dl.rows));
    }
  }
  if (a.type != b.type || c.type != dl.type || (dl.type != a.type && dl.type != CUDA_R_32F)) {
    blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "unsupported layout type combination");
  }
  GemmArgs g{d.transa,
             d.transb,
             m,
             n,
             k,
             1.0f,
             0.0f,
             Operand{nullptr, a.type, static_cast<std::int64_t>(a.rows),
                     static_cast<std::int64_t>(a.cols), a.ld, "A"},
             Operand{nullptr, b.type, static_cast<std::int64_t>(b.rows),
                     static_cast<std::int64_t>(b.cols), b.ld, "B"},
             nullptr,
             nullptr,
             dl.type,
             dl.ld};
  g.bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || gelu_aux ? d.bias : nullptr;
  g.bias_grad = bgrad ? const_cast<void*>(d.bias) : nullptr;
  g.epilogue = d.epilogue;
  g.aux = gelu_aux || dgelu ? d.aux : nullptr;
  g.aux_ld = d.aux_ld;
  return g;
}
}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  return blas_api("cublasLtMatmulAlgoGetHeuristic", [&] {
    const std::string call = "cublasLtMatmulAlgoGetHeuristic";
    if (!handle || !desc || !a || !b || !c || !d || !pref || !results || !returned ||
        requested < 1) {
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "null argument or requestedAlgoCount < 1");
    }
    lt_gemm(call, *reinterpret_cast<LtDesc*>(desc), *reinterpret_cast<LtLayout*>(a),
            *reinterpret_cast<LtLayout*>(b), *reinterpret_cast<LtLayout*>(c),
            *reinterpret_cast<LtLayout*>(d));
    std::memset(results, 0, sizeof *results);
    results->algo.data[0] = 0x5a;  // the stand-in's one "algorithm"
    results->workspaceSize = 0;
    results->state = CUBLAS_STATUS_SUCCESS;
    results->wavesCount = 1.0f;
    *returned = 1;
  });
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  return blas_api("cublasLtMatmul", [&] {
    const std::string call = "cublasLtMatmul";
    if (!handle || !desc || !a || !b || !c || !d)
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call, "null handle or descriptor");
    if (algo != nullptr && algo->data[0] != 0x5a) {
      blas_fail(CUBLAS_STATUS_INVALID_VALUE, call,
                "algo was not returned by cublasLtMatmulAlgoGetHeuristic");
    }
    GemmArgs g = lt_gemm(call, *reinterpret_cast<LtDesc*>(desc), *reinterpret_cast<LtLayout*>(a),
                         *reinterpret_cast<LtLayout*>(b), *reinterpret_cast<LtLayout*>(c),
                         *reinterpret_cast<LtLayout*>(d));
    g.alpha = scalar(alpha, call, "alpha");
    g.beta = scalar(beta, call, "beta");
    g.a.ptr = A;
    g.b.ptr = B;
    g.c_in = C;
    g.d = D;
    if (C != D && g.beta != 0.0f) {
      blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                "C != D with beta != 0 is not modelled by the stand-in");
    }
    if (workspace_bytes > 0) {
      std::lock_guard<std::mutex> lock(Runtime::get().mutex());
      Runtime::get().check_range(call, "workspace", workspace, workspace_bytes, {MemKind::kDevice});
    }
    if (g.m == 0 || g.n == 0) return;
    enqueue_gemms(call, stream, {g});
  });
}

}  // extern "C"
