// Reading a Chrome trace-event file back for tests: the "X" events per track name, and the
// checks every zrt trace must pass (tracks named, non-negative durations, no overlap on a track).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zrt::test {

struct ParsedEvent {
  std::string name;
  double ts = 0.0;
  double dur = 0.0;
  std::map<std::string, std::int64_t> args;  // the event's integer counters, if any
  double end() const { return ts + dur; }
};

struct ParsedTrace {
  int pid = -1;
  std::map<int, std::string> track_names;                    // tid -> thread_name
  std::map<std::string, std::vector<ParsedEvent>> by_track;  // track name -> events by ts

  const std::vector<ParsedEvent>& track(const std::string& name) const {
    static const std::vector<ParsedEvent> none;
    auto it = by_track.find(name);
    return it == by_track.end() ? none : it->second;
  }
  // Events named exactly `name` on `track`, in time order.
  std::vector<ParsedEvent> named(const std::string& track_name, const std::string& name) const {
    std::vector<ParsedEvent> out;
    for (const auto& e : track(track_name))
      if (e.name == name) out.push_back(e);
    return out;
  }
};

inline ParsedTrace parse_trace(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  REQUIRE(doc.contains("traceEvents"));
  REQUIRE(doc["traceEvents"].is_array());
  ParsedTrace trace;
  std::vector<std::pair<int, ParsedEvent>> events;
  for (const auto& e : doc["traceEvents"]) {
    const std::string ph = e.at("ph").get<std::string>();
    const int pid = e.at("pid").get<int>();
    if (trace.pid < 0) trace.pid = pid;
    REQUIRE(pid == trace.pid);  // one process (rank) per file
    if (ph == "M") {
      if (e.at("name") == "thread_name") {
        trace.track_names[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
      }
      continue;
    }
    REQUIRE(ph == "X");
    ParsedEvent p{
        e.at("name").get<std::string>(), e.at("ts").get<double>(), e.at("dur").get<double>(), {}};
    if (e.contains("args")) {
      for (const auto& [key, value] : e["args"].items()) {
        if (value.is_number_integer()) p.args[key] = value.get<std::int64_t>();
      }
    }
    events.emplace_back(e.at("tid").get<int>(), p);
  }
  for (const auto& [tid, e] : events) {
    INFO("event '" << e.name << "' on tid " << tid);
    REQUIRE(trace.track_names.count(tid) == 1);  // every event's track is named
    trace.by_track[trace.track_names[tid]].push_back(e);
  }
  for (auto& [name, list] : trace.by_track) {
    std::stable_sort(list.begin(), list.end(),
                     [](const ParsedEvent& a, const ParsedEvent& b) { return a.ts < b.ts; });
  }
  return trace;
}

// Durations >= 0 and no two events of one track overlapping (each track is one serial stream).
inline void check_tracks_serial(const ParsedTrace& trace) {
  for (const auto& [track, list] : trace.by_track) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      INFO("track " << track << " event " << i << " '" << list[i].name << "'");
      CHECK(list[i].dur >= 0.0);
      if (i > 0) {
        INFO("previous '" << list[i - 1].name << "' ends at " << list[i - 1].end()
                          << ", this starts at " << list[i].ts);
        CHECK(list[i - 1].end() <= list[i].ts + 1e-6);
      }
    }
  }
}

}  // namespace zrt::test
