// The run's history files without a run: TFRecord framing and event encoding against known
// answers (produced by tensorboard's own protobuf classes and masked_crc32c), DeepSpeed's CSV
// layout, metrics.jsonl across a resume (rows past the resumed step dropped, a torn last line,
// a fresh start), and the ETA text. test_train_tensorboard_reader reads a real run's event file
// with tensorboard's reader; test_checkpoint_train checks the same files end to end.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/history_file.h"
#include "train/metrics_log.h"
#include "train/monitors/csv_monitor.h"
#include "train/monitors/event_file_writer.h"
#include "train/monitors/tfrecord.h"
#include "train/run_clock.h"

using namespace zrt::train;
namespace fs = std::filesystem;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "zrt_test_train_monitors" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::int64_t> steps_in(const fs::path& metrics) {
  std::vector<std::int64_t> steps;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line)["step"]);
  return steps;
}

}  // namespace

TEST_CASE("TFRecord: masked CRC-32C and framing match TensorFlow's", "[monitors][tfrecord]") {
  // CRC-32C("123456789") is the published check value 0xE3069283; masked, 0xc78ab0e5.
  CHECK(masked_crc32c("123456789") == 0xc78ab0e5u);
  // A record of "hello": length 5 (u64 LE), masked CRC of those 8 bytes, data, masked CRC.
  CHECK(hex(tfrecord_frame("hello")) == "0500000000000000eab2043e68656c6c6fbb1f1c19");
}

TEST_CASE("Event encoding matches tensorboard's protobuf serialization", "[monitors][tfrecord]") {
  // Each expected string is Event(...).SerializeToString().hex() from tensorboard.compat.proto.
  CHECK(hex(encode_file_version_event(1700000000.5, "brain.Event:2")) ==
        "0900002040fc54d9411a0d627261696e2e4576656e743a32");
  CHECK(hex(encode_session_start_event(1700000000.5, 13)) == "0900002040fc54d941100d3a020801");
  CHECK(
      hex(encode_scalars_event(
          1700000000.5, 24, {{"Train/Samples/train_loss", 4.5f}, {"Train/Samples/lr", 0.001f}})) ==
      "0900002040fc54d94110182a3a0a1f0a18547261696e2f53616d706c65732f747261696e5f6c6f737315000090"
      "400a170a10547261696e2f53616d706c65732f6c72156f12833a");
}

TEST_CASE("EventFileWriter: a named file of framed records", "[monitors][tfrecord]") {
  const fs::path dir = fresh_dir("events") / "job";
  std::string path;
  {
    EventFileWriter writer(dir.string());  // creates the folder
    path = writer.path();
    writer.add_session_start(1, 1700000000.5);
    writer.add_scalars(24, {{"Train/Samples/train_loss", 4.5f}, {"Train/Samples/lr", 0.001f}},
                       1700000000.5);
    writer.flush();
  }
  CHECK(fs::path(path).parent_path() == dir);
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::string bytes = read_text(path);
  // Walk the records: each frame's CRCs hold; the last is the scalars event.
  std::size_t at = 0;
  std::vector<std::string> events;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    std::uint64_t length = 0;
    for (int i = 0; i < 8; ++i) {
      length |= std::uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
    }
    REQUIRE(bytes.size() - at >= 16 + length);
    const std::string framed = bytes.substr(at, 16 + length);
    events.push_back(framed.substr(12, length));
    CHECK(tfrecord_frame(events.back()) == framed);
    at += 16 + length;
  }
  REQUIRE(events.size() == 3);
  CHECK(events[0].find("brain.Event:2") != std::string::npos);
  CHECK(events[2] ==
        encode_scalars_event(1700000000.5, 24,
                             {{"Train/Samples/train_loss", 4.5f}, {"Train/Samples/lr", 0.001f}}));
  // A second writer in the same second gets a name of its own.
  EventFileWriter again(dir.string());
  CHECK(again.path() != path);
}

TEST_CASE("CSV monitor: DeepSpeed's file per scalar, header, rows; a resume drops later rows",
          "[monitors][csv]") {
  CHECK(CsvMonitor::file_name("Train/Samples/train_loss") == "Train_Samples_train_loss.csv");
  CHECK(CsvMonitor::file_name("Eval/Samples/val loss") == "Eval_Samples_val_loss.csv");
  CHECK(CsvMonitor::header("Train/Samples/train_loss") == "step,train_loss");
  CHECK(CsvMonitor::header("plain") == "step,plain");

  const fs::path dir = fresh_dir("csv") / "DeepSpeedJobName";
  {
    CsvMonitor first(dir.string(), 0);
    for (int step = 4; step <= 24; step += 4) {
      first.write("Train/Samples/train_loss", step, 5.5 - step / 8.0);
      first.write("Train/Samples/lr", step, 0.001);
    }
  }
  CHECK(read_text(dir / "Train_Samples_lr.csv") ==
        "step,lr\n4,0.001\n8,0.001\n12,0.001\n16,0.001\n20,0.001\n24,0.001\n");
  // Resumed at sample 12: rows 16-24 of the interrupted run go, the header stays, once.
  {
    CsvMonitor resumed(dir.string(), 12);
    resumed.write("Train/Samples/train_loss", 16, 1.25);
  }
  CHECK(read_text(dir / "Train_Samples_train_loss.csv") ==
        "step,train_loss\n4,5\n8,4.5\n12,4\n16,1.25\n");
  // A file the resumed run has not written yet is left as it was.
  CHECK(read_text(dir / "Train_Samples_lr.csv").size() > 40);
  // A fresh start (resumed at 0) begins the file again, header included.
  {
    CsvMonitor fresh(dir.string(), 0);
    fresh.write("Train/Samples/train_loss", 4, 2.0);
  }
  CHECK(read_text(dir / "Train_Samples_train_loss.csv") == "step,train_loss\n4,2\n");
}

TEST_CASE("metrics.jsonl is appended to; a resume drops rows past its step",
          "[monitors][metrics]") {
  const fs::path dir = fresh_dir("metrics");
  const fs::path path = dir / "metrics.jsonl";
  {
    MetricsLog log(path.string(), 0);
    for (int step = 1; step <= 6; ++step) log.append({{"step", step}, {"loss", 6 - step}});
    log.append({{"step", 6}, {"val_loss", 0.5}});
  }
  // The interrupted run's last line was cut short mid-write.
  std::ofstream(path, std::ios::app) << "{\"step\": 7, \"lo";
  {
    MetricsLog log(path.string(), 3);  // resumed from the checkpoint of step 3
    CHECK(log.trimmed().kept == 3);
    CHECK(log.trimmed().dropped == 5);  // steps 4, 5, 6, the eval row, the torn line
    log.append({{"step", 4}, {"loss", 9}});
  }
  CHECK(steps_in(path) == std::vector<std::int64_t>{1, 2, 3, 4});
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  {
    MetricsLog log(path.string(), 4);  // a restart at the last step: nothing to drop
    CHECK(log.trimmed().dropped == 0);
    CHECK(log.trimmed().kept == 4);
  }
  CHECK(steps_in(path) == std::vector<std::int64_t>{1, 2, 3, 4});
  // A last row cut just before its newline still counts, and the next row starts a new line.
  std::ofstream(path, std::ios::app) << "{\"step\": 5}";
  {
    MetricsLog log(path.string(), 5);
    log.append({{"step", 6}});
  }
  CHECK(steps_in(path) == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  {
    MetricsLog log(path.string(), 0);  // a fresh start begins an empty history
    CHECK(log.trimmed().dropped == 6);
  }
  CHECK(read_text(path).empty());
}

TEST_CASE("keep_history_lines leaves a file alone when nothing goes", "[monitors][metrics]") {
  const fs::path path = fresh_dir("history") / "h.txt";
  CHECK(keep_history_lines(path.string(), [](const std::string&) { return false; }).dropped == 0);
  CHECK_FALSE(fs::exists(path));
  std::ofstream(path) << "a\nb\n";
  const auto before = fs::last_write_time(path);
  const HistoryTrim trim =
      keep_history_lines(path.string(), [](const std::string&) { return true; });
  CHECK(trim.kept == 2);
  CHECK(fs::last_write_time(path) == before);
}

TEST_CASE("elapsed and ETA texts", "[monitors][eta]") {
  CHECK(format_duration(0) == "0s");
  CHECK(format_duration(-3) == "0s");
  CHECK(format_duration(44.6) == "45s");
  CHECK(format_duration(185) == "3m05s");
  CHECK(format_duration(2 * 3600 + 7 * 60 + 10) == "2h07m");
  CHECK(format_duration(3 * 86400 + 4 * 3600) == "3d04h");
  CHECK(eta_seconds(30.0, 10, 90) == Approx(270.0));  // 3 s per step of this run
  CHECK(eta_seconds(30.0, 0, 90) == 0.0);
  CHECK(eta_seconds(30.0, 10, 0) == 0.0);
}
