// The demo sample's log line (train/sampling.h): a byte-level model may emit any byte, and the
// line must stay text.
#include <catch2/catch.hpp>

#include <string>

#include "train/sampling.h"

namespace zrt::train {
namespace {

TEST_CASE("printable_sample keeps UTF-8 text and escapes the rest") {
  CHECK(printable_sample("And God said") == "And God said");
  CHECK(printable_sample("line one\nline two") == "line one\\nline two");
  CHECK(printable_sample(std::string("bell\x07 nul") + '\0' + "x") == "bell\\x07 nul\\x00x");
  CHECK(printable_sample("caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x98\x80");           // 2-, 3- and 4-byte sequences kept
  CHECK(printable_sample("caf\xe9!") == "caf\\xe9!");           // Latin-1, not UTF-8
  CHECK(printable_sample("cut \xe2\x80") == "cut \\xe2\\x80");  // a sequence cut short
  CHECK(printable_sample("\x7f") == "\\x7f");
}

}  // namespace
}  // namespace zrt::train
