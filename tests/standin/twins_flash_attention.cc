// Twins of the fused attention kernels (kernels/cuda/flash_attention.cu and its mma.sync
// variants in flash_attention_mma.cu, head size 64 and, for mma.sync, 128: same arguments, same
// results), written from the math of kernels/cpu/attention.h in plain fp32 loops: the forward
// (out and each row's log-sum-exp), the row term D = dout . out, and the two backward kernels, dQ
// and dK/dV, each adding only its own part of dqkv in the storage type, as the kernel does. The
// kernels round probabilities and dS to 16 bits before their products; the twins do not, so on
// the stand-in these ops equal the CPU backend's to fp32 rounding (the GPU parity test bounds the
// kernels' own rounding). Each kernel comes as kDocs false (doc_start must be null: one document
// per sequence) and true (doc_start (B,T) must be given: query t sees keys [doc_start[t], t]).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using namespace twin_names;
constexpr int kTile = 64;      // rows per block (kernels/cuda/flash_attention.cu)
constexpr int kThreads = 128;  // 4 warps of 16 rows
constexpr float kLog2e = 1.4426950408889634f;

struct Shape {
  int B, T, C, NH, hs;
};

// A kernel instantiation: its name (the head size HS and, for the mma.sync kernels, the COLS
// output columns a block writes are template arguments; $D the kDocs one) and those two numbers.
struct Instance {
  const char* name;
  int hs, cols;
};

// The first key query t of sequence b sees: doc_start[b*T + t], or 0 without documents.
int first_key(const std::int32_t* doc_start, int b, int T, int t) {
  return doc_start != nullptr ? doc_start[I64{b} * T + t] : 0;
}

// The launch's doc_start against its instantiation, and its values against the packing rule
// (kernels/cpu/documents.h), which the kernels rely on and do not check.
void check_documents(KernelCall& k, bool docs, const std::int32_t* doc_start, int B, int T) {
  k.require(docs == (doc_start != nullptr),
            docs ? "the kDocs kernel launched without doc_start"
                 : "doc_start given to the kernel built without documents");
  if (doc_start != nullptr) k.reads(doc_start, I64{B} * T * 4, "doc_start");
}
void check_packing(const std::string& name, const std::int32_t* doc_start, int B, int T) {
  if (doc_start == nullptr) return;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int f = doc_start[I64{b} * T + t];
      const bool ok = t == 0 ? f == 0 : (f == doc_start[I64{b} * T + t - 1] || f == t);
      if (!ok) {
        fail(cudaErrorIllegalAddress, name,
             fmt::format("doc_start[{}] = {} is not a packing of whole documents", I64{b} * T + t,
                         f));
      }
    }
  }
}

std::string with_docs(const char* name, bool docs) {
  std::string text = name;
  const std::size_t at = text.find("$D");
  text.replace(at, 2, docs ? "true" : "false");
  return text;
}

// The launch geometry every fused kernel uses: grid (T/64, B*NH, HS/COLS), 128 threads, for
// C = NH x HS.
Shape check_geometry(KernelCall& k, int T, int C, int NH, const Instance& in) {
  k.require_block(kThreads);
  k.require(NH > 0 && C == NH * in.hs, fmt::format("C {} is not NH {} x {}", C, NH, in.hs));
  k.require(T > 0 && T % kTile == 0, fmt::format("T {} is not a multiple of 64", T));
  k.require(k.grid().x == static_cast<unsigned>(T / kTile),
            fmt::format("grid.x {} is not T/64 = {}", k.grid().x, T / kTile));
  k.require(NH > 0 && k.grid().y % NH == 0, fmt::format("grid.y {} not B x NH", k.grid().y));
  k.require(k.grid().z == static_cast<unsigned>(in.hs / in.cols),
            fmt::format("grid.z {} is not HS/COLS = {}/{}", k.grid().z, in.hs, in.cols));
  return {static_cast<int>(k.grid().y) / NH, T, C, NH, in.hs};
}

// Probabilities p[t][u] of one (b,h) from q, k and lse: exp(s/sqrt(hs) - lse), 0 for u > t and
// for u before t's document.
template <typename S>
std::vector<float> probs(const S* qkv, const float* lse, const std::int32_t* doc_start,
                         const Shape& s, int b, int h) {
  const I64 ld3 = 3 * I64{s.C};
  std::vector<float> p(static_cast<std::size_t>(s.T) * s.T, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  for (int t = 0; t < s.T; ++t) {
    const S* q = qkv + (I64{b} * s.T + t) * ld3 + h * s.hs;
    for (int u = first_key(doc_start, b, s.T, t); u <= t; ++u) {
      const S* k = qkv + (I64{b} * s.T + u) * ld3 + s.C + h * s.hs;
      float dot = 0.0f;
      for (int d = 0; d < s.hs; ++d) dot += ld(q[d]) * ld(k[d]);
      p[static_cast<std::size_t>(t) * s.T + u] =
          std::exp(dot * scale - lse[(I64{b} * s.NH + h) * s.T + t]);
    }
  }
  return p;
}

// dS[t][u] = p (dout_t . v_u - D_t) of one (b,h), over the keys t sees.
template <typename S>
std::vector<float> dscores(const std::vector<float>& p, const S* dout, const S* qkv,
                           const float* rowdot, const std::int32_t* doc_start, const Shape& s,
                           int b, int h) {
  std::vector<float> ds(p.size(), 0.0f);
  for (int t = 0; t < s.T; ++t) {
    const S* dy = dout + (I64{b} * s.T + t) * s.C + h * s.hs;
    for (int u = first_key(doc_start, b, s.T, t); u <= t; ++u) {
      const S* v = qkv + (I64{b} * s.T + u) * 3 * s.C + 2 * s.C + h * s.hs;
      float dp = 0.0f;
      for (int d = 0; d < s.hs; ++d) dp += ld(dy[d]) * ld(v[d]);
      const std::size_t i = static_cast<std::size_t>(t) * s.T + u;
      ds[i] = p[i] * (dp - rowdot[(I64{b} * s.NH + h) * s.T + t]);
    }
  }
  return ds;
}

template <typename S>
void register_storage() {
  const char* n = cuda_name<S>();
  const I64 ss = sizeof(S);

  // The instantiations kernels/cuda/flash_attention{,_mma}.cu launch; COLS as its ColumnSplit.
  for (const bool docs : {false, true}) {
    for (const Instance& in : {Instance{"flash_forward_kernel<$S, 64, $D>", 64, 64},
                               Instance{"flash_mma_forward_kernel<$S, 64, 64, $D>", 64, 64},
                               Instance{"flash_mma_forward_kernel<$S, 128, 128, $D>", 128, 128}}) {
      twin<S*, float*, const S*, int, int, int, float, const std::int32_t*>(
          sig("void " + kNs + with_docs(in.name, docs) +
                  "($S*, float*, $S const*, int, int, int, float, int const*)",
              n),
          [ss, in, docs](KernelCall& k, S* out, float* lse, const S* qkv, int T, int C, int NH,
                         float scale_log2, const std::int32_t* doc_start) {
            const Shape s = check_geometry(k, T, C, NH, in);
            const int hs = s.hs;
            k.require(std::fabs(scale_log2 * std::sqrt(static_cast<float>(hs)) - kLog2e) < 1e-6f,
                      "scale_log2");
            k.writes(out, I64{s.B} * T * C * ss, "out");
            k.writes(lse, I64{s.B} * NH * T * 4, "lse");
            k.reads(qkv, I64{s.B} * T * 3 * C * ss, "qkv");
            check_documents(k, docs, doc_start, s.B, T);
            const std::string name = k.name();
            k.run([=] {
              check_packing(name, doc_start, s.B, T);
              const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
              std::vector<float> row(static_cast<std::size_t>(T));
              for (int b = 0; b < s.B; ++b) {
                for (int h = 0; h < NH; ++h) {
                  for (int t = 0; t < T; ++t) {
                    const S* q = qkv + (I64{b} * T + t) * 3 * C + h * hs;
                    const int first = first_key(doc_start, b, T, t);
                    float mx = -INFINITY;
                    for (int u = first; u <= t; ++u) {
                      const S* kr = qkv + (I64{b} * T + u) * 3 * C + C + h * hs;
                      float dot = 0.0f;
                      for (int d = 0; d < hs; ++d) dot += ld(q[d]) * ld(kr[d]);
                      row[u] = dot * scale;
                      mx = std::fmax(mx, row[u]);
                    }
                    float sum = 0.0f;
                    for (int u = first; u <= t; ++u) sum += std::exp(row[u] - mx);
                    for (int d = 0; d < hs; ++d) {
                      float acc = 0.0f;
                      for (int u = first; u <= t; ++u) {
                        acc += std::exp(row[u] - mx) *
                               ld(qkv[(I64{b} * T + u) * 3 * C + 2 * C + h * hs + d]);
                      }
                      out[(I64{b} * T + t) * C + h * hs + d] = st<S>(acc / sum);
                    }
                    lse[(I64{b} * NH + h) * T + t] = mx + std::log(sum);
                  }
                }
              }
            });
          });
    }
  }

  twin<float*, const S*, const S*, int, int, int, int>(
      sig("void " + kNs +
              "attention_row_dot_kernel<$S>(float*, $S const*, $S const*, int, int, int, int)",
          n),
      [ss](KernelCall& k, float* rowdot, const S* dout, const S* out, int B, int T, int C, int NH) {
        k.require(NH > 0 && C % NH == 0, fmt::format("C {} not divisible by NH {}", C, NH));
        k.require_block(256);
        k.require_rows(I64{B} * T * NH, kRowsPerBlock, "rows B*T*NH");
        k.writes(rowdot, I64{B} * NH * T * 4, "rowdot");
        k.reads(dout, I64{B} * T * C * ss, "dout");
        k.reads(out, I64{B} * T * C * ss, "out");
        k.run([=] {
          const int hs = C / NH;
          for (int b = 0; b < B; ++b) {
            for (int t = 0; t < T; ++t) {
              for (int h = 0; h < NH; ++h) {
                float dot = 0.0f;
                for (int d = 0; d < hs; ++d) {
                  const I64 i = (I64{b} * T + t) * C + h * hs + d;
                  dot += ld(dout[i]) * ld(out[i]);
                }
                rowdot[(I64{b} * NH + h) * T + t] = dot;
              }
            }
          }
        });
      });

  for (const bool docs : {false, true}) {
    for (const Instance& in : {Instance{"flash_backward_dq_kernel<$S, 64, $D>", 64, 64},
                               Instance{"flash_backward_dkdv_kernel<$S, 64, $D>", 64, 64},
                               Instance{"flash_mma_dq_kernel<$S, 64, 64, $D>", 64, 64},
                               Instance{"flash_mma_dkdv_kernel<$S, 64, 64, $D>", 64, 64},
                               Instance{"flash_mma_dq_kernel<$S, 128, 128, $D>", 128, 128},
                               Instance{"flash_mma_dkdv_kernel<$S, 128, 64, $D>", 128, 64}}) {
      const bool dq_kernel = std::string(in.name).find("_dq_") != std::string::npos;
      twin<S*, const S*, const S*, const float*, const float*, int, int, int, float, float,
           const std::int32_t*>(
          sig("void " + kNs + with_docs(in.name, docs) +
                  "($S*, $S const*, $S const*, float const*, float const*, int, int, int, float, "
                  "float, int const*)",
              n),
          [ss, dq_kernel, in, docs](KernelCall& k, S* dqkv, const S* dout, const S* qkv,
                                    const float* lse, const float* rowdot, int T, int C, int NH,
                                    float scale, float scale_log2, const std::int32_t* doc_start) {
            const Shape s = check_geometry(k, T, C, NH, in);
            const int hs = s.hs;
            k.require(std::fabs(scale * std::sqrt(static_cast<float>(hs)) - 1.0f) < 1e-6f &&
                          std::fabs(scale_log2 - scale * kLog2e) < 1e-6f,
                      "scale, scale_log2");
            k.writes(dqkv, I64{s.B} * T * 3 * C * ss, "dqkv");
            k.reads(dout, I64{s.B} * T * C * ss, "dout");
            k.reads(qkv, I64{s.B} * T * 3 * C * ss, "qkv");
            k.reads(lse, I64{s.B} * NH * T * 4, "lse");
            k.reads(rowdot, I64{s.B} * NH * T * 4, "rowdot");
            check_documents(k, docs, doc_start, s.B, T);
            const std::string name = k.name();
            k.run([=] {
              check_packing(name, doc_start, s.B, T);
              const I64 ld3 = 3 * I64{C};
              for (int b = 0; b < s.B; ++b) {
                for (int h = 0; h < NH; ++h) {
                  const std::vector<float> p = probs(qkv, lse, doc_start, s, b, h);
                  const std::vector<float> ds = dscores(p, dout, qkv, rowdot, doc_start, s, b, h);
                  auto at = [&](int t, int u) { return static_cast<std::size_t>(t) * T + u; };
                  auto row = [&](int t, int part) {
                    return (I64{b} * T + t) * ld3 + part * I64{C} + h * hs;
                  };
                  for (int x = 0; x < T; ++x) {
                    for (int d = 0; d < hs; ++d) {
                      if (dq_kernel) {  // dq[x] = scale sum_u ds[x][u] k[u]
                        float acc = 0.0f;
                        for (int u = first_key(doc_start, b, T, x); u <= x; ++u) {
                          acc += ds[at(x, u)] * ld(qkv[row(u, 1) + d]);
                        }
                        dqkv[row(x, 0) + d] = st<S>(ld(dqkv[row(x, 0) + d]) + scale * acc);
                      } else {  // dk[x] = scale sum_t ds[t][x] q[t]; dv[x] = sum_t p[t][x] dout[t]
                        float dk = 0.0f, dv = 0.0f;
                        for (int t = x; t < T && first_key(doc_start, b, T, t) <= x; ++t) {
                          dk += ds[at(t, x)] * ld(qkv[row(t, 0) + d]);
                          dv += p[at(t, x)] * ld(dout[(I64{b} * T + t) * C + h * hs + d]);
                        }
                        dqkv[row(x, 1) + d] = st<S>(ld(dqkv[row(x, 1) + d]) + scale * dk);
                        dqkv[row(x, 2) + d] = st<S>(ld(dqkv[row(x, 2) + d]) + dv);
                      }
                    }
                  }
                }
              }
            });
          });
    }
  }
}

}  // namespace

void register_flash_attention_twins() {
  register_storage<bf16>();
  register_storage<fp16>();
}

}  // namespace zrt::standin
