// The CPU attention's tiled path (kernels/cpu/tiled_attention.h, chosen by attention_path.h):
//  - against float64 (the full kernel instantiated with double) and against the full fp32 kernel,
//    per element within the forward error bound of tests/kernels/attention_order_bounds.h. Its
//    derivation (Higham's g(n) for every sum, 2 ulp for exp_approx, the propagation through the
//    softmax and the backward) covers the tiled kernel unchanged but for one step, which it adds:
//    the online softmax rescales a row's running sum and output by exp(m - m') whenever a later key
//    tile raises its max, at most once per key tile the row spans (`rescales` = ceil(L / K) + 1
//    for a document of L tokens, K keys a tile, +1 for a document that starts inside a tile), each
//    factor off by 2 dmax + 8u (exp of the difference of two computed scores) plus u for the
//    multiplication. The bound is per element and is the difference allowed between two
//    evaluations (twice one's error, doubled for second-order terms), so it holds both for the
//    tiled kernel against the exact values and against the full kernel (whose error is the same
//    expression without the rescales);
//  - finite differences of the tiled backward in float64;
//  - layouts that stress the tiles: T not a multiple of the tile (1, 63, 65, 129, 200 tokens),
//    documents that cross tile boundaries, documents (one a single token) that start exactly on
//    them, so the causal and document edges fall at every position within a tile;
//  - the same bits with 1, 2 and 3 OpenMP threads;
//  - grouped-query attention's entry point on the tiled path, which reads q, k, v in place: the
//    bits of packing them, the tiled kernel and unpacking;
//  - the path rule and the workspace functions: the threshold, ZRT_CPU_ATTENTION, no T^2 term in
//    the tiled workspace, and a kernel never writing past what its workspace function returned.
#include <omp.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_path.h"
#include "kernels/cpu/gqa_attention.h"
#include "kernels/cpu/tiled_attention.h"
#include "runtime/common/error.h"
#include "tests/kernels/attention_order_bounds.h"
#include "tests/kernels/fd_check.h"
#include "tests/kernels/kernel_test_util.h"

namespace zrt::kernels::cpu {
namespace {

using test::check_within;
using test::normal_values;
using test::order_bounds;
using test::OrderBounds;
using test::spacing_of;
using Vec = std::vector<double>;

constexpr std::uint64_t kSeed = 3901;
constexpr int kC = 64, kNH = 2;  // head size 32
constexpr int kGuard = 257;      // elements past the workspace that must stay untouched

template <typename S>
struct TiledRun {
  std::vector<S> out, dqkv;
  std::vector<acc_t<S>> lse;
};

// Forward and backward (dqkv from zero) on `path`, in a workspace of exactly the size the
// workspace functions give plus a NaN guard, filled with NaN first: a kernel that read scratch it
// had not written, or wrote past its size, fails.
template <typename S>
TiledRun<S> run_path(const std::vector<S>& qkv, const std::vector<S>& dout, int B, int T, int C,
                     int NH, const std::int32_t* doc_start, AttentionPath path, int window = 0) {
  using A = acc_t<S>;
  const auto size =
      static_cast<std::size_t>(std::max(attention_forward_workspace<S>(B, T, C, NH, path),
                                        attention_backward_workspace<S>(B, T, C, NH, path)));
  std::vector<A> ws(size + kGuard, std::numeric_limits<A>::quiet_NaN());
  TiledRun<S> r{std::vector<S>(dout.size()), test::to_storage<S>(Vec(qkv.size(), 0.0)),
                std::vector<A>(static_cast<std::size_t>(B) * NH * T)};
  attention_forward<S>(r.out.data(), r.lse.data(), qkv.data(), B, T, C, NH, ws.data(), doc_start,
                       window, path);
  attention_backward<S>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), B, T, C,
                        NH, ws.data(), doc_start, window, path);
  bool guard_intact = true;
  for (std::size_t i = size; i < ws.size(); ++i) guard_intact = guard_intact && std::isnan(ws[i]);
  CHECK(guard_intact);
  return r;
}

template <typename X>
std::vector<X> rows(const std::vector<X>& x, int T, int width, int b, int begin, int length) {
  const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * T + begin) * width;
  return std::vector<X>(first, first + static_cast<std::ptrdiff_t>(length) * width);
}

template <typename X>
std::vector<X> stats(const std::vector<X>& x, int NH, int T, int b, int begin, int length) {
  std::vector<X> out;
  for (int h = 0; h < NH; ++h) {
    const auto first = x.begin() + (static_cast<std::ptrdiff_t>(b) * NH + h) * T + begin;
    out.insert(out.end(), first, first + length);
  }
  return out;
}

int rescales_for(int L) {
  return (L + kTiledAttentionKeyRows - 1) / kTiledAttentionKeyRows + 1;
}

// A layout: B sequences of T tokens and their documents (empty lengths: no doc_start).
struct Layout {
  std::string name;
  int B, T;
  std::vector<std::vector<int>> lengths;
};

std::vector<Layout> layouts() {
  static_assert(kTiledAttentionQueryRows == 64 && kTiledAttentionKeyRows == 64,
                "the layouts below place documents on and across 64-token tile edges");
  return {
      {"one token", 1, 1, {}},
      {"63 tokens", 1, 63, {}},
      {"65 tokens", 2, 65, {}},
      {"129 tokens", 1, 129, {}},
      {"200 tokens", 2, 200, {}},
      {"documents crossing tile edges", 2, 200, {{50, 80, 70}, {1, 62, 1, 136}}},
      {"documents on tile edges", 2, 200, {{64, 64, 72}, {128, 1, 71}}},
      {"short documents", 1, 150, {{3, 5, 60, 1, 1, 1, 70, 9}}},
  };
}

struct Case {
  Vec qkv, dout;
  test::Packing pack;
  const std::int32_t* doc_start() const {
    return pack.doc_start.empty() ? nullptr : pack.doc_start.data();
  }
};

Case make_case(const Layout& l, std::uint64_t stream) {
  Case c{normal_values(kSeed, stream, static_cast<std::size_t>(l.B) * l.T * 3 * kC),
         normal_values(kSeed, stream + 1, static_cast<std::size_t>(l.B) * l.T * kC),
         {}};
  if (l.lengths.empty()) {
    for (int b = 0; b < l.B; ++b) c.pack.spans.push_back({b, 0, l.T});
  } else {
    c.pack = test::pack_documents(l.lengths, l.T);
  }
  return c;
}

// `got` against `want`, document by document, within the bound (header comment) computed from the
// document's inputs as stored in S.
template <typename S, typename W>
void check_per_document(const Layout& l, const Case& c, const TiledRun<S>& got,
                        const TiledRun<W>& want) {
  using A = acc_t<S>;
  const double u = std::is_same_v<A, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const Vec qkv = test::to_double(test::to_storage<S>(c.qkv));
  const Vec dout = test::to_double(test::to_storage<S>(c.dout));
  for (const auto& doc : c.pack.spans) {
    INFO("document of sequence " << doc.b << " at " << doc.begin << ", " << doc.length
                                 << " tokens");
    OrderBounds bound = order_bounds(rows(qkv, l.T, 3 * kC, doc.b, doc.begin, doc.length),
                                     rows(dout, l.T, kC, doc.b, doc.begin, doc.length), doc.length,
                                     kC, kNH, u, spacing_of<S>(), rescales_for(doc.length));
    if constexpr (std::is_same_v<S, fp16>) {
      // fp16 stores values below 2^-14 with an absolute spacing of 2^-24, which the relative
      // spacing term does not cover: one such spacing more.
      for (Vec* b : {&bound.out, &bound.dqkv}) {
        for (double& x : *b) x += std::ldexp(1.0, -24);
      }
    }
    auto part = [&](const auto& run_out, int width) {
      return test::to_double(rows(run_out, l.T, width, doc.b, doc.begin, doc.length));
    };
    check_within("out", part(got.out, kC), part(want.out, kC), bound.out);
    check_within("lse", test::to_double(stats(got.lse, kNH, l.T, doc.b, doc.begin, doc.length)),
                 test::to_double(stats(want.lse, kNH, l.T, doc.b, doc.begin, doc.length)),
                 bound.lse);
    check_within("dqkv", part(got.dqkv, 3 * kC), part(want.dqkv, 3 * kC), bound.dqkv);
  }
}

template <typename S>
void check_against_float64_and_full() {
  std::uint64_t stream = 10;
  for (const Layout& l : layouts()) {
    INFO(l.name);
    const Case c = make_case(l, stream += 2);
    const auto qkv = test::to_storage<S>(c.qkv);
    const auto dout = test::to_storage<S>(c.dout);
    const TiledRun<S> tiled =
        run_path<S>(qkv, dout, l.B, l.T, kC, kNH, c.doc_start(), AttentionPath::kTiled);
    // float64 on the same stored values: the full kernel instantiated with double.
    const TiledRun<double> exact =
        run_path<double>(test::to_double(qkv), test::to_double(dout), l.B, l.T, kC, kNH,
                         c.doc_start(), AttentionPath::kFull);
    const TiledRun<S> full =
        run_path<S>(qkv, dout, l.B, l.T, kC, kNH, c.doc_start(), AttentionPath::kFull);
    {
      INFO("tiled against float64");
      check_per_document(l, c, tiled, exact);
    }
    {
      INFO("tiled against the full kernel");
      check_per_document(l, c, tiled, full);
    }
  }
}

}  // namespace

TEST_CASE("tiled attention against float64 and the full kernel, within the derived bound",
          "[tiled]") {
  SECTION("fp32") {
    check_against_float64_and_full<float>();
  }
  SECTION("bf16") {
    check_against_float64_and_full<bf16>();
  }
  SECTION("fp16") {
    check_against_float64_and_full<fp16>();
  }
}

TEST_CASE("tiled attention in float64 equals the full kernel to float64 rounding", "[tiled]") {
  std::uint64_t stream = 100;
  for (const Layout& l : layouts()) {
    INFO(l.name);
    const Case c = make_case(l, stream += 2);
    const TiledRun<double> tiled =
        run_path<double>(c.qkv, c.dout, l.B, l.T, kC, kNH, c.doc_start(), AttentionPath::kTiled);
    const TiledRun<double> full =
        run_path<double>(c.qkv, c.dout, l.B, l.T, kC, kNH, c.doc_start(), AttentionPath::kFull);
    check_per_document(l, c, tiled, full);
  }
}

TEST_CASE("tiled attention backward matches finite differences (float64)", "[tiled][fd]") {
  // Three query tiles (the last short); a 100-token document across the first tile edge, a
  // one-token one after it, and one across the second edge.
  const int T = 150, C = 32, NH = 2;
  const test::Packing pack = test::pack_documents({{100, 1, 49}}, T);
  Vec qkv = normal_values(kSeed, 201, static_cast<std::size_t>(T) * 3 * C);
  const Vec R = normal_values(kSeed, 202, static_cast<std::size_t>(T) * C);
  const auto path = AttentionPath::kTiled;
  Vec ws(
      static_cast<std::size_t>(std::max(attention_forward_workspace<double>(1, T, C, NH, path),
                                        attention_backward_workspace<double>(1, T, C, NH, path))));
  Vec out(R.size()), lse(static_cast<std::size_t>(NH) * T);
  auto f = [&] {
    attention_forward<double>(out.data(), lse.data(), qkv.data(), 1, T, C, NH, ws.data(),
                              pack.doc_start.data(), 0, path);
    return test::dot(out, R);
  };
  // One thread: ~3000 small calls, each a parallel region that a loaded machine would make wait
  // (the thread count changes no bit: the next test case).
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  f();
  Vec dqkv(qkv.size(), 0.0);
  attention_backward<double>(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), 1, T, C, NH,
                             ws.data(), pack.doc_start.data(), 0, path);
  test::check_gradient("dqkv", qkv, dqkv, f);
  omp_set_num_threads(before);
}

TEST_CASE("tiled attention gives the same bits with 1, 2 and 3 threads", "[tiled]") {
  const Layout l{"threads", 2, 300, {{50, 80, 170}, {300}}};
  const Case c = make_case(l, 300);
  const auto qkv = test::to_storage<float>(c.qkv);
  const auto dout = test::to_storage<float>(c.dout);
  const int before = omp_get_max_threads();
  std::vector<TiledRun<float>> runs;
  for (const int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    runs.push_back(
        run_path<float>(qkv, dout, l.B, l.T, kC, kNH, c.doc_start(), AttentionPath::kTiled));
  }
  omp_set_num_threads(before);
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  for (std::size_t i = 1; i < runs.size(); ++i) {
    INFO("threads " << i + 1 << " against 1");
    CHECK(same(runs[i].out, runs[0].out));
    CHECK(same(runs[i].lse, runs[0].lse));
    CHECK(same(runs[i].dqkv, runs[0].dqkv));
  }
}

namespace {
// Grouped-query attention (NH = 4 query heads over NKV = 2 key/value heads, head size 16) on the
// tiled path: the forward is attention's on the packed qkv (the same bits), and the whole
// against the full path within the packed bound: out, lse and dq as attention's; dk and dv sum
// a group's heads in the same order on both paths, so within the sum of the heads' bounds plus
// the rounding of that sum on each (group u |x|, twice).
void check_gqa_tiled() {
  const int B = 1, T = 150, NH = 4, NKV = 2, hs = 16, C = NH * hs, KC = NKV * hs;
  const test::Packing pack = test::pack_documents({{70, 1, 79}}, T);
  const Vec qv = normal_values(kSeed, 401, static_cast<std::size_t>(T) * C);
  const Vec kv = normal_values(kSeed, 402, static_cast<std::size_t>(T) * KC);
  const Vec vv = normal_values(kSeed, 403, static_cast<std::size_t>(T) * KC);
  const Vec dyv = normal_values(kSeed, 404, static_cast<std::size_t>(T) * C);
  const auto q = test::to_storage<float>(qv), k = test::to_storage<float>(kv),
             v = test::to_storage<float>(vv), dy = test::to_storage<float>(dyv);
  struct GqaRun {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto run = [&](AttentionPath path) {
    std::vector<float> ws(static_cast<std::size_t>(
        std::max(gqa_attention_forward_workspace<float>(B, T, NH, NKV, hs, path),
                 gqa_attention_backward_workspace<float>(B, T, NH, NKV, hs, path))));
    GqaRun r{std::vector<float>(q.size()), std::vector<float>(static_cast<std::size_t>(NH) * T),
             std::vector<float>(q.size(), 0.0f), std::vector<float>(k.size(), 0.0f),
             std::vector<float>(v.size(), 0.0f)};
    gqa_attention_forward<float>(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), B, T, NH,
                                 NKV, hs, ws.data(), pack.doc_start.data(), 0, path);
    gqa_attention_backward<float>(r.dq.data(), r.dk.data(), r.dv.data(), dy.data(), q.data(),
                                  k.data(), v.data(), r.out.data(), r.lse.data(), B, T, NH, NKV, hs,
                                  ws.data(), pack.doc_start.data(), 0, path);
    return r;
  };
  const GqaRun tiled = run(AttentionPath::kTiled), full = run(AttentionPath::kFull);
  // The forward: attention's on the packed qkv, bit for bit.
  std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * C);
  gqa_pack_qkv<float, float>(qkv.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, hs);
  const TiledRun<float> packed_run =
      run_path<float>(qkv, dy, B, T, C, NH, pack.doc_start.data(), AttentionPath::kTiled);
  CHECK(test::to_double(packed_run.out) == test::to_double(tiled.out));
  CHECK(test::to_double(packed_run.lse) == test::to_double(tiled.lse));
  // Against the full path, per document.
  const double u = std::ldexp(1.0, -24);
  const Vec pq = test::to_double(qkv);
  for (const auto& doc : pack.spans) {
    INFO("document at " << doc.begin << ", " << doc.length << " tokens");
    const OrderBounds bound = order_bounds(rows(pq, T, 3 * C, 0, doc.begin, doc.length),
                                           rows(dyv, T, C, 0, doc.begin, doc.length), doc.length, C,
                                           NH, u, 0.0, rescales_for(doc.length));
    auto part = [&](const std::vector<float>& x, int width) {
      return test::to_double(rows(x, T, width, 0, doc.begin, doc.length));
    };
    check_within("out", part(tiled.out, C), part(full.out, C), bound.out);
    check_within("lse", test::to_double(stats(tiled.lse, NH, T, 0, doc.begin, doc.length)),
                 test::to_double(stats(full.lse, NH, T, 0, doc.begin, doc.length)), bound.lse);
    Vec bq, bk, bv;
    const Vec want_k = part(full.dk, KC);
    for (int t = 0; t < doc.length; ++t) {
      for (int i = 0; i < C; ++i) bq.push_back(bound.dqkv[static_cast<std::size_t>(t) * 3 * C + i]);
      for (int kh = 0; kh < NKV; ++kh) {
        for (int d = 0; d < hs; ++d) {
          double sk = 0, sv = 0;
          for (int g = 0; g < NH / NKV; ++g) {
            const std::size_t at =
                static_cast<std::size_t>(t) * 3 * C + (kh * (NH / NKV) + g) * hs + d;
            sk += bound.dqkv[at + C];
            sv += bound.dqkv[at + 2 * C];
          }
          const std::size_t e = static_cast<std::size_t>(t) * KC + kh * hs + d;
          const double group_round = 2.0 * (NH / NKV) * u;
          bk.push_back(sk + group_round * std::abs(want_k[e]));
          bv.push_back(sv + group_round * std::abs(part(full.dv, KC)[e]));
        }
      }
    }
    check_within("dq", part(tiled.dq, C), part(full.dq, C), bq);
    check_within("dk", part(tiled.dk, KC), want_k, bk);
    check_within("dv", part(tiled.dv, KC), part(full.dv, KC), bv);
  }
}
}  // namespace

TEST_CASE("grouped-query attention on the tiled path", "[tiled][gqa]") {
  check_gqa_tiled();
}

namespace {
// The grouped-query tiled path reads q, k, v where they are; it must give the bits of packing
// them (each key/value head repeated), running the tiled kernel on a zeroed packed gradient and
// unpacking it (the path before, which gqa_pack_qkv / gqa_unpack_dqkv still implement), into
// nonzero dq, dk, dv (they are accumulated into), for every layout above and NH / NKV of 1, 2
// and 4, with 1 and 3 threads; in a workspace of exactly its function's size behind a NaN guard.
template <typename S>
void check_gqa_in_place_bits(int NKV, int threads, int window = 0) {
  using A = acc_t<S>;
  const int NH = 4, hs = 16, C = NH * hs, KC = NKV * hs;
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  for (const Layout& layout : layouts()) {
    INFO(layout.name << ", NKV " << NKV << ", " << threads << " threads, window " << window);
    const int B = layout.B, T = layout.T;
    const test::Packing pack = test::pack_documents(layout.lengths, T);
    const std::int32_t* doc_start = layout.lengths.empty() ? nullptr : pack.doc_start.data();
    const auto BT = static_cast<std::size_t>(B) * T;
    const auto q = test::to_storage<S>(normal_values(kSeed, 501, BT * C));
    const auto k = test::to_storage<S>(normal_values(kSeed, 502, BT * KC));
    const auto v = test::to_storage<S>(normal_values(kSeed, 503, BT * KC));
    const auto dy = test::to_storage<S>(normal_values(kSeed, 504, BT * C));
    const auto dq0 = test::to_storage<S>(normal_values(kSeed, 505, BT * C));
    const auto dk0 = test::to_storage<S>(normal_values(kSeed, 506, BT * KC));
    const auto dv0 = test::to_storage<S>(normal_values(kSeed, 507, BT * KC));
    // The grouped-query entry point on the tiled path.
    const auto size = static_cast<std::size_t>(
        std::max(gqa_attention_forward_workspace<S>(B, T, NH, NKV, hs, AttentionPath::kTiled),
                 gqa_attention_backward_workspace<S>(B, T, NH, NKV, hs, AttentionPath::kTiled)));
    std::vector<A> ws(size + kGuard, std::numeric_limits<A>::quiet_NaN());
    std::vector<S> out(BT * C), dq = dq0, dk = dk0, dv = dv0;
    std::vector<A> lse(BT * NH);
    gqa_attention_forward<S>(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, NH, NKV,
                             hs, ws.data(), doc_start, window, AttentionPath::kTiled);
    gqa_attention_backward<S>(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(),
                              v.data(), out.data(), lse.data(), B, T, NH, NKV, hs, ws.data(),
                              doc_start, window, AttentionPath::kTiled);
    bool guard_intact = true;
    for (std::size_t i = size; i < ws.size(); ++i) guard_intact = guard_intact && std::isnan(ws[i]);
    CHECK(guard_intact);
    // Packed, the tiled kernel, unpacked.
    std::vector<S> qkv(BT * 3 * C), dqkv(BT * 3 * C, S(0)), pout(BT * C), pdq = dq0, pdk = dk0,
                                                                          pdv = dv0;
    std::vector<A> plse(BT * NH);
    std::vector<A> pws(static_cast<std::size_t>(
        std::max(attention_forward_workspace<S>(B, T, C, NH, AttentionPath::kTiled),
                 attention_backward_workspace<S>(B, T, C, NH, AttentionPath::kTiled))));
    gqa_pack_qkv<S, S>(qkv.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, hs);
    attention_forward<S>(pout.data(), plse.data(), qkv.data(), B, T, C, NH, pws.data(), doc_start,
                         window, AttentionPath::kTiled);
    attention_backward<S>(dqkv.data(), dy.data(), qkv.data(), pout.data(), plse.data(), B, T, C, NH,
                          pws.data(), doc_start, window, AttentionPath::kTiled);
    gqa_unpack_dqkv<S, S>(pdq.data(), pdk.data(), pdv.data(), dqkv.data(), B, T, NH, NKV, hs);
    CHECK(std::memcmp(out.data(), pout.data(), out.size() * sizeof(S)) == 0);
    CHECK(std::memcmp(lse.data(), plse.data(), lse.size() * sizeof(A)) == 0);
    CHECK(std::memcmp(dq.data(), pdq.data(), dq.size() * sizeof(S)) == 0);
    CHECK(std::memcmp(dk.data(), pdk.data(), dk.size() * sizeof(S)) == 0);
    CHECK(std::memcmp(dv.data(), pdv.data(), dv.size() * sizeof(S)) == 0);
  }
  omp_set_num_threads(saved_threads);
}
}  // namespace

TEST_CASE("grouped-query attention on the tiled path reads q, k, v in place, the bits of packing",
          "[tiled][gqa]") {
  for (int NKV : {1, 2, 4}) {
    for (int threads : {1, 3}) {
      check_gqa_in_place_bits<float>(NKV, threads);
      check_gqa_in_place_bits<double>(NKV, threads);
    }
  }
  // With a sliding window (37 tokens: its edges fall inside tiles) the same holds.
  check_gqa_in_place_bits<float>(2, 3, 37);
  check_gqa_in_place_bits<double>(2, 1, 37);
  // No packed copies: the tiled grouped-query workspace is the tiled kernel's, with larger
  // backward slots, and grows by the (B,NH,T) row term alone.
  const auto gqa_bwd = [](int T) {
    return gqa_attention_backward_workspace<float>(1, T, 4, 2, 64, AttentionPath::kTiled);
  };
  CHECK(gqa_bwd(32768) - gqa_bwd(16384) == 4 * 16384);
  CHECK(gqa_bwd(16384) == 4 * 16384 + kTiledAttentionSlots * (2 * 64 * 64 + 4 * 64 * 64));
  CHECK(gqa_attention_forward_workspace<float>(1, 16384, 4, 2, 64, AttentionPath::kTiled) ==
        tiled_attention_forward_workspace<float>(1, 16384, 4 * 64, 4));
}

namespace {
// Sets ZRT_CPU_ATTENTION for the scope, restoring its absence after.
struct ScopedAttentionEnv {
  explicit ScopedAttentionEnv(const char* value) { setenv("ZRT_CPU_ATTENTION", value, 1); }
  ~ScopedAttentionEnv() { unsetenv("ZRT_CPU_ATTENTION"); }
};
}  // namespace

namespace {
// Sliding-window attention computed another way: straight from its definition in float64, row by
// row (query t of sequence b sees keys [max(doc_start[t], t - W + 1), t]; W 0: no window), with
// the analytic backward (dS = P (dP - rowsum(P dP))).
struct Reference {
  Vec out, lse, dqkv;
};
Reference windowed_reference(const Vec& qkv, const Vec& dout, int B, int T, int C, int NH,
                             const std::int32_t* doc_start, int window) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference r{Vec(static_cast<std::size_t>(B) * T * C, 0.0),
              Vec(static_cast<std::size_t>(B) * NH * T, 0.0), Vec(qkv.size(), 0.0)};
  auto at = [&](int b, int t, int part, int h) {
    return (static_cast<std::size_t>(b) * T + t) * 3 * C + static_cast<std::size_t>(part) * C +
           static_cast<std::size_t>(h) * hs;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        int lo = doc_start != nullptr ? doc_start[static_cast<std::size_t>(b) * T + t] : 0;
        if (window > 0) lo = std::max(lo, t - window + 1);
        const int n = t - lo + 1;
        Vec p(n), dp(n);
        double m = -1e300;
        for (int i = 0; i < n; ++i) {
          double dot = 0;
          for (int d = 0; d < hs; ++d)
            dot += qkv[at(b, t, 0, h) + d] * qkv[at(b, lo + i, 1, h) + d];
          p[i] = dot * scale;
          m = std::max(m, p[i]);
        }
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - m));
        for (double& x : p) x /= z;
        r.lse[(static_cast<std::size_t>(b) * NH + h) * T + t] = m + std::log(z);
        const std::size_t y =
            (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
        double rowsum = 0;
        for (int i = 0; i < n; ++i) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) {
            r.out[y + d] += p[i] * qkv[at(b, lo + i, 2, h) + d];
            dot += dout[y + d] * qkv[at(b, lo + i, 2, h) + d];
          }
          dp[i] = dot;
          rowsum += p[i] * dot;
        }
        for (int i = 0; i < n; ++i) {
          const double ds = p[i] * (dp[i] - rowsum);
          for (int d = 0; d < hs; ++d) {
            r.dqkv[at(b, t, 0, h) + d] += scale * ds * qkv[at(b, lo + i, 1, h) + d];
            r.dqkv[at(b, lo + i, 1, h) + d] += scale * ds * qkv[at(b, t, 0, h) + d];
            r.dqkv[at(b, lo + i, 2, h) + d] += p[i] * dout[y + d];
          }
        }
      }
    }
  }
  return r;
}

// The largest |got - want| over x, relative to 1 + |want|.
double worst_difference(const Vec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  }
  return worst;
}
}  // namespace

// Both CPU paths with a sliding window, in float64, against the definition above, over the
// layouts that put tile edges, document edges and (windows 1, 2, 5, 63, 64, 65, 100 tokens)
// window edges at every position of a tile. The tolerance: every value is a sum of at most
// T + hs < 300 products of inputs below 6 in magnitude (normal draws of this seed) and of
// probabilities, each rounding at most u = 2^-53 relative per operation, so |error| < 300 * 36 *
// u * (1 + |value|) ~ 1e-12 (1 + |value|); 1e-10 keeps headroom, while a key wrongly seen or hidden
// moves a value by its probability times a difference of inputs: 1e-6 or more here.
TEST_CASE("sliding-window attention on both CPU paths equals its definition (float64)",
          "[tiled][window]") {
  std::uint64_t stream = 700;
  for (const Layout& l : layouts()) {
    const Case c = make_case(l, stream += 2);
    for (const int window : {1, 2, 5, 63, 64, 65, 100}) {
      if (window >= l.T) continue;  // no window then (the next test case)
      INFO(l.name << ", window " << window);
      const Reference want =
          windowed_reference(c.qkv, c.dout, l.B, l.T, kC, kNH, c.doc_start(), window);
      for (const AttentionPath path : {AttentionPath::kFull, AttentionPath::kTiled}) {
        INFO(attention_path_name(path));
        const TiledRun<double> got =
            run_path<double>(c.qkv, c.dout, l.B, l.T, kC, kNH, c.doc_start(), path, window);
        CHECK(worst_difference(got.out, want.out) <= 1e-10);
        CHECK(worst_difference(got.lse, want.lse) <= 1e-10);
        CHECK(worst_difference(got.dqkv, want.dqkv) <= 1e-10);
      }
    }
  }
  // The reference itself tells windows apart: window 5 is not the plain causal attention.
  const Layout l = layouts()[4];  // 200 tokens, no documents
  const Case c = make_case(l, 1);
  CHECK(worst_difference(windowed_reference(c.qkv, c.dout, l.B, l.T, kC, kNH, nullptr, 5).out,
                         windowed_reference(c.qkv, c.dout, l.B, l.T, kC, kNH, nullptr, 0).out) >
        1e-3);
}

// A window at least as long as the sequence hides nothing: the unwindowed op's bits on both
// paths; a negative one is an error.
TEST_CASE("a sliding window of T or more is none; a negative one is refused", "[tiled][window]") {
  const Layout l{"documents", 2, 200, {{50, 80, 70}, {1, 62, 1, 136}}};
  const Case c = make_case(l, 900);
  const auto qkv = test::to_storage<float>(c.qkv);
  const auto dout = test::to_storage<float>(c.dout);
  for (const AttentionPath path : {AttentionPath::kFull, AttentionPath::kTiled}) {
    const TiledRun<float> none = run_path<float>(qkv, dout, l.B, l.T, kC, kNH, c.doc_start(), path);
    for (const int window : {l.T, l.T + 7}) {
      const TiledRun<float> wide =
          run_path<float>(qkv, dout, l.B, l.T, kC, kNH, c.doc_start(), path, window);
      CHECK(std::memcmp(wide.out.data(), none.out.data(), none.out.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(wide.dqkv.data(), none.dqkv.data(), none.dqkv.size() * sizeof(float)) == 0);
    }
  }
  std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(l.B) * kNH * l.T),
      ws(static_cast<std::size_t>(attention_forward_workspace<float>(l.B, l.T, kC, kNH)));
  CHECK_THROWS_WITH(attention_forward<float>(out.data(), lse.data(), qkv.data(), l.B, l.T, kC, kNH,
                                             ws.data(), c.doc_start(), -3),
                    Catch::Contains("sliding window -3 is negative"));
}

TEST_CASE("the attention path: the threshold, the variable, the workspace", "[tiled]") {
  REQUIRE(std::getenv("ZRT_CPU_ATTENTION") == nullptr);
  // 2 * min(32, B*NH) * T^2 * 4 bytes against 16 MiB: 4 pairs switch above T = 724, 32 above 256.
  CHECK(attention_full_scores_bytes(1, 724, 4, 4) <= kAttentionTiledAboveBytes);
  CHECK(resolve_attention_path(AttentionPath::kAuto, 1, 724, 4, 4) == AttentionPath::kFull);
  CHECK(resolve_attention_path(AttentionPath::kAuto, 1, 725, 4, 4) == AttentionPath::kTiled);
  CHECK(resolve_attention_path(AttentionPath::kAuto, 8, 256, 12, 4) == AttentionPath::kFull);
  CHECK(resolve_attention_path(AttentionPath::kAuto, 8, 257, 12, 4) == AttentionPath::kTiled);
  CHECK(resolve_attention_path(AttentionPath::kFull, 1, 100000, 4, 4) == AttentionPath::kFull);
  CHECK(resolve_attention_path(AttentionPath::kTiled, 1, 2, 1, 4) == AttentionPath::kTiled);
  {
    ScopedAttentionEnv env("full");
    CHECK(resolve_attention_path(AttentionPath::kAuto, 1, 100000, 4, 4) == AttentionPath::kFull);
    CHECK(resolve_attention_path(AttentionPath::kTiled, 1, 100000, 4, 4) == AttentionPath::kTiled);
    CHECK(attention_forward_workspace<float>(1, 2048, 64, 1) == 2048 * 2048);
  }
  {
    ScopedAttentionEnv env("tiled");
    CHECK(resolve_attention_path(AttentionPath::kAuto, 1, 2, 1, 4) == AttentionPath::kTiled);
  }
  {
    ScopedAttentionEnv env("flash");
    CHECK_THROWS_WITH(resolve_attention_path(AttentionPath::kAuto, 1, 2, 1, 4),
                      Catch::Contains("ZRT_CPU_ATTENTION=flash"));
  }
  // The workspace functions follow the rule: the full kernel's T^2 scores below the threshold,
  // the tiled kernel's slots above; the tiled backward grows by B*NH elements (D) a token and
  // the forward not at all once every slot is in use.
  CHECK(attention_backward_workspace<float>(1, 724, 256, 4) == 2 * 4 * 724 * 724);
  CHECK(attention_backward_workspace<float>(1, 725, 256, 4) ==
        tiled_attention_backward_workspace<float>(1, 725, 256, 4));
  const auto fwd = [](int T) { return attention_forward_workspace<float>(1, T, 64, 1); };
  const auto bwd = [](int T) { return attention_backward_workspace<float>(1, T, 64, 1); };
  CHECK(fwd(32768) == fwd(16384));
  CHECK(bwd(32768) - bwd(16384) == 16384);
  const std::int64_t slot_f = 64 * 64 + 64 * 64 + 2 * 64, slot_b = 2 * 64 * 64;
  CHECK(fwd(16384) == kTiledAttentionSlots * slot_f);
  CHECK(bwd(16384) == 16384 + kTiledAttentionSlots * slot_b);
  // 16-bit storage adds its fp32 copies (linear in T) on either path.
  CHECK(attention_forward_workspace<bf16>(1, 16384, 64, 1) ==
        fwd(16384) + std::int64_t{16384} * 4 * 64);
  // Grouped-query attention passes the path on.
  CHECK(gqa_attention_backward_workspace<float>(1, 16384, 4, 2, 64) -
            gqa_attention_backward_workspace<float>(1, 16384, 4, 2, 64, AttentionPath::kTiled) ==
        0);
  CHECK(gqa_attention_backward_workspace<float>(1, 512, 4, 2, 64, AttentionPath::kFull) -
            gqa_attention_backward_workspace<float>(1, 512, 4, 2, 64, AttentionPath::kTiled) ==
        2 * 4 * 512 * 512 + 2 * 512 * 3 * 4 * 64 -
            tiled_gqa_attention_backward_workspace<float>(1, 512, 4, 64));
}

}  // namespace zrt::kernels::cpu
