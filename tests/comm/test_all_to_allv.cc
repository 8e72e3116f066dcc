// ProcessGroup::all_to_allv at the world size mpirun gives (ctest: 1, 2, 3 and 4 ranks): pieces of
// every size from every rank to every rank, empty ones included, in scattered order with gaps;
// one rank receiving everything; the host-staged group bit for bit against the MPI group; the
// byte counters; receive counts that disagree with what a peer sends are an error; and with
// comm.check_collective_sequence, counts that differ per rank pass while a rank that skips the
// exchange is named instead of hanging.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

#include "runtime/comm/staged_process_group.h"
#include "tests/comm/collective_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

constexpr double kTimeoutS = 60.0;
const std::byte kUntouched{0x5a};

// Elements rank `from` sends rank `to`, known to every rank.
using Counts = std::function<std::int64_t(int from, int to)>;

// This rank's layout for `counts`: pieces in reverse member order with one element of gap
// before each, so offsets are neither sorted nor packed.
AllToAllvLayout scattered_layout(const Counts& counts, int rank, int world) {
  AllToAllvLayout layout;
  layout.send_counts.resize(static_cast<std::size_t>(world));
  layout.send_offsets.resize(static_cast<std::size_t>(world));
  layout.recv_counts.resize(static_cast<std::size_t>(world));
  layout.recv_offsets.resize(static_cast<std::size_t>(world));
  std::int64_t send_at = 0, recv_at = 0;
  for (int p = world - 1; p >= 0; --p) {
    const auto i = static_cast<std::size_t>(p);
    layout.send_counts[i] = counts(rank, p);
    layout.send_offsets[i] = send_at + 1;
    send_at += 1 + layout.send_counts[i];
    layout.recv_counts[i] = counts(p, rank);
    layout.recv_offsets[i] = recv_at + 1;
    recv_at += 1 + layout.recv_counts[i];
  }
  return layout;
}

// Runs the exchange for `counts` on `group` and checks every received piece against what its
// sender computed (piece (from, to) holds make_input(from, to * 1000, ...)) and every gap left as
// it was. Returns the output bytes.
std::vector<std::byte> check_exchange(ProcessGroup& group, Device& device, const Counts& counts,
                                      DType dtype) {
  const int rank = group.rank(), world = group.size();
  const std::int64_t elem = esize(dtype);
  const int salt = 71;
  const AllToAllvLayout layout = scattered_layout(counts, rank, world);
  std::vector<std::byte> input(static_cast<std::size_t>(layout.send_extent() * elem), std::byte{0});
  for (int p = 0; p < world; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const auto piece = make_input(dtype, rank, p * 1000, layout.send_counts[i], salt);
    std::copy(piece.begin(), piece.end(), input.begin() + layout.send_offsets[i] * elem);
  }
  const std::int64_t out_bytes = layout.recv_extent() * elem;
  Stream& stream = group.stream();
  // At least one byte each: an exchange of nothing still has buffers.
  Buffer in = upload(device, stream, input, std::max<std::int64_t>(1, layout.send_extent() * elem));
  Buffer out = upload(device, stream,
                      std::vector<std::byte>(static_cast<std::size_t>(out_bytes), kUntouched),
                      std::max<std::int64_t>(1, out_bytes));
  group.all_to_allv(in.device<std::byte>(), out.device<std::byte>(), layout, dtype);
  const auto got = download(device, stream, out.device<std::byte>(), out_bytes);
  std::vector<bool> in_piece(got.size(), false);
  for (int p = 0; p < world; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const auto expect = make_input(dtype, p, rank * 1000, layout.recv_counts[i], salt);
    const auto at = static_cast<std::size_t>(layout.recv_offsets[i] * elem);
    INFO("piece from rank " << p << " (" << layout.recv_counts[i] << " elements)");
    CHECK(std::equal(expect.begin(), expect.end(), got.begin() + static_cast<std::ptrdiff_t>(at)));
    for (std::size_t b = 0; b < expect.size(); ++b) in_piece[at + b] = true;
  }
  for (std::size_t b = 0; b < got.size(); ++b) {
    if (!in_piece[b]) CHECK(got[b] == kUntouched);
  }
  return got;
}

// Random-looking counts in [0, 6], every third pair empty, the self piece included.
std::int64_t random_count(int from, int to) {
  if ((from + 2 * to) % 3 == 0) return 0;
  return static_cast<std::int64_t>((input_value(from, to, 5) + 1.0f) * 3.5f);
}

}  // namespace

TEST_CASE("all_to_allv: pieces of any size, empty ones included, every dtype") {
  CommOptions options;
  options.timeout_s = kTimeoutS;
  CommFixture f = make_comm(options, "a2av");
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    INFO("dtype " << dtype_name(dtype));
    check_exchange(*f.group, *f.device, random_count, dtype);
  }
  // Every piece empty: still one exchange, nothing written.
  check_exchange(
      *f.group, *f.device, [](int, int) { return std::int64_t{0}; }, DType::kFloat32);
}

TEST_CASE("all_to_allv: one rank receives everything") {
  CommFixture f = make_comm({}, "a2av-skew");
  const int world = f.size();
  for (int target = 0; target < world; ++target) {
    INFO("every row to rank " << target);
    check_exchange(
        *f.group, *f.device,
        [target](int from, int to) { return to == target ? std::int64_t{5 + from} : 0; },
        DType::kFloat32);
  }
}

TEST_CASE("all_to_allv: counted as an all_to_all of the bytes received") {
  CommFixture f = make_comm({}, "a2av-count");
  const int rank = f.rank(), world = f.size();
  const CommCounts before = f.group->stats().snapshot();
  check_exchange(*f.group, *f.device, random_count, DType::kFloat32);
  const CommCounts c = f.group->stats().snapshot() - before;
  const auto op = static_cast<std::size_t>(CollectiveOp::kAllToAll);
  std::int64_t received = 0, sent = 0;
  for (int p = 0; p < world; ++p) {
    received += random_count(p, rank) * 4;
    if (p != rank) sent += random_count(rank, p) * 4;
  }
  CHECK(c.calls[op] == 1);
  CHECK(c.bytes[op] == received);
  CHECK(c.intra_bytes[op] == sent);  // one node
  CHECK(c.inter_bytes[op] == 0);
}

TEST_CASE("all_to_allv: the host-staged group gives the MPI group's bytes") {
  CommFixture plain = make_comm({}, "a2av-plain");
  CommOptions options;
  options.host_staged = true;
  options.timeout_s = kTimeoutS;
  CommFixture staged = make_comm(options, "a2av-staged");
  REQUIRE(dynamic_cast<StagedProcessGroup*>(staged.group.get()) != nullptr);
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    const auto a = check_exchange(*plain.group, *plain.device, random_count, dtype);
    const auto b = check_exchange(*staged.group, *staged.device, random_count, dtype);
    CHECK(a == b);
  }
}

TEST_CASE("all_to_allv: malformed layouts and disagreeing counts are errors") {
  CommFixture f = make_comm({}, "a2av-bad");
  const int rank = f.rank(), world = f.size();
  Buffer in = upload(*f.device, *f.stream, {}, 1024);
  Buffer out = upload(*f.device, *f.stream, {}, 1024);
  AllToAllvLayout short_layout =
      AllToAllvLayout::packed(std::vector<std::int64_t>(static_cast<std::size_t>(world + 1), 1),
                              std::vector<std::int64_t>(static_cast<std::size_t>(world + 1), 1));
  CHECK_THROWS_WITH(f.group->all_to_allv(in.device<std::byte>(), out.device<std::byte>(),
                                         short_layout, DType::kFloat32),
                    Catch::Contains("give one of each per member"));
  std::vector<std::int64_t> sends(static_cast<std::size_t>(world), 1);
  std::vector<std::int64_t> receives = sends;
  receives[static_cast<std::size_t>(rank)] = 2;
  CHECK_THROWS_WITH(f.group->all_to_allv(in.device<std::byte>(), out.device<std::byte>(),
                                         AllToAllvLayout::packed(sends, receives), DType::kFloat32),
                    Catch::Contains("sends itself 1 elements but expects 2"));
  if (world < 2) return;
  // Rank 0 expects 3 elements from rank 1, which sends it 2: rank 0's exchange fails, naming
  // rank 1; nobody waits for a message that never comes.
  sends.assign(static_cast<std::size_t>(world), 2);
  receives = sends;
  if (rank == 0) receives[1] = 3;
  f.group->all_to_allv(in.device<std::byte>(), out.device<std::byte>(),
                       AllToAllvLayout::packed(sends, receives), DType::kFloat32);
  if (rank == 0) {
    CHECK_THROWS_WITH(f.stream->synchronize(),
                      Catch::Contains("rank 1 sent 8 bytes where this rank expected 12"));
  } else {
    f.stream->synchronize();
  }
}

TEST_CASE("all_to_allv: the sequence check agrees on differing counts and names a skip",
          "[sequence]") {
  CommOptions options;
  options.check_collective_sequence = true;
  options.timeout_s = kTimeoutS;
  CommFixture f = make_comm(options, "a2av-seq");
  // Counts differ on every rank: still the same operation.
  check_exchange(*f.group, *f.device, random_count, DType::kFloat32);
  CHECK(f.group->sequence_check()->verified() == 1);
  if (f.size() < 2) return;
  // The last rank skips the exchange (it had no rows for anyone, and a buggy layer returned
  // early) and goes on to a barrier: every rank stops with an error naming both operations.
  Buffer in = upload(*f.device, *f.stream, {}, 64);
  Buffer out = upload(*f.device, *f.stream, {}, 64);
  const AllToAllvLayout empty =
      AllToAllvLayout::packed(std::vector<std::int64_t>(static_cast<std::size_t>(f.size()), 0),
                              std::vector<std::int64_t>(static_cast<std::size_t>(f.size()), 0));
  const auto start = std::chrono::steady_clock::now();
  try {
    if (f.rank() != f.size() - 1) {
      f.group->all_to_allv(in.device<std::byte>(), out.device<std::byte>(), empty, DType::kFloat32);
    }
    f.group->barrier();
    f.stream->synchronize();
    FAIL("the skipped all_to_allv was not caught");
  } catch (const Timeout& e) {
    FAIL("a timeout instead of the sequence check's error: " << e.what());
  } catch (const Error& e) {
    const std::string text = e.what();
    INFO(text);
    CHECK(text.find("group 'a2av-seq'") != std::string::npos);
    CHECK(text.find("#2") != std::string::npos);
    CHECK(text.find("rank 0: all_to_allv of fp32") != std::string::npos);
    CHECK(text.find(fmt::format("rank {}: barrier", f.size() - 1)) != std::string::npos);
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
        kTimeoutS / 4);
}
