// comm.check_collective_sequence (runtime/comm/collective_sequence_check.h): ranks that issue the
// same collectives pass and count them; a rank that skips one, issues another op or another size,
// stops every rank with an Error naming the operation, its number and what each rank issued,
// within a fraction of the timeout (no hang); sub-groups made by make_subgroup are checked too.
#include <catch2/catch.hpp>

#include <chrono>

#include "runtime/comm/topology.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr double kTimeoutS = 60.0;

CommFixture checked_comm(const char* name) {
  CommOptions options;
  options.check_collective_sequence = true;
  options.timeout_s = kTimeoutS;
  return make_comm(options, name);
}

struct Buffers {
  Buffer in, out;
};

Buffers buffers(CommFixture& f, std::int64_t count) {
  const std::int64_t bytes = count * f.size() * 4;
  return {upload(*f.device, *f.stream, {}, bytes), upload(*f.device, *f.stream, {}, bytes)};
}

void all_gather(CommFixture& f, Buffers& b, std::int64_t count) {
  f.group->all_gather(b.in.device<std::byte>(), b.out.device<std::byte>(), count, DType::kFloat32);
}

void reduce_scatter(CommFixture& f, Buffers& b, std::int64_t count) {
  f.group->reduce_scatter(b.in.device<std::byte>(), b.out.device<std::byte>(), count,
                          DType::kFloat32, ReduceOp::kSum);
}

// Runs `body` expecting an Error whose text contains every one of `parts`; returns the seconds it
// took.
template <typename Body>
double expect_mismatch(Body&& body, const std::vector<std::string>& parts) {
  const auto start = std::chrono::steady_clock::now();
  try {
    body();
    FAIL("the sequence check let differing collectives through");
  } catch (const Timeout& e) {
    FAIL("a timeout instead of the sequence check's error: " << e.what());
  } catch (const Error& e) {
    const std::string text = e.what();
    INFO(text);
    for (const std::string& p : parts) CHECK(text.find(p) != std::string::npos);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("sequence check: the same collectives on every rank pass and are counted", "[sequence]") {
  CommFixture f = checked_comm("seq-same");
  Buffers b = buffers(f, 16);
  all_gather(f, b, 16);
  reduce_scatter(f, b, 16);
  f.group->barrier();
  f.group->all_reduce(b.in.device<std::byte>(), b.in.device<std::byte>(), 8, DType::kFloat32,
                      ReduceOp::kSum);
  f.stream->synchronize();
  REQUIRE(f.group->sequence_check() != nullptr);
  // An all-reduce of floats is a reduce-scatter and an all-gather inside some backends, each
  // checked too: at least the four issued here.
  CHECK(f.group->sequence_check()->verified() >= 4);
  // Off by default.
  CommFixture plain = make_comm({}, "seq-off");
  CHECK(plain.group->sequence_check() == nullptr);
}

TEST_CASE("sequence check: a rank that skips a collective stops every rank, naming it",
          "[sequence]") {
  CommFixture f = checked_comm("seq-skip");
  if (f.size() < 2) return;  // nothing can differ on one rank
  Buffers b = buffers(f, 16);
  all_gather(f, b, 16);
  // Done before the mismatch: the check throws at issue time, and this all-gather would otherwise
  // still be running on the stream (the other ranks' halves arriving) when the error unwinds and
  // frees its buffers (seen once in CI, on a loaded 2-core machine, as heap corruption).
  f.stream->synchronize();
  // Rank 1 skips the all-gather the others issue (an expert with no token skipping its
  // reduction): without the check the others would wait for it until the timeout.
  const double seconds = expect_mismatch(
      [&] {
        if (f.rank() != 1) all_gather(f, b, 16);
        reduce_scatter(f, b, 16);
        f.stream->synchronize();
      },
      {"group 'seq-skip'", "#2", "after 1 that agreed", "all_gather of 16 x fp32",
       "rank 1: reduce_scatter (sum) of 16 x fp32"});
  CHECK(seconds < kTimeoutS / 4);
}

TEST_CASE("sequence check: another size on one rank is named with every rank's", "[sequence]") {
  CommFixture f = checked_comm("seq-size");
  if (f.size() < 2) return;
  Buffers b = buffers(f, 64);
  expect_mismatch([&] { all_gather(f, b, f.rank() == f.size() - 1 ? 48 : 64); },
                  {"#1", "rank 0: all_gather of 64 x fp32",
                   fmt::format("rank {}: all_gather of 48 x fp32", f.size() - 1)});
}

TEST_CASE("sequence check: sub-groups from make_subgroup are checked over their members",
          "[sequence]") {
  CommFixture f = checked_comm("seq-parent");
  if (f.size() < 2) return;
  // Pairs of ranks (a shard group of 2 when the world is even, else the whole world).
  const int shard = f.size() % 2 == 0 ? 2 : f.size();
  auto child =
      make_subgroup(*f.group, shard_plan(f.size(), shard, f.rank()), *f.stream, "seq-child");
  REQUIRE(child->sequence_check() != nullptr);
  Buffers b{upload(*f.device, *f.stream, {}, 64 * shard * 4),
            upload(*f.device, *f.stream, {}, 64 * shard * 4)};
  child->all_gather(b.in.device<std::byte>(), b.out.device<std::byte>(), 8, DType::kFloat32);
  f.stream->synchronize();
  CHECK(child->sequence_check()->verified() == 1);
  // The child's first member issues a broadcast where the others all-gather.
  expect_mismatch(
      [&] {
        if (child->rank() == 0) {
          child->broadcast(b.in.device<std::byte>(), 8, DType::kFloat32, 0);
        } else {
          child->all_gather(b.in.device<std::byte>(), b.out.device<std::byte>(), 8,
                            DType::kFloat32);
        }
        f.stream->synchronize();
      },
      {"group 'seq-child'", "#2", "rank 0: broadcast of 8 elements from rank 0",
       "rank 1: all_gather of 8 x fp32"});
}
