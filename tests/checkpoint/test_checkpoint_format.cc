// Checkpoint files without training: CRC-32C known answers, the index and rank files round
// trip, the resharding reader rebuilds every element of another partition (world size and
// stage) from a value function, and damaged, foreign or mismatched files fail with messages
// naming the file, the dataset and the problem. A format-1 checkpoint (written by zrt before
// the slice table, a fixture) still reads and reshards; the tables of a checkpoint over several
// shard groups are merged from the ranks' rows, read by parameter name, and refused when a
// slice is written twice or by no rank; an expert's own parameter reads from the stacked one
// and back.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/crc32c.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/layout.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/checkpoint/rank_share.h"
#include "runtime/checkpoint/tensor_writer.h"
#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"

using namespace zrt;
using namespace zrt::checkpoint;
namespace fs = std::filesystem;

namespace {

// A small model: 4 modules, a tied parameter, odd sizes so padding and slice boundaries cut
// through parameters.
std::vector<ParamSpec> model() {
  return {
      {"emb", {37, 5}, {0, 3}, false}, {"a.w", {5, 19}, {1}, false},
      {"a.b", {19}, {1}, true},        {"b.w", {19, 7}, {2}, false},
      {"b.b", {7}, {2}, true},         {"head.w", {7, 11}, {3}, false},
  };
}

// The value every state array holds at element e of parameter p (exact in fp32).
float value(int p, std::int64_t e, int array) {
  return static_cast<float>(p * 1000 + e) + 0.25f * static_cast<float>(array);
}

PartitionPlan plan_for(int stage, int world, std::int64_t bucket = 120) {
  PartitionOptions o;
  o.stage = stage;
  o.world = stage == 0 ? 1 : world;
  o.bucket_elements = bucket;
  o.persistence_threshold = stage == 3 ? 10 : 0;
  o.alignment = 4;
  o.num_modules = 4;
  return PartitionPlan(model(), o);
}

// Writes a checkpoint of `plan` holding value() into dir.
CheckpointIndex write_checkpoint(const fs::path& dir, const PartitionPlan& plan, int stage) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  CheckpointIndex index;
  index.step = 7;
  index.optimizer_steps = 6;
  index.skipped_steps = 1;
  index.stage = stage;
  index.seed = 99;
  index.loss_scale = LossScaleState{1024.0, 7, 3, 2};
  index.data = DataStreamState{56, true, 5, 32, 1, 724, "a.bin 1024 00000000deadbeef"};
  index.scheduler = "WarmupLR";
  index.config_json = R"({"model": {"preset": "gpt2-tiny"}})";
  const auto params = model();
  fill_tables(index, params, plan);
  write_index((dir / "index.h5").string(), index);
  for (int r = 0; r < plan.world(); ++r) {
    RankSnapshot snap;
    snap.rank = r;
    const auto n = static_cast<std::size_t>(plan.total_shard());
    snap.assign(static_cast<std::int64_t>(n));  // master, exp_avg, exp_avg_sq
    std::int64_t base = 0;
    for (const Unit& u : plan.units()) {
      for (int p : u.params) {
        const auto range = plan.owned_range(p, r);
        for (std::int64_t i = 0; i < range.count; ++i) {
          const auto at = static_cast<std::size_t>(base + range.slice_offset + i);
          for (int a = 0; a < 3; ++a) {
            snap.arrays[static_cast<std::size_t>(a)][at] = value(p, range.first + i, a);
          }
        }
      }
      base += u.shard;
    }
    write_rank_file((dir / rank_file_name(r)).string(), snap, plan.world(), 99);
  }
  return index;
}

// Loads `dir` into the slices of `plan` for every rank and checks each element.
void check_reshard(const fs::path& dir, const PartitionPlan& plan) {
  const auto params = model();
  const CheckpointIndex index = read_index((dir / "index.h5").string(), &params);
  ShardedReader reader(dir.string(), index);
  for (int r = 0; r < plan.world(); ++r) {
    for (std::size_t ui = 0; ui < plan.units().size(); ++ui) {
      const int u = static_cast<int>(ui);
      const auto n = static_cast<std::size_t>(plan.unit(u).shard);
      std::vector<float> a(n, -1.f), b(n, -1.f), c(n, -1.f);  // fill() must zero the padding
      reader.fill(plan, r, u, {a.data(), b.data(), c.data()});
      std::vector<bool> covered(n, false);
      for (int p : plan.unit(u).params) {
        const auto range = plan.owned_range(p, r);
        for (std::int64_t i = 0; i < range.count; ++i) {
          const auto at = static_cast<std::size_t>(range.slice_offset + i);
          covered[at] = true;
          INFO("rank " << r << " unit " << u << " param " << p << " element " << range.first + i);
          REQUIRE(a[at] == value(p, range.first + i, 0));
          REQUIRE(b[at] == value(p, range.first + i, 1));
          REQUIRE(c[at] == value(p, range.first + i, 2));
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (!covered[i]) {
          INFO("rank " << r << " unit " << u << " padding element " << i);
          REQUIRE(a[i] == 0.0f);
          REQUIRE(b[i] == 0.0f);
          REQUIRE(c[i] == 0.0f);
        }
      }
    }
  }
}

fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "zrt_test_ckpt_format" / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("latest: the tag without surrounding whitespace; anything else named with its bytes") {
  const fs::path dir = scratch_dir("latest");
  fs::create_directories(dir);
  const auto latest_of = [&](const std::string& text) {
    std::ofstream(dir / "latest", std::ios::binary) << text;
    return checkpoint::read_latest(dir.string());
  };
  CHECK_FALSE(checkpoint::read_latest(dir.string()).has_value());  // no file: no checkpoint
  CHECK(latest_of("global_step4") == std::optional<std::string>("global_step4"));
  CHECK(latest_of("global_step4\n") == std::optional<std::string>("global_step4"));
  // An editor's CRLF and stray spaces (DeepSpeed strips them too).
  CHECK(latest_of("global_step4\r\n") == std::optional<std::string>("global_step4"));
  CHECK(latest_of("  global_step4 \t") == std::optional<std::string>("global_step4"));
  const std::string file = (dir / "latest").string();
  for (const auto& [text, shown] : std::vector<std::pair<std::string, std::string>>{
           {"", ""},
           {" \r\n", " \\x0d"},
           {"../global_step4", "../global_step4"},
           {"..", ".."},
           {"global\x1b[2Jstep4", "global\\x1b[2Jstep4"}}) {
    INFO(shown);
    CHECK_THAT(
        message_of([&] { latest_of(text); }),
        Catch::EndsWith(file + ": does not name a checkpoint tag ('" + shown +
                        "'): it holds one line, the name of a checkpoint directory beside it (e.g. "
                        "global_step100)"));
  }
}

TEST_CASE("crc32c: known answers, hardware and portable agree, chaining") {
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);  // the standard check value
  CHECK(crc32c_portable(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::vector<unsigned char> zeros(32, 0);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4: 32 zero bytes
  std::vector<unsigned char> ones(32, 0xFF);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);  // RFC 3720 B.4: 32 0xFF bytes
  std::mt19937 rng(3);
  std::vector<unsigned char> data(100003);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  // Lengths around the hardware path's three interleaved 4 KiB lanes (12 KiB groups), at
  // aligned and unaligned starts, and with a nonzero incoming crc.
  for (std::size_t n :
       {0u, 1u, 7u, 8u, 9u, 4096u, 12287u, 12288u, 12289u, 24576u, 24583u, 100003u - 3u}) {
    for (std::size_t at : {0u, 1u, 3u}) {
      INFO(n << " bytes at offset " << at);
      CHECK(crc32c(data.data() + at, n) == crc32c_portable(data.data() + at, n));
      CHECK(crc32c(data.data() + at, n, 0x1234567u) ==
            crc32c_portable(data.data() + at, n, 0x1234567u));
    }
  }
  CHECK(crc32c(data.data() + 1000, data.size() - 1000, crc32c(data.data(), 1000)) ==
        crc32c(data.data(), data.size()));
}

TEST_CASE("verified range reads: every range, whole blocks read in place, corruption found") {
  // 16-byte checksum blocks (4 floats) over 23 floats: ranges inside one block, across two,
  // with whole blocks in the middle, ending in the short last block.
  const fs::path dir = scratch_dir("ranges");
  fs::create_directories(dir);
  const std::string path = (dir / "r.h5").string();
  std::vector<float> data(23);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = 1.5f * static_cast<float>(i) + 1.0f;
  {
    H5File f = H5File::create(path);
    write_dataset(f, "/x", H5Elem::kFloat32, {23}, data.data(), 16);
    f.close();
  }
  std::vector<unsigned char> scratch;
  {
    H5File f = H5File::open_read(path);
    H5Dataset ds(f, "/x", H5Elem::kFloat32, {23});
    for (std::int64_t first = 0; first <= 23; ++first) {
      for (std::int64_t count = 0; first + count <= 23; ++count) {
        std::vector<float> out(static_cast<std::size_t>(count) + 2, -7.f);
        const std::int64_t bytes = ds.read(first, count, out.data() + 1, true, scratch);
        INFO("elements " << first << ".." << first + count);
        // Whole blocks only: from the block of `first` to the block of the last element.
        const std::int64_t b0 = first / 4, b1 = count == 0 ? b0 - 1 : (first + count - 1) / 4;
        CHECK(bytes == 4 * (std::min<std::int64_t>(23, 4 * (b1 + 1)) - 4 * b0));
        CHECK(out.front() == -7.f);  // nothing written outside the range
        CHECK(out.back() == -7.f);
        for (std::int64_t k = 0; k < count; ++k) {
          REQUIRE(out[static_cast<std::size_t>(k + 1)] ==
                  data[static_cast<std::size_t>(first + k)]);
        }
      }
    }
  }
  // A flipped byte in block 2 (elements 8..11): found by a range that holds block 2 whole (read
  // in place), by one that ends inside it, and not by a range that avoids it.
  std::int64_t offset = -1;
  {
    H5File f = H5File::open_read(path);
    H5Id ds(H5Dopen2(f.id(), "/x", H5P_DEFAULT));
    offset = static_cast<std::int64_t>(H5Dget_offset(ds.get()));
  }
  REQUIRE(offset > 0);
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(offset + 9 * 4 + 1);
    io.put(static_cast<char>(0x5A));
  }
  H5File f = H5File::open_read(path);
  H5Dataset ds(f, "/x", H5Elem::kFloat32, {23});
  std::vector<float> out(23);
  CHECK_THAT(message_of([&] { ds.read(5, 10, out.data(), true, scratch); }),
             Catch::Contains("r.h5: dataset '/x': checksum mismatch in block 2 (bytes 32..48)"));
  CHECK_THAT(message_of([&] { ds.read(1, 9, out.data(), true, scratch); }),
             Catch::Contains("checksum mismatch in block 2"));
  CHECK(message_of([&] { ds.read(12, 11, out.data(), true, scratch); }) == "(no error)");
  CHECK(message_of([&] { ds.read(0, 8, out.data(), true, scratch); }) == "(no error)");
}

namespace {

// Whether the directory's file system takes O_DIRECT writes (tmpfs before Linux 6.6 does not).
bool takes_o_direct(const fs::path& dir) {
  const std::string probe = (dir / "probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  bool ok = false;
  if (fd >= 0) {
    void* block = std::aligned_alloc(4096, 4096);
    std::memset(block, 0, 4096);
    ok = ::pwrite(fd, block, 4096, 0) == 4096;
    std::free(block);
    ::close(fd);
  }
  fs::remove(probe);
  return ok;
}

// How many of the file's pages [offset, offset + bytes) are in the page cache.
std::int64_t cached_pages(const std::string& path, std::int64_t offset, std::int64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::int64_t start = offset / page * page;
  const std::int64_t length = offset + bytes - start;
  void* map = ::mmap(nullptr, static_cast<std::size_t>(length), PROT_READ, MAP_SHARED, fd, start);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  std::vector<unsigned char> resident(static_cast<std::size_t>((length + page - 1) / page));
  REQUIRE(::mincore(map, static_cast<std::size_t>(length), resident.data()) == 0);
  ::munmap(map, static_cast<std::size_t>(length));
  std::int64_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

}  // namespace

TEST_CASE("tensor data past the page cache: every size, alignment and path reads back verified") {
  const fs::path dir = scratch_dir("tensor_writer");
  fs::create_directories(dir);
  const bool direct_here = takes_o_direct(dir);
  if (!direct_here) WARN("this file system refuses O_DIRECT: only the buffered path is tested");
  // Sizes around the 4 KiB alignment, the 1 MiB checksum blocks and the 8 MiB pieces; memory
  // at an aligned start (written from place) and one float off (through the staging buffers).
  // Slack for the largest size: up to 4095 bytes lost rounding the start up to a 4 KiB boundary,
  // plus the one-float shift.
  std::vector<float> source((std::int64_t{5} << 20) + 4096 / sizeof(float) + 64);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = 0.5f * static_cast<float>(i % 65521);
  float* aligned_start = reinterpret_cast<float*>(
      (reinterpret_cast<std::uintptr_t>(source.data()) + 4095) / 4096 * 4096);
  const std::int64_t sizes[] = {
      0, 1, 1023, 1024, 262144, 262147, (std::int64_t{9} << 18) + 5, (std::int64_t{5} << 20) - 7};
  for (const bool allow_direct : {true, false}) {
    for (const int shift : {0, 1}) {
      const std::string path =
          (dir / ("t_" + std::to_string(allow_direct) + std::to_string(shift) + ".h5")).string();
      const float* data = aligned_start + shift;
      {
        H5File f = H5File::create(path);
        TensorWriter writer(path, allow_direct);
        for (const std::int64_t n : sizes) {
          INFO(n << " floats, shift " << shift << ", direct allowed " << allow_direct);
          double crc_s = 0;
          write_dataset(f, "/d" + std::to_string(n), H5Elem::kFloat32, {n}, data, kTensorBlockBytes,
                        0, &writer, &crc_s);
          CHECK(crc_s >= 0.0);
          // Whole 4 KiB blocks of a dataset of at least 1 MiB go past the page cache when
          // allowed and the file system takes it.
          CHECK(writer.wrote_direct() == (allow_direct && direct_here && n * 4 >= (1 << 20)));
        }
        f.close();
        fsync_path(path);
      }
      H5File f = H5File::open_read(path);
      // Page-cache residency first: reading a dataset reads ahead into the next one.
      for (const std::int64_t n : sizes) {
        INFO(n << " floats, shift " << shift << ", direct allowed " << allow_direct);
        H5Id raw(H5Dopen2(f.id(), ("/d" + std::to_string(n)).c_str(), H5P_DEFAULT));
        const auto offset = static_cast<std::int64_t>(H5Dget_offset(raw.get()));
        if (n * 4 >= kAlignedObjectBytes) CHECK(offset % 4096 == 0);
        if (allow_direct && direct_here && n * 4 >= kAlignedObjectBytes) {
          // The body never entered the page cache (the buffered tail's page may have).
          CHECK(cached_pages(path, offset, n * 4 / 4096 * 4096) == 0);
        }
      }
      for (const std::int64_t n : sizes) {
        INFO(n << " floats, shift " << shift << ", direct allowed " << allow_direct);
        H5Dataset ds(f, "/d" + std::to_string(n), H5Elem::kFloat32, {n});
        CHECK(ds.block_bytes() == kTensorBlockBytes);
        std::vector<float> back(static_cast<std::size_t>(n) + 1, -1.f);
        ds.read_all(back.data());  // every checksum block verified
        CHECK(back.back() == -1.f);
        CHECK(std::equal(back.begin(), back.end() - 1, data));
      }
    }
  }
}

TEST_CASE("tensor data from runs of memory: the bytes and checksums of the joined array") {
  // A synchronous save writes a rank's state from the engine's per-unit slices: whatever the
  // split, the file must hold the concatenation and the checksums must be its blocks'.
  const fs::path dir = scratch_dir("tensor_runs");
  fs::create_directories(dir);
  const bool direct_here = takes_o_direct(dir);
  if (!direct_here) WARN("this file system refuses O_DIRECT: only the buffered path is tested");
  const std::int64_t total = (std::int64_t{19} << 20) + 4096 + 13;  // three pieces and a tail
  // 4 KiB-aligned backing memory, so runs that start aligned can be written in place.
  std::vector<unsigned char> backing(static_cast<std::size_t>(total) + 8192);
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(backing.data()) + 4095) / 4096 * 4096);
  std::mt19937 rng(7);
  for (std::int64_t i = 0; i < total; ++i) base[i] = static_cast<unsigned char>(rng());
  const std::int64_t mib = std::int64_t{1} << 20;
  // Run lengths in order (the last run takes the rest): aligned runs, empty ones, runs ending
  // inside a checksum block or across the 8 MiB pieces, tiny ones.
  const std::vector<std::vector<std::int64_t>> splits = {
      {},                                     // one run
      {8 * mib, 8 * mib},                     // aligned runs at the pieces
      {0, 3, 0, 4093, 5 * mib + 7, 0, 1},     // tiny, empty, misaligned
      {mib - 1, 2, 9 * mib + 4096, 123457}};  // a run across a piece boundary
  for (const std::int64_t block : {mib, std::int64_t{1000}}) {
    std::vector<std::uint32_t> expected;
    for (std::int64_t at = 0; at < total; at += block) {
      expected.push_back(crc32c(base + at, static_cast<std::size_t>(std::min(block, total - at))));
    }
    for (const bool allow_direct : {true, false}) {
      for (const std::int64_t offset :
           {std::int64_t{0}, std::int64_t{4096 * 3}, std::int64_t{100}}) {
        for (std::size_t s = 0; s < splits.size(); ++s) {
          INFO("block " << block << ", direct allowed " << allow_direct << ", offset " << offset
                        << ", split " << s);
          std::vector<HostBytes> runs;
          std::int64_t at = 0;
          for (const std::int64_t n : splits[s]) {
            runs.push_back({base + at, n});
            at += n;
          }
          runs.push_back({base + at, total - at});
          const std::string path = (dir / "runs.bin").string();
          { std::ofstream(path, std::ios::trunc); }
          std::vector<std::uint32_t> crcs;
          {
            TensorWriter writer(path, allow_direct);
            crcs = writer.write(offset, runs, block);
            CHECK(writer.wrote_direct() == (allow_direct && direct_here && offset % 4096 == 0));
          }
          CHECK(crcs == expected);
          std::ifstream in(path, std::ios::binary);
          std::vector<unsigned char> back(static_cast<std::size_t>(offset + total) + 1);
          in.read(reinterpret_cast<char*>(back.data()), static_cast<std::streamsize>(back.size()));
          REQUIRE(in.gcount() == offset + total);
          CHECK(std::equal(base, base + total, back.begin() + offset));
        }
      }
    }
  }
}

TEST_CASE("index round trip keeps every field and table") {
  const fs::path dir = scratch_dir("index");
  const PartitionPlan plan = plan_for(2, 3);
  const CheckpointIndex written = write_checkpoint(dir, plan, 2);
  const auto params = model();
  const CheckpointIndex read = read_index((dir / "index.h5").string(), &params);
  CHECK(read.step == 7);
  CHECK(read.optimizer_steps == 6);
  CHECK(read.skipped_steps == 1);
  CHECK(read.world == 3);
  CHECK(read.stage == 2);
  CHECK(read.seed == 99);
  CHECK(read.loss_scale.scale == 1024.0);
  CHECK(read.loss_scale.iteration == 7);
  CHECK(read.loss_scale.last_overflow_iteration == 3);
  CHECK(read.loss_scale.hysteresis_left == 2);
  CHECK(read.data.position == 56);
  CHECK(read.data.shuffle);
  CHECK(read.data.seed == 5);
  CHECK(read.data.num_samples == 724);
  CHECK(read.data.fingerprint == "a.bin 1024 00000000deadbeef");
  CHECK(read.scheduler == "WarmupLR");
  CHECK(read.config_json == written.config_json);
  REQUIRE(read.params.size() == params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    CHECK(read.params[p].name == params[p].name);
    CHECK(read.params[p].shape == params[p].shape);
    CHECK(read.params[p].unit == plan.placement(static_cast<int>(p)).unit);
    CHECK(read.params[p].offset == plan.placement(static_cast<int>(p)).offset);
  }
  CHECK(read.units.size() == plan.units().size());
  CHECK(read.slice_elements() == plan.total_shard());
  CHECK(verify_checkpoint(dir.string()) == 3 * 3 * plan.total_shard() * 4);
  // The parameters' own step counts: not written unless every one is known (an index written
  // before them reads as -1: the run's count), else read back as written.
  for (const ParamEntry& e : read.params) CHECK(e.steps == -1);
  CHECK_FALSE(H5File::open_read((dir / "index.h5").string()).has("/param_steps"));
  CheckpointIndex counted = read;
  for (std::size_t p = 0; p < counted.params.size(); ++p) {
    counted.params[p].steps = static_cast<std::int64_t>(p % 2 == 0 ? 6 : 0);
  }
  write_index((dir / "index.h5").string(), counted);
  const CheckpointIndex reread = read_index((dir / "index.h5").string(), &params);
  for (std::size_t p = 0; p < reread.params.size(); ++p) {
    CHECK(reread.params[p].steps == (p % 2 == 0 ? 6 : 0));
  }
  // More steps than the checkpoint's optimizer took: refused, naming the parameter.
  counted.params[1].steps = 7;
  write_index((dir / "index.h5").string(), counted);
  CHECK_THAT(message_of([&] { read_index((dir / "index.h5").string(), &params); }),
             Catch::Contains("dataset '/param_steps': parameter 1 ('") &&
                 Catch::Contains("took 7 optimizer steps of the checkpoint's 6"));
}

TEST_CASE("an index written before the optimizer seam holds Adam's state and still loads") {
  const fs::path dir = scratch_dir("pre_seam");
  const PartitionPlan plan = plan_for(2, 3);
  write_checkpoint(dir, plan, 2);
  const auto params = model();
  CHECK(read_index((dir / "index.h5").string(), &params).optimizer == "Adam");
  {  // Remove the attributes the optimizer seam added: the index as zrt wrote it before.
    H5Id file(H5Fopen((dir / "index.h5").string().c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    REQUIRE(file.get() >= 0);
    REQUIRE(H5Adelete(file.get(), "optimizer") >= 0);
    REQUIRE(H5Adelete(file.get(), "optimizer_states") >= 0);
  }
  const CheckpointIndex read = read_index((dir / "index.h5").string(), &params);
  CHECK(read.optimizer == "Adam");
  CHECK(read.optimizer_states == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(read.state_datasets() == std::vector<std::string>{"/master", "/exp_avg", "/exp_avg_sq"});
  check_reshard(dir, plan_for(1, 2));  // every element of all three datasets, resharded
  CHECK(verify_checkpoint(dir.string()) == 3 * 3 * plan.total_shard() * 4);
}

TEST_CASE("resharding reads every element into any world size and stage") {
  struct Case {
    int from_stage, from_world, to_stage, to_world;
  };
  for (const Case c : {Case{2, 4, 2, 2}, Case{2, 2, 2, 3}, Case{1, 3, 3, 4}, Case{2, 2, 3, 2},
                       Case{3, 3, 1, 3}, Case{0, 4, 3, 3}, Case{3, 4, 0, 2}}) {
    INFO("stage " << c.from_stage << " x" << c.from_world << " -> stage " << c.to_stage << " x"
                  << c.to_world);
    const fs::path dir = scratch_dir("reshard");
    write_checkpoint(dir, plan_for(c.from_stage, c.from_world), c.from_stage);
    check_reshard(dir, plan_for(c.to_stage, c.to_world));
  }
  // Full rebuild (consolidate's path) agrees too.
  const fs::path dir = scratch_dir("full");
  const auto index = write_checkpoint(dir, plan_for(2, 3), 2);
  const auto full = read_full_params(dir.string(), index);
  for (std::size_t p = 0; p < full.size(); ++p) {
    for (std::size_t e = 0; e < full[p].size(); ++e) {
      REQUIRE(full[p][e] == value(static_cast<int>(p), static_cast<std::int64_t>(e), 0));
    }
  }
}

TEST_CASE("damaged, foreign and mismatched files fail naming file, dataset and problem") {
  // HDF5 frees its blocks at once from here on instead of keeping them on its free lists, so that
  // a leak in its own error path on the damaged files below is reported at the allocation that
  // leaked (tests/lsan.supp names it), not at whichever earlier object's block was reused.
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  H5garbage_collect();
  const auto params = model();
  const PartitionPlan plan = plan_for(2, 3);
  const fs::path dir = scratch_dir("integrity");
  auto fresh = [&] { write_checkpoint(dir, plan, 2); };
  auto load_all = [&] {
    const CheckpointIndex index = read_index((dir / "index.h5").string(), &params);
    ShardedReader reader(dir.string(), index);
    for (int r = 0; r < plan.world(); ++r) {
      for (std::size_t u = 0; u < plan.units().size(); ++u) {
        const auto n = static_cast<std::size_t>(plan.unit(static_cast<int>(u)).shard);
        std::vector<float> a(n), b(n), c(n);
        reader.fill(plan, r, static_cast<int>(u), {a.data(), b.data(), c.data()});
      }
    }
  };

  SECTION("a flipped byte in the tensor data: checksum error") {
    fresh();
    const std::string path = (dir / "rank_00001.h5").string();
    haddr_t offset = 0;
    {
      H5File f = H5File::open_read(path);
      H5Id ds(H5Dopen2(f.id(), "/exp_avg", H5P_DEFAULT));
      offset = H5Dget_offset(ds.get());
    }
    {
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(static_cast<std::streamoff>(offset + 37));
      char b = 0;
      io.read(&b, 1);
      b = static_cast<char>(b ^ 0x10);
      io.seekp(static_cast<std::streamoff>(offset + 37));
      io.write(&b, 1);
    }
    const std::string m = message_of(load_all);
    CHECK_THAT(m,
               Catch::Contains("rank_00001.h5: dataset '/exp_avg': checksum mismatch in block 0"));
    CHECK_THAT(message_of([&] { verify_checkpoint(dir.string()); }),
               Catch::Contains("rank_00001.h5: dataset '/exp_avg': checksum mismatch"));
  }
  // The attributes live in HDF5's metadata, outside the datasets' checksums; HDF5 checksums
  // that metadata itself (the files' object headers are of version 2, and an index's many
  // attributes sit in a heap of checksummed blocks), so a flipped byte in a value that would
  // still parse (the index's config JSON: "gpt2-tiny" to "gpt2-tinx"; a rank file's rng_seed)
  // fails the lookup. The load names the file and says it is corrupt, not that an attribute is
  // missing (which sent the reader after an older or foreign file).
  SECTION("a flipped byte in a root attribute's value: the file is named corrupt") {
    auto flip_after = [](const fs::path& path, const std::string& anchor, const std::string& bytes,
                         std::size_t at) {
      std::string content;
      {
        std::ifstream in(path, std::ios::binary);
        content.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      const std::size_t anchored = content.find(anchor);
      REQUIRE(anchored != std::string::npos);
      const std::size_t found = content.find(bytes, anchored);
      REQUIRE(found != std::string::npos);
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(static_cast<std::streamoff>(found + at));
      const char b = static_cast<char>(content[found + at] ^ 0x01);
      io.write(&b, 1);
    };
    fresh();
    const fs::path index_path = dir / "index.h5";
    flip_after(index_path, "gpt2-tiny", "gpt2-tiny", 8);  // write_checkpoint's config JSON
    const std::string index_message = message_of(load_all);
    CHECK_THAT(index_message, Catch::Contains("index.h5: attribute '") &&
                                  Catch::Contains("cannot be read") &&
                                  Catch::Contains("the file is corrupt or truncated"));
    CHECK_THAT(index_message, !Catch::Contains("is missing"));
    CHECK_THAT(message_of([&] { verify_checkpoint(dir.string()); }),
               Catch::Contains("index.h5: attribute '") && Catch::Contains("cannot be read"));

    fresh();
    const std::int64_t seed = 99;  // write_checkpoint's, as stored (little-endian int64)
    flip_after(dir / "rank_00002.h5", "rng_seed",
               std::string(reinterpret_cast<const char*>(&seed), sizeof seed), 0);
    CHECK_THAT(message_of(load_all), Catch::Contains("rank_00002.h5: attribute '") &&
                                         Catch::Contains("the file is corrupt or truncated"));
  }
  SECTION("a truncated rank file") {
    fresh();
    const fs::path path = dir / "rank_00002.h5";
    fs::resize_file(path, fs::file_size(path) / 2);
    const std::string m = message_of(load_all);
    CHECK_THAT(m, Catch::Contains("rank_00002.h5"));
    CHECK_THAT(m, Catch::Contains("truncated"));
  }
  SECTION("a foreign HDF5 file as the index, a text file as a rank file") {
    fresh();
    {
      H5File f = H5File::create((dir / "index.h5").string());
      const std::int64_t v[3] = {1, 2, 3};
      write_dataset(f, "/something", H5Elem::kInt64, {3}, v);
      f.close();
    }
    CHECK_THAT(message_of(load_all),
               Catch::Contains("index.h5: not a zrt checkpoint index (root attribute 'format'"));
    fresh();
    std::ofstream(dir / "rank_00000.h5") << "not an HDF5 file\n";
    CHECK_THAT(message_of(load_all), Catch::Contains("rank_00000.h5: not a readable HDF5 file"));
  }
  SECTION("another model: a parameter's shape or the parameter count differs") {
    fresh();
    auto other = params;
    other[3].shape = {19, 8};
    CHECK_THAT(message_of([&] { read_index((dir / "index.h5").string(), &other); }),
               Catch::Contains("index.h5: dataset '/param_name': parameter 3 is 'b.w' [19, 7] in "
                               "the checkpoint but 'b.w' [19, 8] in the model"));
    other = params;
    other.pop_back();
    CHECK_THAT(message_of([&] { read_index((dir / "index.h5").string(), &other); }),
               Catch::Contains("the checkpoint has 6 parameters, the model 5"));
  }
  SECTION("another dtype: a rank file holding float64 master weights") {
    fresh();
    {
      const std::string path = (dir / "rank_00001.h5").string();
      H5File f = H5File::create(path);
      write_attr(f.id(), "format", std::string(kRankFormat));
      write_attr(f.id(), "rank", std::int64_t{1});
      write_attr(f.id(), "world", std::int64_t{3});
      const hsize_t n = static_cast<hsize_t>(plan.total_shard());
      std::vector<double> zeros(n, 0.0);
      H5Id space(H5Screate_simple(1, &n, nullptr));
      H5Id ds(H5Dcreate2(f.id(), "/master", H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                         H5P_DEFAULT));
      H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
      ds.reset();
      f.close();
    }
    CHECK_THAT(message_of(load_all),
               Catch::Contains("rank_00001.h5: dataset '/master': element type is float64, "
                               "expected float32"));
  }
  SECTION("a rank file of another world size: its length is checked before reading") {
    fresh();
    const fs::path other = scratch_dir("integrity_other");
    write_checkpoint(other, plan_for(2, 2), 2);
    fs::copy_file(other / "rank_00001.h5", dir / "rank_00001.h5",
                  fs::copy_options::overwrite_existing);
    CHECK_THAT(message_of(load_all),
               Catch::Contains("rank_00001.h5: holds rank 1 of 2, the index expects rank 1 of 3"));
  }
}

TEST_CASE("a format-1 checkpoint (one world for every unit) still reads, reshards and verifies") {
  // Written by zrt before format 2 with write_checkpoint(dir, plan_for(2, 3), 2) above.
  const fs::path dir = fs::path(ZRT_CKPT_FIXTURES) / "v1_stage2_world3";
  const auto params = model();
  const CheckpointIndex index = read_index((dir / "index.h5").string(), &params);
  {
    H5File f = H5File::open_read((dir / "index.h5").string());
    CHECK(read_attr_int(f.id(), "format_version", "index.h5") == kOneWorldFormatVersion);
  }
  CHECK(index.step == 7);
  CHECK(index.world == 3);
  CHECK(index.stage == 2);
  const PartitionPlan saved = plan_for(2, 3);
  REQUIRE(index.units.size() == saved.units().size());
  for (std::size_t u = 0; u < saved.units().size(); ++u) {
    REQUIRE(index.units[u].slices.size() == 3);
    for (int r = 0; r < 3; ++r) {
      CHECK(index.units[u].slices[static_cast<std::size_t>(r)].rank == r);
      CHECK(index.units[u].slices[static_cast<std::size_t>(r)].offset ==
            saved.unit(static_cast<int>(u)).offset / 3);
    }
  }
  CHECK(index.rank_elements == std::vector<std::int64_t>(3, saved.total_shard()));
  CHECK(index.slice_elements() == saved.total_shard());
  check_reshard(dir, plan_for(2, 3));
  check_reshard(dir, plan_for(3, 4));
  check_reshard(dir, plan_for(1, 2));
  check_reshard(dir, plan_for(0, 1));
  CHECK(verify_checkpoint(dir.string()) == 3 * 3 * saved.total_shard() * 4);
  const auto full = read_full_params(dir.string(), index);
  for (std::size_t p = 0; p < full.size(); ++p) {
    for (std::size_t e = 0; e < full[p].size(); ++e) {
      REQUIRE(full[p][e] == value(static_cast<int>(p), static_cast<std::int64_t>(e), 0));
    }
  }
}

namespace {

// A checkpoint over two groups as three ranks would write it: group 0 (emb, a.w, a.b) sliced
// over the 3 ranks; group 1 as "experts": x0.w and x1.w whole on rank 0 and 1 (a group of one
// rank each, like autoep_size 3 would give) and x2.w sliced over ranks 1 and 2. Every element
// holds value() of its parameter's row in `names`.
const std::vector<ParamSpec>& grouped_model() {
  static const std::vector<ParamSpec> params = {
      {"emb", {37, 5}, {0}, false}, {"a.w", {5, 19}, {1}, false}, {"a.b", {19}, {1}, true},
      {"x0.w", {6, 7}, {2}, false}, {"x1.w", {6, 7}, {2}, false}, {"x2.w", {9, 3}, {2}, false}};
  return params;
}

// The slices of `unit` (parameters `members` of grouped_model(), one after the other, padded to
// `numel`) for rank `slice` of `slices`, as a row and its values.
WrittenSlice grouped_slice(const std::vector<int>& members, std::int64_t numel, int slices,
                           int slice, std::int64_t group, std::int64_t offset, int local_unit,
                           std::vector<std::vector<float>>& file) {
  const auto& params = grouped_model();
  WrittenSlice row;
  row.unit_key = params[static_cast<std::size_t>(members.front())].name;
  row.local_unit = local_unit;
  row.group = group;
  row.numel = numel;
  row.shard = numel / slices;
  row.slices = slices;
  row.slice = slice;
  row.offset = offset;
  std::vector<std::vector<float>> whole(3, std::vector<float>(static_cast<std::size_t>(numel), 0));
  std::int64_t at = 0;
  for (int p : members) {
    const ParamSpec& spec = params[static_cast<std::size_t>(p)];
    if (slice == 0)
      row.params.push_back(ParamEntry{spec.name, spec.shape, spec.numel(), 0, at, -1});
    for (std::int64_t e = 0; e < spec.numel(); ++e) {
      for (int a = 0; a < 3; ++a) {
        whole[static_cast<std::size_t>(a)][static_cast<std::size_t>(at + e)] = value(p, e, a);
      }
    }
    at += spec.numel();
  }
  for (int a = 0; a < 3; ++a) {
    auto& w = whole[static_cast<std::size_t>(a)];
    file[static_cast<std::size_t>(a)].insert(file[static_cast<std::size_t>(a)].end(),
                                             w.begin() + slice * row.shard,
                                             w.begin() + (slice + 1) * row.shard);
  }
  return row;
}

}  // namespace

TEST_CASE("tables of several groups: merged from the ranks' rows, read by name at any slicing") {
  const fs::path dir = scratch_dir("groups");
  fs::create_directories(dir);
  // The dense unit: emb + a.w + a.b = 185 + 95 + 19 = 299 elements, padded to 300 over 3 ranks.
  std::vector<RankShare> shares(3);
  std::vector<std::vector<std::vector<float>>> files(3, std::vector<std::vector<float>>(3));
  for (int r = 0; r < 3; ++r) {
    shares[r].slices.push_back(grouped_slice({0, 1, 2}, 300, 3, r, 0, 0, 0, files[r]));
  }
  shares[0].slices.push_back(grouped_slice({3}, 42, 1, 0, 1, 100, 1, files[0]));
  shares[1].slices.push_back(grouped_slice({4}, 42, 1, 0, 1, 100, 1, files[1]));
  shares[1].slices.push_back(grouped_slice({5}, 28, 2, 0, 1, 142, 2, files[1]));
  shares[2].slices.push_back(grouped_slice({5}, 28, 2, 1, 1, 100, 2, files[2]));
  for (int r = 0; r < 3; ++r) {
    const auto n = static_cast<std::int64_t>(files[r][0].size());
    shares[r].written = {StateRange{0, n}};
    // The rows travel encoded, as the checkpointer gathers them.
    shares[r] = decode_share(encode_share(shares[r]), "rank " + std::to_string(r));
  }
  CheckpointIndex index;
  index.config_json = "{}";
  merge_shares(index, shares);
  CHECK(index.world == 3);
  CHECK(index.rank_elements == std::vector<std::int64_t>{142, 156, 114});
  REQUIRE(index.units.size() == 4);
  // The writers' plan order, one local unit's copies in rank order.
  std::vector<std::string> names;
  for (const ParamEntry& e : index.params) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"emb", "a.w", "a.b", "x0.w", "x1.w", "x2.w"});
  CHECK(index.units[3].slices.size() == 2);
  CHECK(index.units[3].slices[1].rank == 2);
  write_index((dir / "index.h5").string(), index);
  for (int r = 0; r < 3; ++r) {
    RankSnapshot snap;
    snap.rank = r;
    snap.arrays = files[r];
    write_rank_file((dir / rank_file_name(r)).string(), snap, 3, 0);
  }
  const CheckpointIndex read = read_index((dir / "index.h5").string());
  CHECK(read.units[2].group == 1);
  CHECK(verify_checkpoint(dir.string()) == 3 * (142 + 156 + 114) * 4);
  const auto full = read_full_params(dir.string(), read);
  for (std::size_t p = 0; p < full.size(); ++p) {
    for (std::size_t e = 0; e < full[p].size(); ++e) {
      REQUIRE(full[p][e] == value(static_cast<int>(p), static_cast<std::int64_t>(e), 0));
    }
  }
  // A rank of another run holding x2.w and the dense part, in its own order, by name.
  std::vector<ParamSpec> mine = {grouped_model()[5], grouped_model()[1], grouped_model()[0],
                                 grouped_model()[2]};
  for (ParamSpec& p : mine) p.modules = {0};
  const ParamSources sources = find_params(read, mine, "index.h5");
  std::vector<int> rows;
  for (const auto& runs : sources) {
    REQUIRE(runs.size() == 1);
    rows.push_back(runs[0].row);
  }
  CHECK(rows == std::vector<int>{5, 1, 0, 2});
  for (int world : {1, 2}) {
    PartitionOptions o;
    o.stage = 2;
    o.world = world;
    o.alignment = 4;
    o.num_modules = 1;
    const PartitionPlan plan(mine, o);
    ShardedReader reader(dir.string(), read, sources);
    for (int r = 0; r < world; ++r) {
      for (int u = 0; u < static_cast<int>(plan.units().size()); ++u) {
        const auto n = static_cast<std::size_t>(plan.unit(u).shard);
        std::vector<float> a(n, -1), b(n, -1), c(n, -1);
        reader.fill(plan, r, u, {a.data(), b.data(), c.data()});
        for (int p : plan.unit(u).params) {
          const auto range = plan.owned_range(p, r);
          const int q = rows[static_cast<std::size_t>(p)];
          for (std::int64_t i = 0; i < range.count; ++i) {
            const auto at = static_cast<std::size_t>(range.slice_offset + i);
            REQUIRE(a[at] == value(q, range.first + i, 0));
            REQUIRE(c[at] == value(q, range.first + i, 2));
          }
        }
      }
    }
  }
  auto other = mine;
  other[0].name = "x3.w";
  CHECK_THAT(message_of([&] { find_params(read, other, "index.h5"); }),
             Catch::Contains("index.h5: the model's parameter 'x3.w' [9, 3] is not in the "
                             "checkpoint"));
  other = mine;
  other[0].shape = {3, 9};
  CHECK_THAT(message_of([&] { find_params(read, other, "index.h5"); }),
             Catch::Contains("parameter 'x2.w' is [9, 3] in the checkpoint but [3, 9]"));

  // Rows that do not fit together.
  auto twice = shares;
  twice[2].slices.back().slice = 0;
  CHECK_THAT(message_of([&] { merge_shares(index, twice); }),
             Catch::Contains("slice 0 of the unit of 'x2.w' is written by two ranks (1 and 2)"));
  auto lost = shares;
  lost[2].slices.pop_back();
  CHECK_THAT(message_of([&] { merge_shares(index, lost); }),
             Catch::Contains("slice 1 of 2 of the unit of 'x2.w' is written by no rank"));
  auto renamed = shares;
  renamed[1].slices[1].params[0].name = "x0.w";
  renamed[1].slices[1].unit_key = "x0.w-copy";
  CHECK_THAT(message_of([&] { merge_shares(index, renamed); }),
             Catch::Contains("parameter 'x0.w' is in two units"));
  CHECK_THAT(message_of([&] { decode_share("abc", "rank 7"); }),
             Catch::Contains("the table rows from rank 7 are malformed"));
  // A slice table whose slices overlap in a rank file (x1.w moved into the dense slice of
  // rank 1) is refused on reading.
  index.units[2].slices[0].offset = 90;
  write_index((dir / "index.h5").string(), index);
  CHECK_THAT(message_of([&] { read_index((dir / "index.h5").string()); }),
             Catch::Contains("the slices in rank file 1 overlap at element 90"));
}

TEST_CASE("an expert's own parameter is a row of the stacked one, either way round") {
  CheckpointIndex index;
  index.params = {{"m.experts.0.w", {2, 3}, 6, 0, 0},
                  {"m.experts.1.w", {2, 3}, 6, 0, 8},
                  {"m.experts.b", {2, 3}, 6, 0, 16},
                  {"m.gate", {2, 4}, 8, 0, 24}};
  auto sources_of = [&](const ParamSpec& p) { return find_params(index, {p}, "index.h5")[0]; };
  // Stacked in the run, one parameter per expert in the checkpoint.
  const auto stacked = sources_of({"m.experts.w", {2, 2, 3}, {0}});
  REQUIRE(stacked.size() == 2);
  CHECK((stacked[0].first == 0 && stacked[0].count == 6 && stacked[0].row == 0 &&
         stacked[0].at == 0));
  CHECK((stacked[1].first == 6 && stacked[1].count == 6 && stacked[1].row == 1 &&
         stacked[1].at == 0));
  // One per expert in the run, stacked in the checkpoint.
  const auto own = sources_of({"m.experts.1.b", {3}, {0}});
  REQUIRE(own.size() == 1);
  CHECK((own[0].row == 2 && own[0].at == 3 && own[0].count == 3));
  // Put together from whole values.
  const std::vector<std::vector<float>> values = {
      {1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {-1, -2, -3, -4, -5, -6}, {}};
  CHECK(assemble_param(stacked, values) ==
        std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  CHECK(assemble_param(own, values) == std::vector<float>{-4, -5, -6});
  // More experts than the checkpoint holds, or rows of another shape.
  CHECK_THAT(message_of([&] {
               sources_of({"m.experts.w", {3, 2, 3}, {0}});
             }),
             Catch::Contains("'m.experts.w' [3, 2, 3] stacks 3 experts, but the checkpoint has "
                             "no 'm.experts.2.w' [2, 3]"));
  CHECK_THAT(message_of([&] {
               sources_of({"m.experts.2.b", {3}, {0}});
             }),
             Catch::Contains("'m.experts.2.b' is expert 2, but the checkpoint's 'm.experts.b' "
                             "[2, 3] stacks 2"));
  CHECK_THAT(message_of([&] {
               sources_of({"m.experts.0.b", {4}, {0}});
             }),
             Catch::Contains("'m.experts.0.b' [4] of the model is not a row of the "
                             "checkpoint's stacked 'm.experts.b' [2, 3]"));
  CHECK_THAT(message_of([&] {
               sources_of({"m.gate", {2, 5}, {0}});
             }),
             Catch::Contains("parameter 'm.gate' is [2, 4] in the checkpoint but [2, 5]"));
}
