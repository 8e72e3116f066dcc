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
#include "runtime/trace/trace_summary.h"
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

TEST_CASE("trace step summaries: busy time is each track's union within the step") {
  auto event = [](TraceTrack track, const char* name, double start, double duration) {
    TraceEvent e;
    e.track = track;
    e.name = name;
    e.start_us = start;
    e.duration_us = duration;
    return e;
  };
  // Two steps, [0, 100) and [100, 250), worked by hand:
  //   compute: [10, 40) + [30, 60) overlap -> [10, 60) = 50; [90, 120) straddles the boundary:
  //            10 in step 1, 20 in step 2; [200, 230) = 30 more in step 2.
  //   CPU optimizer: [50, 95) in step 1 (under compute: [50, 60) and [90, 95) = 15);
  //                  [110, 180) in step 2 (under compute: [110, 120) = 10).
  //   copy: [20, 25) in step 1 only; comm: nothing.
  //   A span after the last step [260, 270) counts nowhere.
  const std::vector<TraceEvent> events = {
      event(TraceTrack::kSteps, "step 1", 0, 100),
      event(TraceTrack::kSteps, "step 2", 100, 150),
      event(TraceTrack::kCompute, "a", 10, 30),
      event(TraceTrack::kCompute, "b", 30, 30),
      event(TraceTrack::kCompute, "c", 90, 30),
      event(TraceTrack::kCompute, "d", 200, 30),
      event(TraceTrack::kCompute, "e", 260, 10),
      event(TraceTrack::kCpuOptimizer, "adam unit 0", 50, 45),
      event(TraceTrack::kCpuOptimizer, "adam unit 1", 110, 70),
      event(TraceTrack::kCopy, "d2h unit 0", 20, 5),
  };
  const std::vector<TraceStepSummary> steps = summarize_trace_steps(events);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].name == "step 1");
  CHECK(steps[0].duration_us == 100.0);
  CHECK(steps[0].busy(TraceTrack::kCompute) == 60.0);
  CHECK(steps[0].compute_idle_us() == 40.0);
  CHECK(steps[0].busy(TraceTrack::kCpuOptimizer) == 45.0);
  CHECK(steps[0].cpu_optimizer_under_compute_us == 15.0);
  CHECK(steps[0].busy(TraceTrack::kCopy) == 5.0);
  CHECK(steps[0].busy(TraceTrack::kComm) == 0.0);
  CHECK(steps[1].busy(TraceTrack::kCompute) == 50.0);
  CHECK(steps[1].compute_idle_us() == 100.0);
  CHECK(steps[1].busy(TraceTrack::kCpuOptimizer) == 70.0);
  CHECK(steps[1].cpu_optimizer_under_compute_us == 10.0);
  CHECK(steps[1].busy(TraceTrack::kCopy) == 0.0);
  CHECK(format_trace_step(steps[0]) ==
        "step 1: 0.1 ms; compute busy 0.1 ms, idle 0.0 ms (40%); copy 0.0 ms; CPU optimizer "
        "0.0 ms (0.0 ms under compute)");
  CHECK(summarize_trace_steps({events.begin() + 2, events.end()}).empty());  // no markers
}
