// The timeline trace's pieces: the recorder (thread-safe appends, the Chrome file it writes,
// per-rank file names) and the CPU streams' spans (timed where the work runs, waits before the
// first work item excluded, spans ended by the next begin, nothing recorded outside spans).
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include <unistd.h>

#include "runtime/device/device.h"
#include "runtime/trace/trace_recorder.h"
#include "tests/trace/trace_test_util.h"

using namespace zrt;
using namespace zrt::test;

namespace {

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("zrt_test_trace_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void busy_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

TEST_CASE("trace file names: the rank goes before the extension when there are several") {
  CHECK(trace_path_for_rank("trace.json", 0, 1) == "trace.json");
  CHECK(trace_path_for_rank("out/trace.json", 1, 2) == "out/trace.rank1.json");
  CHECK(trace_path_for_rank("out/trace", 3, 4) == "out/trace.rank3");
}

TEST_CASE("the recorder collects events from many threads and writes a Chrome trace") {
  TraceRecorder recorder(3);
  constexpr int kThreads = 6;
  constexpr int kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&recorder, t] {
      for (int i = 0; i < kEach; ++i) {
        // Thread t owns the interval [t * 1e6 + i * 10, + 5): no overlaps within a thread's track.
        recorder.add(TraceTrack::kComm, "t" + std::to_string(t) + " e" + std::to_string(i),
                     t * 1e6 + i * 10.0, 5.0);
      }
    });
  }
  for (auto& th : threads) th.join();
  recorder.add_deferred([] { return TraceEvent{TraceTrack::kCopy, "deferred", 7.0, -1.0, {}}; });
  recorder.add_step(2, 0.0, 100.0);
  const std::string path = temp_file("recorder.json");
  recorder.write(path);
  const ParsedTrace trace = parse_trace(path);
  CHECK(trace.pid == 3);
  CHECK(trace.track_names.size() == kNumTraceTracks);
  for (const char* name : {"steps", "compute", "comm", "copy", "CPU optimizer"}) {
    bool named = false;
    for (const auto& [tid, n] : trace.track_names) named = named || n == name;
    CHECK(named);
  }
  CHECK(trace.track("comm").size() == kThreads * kEach);
  CHECK(trace.named("comm", "t5 e499").size() == 1);
  REQUIRE(trace.track("copy").size() == 1);
  CHECK(trace.track("copy")[0].dur == 0.0);  // negative durations are clamped
  REQUIRE(trace.track("steps").size() == 1);
  CHECK(trace.track("steps")[0].name == "step 2");
  CHECK(trace.track("steps")[0].dur == 100.0);
  check_tracks_serial(trace);
  std::filesystem::remove(path);
}

TEST_CASE("a CPU stream times the work of a span on its worker") {
  auto device = make_device(DeviceOptions{});
  auto stream = device->create_stream("s");
  auto other = device->create_stream("other");
  TraceRecorder recorder(0);

  // Work outside any span is not recorded.
  stream->host_callback([] { busy_for(std::chrono::microseconds(500)); });

  // A span whose stream first waits 200 ms for another stream: the wait is not in the event.
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  other->host_callback([opened] { opened.wait(); });
  auto event = device->create_event();
  event->record(*other);
  stream->trace_begin(recorder, TraceTrack::kCompute, "first");
  stream->wait(*event);
  stream->host_callback([] { busy_for(std::chrono::milliseconds(3)); });
  stream->host_callback([] { busy_for(std::chrono::milliseconds(2)); });
  // A begin ends the open span; the empty span after it records nothing.
  stream->trace_begin(recorder, TraceTrack::kCompute, "second");
  stream->host_callback([] { busy_for(std::chrono::milliseconds(1)); });
  stream->trace_begin(recorder, TraceTrack::kCompute, "empty");
  stream->trace_end();
  stream->trace_end();  // no span open: nothing
  const double before_open_us = recorder.now_us();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  gate.set_value();
  stream->synchronize();

  const auto events = recorder.events();
  REQUIRE(events.size() == 2);
  CHECK(events[0].name == "first");
  CHECK(events[0].track == TraceTrack::kCompute);
  CHECK(events[0].start_us >= before_open_us + 200000.0);  // started after the wait
  CHECK(events[0].duration_us >= 5000.0);
  CHECK(events[0].duration_us < 100000.0);  // the 200 ms wait is not in it
  CHECK(events[1].name == "second");
  CHECK(events[1].duration_us >= 1000.0);
  CHECK(events[1].start_us >= events[0].start_us + events[0].duration_us);
}
