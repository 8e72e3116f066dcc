// data_fingerprint.h: what a resume compares of the files it continues. A file's entry changes
// with its size and with its first and last 64 KiB (a regenerated shard of the same length);
// describe_fingerprint_change names the first file that differs, one added or gone, or another
// order, and says nothing for the same files. The sources' paths() list what they read.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/data/data_fingerprint.h"
#include "runtime/data/token_dataset.h"
#include "runtime/data/token_shard.h"

using namespace zrt;
namespace fs = std::filesystem;

namespace {

fs::path dir() {
  static const fs::path d = [] {
    const fs::path p = fs::temp_directory_path() / "zrt_test_data_fingerprint";
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return d;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = (dir() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST_CASE("the data fingerprint tells files apart by size and by their ends", "[data]") {
  const std::string big(300 * 1024, 'a');  // longer than both hashed ends (128 KiB)
  const std::string a = write_file("a.bin", big), b = write_file("b.bin", "short file");
  const std::string both = data_fingerprint({a, b});
  CHECK(describe_fingerprint_change(both, data_fingerprint({a, b})).empty());
  CHECK(both.find("a.bin 307200 ") == 0);  // "<name> <bytes> <hash>" per line

  // Another byte near either end: same size, other contents.
  for (const std::size_t at : {std::size_t{10}, big.size() - 10}) {
    std::string other = big;
    other[at] = 'b';
    write_file("a.bin", other);
    CHECK(describe_fingerprint_change(both, data_fingerprint({a, b})) ==
          "a.bin has other contents (same size)");
  }
  // A byte in the middle of a file longer than 128 KiB is not read (documented limit).
  std::string middle = big;
  middle[150 * 1024] = 'b';
  write_file("a.bin", middle);
  CHECK(describe_fingerprint_change(both, data_fingerprint({a, b})).empty());
  write_file("a.bin", big);

  // Another size, a file added or gone, another order.
  write_file("b.bin", "a longer short file");
  CHECK(describe_fingerprint_change(both, data_fingerprint({a, b})) ==
        "b.bin holds 19 bytes, 10 then");
  write_file("b.bin", "short file");
  const std::string c = write_file("c.bin", "third");
  CHECK(describe_fingerprint_change(both, data_fingerprint({a, b, c})) ==
        "c.bin was not among the files then");
  CHECK(describe_fingerprint_change(both, data_fingerprint({a})) == "b.bin is gone");
  CHECK(describe_fingerprint_change(both, data_fingerprint({b, a})) ==
        "the files are the same but in another order");
  // A file that cannot be read is named.
  CHECK_THROWS_WITH(data_fingerprint({(dir() / "missing.bin").string()}),
                    Catch::Contains("missing.bin: cannot open"));
}

TEST_CASE("a token dataset lists the shards it reads, in order", "[data]") {
  std::vector<std::uint16_t> tokens(200, 7);
  for (const char* name : {"tok_train_000001.bin", "tok_train_000000.bin"}) {
    write_shard((dir() / name).string(), tokens.data(), tokens.size());
  }
  const TokenDataset data((dir() / "tok_train_*.bin").string(), 16);
  REQUIRE(data.paths().size() == 2);
  CHECK(fs::path(data.paths()[0]).filename() == "tok_train_000000.bin");
  CHECK(fs::path(data.paths()[1]).filename() == "tok_train_000001.bin");
}
