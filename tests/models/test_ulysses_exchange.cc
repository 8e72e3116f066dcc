// UlyssesExchange's packed path (models/transformer/ulysses_exchange.h) at 2 and 4 ranks, one sp
// group of every rank: GPT-2's packed q, k, v (B,Tl,3,NH,hs) of each rank's chunk become, in one
// all-to-all, this rank's NH/sp heads of each part over the whole sequence, still packed
// (B, sp*Tl, 3, NH/sp, hs); the backward adds the adjoint into the chunk's gradient. Both against
// the index map written out here, element by element and exactly (the layout only moves values;
// the backward's one addition per element is the same fp32 add); and, at one sequence a
// micro-batch, the in-place forms with one staging buffer.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstring>
#include <vector>

#include "kernels/kernel_context.h"
#include "models/transformer/ulysses_exchange.h"
#include "runtime/device/device_access.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr int kB = 2, kTl = 3, kParts = 3, kNH = 4, kHs = 2;

Buffer upload_floats(Device& device, Stream& stream, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return upload(device, stream, bytes);
}

std::vector<float> download_floats(Device& device, Stream& stream, Buffer& b, std::size_t count) {
  const std::vector<std::byte> bytes =
      download(device, stream, b.device<std::byte>(), static_cast<std::int64_t>(count * 4));
  std::vector<float> out(count);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Element (b, t, part, head, d) of a (B, T, parts, heads, hs) tensor.
std::size_t at(int T, int heads, int b, int t, int part, int head, int d) {
  return ((((static_cast<std::size_t>(b) * T + t) * kParts + part) * heads + head) * kHs) + d;
}

}  // namespace

TEST_CASE("to_heads_packed gives each rank its heads of every part over the whole sequence",
          "[ulysses]") {
  int sp = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &sp);
  if (kNH % sp != 0) return;
  CommOptions options;
  options.check_collective_sequence = true;
  CommFixture f = make_comm(options, "sequence-parallel");
  std::unique_ptr<Stream> compute = f.device->create_stream("compute");
  kernels::KernelContext ctx(*f.device, *compute);
  transformer::UlyssesExchange ex(ctx, *f.group);
  const int rank = f.rank(), Hd = kNH / sp, T = sp * kTl;
  const std::size_t n = static_cast<std::size_t>(kB) * kTl * kParts * kNH * kHs;

  // chunk: this rank's (B,Tl,3,NH,hs); dfull: the gradient of its (B,T,3,Hd,hs); dchunk0: what
  // the chunk's gradient held before the backward adds to it.
  auto chunk_of = [&](int r) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input_value(r, static_cast<std::int64_t>(i), 5);
    return v;
  };
  auto dfull_of = [&](int r) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input_value(r, static_cast<std::int64_t>(i), 7);
    return v;
  };
  std::vector<float> dchunk0(n);
  for (std::size_t i = 0; i < n; ++i)
    dchunk0[i] = input_value(rank, static_cast<std::int64_t>(i), 9);

  Buffer chunk = upload_floats(*f.device, *compute, chunk_of(rank));
  Buffer dfull = upload_floats(*f.device, *compute, dfull_of(rank));
  Buffer dchunk = upload_floats(*f.device, *compute, dchunk0);
  Buffer full = upload_floats(*f.device, *compute, std::vector<float>(n, 0.0f));
  Buffer send = upload_floats(*f.device, *compute, std::vector<float>(n, 0.0f));
  Buffer recv = upload_floats(*f.device, *compute, std::vector<float>(n, 0.0f));

  ex.to_heads_packed(DType::kFloat32, full.device<std::byte>(), chunk.device<std::byte>(), kB, kTl,
                     kParts, kNH, kHs, send.device<std::byte>(), recv.device<std::byte>());
  ex.to_heads_packed_backward(DType::kFloat32, dchunk.device<std::byte>(),
                              dfull.device<std::byte>(), kB, kTl, kParts, kNH, kHs,
                              send.device<std::byte>(), recv.device<std::byte>());
  const std::vector<float> got_full = download_floats(*f.device, *compute, full, n);
  const std::vector<float> got_dchunk = download_floats(*f.device, *compute, dchunk, n);

  // full[b][t][p][h] = rank (t / Tl)'s chunk at token t % Tl, part p, head rank * Hd + h.
  int mismatches = 0;
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::vector<float> source = chunk_of(t / kTl);
      for (int p = 0; p < kParts; ++p) {
        for (int h = 0; h < Hd; ++h) {
          for (int d = 0; d < kHs; ++d) {
            const float want = source[at(kTl, kNH, b, t % kTl, p, rank * Hd + h, d)];
            if (got_full[at(T, Hd, b, t, p, h, d)] != want) ++mismatches;
          }
        }
      }
    }
  }
  CHECK(mismatches == 0);
  // dchunk[b][t][p][h] += rank (h / Hd)'s dfull at token rank * Tl + t, part p, head h % Hd.
  mismatches = 0;
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kTl; ++t) {
      for (int p = 0; p < kParts; ++p) {
        for (int h = 0; h < kNH; ++h) {
          const std::vector<float> source = dfull_of(h / Hd);
          for (int d = 0; d < kHs; ++d) {
            const std::size_t i = at(kTl, kNH, b, t, p, h, d);
            const float want = dchunk0[i] + source[at(T, Hd, b, rank * kTl + t, p, h % Hd, d)];
            if (got_dchunk[i] != want) ++mismatches;
          }
        }
      }
    }
  }
  CHECK(mismatches == 0);
}

// One sequence a micro-batch (B == 1): the whole sequence's layout is the all-to-all's block
// order, so each exchange sends or receives in place and the caller passes one buffer as both
// send and recv; and the model's in-place forms (the chunk and its whole-sequence layout in one
// buffer). Query heads (B,Tl,NH,hs) against the index map, exactly.
TEST_CASE("at one sequence the exchanges run in place with one staging buffer", "[ulysses]") {
  int sp = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &sp);
  if (kNH % sp != 0) return;
  CommFixture f = make_comm(CommOptions{}, "sequence-parallel");
  std::unique_ptr<Stream> compute = f.device->create_stream("compute");
  kernels::KernelContext ctx(*f.device, *compute);
  transformer::UlyssesExchange ex(ctx, *f.group);
  const int rank = f.rank(), Hd = kNH / sp, T = sp * kTl;
  const kernels::UlyssesHeads heads = kernels::ulysses_query_heads(kNH, sp);
  const std::size_t n = static_cast<std::size_t>(kTl) * kNH * kHs;  // chunk == full's size
  auto values = [&](int r, int salt) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = input_value(r, static_cast<std::int64_t>(i), salt);
    return v;
  };
  // Element (t, h, d) of a (T, heads, hs) tensor.
  auto at1 = [](int heads_n, int t, int h, int d) {
    return (static_cast<std::size_t>(t) * heads_n + h) * kHs + d;
  };
  Buffer staging = upload_floats(*f.device, *compute, std::vector<float>(n, 0.0f));
  const auto one = staging.device<std::byte>();
  auto run = [&](const std::vector<float>& in, auto&& op) {
    Buffer b = upload_floats(*f.device, *compute, in);
    op(b.device<std::byte>());
    return download_floats(*f.device, *compute, b, n);
  };
  const DType dt = DType::kFloat32;
  // to_heads in place: full[t][h] = rank (t / Tl)'s chunk at t % Tl, head rank * Hd + h.
  const std::vector<float> full = run(values(rank, 11), [&](DevicePtr<std::byte> x) {
    ex.to_heads(dt, x, x, 1, kTl, heads, kHs, one, one);
  });
  // to_chunk in place of a second buffer: chunk[t][h] = rank (h / Hd)'s full at rank*Tl + t.
  Buffer chunk = upload_floats(*f.device, *compute, std::vector<float>(n, 0.0f));
  Buffer from = upload_floats(*f.device, *compute, values(rank, 13));
  ex.to_chunk(dt, chunk.device<std::byte>(), from.device<std::byte>(), 1, kTl, kNH, kHs, one, one);
  const std::vector<float> got_chunk = download_floats(*f.device, *compute, chunk, n);
  // to_chunk_backward in place: as to_heads with the query heads.
  const std::vector<float> dfull = run(values(rank, 15), [&](DevicePtr<std::byte> x) {
    ex.to_chunk_backward(dt, x, x, 1, kTl, kNH, kHs, one, one);
  });
  // to_heads_backward_in_place: dchunk[t][h] = rank (h / Hd)'s dfull at rank*Tl + t (from zero).
  const std::vector<float> dchunk = run(values(rank, 17), [&](DevicePtr<std::byte> x) {
    ex.to_heads_backward_in_place(dt, x, 1, kTl, heads, kHs, one, one);
  });
  int mismatches = 0;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < Hd; ++h) {
      for (int d = 0; d < kHs; ++d) {
        const std::size_t src = at1(kNH, t % kTl, rank * Hd + h, d);
        if (full[at1(Hd, t, h, d)] != values(t / kTl, 11)[src]) ++mismatches;
        if (dfull[at1(Hd, t, h, d)] != values(t / kTl, 15)[src]) ++mismatches;
      }
    }
  }
  for (int t = 0; t < kTl; ++t) {
    for (int h = 0; h < kNH; ++h) {
      for (int d = 0; d < kHs; ++d) {
        const std::size_t src = at1(Hd, rank * kTl + t, h % Hd, d);
        if (got_chunk[at1(kNH, t, h, d)] != values(h / Hd, 13)[src]) ++mismatches;
        if (dchunk[at1(kNH, t, h, d)] != values(h / Hd, 17)[src]) ++mismatches;
      }
    }
  }
  CHECK(mismatches == 0);
}
