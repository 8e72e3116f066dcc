// Twins of the Llama family's kernels (kernels/cuda/{rmsnorm,rope,swiglu,gqa_attention}.cu;
// linear.cu is cuBLAS plus matmul.cu's bias kernels, twinned in twins_gpt.cc). Where a CUDA
// kernel is a whole op of the CPU backend (rmsnorm forward, rope, swiglu) the CPU twin in
// kernels/cpu runs it; the others are pieces of an op (a row pass, a column-sum pass, a qkv
// pack or unpack) and their twins compute exactly what the kernel writes, with its geometry.
#include <cstdint>
#include <initializer_list>
#include <iterator>

#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/rope_table.h"
#include "runtime/common/dtype.h"
#include "tests/standin/kernel_twins.h"
#include "tests/standin/twin_names.h"

namespace zrt::standin {

namespace {

using I64 = std::int64_t;
using namespace twin_names;

template <typename S>
void register_storage() {
  const char* s = cuda_name<S>();
  const I64 ss = sizeof(S);

  // ---- rmsnorm ----
  twin<S*, float*, const S*, const S*, int, int, float>(
      sig("void " + kNs +
              "rmsnorm_forward_kernel<$S>($S*, float*, $S const*, $S const*, int, int, float)",
          s),
      [ss](KernelCall& k, S* out, float* rstd, const S* inp, const S* weight, int N, int C,
           float eps) {
        k.require_block(256);
        k.require_rows(N, kRowsPerBlock, "rows N");
        k.writes(out, I64{N} * C * ss, "out");
        k.writes(rstd, I64{N} * 4, "rstd");
        k.reads(inp, I64{N} * C * ss, "inp");
        k.reads(weight, C * ss, "weight");
        k.run([=] { kernels::cpu::rmsnorm_forward<S>(out, rstd, inp, weight, N, C, eps); });
      });
  // The scalar dinp kernel and its register-resident variants compute the same values.
  const auto dinp_twin = [ss](KernelCall& k, S* dinp, const S* dout, const S* inp, const S* weight,
                              const float* rstd, int N, int C) {
    k.require_block(256);
    k.require_rows(N, kRowsPerBlock, "rows N");
    k.writes(dinp, I64{N} * C * ss, "dinp");
    k.reads(dout, I64{N} * C * ss, "dout");
    k.reads(inp, I64{N} * C * ss, "inp");
    k.reads(weight, C * ss, "weight");
    k.reads(rstd, I64{N} * 4, "rstd");
    k.run([=] {
      for (int r = 0; r < N; ++r) {
        const I64 off = I64{r} * C;
        const float sc = rstd[r];
        float gn_sum = 0.0f;
        for (int c = 0; c < C; ++c) {
          gn_sum += ld(dout[off + c]) * ld(weight[c]) * (ld(inp[off + c]) * sc);
        }
        const float gn_mean = gn_sum / C;
        for (int c = 0; c < C; ++c) {
          const float norm = ld(inp[off + c]) * sc;
          const float g = ld(dout[off + c]) * ld(weight[c]);
          dinp[off + c] = st<S>(ld(dinp[off + c]) + (g - norm * gn_mean) * sc);
        }
      }
    });
  };
  twin<S*, const S*, const S*, const S*, const float*, int, int>(
      sig("void " + kNs +
              "rmsnorm_dinp_kernel<$S>($S*, $S const*, $S const*, $S const*, float const*, int, "
              "int)",
          s),
      dinp_twin);
  if (ss == 2) {
    // The vector variants (16-bit rows, C % 8 == 0): NV pieces of 8 elements per lane, NV the
    // smallest width with 256 NV >= C; 16-byte loads, so every row and the weight must start
    // 16-byte aligned.
    for (std::size_t i = 0; i < std::size(kRowPieceWidths); ++i) {
      const int nv = kRowPieceWidths[i], below = i == 0 ? 0 : kRowPieceWidths[i - 1];
      const auto require_width = [nv, below](KernelCall& k, int C,
                                             std::initializer_list<const void*> rows) {
        require_row_pieces(k, C, nv, below, rows);
      };
      twin<S*, float*, S*, const S*, const S*, const S*, int, int, float>(
          sig("void " + kNs + "rmsnorm_forward_vec_kernel<$S, " + std::to_string(nv) +
                  ">($S*, float*, $S*, $S const*, $S const*, $S const*, int, int, float)",
              s),
          [ss, require_width](KernelCall& k, S* out, float* rstd, S* res, const S* a, const S* b,
                              const S* weight, int N, int C, float eps) {
            require_width(k, C, {out, res, a, b, weight});
            k.require_block(256);
            k.require_rows(N, kRowsPerBlock, "rows N");
            k.writes(out, I64{N} * C * ss, "out");
            k.writes(rstd, I64{N} * 4, "rstd");
            k.reads(a, I64{N} * C * ss, "a");
            if (b != nullptr) {
              k.reads(b, I64{N} * C * ss, "b");
              k.writes(res, I64{N} * C * ss, "res");
            }
            k.reads(weight, C * ss, "weight");
            k.run([=] {
              const S* inp = a;
              if (b != nullptr) {
                kernels::cpu::residual_forward<S>(res, a, b, I64{N} * C);
                inp = res;
              }
              kernels::cpu::rmsnorm_forward<S>(out, rstd, inp, weight, N, C, eps);
            });
          });
      twin<S*, const S*, const S*, const S*, const float*, int, int>(
          sig("void " + kNs + "rmsnorm_dinp_vec_kernel<$S, " + std::to_string(nv) +
                  ">($S*, $S const*, $S const*, $S const*, float const*, int, int)",
              s),
          [dinp_twin, require_width](KernelCall& k, S* dinp, const S* dout, const S* inp,
                                     const S* weight, const float* rstd, int N, int C) {
            require_width(k, C, {dinp, dout, inp, weight});
            dinp_twin(k, dinp, dout, inp, weight, rstd, N, C);
          });
    }
  }
  twin<float*, const S*, const S*, const float*, int, int, int>(
      sig("void " + kNs +
              "rmsnorm_partials_kernel<$S>(float*, $S const*, $S const*, float const*, int, int, "
              "int)",
          s),
      [ss](KernelCall& k, float* part, const S* dout, const S* inp, const float* rstd, int N, int C,
           int chunks) {
        k.require(chunks == (N + kColumnSumRows - 1) / kColumnSumRows,
                  fmt::format("{} chunks for {} rows", chunks, N));
        k.require_threads(C, "columns C");
        // Past 65535 chunks each block strides over them (column_chunk_blocks).
        k.require_blocks_y(std::min(chunks, kMaxColumnChunkBlocks), "row chunks");
        k.writes(part, I64{chunks} * C * 4, "part");
        k.reads(dout, I64{N} * C * ss, "dout");
        k.reads(inp, I64{N} * C * ss, "inp");
        k.reads(rstd, I64{N} * 4, "rstd");
        k.run([=] {
          for (int chunk = 0; chunk < chunks; ++chunk) {
            for (int c = 0; c < C; ++c) {
              float dw = 0.0f;
              for (int r = chunk * kColumnSumRows; r < std::min(N, (chunk + 1) * kColumnSumRows);
                   ++r) {
                const I64 i = I64{r} * C + c;
                dw += ld(dout[i]) * (ld(inp[i]) * rstd[r]);
              }
              part[I64{chunk} * C + c] = dw;
            }
          }
        });
      });

  // ---- rope: one thread per pair; sign +1 forward, -1 backward (the CPU twins); positions may
  // be null (position t) ----
  twin<S*, const S*, kernels::RopeTable, long, int, int, float, const std::int32_t*>(
      sig("void " + kNs +
              "rope_kernel<$S>($S*, $S const*, zrt::kernels::RopeTable, long, int, int, float, int "
              "const*)",
          s),
      [ss](KernelCall& k, S* out, const S* inp, kernels::RopeTable table, long pairs, int T, int NH,
           float sign, const std::int32_t* positions) {
        k.require(table.pairs > 0 && pairs % (I64{T} * NH * table.pairs) == 0,
                  fmt::format("{} pairs are not rows of {} heads of {} pairs at T {}", pairs, NH,
                              table.pairs, T));
        k.require_threads(std::min<I64>(pairs, 65535LL * 32 * 256), "pairs");
        k.writes(out, pairs * 2 * ss, "out");
        k.reads(inp, pairs * 2 * ss, "inp");
        if (positions != nullptr) {
          k.reads(positions, pairs / (I64{NH} * table.pairs) * 4, "positions");
        }
        k.run([=] {
          const int B = static_cast<int>(pairs / (I64{T} * NH * table.pairs));
          const int hs = 2 * table.pairs;
          if (sign > 0) {
            kernels::cpu::rope_forward<S>(out, inp, table, B, T, NH, hs, positions);
          } else {
            kernels::cpu::rope_backward<S>(out, inp, table, B, T, NH, hs, positions);
          }
        });
      });

  // ---- swiglu: grid-stride element-wise, the CPU twins ----
  twin<S*, const S*, const S*, long>(
      sig("void " + kNs + "swiglu_forward_kernel<$S>($S*, $S const*, $S const*, long)", s),
      [ss](KernelCall& k, S* out, const S* gate, const S* up, long n) {
        k.writes(out, n * ss, "out");
        k.reads(gate, n * ss, "gate");
        k.reads(up, n * ss, "up");
        k.run([=] { kernels::cpu::swiglu_forward<S>(out, gate, up, n); });
      });
  twin<S*, S*, const S*, const S*, const S*, long>(
      sig("void " + kNs +
              "swiglu_backward_kernel<$S>($S*, $S*, $S const*, $S const*, $S const*, long)",
          s),
      [ss](KernelCall& k, S* dgate, S* dup, const S* dout, const S* gate, const S* up, long n) {
        k.writes(dgate, n * ss, "dgate");
        k.writes(dup, n * ss, "dup");
        k.reads(dout, n * ss, "dout");
        k.reads(gate, n * ss, "gate");
        k.reads(up, n * ss, "up");
        k.run([=] { kernels::cpu::swiglu_backward<S>(dgate, dup, dout, gate, up, n); });
      });

  // ---- grouped-query attention: packing into attention's qkv layout and back ----
  twin<S*, const S*, const S*, const S*, int, int, int, int, int>(
      sig("void " + kNs +
              "pack_gqa_qkv_kernel<$S>($S*, $S const*, $S const*, $S const*, int, int, int, int, "
              "int)",
          s),
      [ss](KernelCall& k, S* qkv, const S* q, const S* kk, const S* v, int B, int T, int NH,
           int group, int hs) {
        k.require(group > 0 && NH % group == 0,
                  fmt::format("NH {} not a multiple of the group {}", NH, group));
        const I64 C = I64{NH} * hs, KC = C / group, BT = I64{B} * T;
        k.writes(qkv, BT * 3 * C * ss, "qkv");
        k.reads(q, BT * C * ss, "q");
        k.reads(kk, BT * KC * ss, "k");
        k.reads(v, BT * KC * ss, "v");
        k.run([=] {
          for (I64 bt = 0; bt < BT; ++bt) {
            S* row = qkv + bt * 3 * C;
            for (I64 c = 0; c < C; ++c) {
              const I64 src = bt * KC + (c / hs / group) * hs + c % hs;
              row[c] = q[bt * C + c];
              row[C + c] = kk[src];
              row[2 * C + c] = v[src];
            }
          }
        });
      });
  twin<S*, S*, S*, const S*, int, int, int, int, int>(
      sig("void " + kNs +
              "unpack_gqa_dqkv_kernel<$S>($S*, $S*, $S*, $S const*, int, int, int, int, int)",
          s),
      [ss](KernelCall& k, S* dq, S* dk, S* dv, const S* dqkv, int B, int T, int NH, int group,
           int hs) {
        k.require(group > 0 && NH % group == 0,
                  fmt::format("NH {} not a multiple of the group {}", NH, group));
        const I64 C = I64{NH} * hs, KC = C / group, BT = I64{B} * T;
        k.writes(dq, BT * C * ss, "dq");
        k.writes(dk, BT * KC * ss, "dk");
        k.writes(dv, BT * KC * ss, "dv");
        k.reads(dqkv, BT * 3 * C * ss, "dqkv");
        k.run([=] {
          for (I64 bt = 0; bt < BT; ++bt) {
            const S* row = dqkv + bt * 3 * C;
            for (I64 c = 0; c < C; ++c) dq[bt * C + c] = st<S>(ld(dq[bt * C + c]) + ld(row[c]));
            for (I64 c = 0; c < KC; ++c) {
              const I64 kh = c / hs, d = c % hs;
              float gk = 0.0f, gv = 0.0f;
              for (int g = 0; g < group; ++g) {
                gk += ld(row[C + (kh * group + g) * hs + d]);
                gv += ld(row[2 * C + (kh * group + g) * hs + d]);
              }
              dk[bt * KC + c] = st<S>(ld(dk[bt * KC + c]) + gk);
              dv[bt * KC + c] = st<S>(ld(dv[bt * KC + c]) + gv);
            }
          }
        });
      });
}

template <typename G>
void register_grad() {
  const I64 gs = sizeof(G);
  twin<G*, const float*, int, int>(
      sig("void " + kNs + "rmsnorm_finish_kernel<$G>($G*, float const*, int, int)", "",
          cuda_name<G>()),
      [gs](KernelCall& k, G* dweight, const float* part, int chunks, int C) {
        constexpr int kColumns = 32, kSlices = 16;  // slice y: chunks y, y + 16, ...; then in order
        k.require(k.block().x == kColumns && k.block().y == kSlices && k.block().z == 1,
                  "block must be 32 columns x 16 slices");
        k.require_threads(C, "columns C");
        k.writes(dweight, C * gs, "dweight");
        k.reads(part, I64{chunks} * C * 4, "part");
        k.run([=] {
          for (int c = 0; c < C; ++c) {
            float dw = 0.0f;
            for (int y = 0; y < kSlices; ++y) {
              float slice = 0.0f;
              for (int q = y; q < chunks; q += kSlices) slice += part[I64{q} * C + c];
              dw += slice;
            }
            dweight[c] = st<G>(ld(dweight[c]) + dw);
          }
        });
      });
}

}  // namespace

void register_llama_twins() {
  register_storage<float>();
  register_storage<bf16>();
  register_storage<fp16>();
  register_grad<float>();
  register_grad<bf16>();
  register_grad<fp16>();
}

}  // namespace zrt::standin
