// TraceSpan: a stream span for the timeline trace, scoped. With a null recorder it does nothing
// and builds no label, so untraced code pays one pointer check.
//
//   TraceSpan span(trace_, comm_, TraceTrack::kComm, "reduce_scatter", "unit", u);
//   ... enqueue the unit's work on comm_ ...
//   span.end();  // or at scope exit
#pragma once

#include <string>

#include <spdlog/spdlog.h>

#include "runtime/device/stream.h"
#include "runtime/trace/trace_recorder.h"

namespace zrt {

class TraceSpan {
 public:
  // Opens a span named "<what> <noun> <index>" ("reduce_scatter unit 3"), or "<what>" when noun
  // is null.
  TraceSpan(TraceRecorder* recorder, Stream& stream, TraceTrack track, const char* what,
            const char* noun = nullptr, int index = -1)
      : stream_(recorder != nullptr ? &stream : nullptr) {
    if (stream_ == nullptr) return;
    std::string label = what;
    if (noun != nullptr) label += " " + std::string(noun) + " " + std::to_string(index);
    stream_->trace_begin(*recorder, track, std::move(label));
  }
  ~TraceSpan() {
    try {
      end();
    } catch (const std::exception& e) {
      spdlog::error("closing a trace span failed: {}", e.what());
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  // Closes the span now (idempotent).
  void end() {
    if (stream_ == nullptr) return;
    Stream* stream = stream_;
    stream_ = nullptr;
    stream->trace_end();
  }

 private:
  Stream* stream_;  // null: not tracing, or already ended
};

}  // namespace zrt
