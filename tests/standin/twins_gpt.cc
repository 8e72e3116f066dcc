// Twins of the GPT kernels (kernels/cuda/*.cu). Where a CUDA kernel is a whole op of the CPU
// backend (gelu, residual, encoder forward) the CPU twin in kernels/cpu runs it; the others are
// pieces of an op (a permutation, a softmax pass, a column-sum pass) and their twins here compute
// exactly what the kernel writes, with the kernel's geometry rules.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/residual.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using namespace twin_names;
constexpr float kEps = 1e-5f;

// Elements a kernel may touch through `p` when only the allocation bounds them (embedding rows
// addressed by token ids): the rest of p's allocation. Checked when the kernel runs.
I64 elements_left(const void* p, std::size_t elem, const std::string& call) {
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  rt.check_range(call, "table", p, 1, {MemKind::kDevice, MemKind::kPinned}, true);
  Allocation* a = rt.find(p);
  return static_cast<I64>((a->base + a->bytes - reinterpret_cast<std::uintptr_t>(p)) / elem);
}

// What LayerNorm's backward kernels read of its N rows of width C.
template <typename S>
void layernorm_backward_reads(KernelCall& k, const S* dout, const S* inp, const S* weight,
                              const float* mean, const float* rstd, int N, int C) {
  const I64 ss = sizeof(S);
  k.reads(dout, I64{N} * C * ss, "dout");
  k.reads(inp, I64{N} * C * ss, "inp");
  k.reads(weight, C * ss, "weight");
  k.reads(mean, I64{N} * 4, "mean");
  k.reads(rstd, I64{N} * 4, "rstd");
}

// LayerNorm's input gradient of row r, as the dinp kernels compute it (accumulated into dinp).
template <typename S>
void layernorm_dinp_row(S* dinp, const S* dout, const S* inp, const S* weight, const float* mean,
                        const float* rstd, int r, int C) {
  const I64 off = I64{r} * C;
  const float m = mean[r], sc = rstd[r];
  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int c = 0; c < C; ++c) {
    const float norm = (ld(inp[off + c]) - m) * sc;
    const float g = ld(dout[off + c]) * ld(weight[c]);
    g_sum += g;
    gn_sum += g * norm;
  }
  const float g_mean = g_sum / C, gn_mean = gn_sum / C;
  for (int c = 0; c < C; ++c) {
    const float norm = (ld(inp[off + c]) - m) * sc;
    const float g = ld(dout[off + c]) * ld(weight[c]);
    dinp[off + c] = st<S>(ld(dinp[off + c]) + (g - g_mean - norm * gn_mean) * sc);
  }
}

template <typename S>
void register_storage() {
  const char* s = cuda_name<S>();
  const I64 ss = sizeof(S);

  // ---- encoder (positions may be null: wpe row t) ----
  twin<S*, const std::int32_t*, const S*, const S*, long, int, int, const std::int32_t*>(
      sig("void " + kNs +
              "encoder_forward_kernel<$S>($S*, int const*, $S const*, $S const*, long, int, int, "
              "int const*)",
          s),
      [ss](KernelCall& k, S* out, const std::int32_t* tokens, const S* wte, const S* wpe, long rows,
           int T, int C, const std::int32_t* positions) {
        k.require(T > 0 && rows % T == 0, fmt::format("rows {} not a multiple of T {}", rows, T));
        k.writes(out, rows * C * ss, "out");
        k.reads(tokens, rows * 4, "tokens");
        k.reads(wte, C * ss, "wte");
        const std::string name = k.name();
        // The position table's rows: T, or with positions as many as its allocation holds (the
        // kernel is not told them: a sequence-parallel chunk's positions are global, past T).
        const I64 P = wpe != nullptr && positions != nullptr
                          ? elements_left(wpe, sizeof(S), name) / C
                          : static_cast<I64>(T);
        if (wpe != nullptr) k.reads(wpe, P * C * ss, "wpe");  // null: Llama
        if (positions != nullptr) k.reads(positions, rows * 4, "positions");
        k.run([=] {
          const I64 V = elements_left(wte, sizeof(S), name) / C;
          kernels::cpu::encoder_forward<S>(out, tokens, wte, wpe, static_cast<int>(rows / T), T, C,
                                           static_cast<int>(V), positions, static_cast<int>(P));
        });
      });

  // ---- gelu, residual: grid-stride element-wise, the CPU twins ----
  twin<S*, const S*, long>(sig("void " + kNs + "gelu_forward_kernel<$S>($S*, $S const*, long)", s),
                           [ss](KernelCall& k, S* out, const S* inp, long n) {
                             k.writes(out, n * ss, "out");
                             k.reads(inp, n * ss, "inp");
                             k.run([=] { kernels::cpu::gelu_forward<S>(out, inp, n); });
                           });
  twin<S*, const S*, const S*, long>(
      sig("void " + kNs + "gelu_backward_kernel<$S>($S*, $S const*, $S const*, long)", s),
      [ss](KernelCall& k, S* dinp, const S* inp, const S* dout, long n) {
        k.writes(dinp, n * ss, "dinp");
        k.reads(inp, n * ss, "inp");
        k.reads(dout, n * ss, "dout");
        k.run([=] { kernels::cpu::gelu_backward<S>(dinp, inp, dout, n); });
      });
  twin<S*, const S*, const S*, long>(
      sig("void " + kNs + "residual_forward_kernel<$S>($S*, $S const*, $S const*, long)", s),
      [ss](KernelCall& k, S* out, const S* a, const S* b, long n) {
        k.writes(out, n * ss, "out");
        k.reads(a, n * ss, "a");
        k.reads(b, n * ss, "b");
        k.run([=] { kernels::cpu::residual_forward<S>(out, a, b, n); });
      });
  twin<S*, S*, const S*, long>(
      sig("void " + kNs + "residual_backward_kernel<$S>($S*, $S*, $S const*, long)", s),
      [ss](KernelCall& k, S* da, S* db, const S* dout, long n) {
        k.writes(da, n * ss, "da");
        k.writes(db, n * ss, "db");
        k.reads(dout, n * ss, "dout");
        k.run([=] { kernels::cpu::residual_backward<S>(da, db, dout, n); });
      });

  // ---- matmul bias ----
  twin<S*, const S*, long, int>(
      sig("void " + kNs + "add_bias_kernel<$S>($S*, $S const*, long, int)", s),
      [ss](KernelCall& k, S* out, const S* bias, long rows, int OC) {
        k.writes(out, rows * OC * ss, "out");
        k.reads(bias, OC * ss, "bias");
        k.run([=] {
          for (I64 i = 0; i < rows * OC; ++i) out[i] = st<S>(ld(out[i]) + ld(bias[i % OC]));
        });
      });
  twin<float*, const S*, int, int, int>(
      sig("void " + kNs + "column_partials_kernel<$S>(float*, $S const*, int, int, int)", s),
      [ss](KernelCall& k, float* part, const S* dout, int N, int C, int chunks) {
        k.require(chunks == (N + kColumnSumRows - 1) / kColumnSumRows,
                  fmt::format("{} chunks for {} rows", chunks, N));
        k.require_threads(C, "columns C");
        // Past 65535 chunks each block strides over them (column_chunk_blocks).
        k.require_blocks_y(std::min(chunks, kMaxColumnChunkBlocks), "row chunks");
        k.writes(part, I64{chunks} * C * 4, "part");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.run([=] {
          for (int chunk = 0; chunk < chunks; ++chunk) {
            for (int c = 0; c < C; ++c) {
              float sum = 0.0f;
              for (int r = chunk * kColumnSumRows; r < std::min(N, (chunk + 1) * kColumnSumRows);
                   ++r) {
                sum += ld(dout[I64{r} * C + c]);
              }
              part[I64{chunk} * C + c] = sum;
            }
          }
        });
      });

  // ---- attention ----
  twin<float*, const S*, int, int, int, int, int>(
      sig("void " + kNs + "permute_kernel<$S>(float*, $S const*, int, int, int, int, int)", s),
      [ss](KernelCall& k, float* dst, const S* src, int B, int T, int C, int NH, int parts) {
        k.require(NH > 0 && C % NH == 0, fmt::format("C {} not divisible by NH {}", C, NH));
        const I64 n = I64{B} * T * parts * C;
        k.writes(dst, n * 4, "dst");
        k.reads(src, n * ss, "src");
        k.run([=] {
          const int hs = C / NH;
          const I64 part = I64{B} * T * C;
          for (I64 i = 0; i < n; ++i) {
            const int col = static_cast<int>(i % (parts * C));
            const I64 bt = i / (parts * C);
            const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
            const int which = col / C, h = (col % C) / hs, d = col % hs;
            dst[which * part + ((I64{b} * NH + h) * T + t) * hs + d] = ld(src[i]);
          }
        });
      });
  for (bool accumulate : {false, true}) {
    twin<S*, const float*, int, int, int, int, int>(
        sig(std::string("void ") + kNs + "unpermute_kernel<$S, " + (accumulate ? "true" : "false") +
                ">($S*, float const*, int, int, int, int, int)",
            s),
        [ss, accumulate](KernelCall& k, S* out, const float* src, int B, int T, int C, int NH,
                         int parts) {
          k.require(NH > 0 && C % NH == 0, fmt::format("C {} not divisible by NH {}", C, NH));
          const I64 n = I64{B} * T * parts * C;
          k.writes(out, n * ss, "out");
          k.reads(src, n * 4, "src");
          k.run([=] {
            const int hs = C / NH;
            const I64 part = I64{B} * T * C;
            for (I64 i = 0; i < n; ++i) {
              const int col = static_cast<int>(i % (parts * C));
              const I64 bt = i / (parts * C);
              const int t = static_cast<int>(bt % T), b = static_cast<int>(bt / T);
              const int which = col / C, h = (col % C) / hs, d = col % hs;
              const float v = src[which * part + ((I64{b} * NH + h) * T + t) * hs + d];
              out[i] = st<S>(accumulate ? ld(out[i]) + v : v);
            }
          });
        });
  }

  // ---- layernorm ----
  // The rows of layernorm_forward (the scalar kernel's order of sums; the register-resident
  // kernel sums per lane, which moves results within fp32 rounding).
  const auto layernorm_rows = [](S* out, float* mean, float* rstd, const S* inp, const S* weight,
                                 const S* bias, int N, int C) {
    for (int r = 0; r < N; ++r) {
      const S* x = inp + I64{r} * C;
      float sum = 0.0f;
      for (int c = 0; c < C; ++c) sum += ld(x[c]);
      const float m = sum / C;
      float var = 0.0f;
      for (int c = 0; c < C; ++c) var += (ld(x[c]) - m) * (ld(x[c]) - m);
      const float sc = 1.0f / std::sqrt(var / C + kEps);
      for (int c = 0; c < C; ++c) {
        out[I64{r} * C + c] = st<S>((ld(x[c]) - m) * sc * ld(weight[c]) + ld(bias[c]));
      }
      mean[r] = m;
      rstd[r] = sc;
    }
  };
  twin<S*, float*, float*, const S*, const S*, const S*, int, int>(
      sig("void " + kNs +
              "layernorm_forward_kernel<$S>($S*, float*, float*, $S const*, $S const*, $S const*, "
              "int, int)",
          s),
      [ss, layernorm_rows](KernelCall& k, S* out, float* mean, float* rstd, const S* inp,
                           const S* weight, const S* bias, int N, int C) {
        k.require_block(256);
        k.require_rows(N, kRowsPerBlock, "rows N");
        k.writes(out, I64{N} * C * ss, "out");
        k.writes(mean, I64{N} * 4, "mean");
        k.writes(rstd, I64{N} * 4, "rstd");
        k.reads(inp, I64{N} * C * ss, "inp");
        k.reads(weight, C * ss, "weight");
        k.reads(bias, C * ss, "bias");
        k.run([=] { layernorm_rows(out, mean, rstd, inp, weight, bias, N, C); });
      });
  if (ss == 2) {
    // The register-resident forward (16-bit rows, C % 8 == 0, NV the smallest width with
    // 256 NV >= C, 16-byte aligned rows); with b, the residual add a + b (rounded as
    // residual_forward rounds it) is stored to res and normalized.
    for (std::size_t i = 0; i < std::size(kRowPieceWidths); ++i) {
      const int nv = kRowPieceWidths[i], below = i == 0 ? 0 : kRowPieceWidths[i - 1];
      twin<S*, float*, float*, S*, const S*, const S*, const S*, const S*, int, int>(
          sig("void " + kNs + "layernorm_forward_vec_kernel<$S, " + std::to_string(nv) +
                  ">($S*, float*, float*, $S*, $S const*, $S const*, $S const*, $S const*, int, "
                  "int)",
              s),
          [ss, nv, below, layernorm_rows](KernelCall& k, S* out, float* mean, float* rstd, S* res,
                                          const S* a, const S* b, const S* weight, const S* bias,
                                          int N, int C) {
            require_row_pieces(k, C, nv, below, {out, res, a, b, weight, bias});
            k.require_block(256);
            k.require_rows(N, kRowsPerBlock, "rows N");
            k.writes(out, I64{N} * C * ss, "out");
            k.writes(mean, I64{N} * 4, "mean");
            k.writes(rstd, I64{N} * 4, "rstd");
            k.reads(a, I64{N} * C * ss, "a");
            if (b != nullptr) {
              k.reads(b, I64{N} * C * ss, "b");
              k.writes(res, I64{N} * C * ss, "res");
            }
            k.reads(weight, C * ss, "weight");
            k.reads(bias, C * ss, "bias");
            k.run([=] {
              const S* inp = a;
              if (b != nullptr) {
                kernels::cpu::residual_forward<S>(res, a, b, I64{N} * C);
                inp = res;
              }
              layernorm_rows(out, mean, rstd, inp, weight, bias, N, C);
            });
          });
    }
  }
  // The scalar dinp kernel and its register-resident variants (16-bit storage, C = 256 * NV)
  // compute the same values; the variants also need C to fit their loads exactly.
  const auto dinp_twin = [ss](KernelCall& k, S* dinp, const S* dout, const S* inp, const S* weight,
                              const float* mean, const float* rstd, int N, int C) {
    k.require_block(256);
    k.require_rows(N, kRowsPerBlock, "rows N");
    k.writes(dinp, I64{N} * C * ss, "dinp");
    layernorm_backward_reads(k, dout, inp, weight, mean, rstd, N, C);
    k.run([=] {
      for (int r = 0; r < N; ++r) layernorm_dinp_row(dinp, dout, inp, weight, mean, rstd, r, C);
    });
  };
  twin<S*, const S*, const S*, const S*, const float*, const float*, int, int>(
      sig("void " + kNs +
              "layernorm_dinp_kernel<$S>($S*, $S const*, $S const*, $S const*, float const*, float "
              "const*, int, int)",
          s),
      dinp_twin);
  if (ss == 2) {
    for (int nv = 1; nv <= 8; ++nv) {
      twin<S*, const S*, const S*, const S*, const float*, const float*, int, int>(
          sig("void " + kNs + "layernorm_dinp_vec_kernel<$S, " + std::to_string(nv) +
                  ">($S*, $S const*, $S const*, $S const*, float const*, float const*, int, int)",
              s),
          [dinp_twin, nv](KernelCall& k, S* dinp, const S* dout, const S* inp, const S* weight,
                          const float* mean, const float* rstd, int N, int C) {
            k.require(C == 256 * nv, fmt::format("C {} is not 256 x {}", C, nv));
            dinp_twin(k, dinp, dout, inp, weight, mean, rstd, N, C);
          });
    }
  }
  // The one-pass backward (16-bit rows, C = 256 * NV, NV <= 4): the dinp kernels' values, and
  // per chunk of 32 rows (a block) the column sums of dout * norm and dout, warp w (of 8) summing
  // rows w, w + 8, ... of the chunk in turn, then the warps' sums added in warp order.
  if (ss == 2) {
    for (int nv = 1; nv <= 4; ++nv) {
      twin<S*, float*, float*, const S*, const S*, const S*, const float*, const float*, int, int>(
          sig("void " + kNs + "layernorm_backward_vec_kernel<$S, " + std::to_string(nv) +
                  ">($S*, float*, float*, $S const*, $S const*, $S const*, float const*, float "
                  "const*, int, int)",
              s),
          [ss, nv](KernelCall& k, S* dinp, float* part_w, float* part_b, const S* dout,
                   const S* inp, const S* weight, const float* mean, const float* rstd, int N,
                   int C) {
            constexpr int kChunkRows = 32, kWarps = 8;
            const int chunks = (N + kChunkRows - 1) / kChunkRows;
            k.require_block(256);
            k.require_blocks(chunks, "row chunks");
            require_row_pieces(k, C, nv, nv - 1, {dinp, dout, inp, weight});
            k.require(C == 256 * nv, fmt::format("C {} is not 256 x {}", C, nv));
            k.writes(dinp, I64{N} * C * ss, "dinp");
            k.writes(part_w, I64{chunks} * C * 4, "part_w");
            k.writes(part_b, I64{chunks} * C * 4, "part_b");
            layernorm_backward_reads(k, dout, inp, weight, mean, rstd, N, C);
            k.run([=] {
              std::vector<float> dw(static_cast<std::size_t>(kWarps) * C);
              std::vector<float> db(dw.size());
              for (int chunk = 0; chunk < chunks; ++chunk) {
                std::fill(dw.begin(), dw.end(), 0.0f);
                std::fill(db.begin(), db.end(), 0.0f);
                for (int i = 0; i < kChunkRows / kWarps; ++i) {
                  for (int w = 0; w < kWarps; ++w) {
                    const int r = chunk * kChunkRows + i * kWarps + w;
                    if (r >= N) continue;
                    const I64 off = I64{r} * C;
                    for (int c = 0; c < C; ++c) {
                      const float dy = ld(dout[off + c]);
                      dw[I64{w} * C + c] += dy * ((ld(inp[off + c]) - mean[r]) * rstd[r]);
                      db[I64{w} * C + c] += dy;
                    }
                    layernorm_dinp_row(dinp, dout, inp, weight, mean, rstd, r, C);
                  }
                }
                for (int c = 0; c < C; ++c) {
                  float sw = 0.0f, sb = 0.0f;
                  for (int w = 0; w < kWarps; ++w) {
                    sw += dw[I64{w} * C + c];
                    sb += db[I64{w} * C + c];
                  }
                  part_w[I64{chunk} * C + c] = sw;
                  part_b[I64{chunk} * C + c] = sb;
                }
              }
            });
          });
    }
  }
  twin<float*, float*, const S*, const S*, const float*, const float*, int, int, int>(
      sig("void " + kNs +
              "layernorm_partials_kernel<$S>(float*, float*, $S const*, $S const*, float const*, "
              "float const*, int, int, int)",
          s),
      [ss](KernelCall& k, float* part_w, float* part_b, const S* dout, const S* inp,
           const float* mean, const float* rstd, int N, int C, int chunks) {
        k.require(chunks == (N + kColumnSumRows - 1) / kColumnSumRows,
                  fmt::format("{} chunks for {} rows", chunks, N));
        k.require_threads(C, "columns C");
        // Past 65535 chunks each block strides over them (column_chunk_blocks).
        k.require_blocks_y(std::min(chunks, kMaxColumnChunkBlocks), "row chunks");
        k.writes(part_w, I64{chunks} * C * 4, "part_w");
        k.writes(part_b, I64{chunks} * C * 4, "part_b");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.reads(inp, I64{N} * C * ss, "inp");
        k.reads(mean, I64{N} * 4, "mean");
        k.reads(rstd, I64{N} * 4, "rstd");
        k.run([=] {
          for (int chunk = 0; chunk < chunks; ++chunk) {
            for (int c = 0; c < C; ++c) {
              float dw = 0.0f, db = 0.0f;
              for (int r = chunk * kColumnSumRows; r < std::min(N, (chunk + 1) * kColumnSumRows);
                   ++r) {
                const I64 i = I64{r} * C + c;
                const float dy = ld(dout[i]);
                dw += dy * ((ld(inp[i]) - mean[r]) * rstd[r]);
                db += dy;
              }
              part_w[I64{chunk} * C + c] = dw;
              part_b[I64{chunk} * C + c] = db;
            }
          }
        });
      });

  // ---- cross-entropy: one block of 1024 threads per row (rows = gridDim.x) ----
  // ldl: the logits' row stride (>= V); the backward zeroes the padding columns V..ldl. A target
  // < 0 is a row out of the loss: loss 0, a zero gradient row. The kernels' pack width W (1, or
  // 16 bytes of S) reads a row in W-element packs: W divides ldl and the logits are 16-byte
  // aligned, and the last pack read holds V - 1 (padding past V read, never used).
  const auto require_packs = [](KernelCall& k, int W, const void* logits, int V, int ldl) {
    k.require_block(1024);
    k.require(ldl >= V, fmt::format("row stride {} below V {}", ldl, V));
    k.require(ldl % W == 0, fmt::format("row stride {} not a multiple of the pack {}", ldl, W));
    k.require(W == 1 || reinterpret_cast<std::uintptr_t>(logits) % 16 == 0,
              "logits not 16-byte aligned for 16-byte packs");
  };
  const auto forward_twin = [ss, require_packs](KernelCall& k, int W, float* losses,
                                                const S* logits, const std::int32_t* targets, int V,
                                                int ldl) {
    const I64 N = k.grid().x;
    require_packs(k, W, logits, V, ldl);
    k.writes(losses, N * 4, "losses");
    k.reads(logits, ((N - 1) * ldl + (V + W - 1) / W * W) * ss, "logits");
    k.reads(targets, N * 4, "targets");
    const std::string name = k.name();
    k.run([=] {
      for (I64 n = 0; n < N; ++n) {
        const S* row = logits + n * ldl;
        if (targets[n] >= V) {
          fail(cudaErrorIllegalAddress, name,
               fmt::format("targets[{}] = {} outside [0, {})", n, targets[n], V));
        }
        if (targets[n] < 0) {
          losses[n] = 0.0f;
          continue;
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int v = 0; v < V; ++v) mx = std::fmax(mx, ld(row[v]));
        for (int v = 0; v < V; ++v) sum += std::exp(ld(row[v]) - mx);
        losses[n] = std::log(sum) + mx - ld(row[targets[n]]);
      }
    });
  };
  // losses may be null (the plain backward); with it, the fused classifier's loss per row.
  // vector_out: the stores go as whole packs, so dlogits must be 16-byte aligned for W > 1.
  const auto backward_twin = [ss, require_packs](KernelCall& k, int W, S* dlogits, float* losses,
                                                 const S* logits, const std::int32_t* targets,
                                                 float dloss, int V, int ldl, bool vector_out) {
    const I64 N = k.grid().x;
    require_packs(k, W, logits, V, ldl);
    k.require(!vector_out || W == 1 || reinterpret_cast<std::uintptr_t>(dlogits) % 16 == 0,
              "dlogits not 16-byte aligned for whole-pack stores");
    k.writes(dlogits, N * ldl * ss, "dlogits");
    if (losses != nullptr) k.writes(losses, N * 4, "losses");
    k.reads(logits, N * ldl * ss, "logits");
    k.reads(targets, N * 4, "targets");
    const std::string name = k.name();
    k.run([=] {
      std::vector<float> row(static_cast<std::size_t>(V));
      for (I64 n = 0; n < N; ++n) {
        if (targets[n] >= V) {
          fail(cudaErrorIllegalAddress, name,
               fmt::format("targets[{}] = {} outside [0, {})", n, targets[n], V));
        }
        if (targets[n] < 0) {
          if (losses != nullptr) losses[n] = 0.0f;
          for (int v = 0; v < ldl; ++v) dlogits[n * ldl + v] = st<S>(0.0f);
          continue;
        }
        for (int v = 0; v < V; ++v) row[v] = ld(logits[n * ldl + v]);  // in place allowed
        float mx = -INFINITY, sum = 0.0f;
        for (int v = 0; v < V; ++v) mx = std::fmax(mx, row[v]);
        for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
        if (losses != nullptr) losses[n] = std::log(sum) + mx - row[targets[n]];
        const float inv = 1.0f / sum;
        for (int v = 0; v < V; ++v) {
          const float p = std::exp(row[v] - mx) * inv;
          dlogits[n * ldl + v] = st<S>((p - (v == targets[n] ? 1.0f : 0.0f)) * dloss);
        }
        for (int v = V; v < ldl; ++v) dlogits[n * ldl + v] = st<S>(0.0f);
      }
    });
  };
  for (const int W : {1, static_cast<int>(16 / ss)}) {
    const std::string w = std::to_string(W);
    twin<float*, const S*, const std::int32_t*, int, int>(
        sig("void " + kNs + "crossentropy_forward_kernel<$S, " + w +
                ">(float*, $S const*, int const*, int, int)",
            s),
        [forward_twin, W](KernelCall& k, float* losses, const S* logits,
                          const std::int32_t* targets, int V,
                          int ldl) { forward_twin(k, W, losses, logits, targets, V, ldl); });
    twin<S*, float*, const S*, const std::int32_t*, float, int, int, bool>(
        sig("void " + kNs + "crossentropy_backward_kernel<$S, " + w +
                ">($S*, float*, $S const*, int const*, float, int, int, bool)",
            s),
        [backward_twin, W](KernelCall& k, S* dlogits, float* losses, const S* logits,
                           const std::int32_t* targets, float dloss, int V, int ldl,
                           bool vector_out) {
          backward_twin(k, W, dlogits, losses, logits, targets, dloss, V, ldl, vector_out);
        });
  }
}

// Kernels templated on the storage type S and the gradient type G (S or float).
template <typename S, typename G>
void register_storage_grad() {
  const char* s = cuda_name<S>();
  const char* g = cuda_name<G>();
  const I64 ss = sizeof(S), gs = sizeof(G);

  // A table's gradient (dwte, or dwpe by packed positions) from key_groups' groups:
  // block r, when r is its key's first row (count[r] > 0), adds the sum of its group's rows of
  // dout, in row order, to the key's row of the table.
  twin<G*, const S*, const std::int32_t*, const int*, const int*, const int*, int>(
      sig("void " + kNs +
              "table_backward_kernel<$S, $G>($G*, $S const*, int const*, int const*, int const*, "
              "int const*, int)",
          s, g),
      [ss, gs](KernelCall& k, G* dtable, const S* dout, const std::int32_t* keys, const int* order,
               const int* start, const int* count, int C) {
        const I64 rows = k.grid().x;  // one block per row
        k.reads(dout, rows * C * ss, "dout");
        k.reads(keys, rows * 4, "keys");
        k.reads(order, rows * 4, "order");
        k.reads(start, rows * 4, "start");
        k.reads(count, rows * 4, "count");
        k.writes(dtable, C * gs, "dtable");
        const std::string name = k.name();
        k.run([=] {
          const I64 table_rows = elements_left(dtable, sizeof(G), name) / C;
          for (I64 r = 0; r < rows; ++r) {
            if (count[r] == 0) continue;
            if (keys[r] < 0 || keys[r] >= table_rows) {
              fail(cudaErrorIllegalAddress, name,
                   fmt::format("keys[{}] = {} indexes past the table's {} rows", r, keys[r],
                               table_rows));
            }
            if (start[r] < 0 || I64{start[r]} + count[r] > rows) {
              fail(cudaErrorIllegalAddress, name,
                   fmt::format("row {}'s group [{}, {}) past order's {} rows", r, start[r],
                               I64{start[r]} + count[r], rows));
            }
            G* dw = dtable + I64{keys[r]} * C;
            for (int c = 0; c < C; ++c) {
              float sum = 0.0f;
              for (int j = 0; j < count[r]; ++j) {
                const int q = order[start[r] + j];
                if (q < 0 || q >= rows)
                  fail(cudaErrorIllegalAddress, name,
                       fmt::format("order[{}] = {} of {} rows", start[r] + j, q, rows));
                sum += ld(dout[I64{q} * C + c]);
              }
              dw[c] = st<G>(ld(dw[c]) + sum);
            }
          }
        });
      });
  twin<G*, const S*, int, int, int>(
      sig("void " + kNs + "wpe_backward_kernel<$S, $G>($G*, $S const*, int, int, int)", s, g),
      [ss, gs](KernelCall& k, G* dwpe, const S* dout, int B, int T, int C) {
        const I64 n = I64{T} * C;
        k.writes(dwpe, n * gs, "dwpe");
        k.reads(dout, B * n * ss, "dout");
        k.run([=] {
          for (I64 i = 0; i < n; ++i) {
            float sum = 0.0f;
            for (int b = 0; b < B; ++b) sum += ld(dout[b * n + i]);
            dwpe[i] = st<G>(ld(dwpe[i]) + sum);
          }
        });
      });
}

template <typename G>
void register_grad() {
  const char* g = cuda_name<G>();
  const I64 gs = sizeof(G);
  twin<G*, const float*, int, int>(
      sig("void " + kNs + "column_finish_kernel<$G>($G*, float const*, int, int)", "", g),
      [gs](KernelCall& k, G* dbias, const float* part, int chunks, int C) {
        constexpr int kColumns = 32, kSlices = 16;  // slice y: chunks y, y + 16, ...; then in order
        k.require(k.block().x == kColumns && k.block().y == kSlices && k.block().z == 1,
                  "block must be 32 columns x 16 slices");
        k.require_threads(C, "columns C");
        k.writes(dbias, C * gs, "dbias");
        k.reads(part, I64{chunks} * C * 4, "part");
        k.run([=] {
          for (int c = 0; c < C; ++c) {
            float sum = 0.0f;
            for (int y = 0; y < kSlices; ++y) {
              float slice = 0.0f;
              for (int q = y; q < chunks; q += kSlices) slice += part[I64{q} * C + c];
              sum += slice;
            }
            dbias[c] = st<G>(ld(dbias[c]) + sum);
          }
        });
      });
  // Blocks of 32 columns x 16 slices: slice y sums chunks y, y + 16, ... in turn, then the
  // slices are added in order.
  twin<G*, G*, const float*, const float*, int, int>(
      sig("void " + kNs +
              "layernorm_finish_kernel<$G>($G*, $G*, float const*, float const*, int, int)",
          "", g),
      [gs](KernelCall& k, G* dweight, G* dbias, const float* part_w, const float* part_b,
           int chunks, int C) {
        constexpr int kColumns = 32, kSlices = 16;
        k.require(k.block().x == kColumns && k.block().y == kSlices && k.block().z == 1,
                  "block must be 32 columns x 16 slices");
        k.require_threads(C, "columns C");
        // Either may be null (a frozen weight or bias), never both (the launch is skipped).
        k.require(dweight != nullptr || dbias != nullptr, "a null dweight and dbias");
        if (dweight != nullptr) k.writes(dweight, C * gs, "dweight");
        if (dbias != nullptr) k.writes(dbias, C * gs, "dbias");
        k.reads(part_w, I64{chunks} * C * 4, "part_w");
        k.reads(part_b, I64{chunks} * C * 4, "part_b");
        k.run([=] {
          for (int c = 0; c < C; ++c) {
            float dw = 0.0f, db = 0.0f;
            for (int y = 0; y < kSlices; ++y) {
              float sw = 0.0f, sb = 0.0f;
              for (int q = y; q < chunks; q += kSlices) {
                sw += part_w[I64{q} * C + c];
                sb += part_b[I64{q} * C + c];
              }
              dw += sw;
              db += sb;
            }
            if (dweight != nullptr) dweight[c] = st<G>(ld(dweight[c]) + dw);
            if (dbias != nullptr) dbias[c] = st<G>(ld(dbias[c]) + db);
          }
        });
      });
}

}  // namespace

void register_gpt_twins() {
  register_storage<float>();
  register_storage<bf16>();
  register_storage<fp16>();
  register_storage_grad<float, float>();
  register_storage_grad<bf16, bf16>();
  register_storage_grad<bf16, float>();
  register_storage_grad<fp16, fp16>();
  register_storage_grad<fp16, float>();
  register_grad<float>();
  register_grad<bf16>();
  register_grad<fp16>();

  // Rows grouped by key (encoder.cu's key_groups): a stable radix sort of the rows by key,
  // kRadixBits a pass over tiles of kSortTile rows, then each group's bounds. The twins compute
  // what each kernel writes from its definition (a tile's digit counts; an exclusive scan; a
  // stable counting scatter; the groups of a sorted order), not the kernels' warp mechanics.
  constexpr int kSortTile = 1024, kDigits = 256;
  const auto sort_geometry = [](KernelCall& k, int rows) {
    k.require_block(kSortTile);
    k.require_blocks((I64{rows} + kSortTile - 1) / kSortTile, "a block per tile");
  };
  twin<const std::int32_t*, const int*, int, int, int*>(
      kNs + "digit_counts_kernel(int const*, int const*, int, int, int*)",
      [sort_geometry](KernelCall& k, const std::int32_t* keys, const int* in, int rows, int shift,
                      int* counts) {
        sort_geometry(k, rows);
        const I64 tiles = k.grid().x;
        k.reads(keys, I64{rows} * 4, "keys");
        if (in != nullptr) k.reads(in, I64{rows} * 4, "in");
        k.writes(counts, kDigits * tiles * 4, "counts");
        const std::string name = k.name();
        k.run([=] {
          std::fill(counts, counts + kDigits * tiles, 0);
          for (I64 i = 0; i < rows; ++i) {
            const int row = in != nullptr ? in[i] : static_cast<int>(i);
            if (row < 0 || row >= rows) {
              fail(cudaErrorIllegalAddress, name,
                   fmt::format("in[{}] = {} of {} rows", i, row, rows));
            }
            ++counts[((keys[row] >> shift) & (kDigits - 1)) * tiles + i / kSortTile];
          }
        });
      });
  twin<int*, int>(kNs + "exclusive_scan_kernel(int*, int)", [](KernelCall& k, int* values, int n) {
    k.require_block(1024);
    k.require(k.grid().x == 1, "one block scans");
    k.writes(values, I64{n} * 4, "values");
    k.run([=] {
      int run = 0;
      for (int j = 0; j < n; ++j) {
        const int v = values[j];
        values[j] = run;
        run += v;
      }
    });
  });
  twin<const std::int32_t*, const int*, int, int, const int*, int*>(
      kNs + "digit_scatter_kernel(int const*, int const*, int, int, int const*, int*)",
      [sort_geometry](KernelCall& k, const std::int32_t* keys, const int* in, int rows, int shift,
                      const int* offsets, int* out) {
        sort_geometry(k, rows);
        const I64 tiles = k.grid().x;
        k.reads(keys, I64{rows} * 4, "keys");
        if (in != nullptr) k.reads(in, I64{rows} * 4, "in");
        k.reads(offsets, kDigits * tiles * 4, "offsets");
        k.writes(out, I64{rows} * 4, "out");
        const std::string name = k.name();
        k.run([=] {
          for (I64 tile = 0; tile < tiles; ++tile) {
            std::vector<int> seen(kDigits, 0);  // the tile's earlier rows, by digit
            for (I64 i = tile * kSortTile; i < std::min<I64>(rows, (tile + 1) * kSortTile); ++i) {
              const int row = in != nullptr ? in[i] : static_cast<int>(i);
              const int d = (keys[row] >> shift) & (kDigits - 1);
              const I64 place = I64{offsets[d * tiles + tile]} + seen[d]++;
              if (place < 0 || place >= rows) {
                fail(cudaErrorIllegalAddress, name,
                     fmt::format("row {} placed at {} of {}", row, place, rows));
              }
              out[place] = row;
            }
          }
        });
      });
  twin<const std::int32_t*, const int*, int, int*, int*>(
      kNs + "group_bounds_kernel(int const*, int const*, int, int*, int*)",
      [](KernelCall& k, const std::int32_t* keys, const int* order, int rows, int* start,
         int* count) {
        // Grid-stride over the places: any one-dimensional grid covers them.
        k.require(k.grid().y == 1 && k.grid().z == 1, "the grid must be one-dimensional");
        k.reads(keys, I64{rows} * 4, "keys");
        k.reads(order, I64{rows} * 4, "order");
        k.writes(start, I64{rows} * 4, "start");
        k.writes(count, I64{rows} * 4, "count");
        const std::string name = k.name();
        k.run([=] {
          for (int p = 1; p < rows; ++p) {
            if (keys[order[p]] < keys[order[p - 1]]) {
              fail(cudaErrorIllegalAddress, name,
                   fmt::format("order[] does not ascend by key at place {}: key {} after {}", p,
                               keys[order[p]], keys[order[p - 1]]));
            }
          }
          for (int p = 0; p < rows;) {
            int end = p + 1;
            while (end < rows && keys[order[end]] == keys[order[p]]) ++end;
            for (int q = p; q < end; ++q) {
              start[order[q]] = q;
              count[order[q]] = q == p ? end - p : 0;
            }
            p = end;
          }
        });
      });
  twin<float*, float*, long, int>(kNs + "causal_softmax_kernel(float*, float*, long, int)",
                                  [](KernelCall& k, float* att, float* lse, long rows, int T) {
                                    k.require_block(256);
                                    k.require_rows(rows, kRowsPerBlock, "rows");
                                    k.writes(att, rows * T * 4, "att");
                                    if (lse != nullptr) k.writes(lse, rows * 4, "lse");
                                    k.run([=] {
                                      for (I64 r = 0; r < rows; ++r) {
                                        const int t = static_cast<int>(r % T);
                                        float* a = att + r * T;
                                        float mx = -INFINITY, sum = 0.0f;
                                        for (int u = 0; u <= t; ++u) mx = std::fmax(mx, a[u]);
                                        for (int u = 0; u <= t; ++u) sum += std::exp(a[u] - mx);
                                        const float inv = 1.0f / sum;
                                        for (int u = 0; u < T; ++u)
                                          a[u] = u <= t ? std::exp(a[u] - mx) * inv : 0.0f;
                                        if (lse != nullptr) lse[r] = mx + std::log(sum);
                                      }
                                    });
                                  });
  twin<float*, const float*, long, int>(
      kNs + "causal_probs_kernel(float*, float const*, long, int)",
      [](KernelCall& k, float* att, const float* lse, long rows, int T) {
        k.require_block(256);
        k.require_rows(rows, kRowsPerBlock, "rows");
        k.writes(att, rows * T * 4, "att");
        k.reads(lse, rows * 4, "lse");
        k.run([=] {
          for (I64 r = 0; r < rows; ++r) {
            const int t = static_cast<int>(r % T);
            float* a = att + r * T;
            for (int u = 0; u < T; ++u) a[u] = u <= t ? std::exp(a[u] - lse[r]) : 0.0f;
          }
        });
      });
  twin<float*, const float*, long, int>(
      kNs + "softmax_backward_kernel(float*, float const*, long, int)",
      [](KernelCall& k, float* datt, const float* att, long rows, int T) {
        k.require_block(256);
        k.require_rows(rows, kRowsPerBlock, "rows");
        k.writes(datt, rows * T * 4, "datt");
        k.reads(att, rows * T * 4, "att");
        k.run([=] {
          for (I64 r = 0; r < rows; ++r) {
            const int t = static_cast<int>(r % T);
            const float* a = att + r * T;
            float* d = datt + r * T;
            float dot = 0.0f;
            for (int u = 0; u <= t; ++u) dot += a[u] * d[u];
            for (int u = 0; u < T; ++u) d[u] = u <= t ? a[u] * (d[u] - dot) : 0.0f;
          }
        });
      });
  // The packed-documents and sliding-window mask of the batched attention: -inf before each
  // row's first visible key.
  twin<float*, const std::int32_t*, int, long, int, int>(
      kNs + "document_mask_kernel(float*, int const*, int, long, int, int)",
      [](KernelCall& k, float* att, const std::int32_t* doc_start, int window, long rows, int T,
         int NH) {
        k.require_block(256);
        k.require_rows(rows, kRowsPerBlock, "rows");
        k.require(NH > 0 && T > 0 && rows % (I64{NH} * T) == 0,
                  fmt::format("rows {} are not B x NH {} x T {}", rows, NH, T));
        k.require(doc_start != nullptr || window > 0, "launched with neither documents nor window");
        k.require(window >= 0 && window < T,
                  fmt::format("window {} outside [0, T = {})", window, T));
        k.writes(att, rows * T * 4, "att");
        if (doc_start != nullptr) k.reads(doc_start, rows / NH * 4, "doc_start");
        const std::string name = k.name();
        k.run([=] {
          for (I64 r = 0; r < rows; ++r) {
            const int t = static_cast<int>(r % T);
            const I64 b = r / (I64{NH} * T);
            int first = doc_start != nullptr ? doc_start[b * T + t] : 0;
            if (first < 0 || first > t) {
              fail(cudaErrorIllegalAddress, name,
                   fmt::format("doc_start[{}] = {} outside [0, {}]", b * T + t, first, t));
            }
            if (window > 0) first = std::max(first, t - window + 1);
            for (int u = 0; u < first; ++u) att[r * T + u] = -INFINITY;
          }
        });
      });
  twin<float*, const float*, int, float>(
      kNs + "loss_mean_kernel(float*, float const*, int, float)",
      [](KernelCall& k, float* out, const float* losses, int N, float divisor) {
        k.require_block(256);
        k.require(k.grid().x == 1, "must run as one block");
        k.writes(out, 4, "out");
        k.reads(losses, I64{N} * 4, "losses");
        k.run([=] {
          double sum = 0.0;
          for (int i = 0; i < N; ++i) sum += losses[i];
          out[0] = static_cast<float>(sum / (divisor > 0.0f ? static_cast<double>(divisor) : N));
        });
      });
}

}  // namespace zrt::standin
