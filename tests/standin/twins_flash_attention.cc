// Twins of the fused attention kernels (kernels/cuda/flash_attention.cu and its mma.sync
// variants in flash_attention_mma.cu, head size 64 and, for mma.sync, 128: same arguments, same
// results), written from the math of kernels/cpu/attention.h in plain fp32 loops: the forward
// (out and each row's log-sum-exp), the row term D = dout . out, and the two backward kernels, dQ
// and dK/dV, each adding only its own part of the gradients in the storage type, as the kernel
// does. The WMMA kernels read the packed (B,T,3C) qkv; the mma ones q, k, v where they are (rows
// of their own strides, query head h reading key/value head h / group: grouped-query attention
// in place), their dK/dV a block per key/value head summing its group. The
// kernels round probabilities and dS to 16 bits before their products; the twins do not, so on
// the stand-in these ops equal the CPU backend's to fp32 rounding (the GPU parity test bounds the
// kernels' own rounding). Each kernel comes as kDocs false (doc_start must be null and window 0:
// one document per sequence, no window) and true (doc_start (B,T) or a sliding window W or both
// given: query t sees keys [max(doc_start[t], t - W + 1), t]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
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
  int B, T, C, NH, hs, group;
};

// Where a launch's q, k, v (or dq, dk, dv) rows are: flash_attention_mma.cuh's HeadRows (query
// head h reads key/value head h / group). The WMMA kernels take the packed (B,T,3C) qkv: q, k, v
// at columns 0, C, 2C of rows of 3C, group 1 (packed()).
template <typename P>
struct Rows {
  P* q;
  P* k;
  P* v;
  I64 q_ld, kv_ld;
  int group;
  P* q_row(const Shape& s, int b, int t, int h) const {
    return q + (I64{b} * s.T + t) * q_ld + I64{h} * s.hs;
  }
  P* k_row(const Shape& s, int b, int t, int h) const {
    return k + (I64{b} * s.T + t) * kv_ld + I64{h / group} * s.hs;
  }
  P* v_row(const Shape& s, int b, int t, int h) const {
    return v + (I64{b} * s.T + t) * kv_ld + I64{h / group} * s.hs;
  }
};
template <typename P>
Rows<P> packed(P* qkv, int C) {
  return {qkv, qkv + C, qkv + 2 * I64{C}, 3 * I64{C}, 3 * I64{C}, 1};
}

// A kernel instantiation: its name (the head size HS and, for the mma.sync kernels, the COLS
// output columns a block writes are template arguments; $D the kDocs one) and those two numbers.
struct Instance {
  const char* name;
  int hs, cols;
};

// A launch's packed documents (doc_start (B,T) or null) and sliding window (0: none).
struct Keys {
  const std::int32_t* doc_start;
  int window;
};

// The first key query t of sequence b sees: doc_start[b*T + t] (0 without documents), or
// t - window + 1 when the window starts later.
int first_key(const Keys& keys, int b, int T, int t) {
  const int doc = keys.doc_start != nullptr ? keys.doc_start[I64{b} * T + t] : 0;
  return keys.window > 0 ? std::max(doc, t - keys.window + 1) : doc;
}

// The launch's doc_start and window against its instantiation, and doc_start's values against
// the packing rule (kernels/cpu/documents.h), which the kernels rely on and do not check.
void check_documents(KernelCall& k, bool docs, const Keys& keys, int B, int T) {
  k.require(docs == (keys.doc_start != nullptr || keys.window > 0),
            docs ? "the kDocs kernel launched without doc_start or a window"
                 : "doc_start or a window given to the kernel built without documents");
  k.require(keys.window >= 0 && keys.window < T,
            fmt::format("window {} outside [0, T = {}) (kernels/ops.h passes a longer one as 0)",
                        keys.window, T));
  if (keys.doc_start != nullptr) k.reads(keys.doc_start, I64{B} * T * 4, "doc_start");
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

// Each of `instances` as the staged (false) and the pipelined (true) mma kernel: the same
// arguments and results (flash_attention_mma.cuh), so the same twin.
std::vector<std::pair<Instance, bool>> pipelined_or_not(std::initializer_list<Instance> instances) {
  std::vector<std::pair<Instance, bool>> out;
  for (const bool pipelined : {false, true}) {
    for (const Instance& in : instances) out.emplace_back(in, pipelined);
  }
  return out;
}

// The kernel's name with its kDocs ($D) and, for the mma kernels, kPipelined ($P) arguments.
std::string with_docs(const char* name, bool docs, bool pipelined = false) {
  std::string text = name;
  const std::size_t at = text.find("$D");
  text.replace(at, 2, docs ? "true" : "false");
  if (const std::size_t p = text.find("$P"); p != std::string::npos) {
    text.replace(p, 2, pipelined ? "true" : "false");
  }
  return text;
}

// The launch geometry every fused kernel uses: grid (T/64, B*heads, HS/COLS), 128 threads, for
// C = NH x HS, where heads is NH (the forward, dQ) or, for the mma dK/dV kernel, NH / group (a
// block per key/value head).
Shape check_geometry(KernelCall& k, int T, int C, int NH, int group, bool per_kv_head,
                     const Instance& in) {
  k.require_block(kThreads);
  k.require(NH > 0 && C == NH * in.hs, fmt::format("C {} is not NH {} x {}", C, NH, in.hs));
  k.require(group >= 1 && NH % group == 0,
            fmt::format("{} query heads do not fall in groups of {}", NH, group));
  k.require(T > 0 && T % kTile == 0, fmt::format("T {} is not a multiple of 64", T));
  k.require(k.grid().x == static_cast<unsigned>(T / kTile),
            fmt::format("grid.x {} is not T/64 = {}", k.grid().x, T / kTile));
  const int heads = per_kv_head ? NH / group : NH;
  k.require(heads > 0 && k.grid().y % heads == 0,
            fmt::format("grid.y {} not B x {} heads", k.grid().y, heads));
  k.require(k.grid().z == static_cast<unsigned>(in.hs / in.cols),
            fmt::format("grid.z {} is not HS/COLS = {}/{}", k.grid().z, in.hs, in.cols));
  return {static_cast<int>(k.grid().y) / heads, T, C, NH, in.hs, group};
}

// The bytes from a view's first row to the end of its last: (B*T - 1) rows of `ld` and one of
// `width` elements.
I64 extent(const Shape& s, I64 ld, I64 width, I64 ss) {
  return ((I64{s.B} * s.T - 1) * ld + width) * ss;
}
// Declares the launch's q, k, v reads (or, `write`, its dq, dk, dv writes) and checks the row
// rules the mma kernels rely on: strides of whole heads, rows 16-byte aligned.
template <typename P>
void declare(KernelCall& k, const Rows<P>& r, const Shape& s, I64 ss, bool write, bool check_q,
             bool check_kv) {
  const I64 kv_width = I64{s.NH / s.group} * s.hs;
  k.require(r.q_ld >= s.C && r.kv_ld >= kv_width, "row strides shorter than the rows");
  const auto aligned = [](const void* p, I64 ld, I64 ss_) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && (ld * ss_) % 16 == 0;
  };
  if (check_q) {
    k.require(aligned(r.q, r.q_ld, ss), "q rows are not 16-byte aligned");
    if (write) {
      k.writes(r.q, extent(s, r.q_ld, s.C, ss), "dq");
    } else {
      k.reads(r.q, extent(s, r.q_ld, s.C, ss), "q");
    }
  }
  if (check_kv) {
    k.require(aligned(r.k, r.kv_ld, ss) && aligned(r.v, r.kv_ld, ss),
              "k, v rows are not 16-byte aligned");
    if (write) {
      k.writes(r.k, extent(s, r.kv_ld, kv_width, ss), "dk");
      k.writes(r.v, extent(s, r.kv_ld, kv_width, ss), "dv");
    } else {
      k.reads(r.k, extent(s, r.kv_ld, kv_width, ss), "k");
      k.reads(r.v, extent(s, r.kv_ld, kv_width, ss), "v");
    }
  }
}

// Probabilities p[t][u] of one (b,h) from q, k and lse: exp(s/sqrt(hs) - lse), 0 for u > t and
// for u before t's document.
template <typename S>
std::vector<float> probs(const Rows<const S>& in, const float* lse, const Keys& keys,
                         const Shape& s, int b, int h) {
  std::vector<float> p(static_cast<std::size_t>(s.T) * s.T, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  for (int t = 0; t < s.T; ++t) {
    const S* q = in.q_row(s, b, t, h);
    for (int u = first_key(keys, b, s.T, t); u <= t; ++u) {
      const S* k = in.k_row(s, b, u, h);
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
std::vector<float> dscores(const std::vector<float>& p, const S* dout, const Rows<const S>& in,
                           const float* rowdot, const Keys& keys, const Shape& s, int b, int h) {
  std::vector<float> ds(p.size(), 0.0f);
  for (int t = 0; t < s.T; ++t) {
    const S* dy = dout + (I64{b} * s.T + t) * s.C + h * s.hs;
    for (int u = first_key(keys, b, s.T, t); u <= t; ++u) {
      const S* v = in.v_row(s, b, u, h);
      float dp = 0.0f;
      for (int d = 0; d < s.hs; ++d) dp += ld(dy[d]) * ld(v[d]);
      const std::size_t i = static_cast<std::size_t>(t) * s.T + u;
      ds[i] = p[i] * (dp - rowdot[(I64{b} * s.NH + h) * s.T + t]);
    }
  }
  return ds;
}

// The forward: out (B,T,C) and lse (B,NH,T).
template <typename S>
void forward(S* out, float* lse, const Rows<const S>& in, const Keys& keys, const Shape& s) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
  std::vector<float> row(static_cast<std::size_t>(s.T));
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int t = 0; t < s.T; ++t) {
        const S* q = in.q_row(s, b, t, h);
        const int first = first_key(keys, b, s.T, t);
        float mx = -INFINITY;
        for (int u = first; u <= t; ++u) {
          const S* kr = in.k_row(s, b, u, h);
          float dot = 0.0f;
          for (int d = 0; d < s.hs; ++d) dot += ld(q[d]) * ld(kr[d]);
          row[u] = dot * scale;
          mx = std::fmax(mx, row[u]);
        }
        float sum = 0.0f;
        for (int u = first; u <= t; ++u) sum += std::exp(row[u] - mx);
        for (int d = 0; d < s.hs; ++d) {
          float acc = 0.0f;
          for (int u = first; u <= t; ++u) {
            acc += std::exp(row[u] - mx) * ld(in.v_row(s, b, u, h)[d]);
          }
          out[(I64{b} * s.T + t) * s.C + h * s.hs + d] = st<S>(acc / sum);
        }
        lse[(I64{b} * s.NH + h) * s.T + t] = mx + std::log(sum);
      }
    }
  }
}

// One backward kernel's part: dQ (dq_kernel) or dK and dV, each added to what `grads` holds in
// the storage type. dK, dV of a key/value head sum its group's query heads in fp32 and are
// rounded once, as the mma kernel's registers do (group 1: the WMMA kernels' one head).
template <typename S>
void backward(bool dq_kernel, const Rows<S>& grads, const S* dout, const Rows<const S>& in,
              const float* lse, const float* rowdot, const Keys& keys, const Shape& s,
              float scale) {
  const int T = s.T, hs = s.hs;
  auto at = [&](int t, int u) { return static_cast<std::size_t>(t) * T + u; };
  for (int b = 0; b < s.B; ++b) {
    for (int kh = 0; kh < s.NH / s.group; ++kh) {
      std::vector<float> dk(static_cast<std::size_t>(T) * hs, 0.0f), dv(dk.size(), 0.0f);
      for (int h = kh * s.group; h < (kh + 1) * s.group; ++h) {
        const std::vector<float> p = probs(in, lse, keys, s, b, h);
        const std::vector<float> ds = dscores(p, dout, in, rowdot, keys, s, b, h);
        for (int x = 0; x < T; ++x) {
          for (int d = 0; d < hs; ++d) {
            if (dq_kernel) {  // dq[x] = scale sum_u ds[x][u] k[u]
              float acc = 0.0f;
              for (int u = first_key(keys, b, T, x); u <= x; ++u) {
                acc += ds[at(x, u)] * ld(in.k_row(s, b, u, h)[d]);
              }
              S* dq = grads.q_row(s, b, x, h) + d;
              *dq = st<S>(ld(*dq) + scale * acc);
            } else {  // dk[x] += sum_t ds[t][x] q[t]; dv[x] += sum_t p[t][x] dout[t]
              for (int t = x; t < T && first_key(keys, b, T, t) <= x; ++t) {
                dk[static_cast<std::size_t>(x) * hs + d] +=
                    ds[at(t, x)] * ld(in.q_row(s, b, t, h)[d]);
                dv[static_cast<std::size_t>(x) * hs + d] +=
                    p[at(t, x)] * ld(dout[(I64{b} * T + t) * s.C + h * hs + d]);
              }
            }
          }
        }
      }
      if (dq_kernel) continue;
      for (int x = 0; x < T; ++x) {
        S* dk_row = grads.k_row(s, b, x, kh * s.group);
        S* dv_row = grads.v_row(s, b, x, kh * s.group);
        for (int d = 0; d < hs; ++d) {
          dk_row[d] = st<S>(ld(dk_row[d]) + scale * dk[static_cast<std::size_t>(x) * hs + d]);
          dv_row[d] = st<S>(ld(dv_row[d]) + dv[static_cast<std::size_t>(x) * hs + d]);
        }
      }
    }
  }
}

void check_scales(KernelCall& k, int hs, float scale, float scale_log2) {
  k.require(std::fabs(scale * std::sqrt(static_cast<float>(hs)) - 1.0f) < 1e-6f &&
                std::fabs(scale_log2 - scale * kLog2e) < 1e-6f,
            "scale, scale_log2");
}

// One backward kernel's twin: the dQ kernel when grads holds dq only, else dK/dV (the mma
// kernels' a block per key/value head; the WMMA kernels' packed rows have group 1). Checks the
// launch, declares its accesses and sets the body.
template <typename S>
void backward_twin(KernelCall& k, const Instance& in, bool docs, const Rows<S>& grads,
                   const S* dout, const Rows<const S>& rows, const float* lse, const float* rowdot,
                   int T, int C, int NH, float scale, float scale_log2, const Keys& keys) {
  const I64 ss = sizeof(S);
  const bool dq_kernel = grads.q != nullptr;
  const Shape s = check_geometry(k, T, C, NH, rows.group, !dq_kernel, in);
  check_scales(k, s.hs, scale, scale_log2);
  declare(k, grads, s, ss, true, dq_kernel, !dq_kernel);
  k.reads(dout, I64{s.B} * T * C * ss, "dout");
  declare(k, rows, s, ss, false, true, true);
  k.reads(lse, I64{s.B} * NH * T * 4, "lse");
  k.reads(rowdot, I64{s.B} * NH * T * 4, "rowdot");
  check_documents(k, docs, keys, s.B, T);
  const std::string name = k.name();
  k.run([=] {
    check_packing(name, keys.doc_start, s.B, T);
    backward<S>(dq_kernel, grads, dout, rows, lse, rowdot, keys, s, scale);
  });
}

template <typename S>
void register_storage() {
  const char* n = cuda_name<S>();
  const I64 ss = sizeof(S);

  for (const bool docs : {false, true}) {
    // The WMMA forward (flash_attention.cu): the packed qkv.
    const Instance wmma{"flash_forward_kernel<$S, 64, $D>", 64, 64};
    twin<S*, float*, const S*, int, int, int, float, const std::int32_t*, int>(
        sig("void " + kNs + with_docs(wmma.name, docs) +
                "($S*, float*, $S const*, int, int, int, float, int const*, int)",
            n),
        [ss, wmma, docs](KernelCall& k, S* out, float* lse, const S* qkv, int T, int C, int NH,
                         float scale_log2, const std::int32_t* doc_start, int window) {
          const Keys keys{doc_start, window};
          const Shape s = check_geometry(k, T, C, NH, 1, false, wmma);
          k.require(std::fabs(scale_log2 * std::sqrt(static_cast<float>(s.hs)) - kLog2e) < 1e-6f,
                    "scale_log2");
          k.writes(out, I64{s.B} * T * C * ss, "out");
          k.writes(lse, I64{s.B} * NH * T * 4, "lse");
          k.reads(qkv, I64{s.B} * T * 3 * C * ss, "qkv");
          check_documents(k, docs, keys, s.B, T);
          const std::string name = k.name();
          k.run([=] {
            check_packing(name, keys.doc_start, s.B, T);
            forward<S>(out, lse, packed(qkv, C), keys, s);
          });
        });
    // The mma forward (flash_attention_mma.cu): q, k, v where they are; COLS as its ColumnSplit.
    for (const auto& item :
         pipelined_or_not({Instance{"flash_mma_forward_kernel<$S, 64, 64, $D, $P>", 64, 64},
                           Instance{"flash_mma_forward_kernel<$S, 128, 128, $D, $P>", 128, 128}})) {
      const Instance in = item.first;
      const bool pipelined = item.second;
      twin<S*, float*, const S*, const S*, const S*, int, int, int, int, int, int, float,
           const std::int32_t*, int>(
          sig("void " + kNs + with_docs(in.name, docs, pipelined) +
                  "($S*, float*, $S const*, $S const*, $S const*, int, int, int, int, int, int, "
                  "float, int const*, int)",
              n),
          [ss, in, docs](KernelCall& k, S* out, float* lse, const S* q, const S* kp, const S* v,
                         int q_ld, int kv_ld, int group, int T, int C, int NH, float scale_log2,
                         const std::int32_t* doc_start, int window) {
            const Keys keys{doc_start, window};
            const Shape s = check_geometry(k, T, C, NH, group, false, in);
            k.require(std::fabs(scale_log2 * std::sqrt(static_cast<float>(s.hs)) - kLog2e) < 1e-6f,
                      "scale_log2");
            const Rows<const S> rows{q, kp, v, q_ld, kv_ld, group};
            k.writes(out, I64{s.B} * T * C * ss, "out");
            k.writes(lse, I64{s.B} * NH * T * 4, "lse");
            declare(k, rows, s, ss, false, true, true);
            check_documents(k, docs, keys, s.B, T);
            const std::string name = k.name();
            k.run([=] {
              check_packing(name, keys.doc_start, s.B, T);
              forward<S>(out, lse, rows, keys, s);
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
    // The WMMA backward kernels: the packed qkv and dqkv.
    for (const Instance& in : {Instance{"flash_backward_dq_kernel<$S, 64, $D>", 64, 64},
                               Instance{"flash_backward_dkdv_kernel<$S, 64, $D>", 64, 64}}) {
      const bool dq_kernel = std::string(in.name).find("_dq_") != std::string::npos;
      twin<S*, const S*, const S*, const float*, const float*, int, int, int, float, float,
           const std::int32_t*, int>(
          sig("void " + kNs + with_docs(in.name, docs) +
                  "($S*, $S const*, $S const*, float const*, float const*, int, int, int, float, "
                  "float, int const*, int)",
              n),
          [dq_kernel, in, docs](KernelCall& k, S* dqkv, const S* dout, const S* qkv,
                                const float* lse, const float* rowdot, int T, int C, int NH,
                                float scale, float scale_log2, const std::int32_t* doc_start,
                                int window) {
            // The dQ kernel adds to dqkv's q part only, dK/dV to its k and v parts.
            const Rows<S> d = packed(dqkv, C);
            const Rows<S> grads = dq_kernel ? Rows<S>{d.q, nullptr, nullptr, d.q_ld, d.kv_ld, 1}
                                            : Rows<S>{nullptr, d.k, d.v, d.q_ld, d.kv_ld, 1};
            backward_twin<S>(k, in, docs, grads, dout, packed(qkv, C), lse, rowdot, T, C, NH, scale,
                             scale_log2, Keys{doc_start, window});
          });
    }
    // The mma dQ kernel: q, k, v where they are, dq with q's rows.
    for (const auto& item :
         pipelined_or_not({Instance{"flash_mma_dq_kernel<$S, 64, 64, $D, $P>", 64, 64},
                           Instance{"flash_mma_dq_kernel<$S, 128, 128, $D, $P>", 128, 128}})) {
      const Instance in = item.first;
      const bool pipelined = item.second;
      twin<S*, const S*, const S*, const S*, const S*, int, int, int, const float*, const float*,
           int, int, int, float, float, const std::int32_t*, int>(
          sig("void " + kNs + with_docs(in.name, docs, pipelined) +
                  "($S*, $S const*, $S const*, $S const*, $S const*, int, int, int, float const*, "
                  "float const*, int, int, int, float, float, int const*, int)",
              n),
          [in, docs](KernelCall& k, S* dq, const S* dout, const S* q, const S* kp, const S* v,
                     int q_ld, int kv_ld, int group, const float* lse, const float* rowdot, int T,
                     int C, int NH, float scale, float scale_log2, const std::int32_t* doc_start,
                     int window) {
            backward_twin<S>(k, in, docs, Rows<S>{dq, nullptr, nullptr, q_ld, kv_ld, group}, dout,
                             Rows<const S>{q, kp, v, q_ld, kv_ld, group}, lse, rowdot, T, C, NH,
                             scale, scale_log2, Keys{doc_start, window});
          });
    }
    // The mma dK/dV kernel: a block per key/value head, its group's sum; dk, dv with k's rows.
    for (const auto& item :
         pipelined_or_not({Instance{"flash_mma_dkdv_kernel<$S, 64, 64, $D, $P>", 64, 64},
                           Instance{"flash_mma_dkdv_kernel<$S, 128, 64, $D, $P>", 128, 64}})) {
      const Instance in = item.first;
      const bool pipelined = item.second;
      twin<S*, S*, const S*, const S*, const S*, const S*, int, int, int, const float*,
           const float*, int, int, int, float, float, const std::int32_t*, int>(
          sig("void " + kNs + with_docs(in.name, docs, pipelined) +
                  "($S*, $S*, $S const*, $S const*, $S const*, $S const*, int, int, int, float "
                  "const*, float const*, int, int, int, float, float, int const*, int)",
              n),
          [in, docs](KernelCall& k, S* dk, S* dv, const S* dout, const S* q, const S* kp,
                     const S* v, int q_ld, int kv_ld, int group, const float* lse,
                     const float* rowdot, int T, int C, int NH, float scale, float scale_log2,
                     const std::int32_t* doc_start, int window) {
            backward_twin<S>(k, in, docs, Rows<S>{nullptr, dk, dv, q_ld, kv_ld, group}, dout,
                             Rows<const S>{q, kp, v, q_ld, kv_ld, group}, lse, rowdot, T, C, NH,
                             scale, scale_log2, Keys{doc_start, window});
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
