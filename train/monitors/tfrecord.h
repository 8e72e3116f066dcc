// TFRecord framing and the few protobuf messages of a TensorBoard event file, encoded by hand
// (zrt has no protobuf dependency). A record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data |
//   uint32 masked_crc32c(data)
// and each record's data is a serialized tensorflow.Event:
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//                Summary summary = 5; SessionLog session_log = 7; }
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }  (START = 1)
// The first event of a file carries file_version "brain.Event:2"; readers of version 2 files
// drop every point at or after a SessionLog START's step seen earlier (a restarted run).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zrt::train {

// The CRC-32C of `data`, rotated right by 15 bits plus 0xa282ead8: TFRecord's "masked" CRC,
// which keeps a CRC of data that itself holds CRCs from being degenerate.
std::uint32_t masked_crc32c(std::string_view data);

// `payload` framed as one TFRecord.
std::string tfrecord_frame(std::string_view payload);

// A serialized Event holding only wall_time, step 0 and file_version (the file's first event).
std::string encode_file_version_event(double wall_time, std::string_view version);

// A serialized Event holding SessionLog START at `step`.
std::string encode_session_start_event(double wall_time, std::int64_t step);

// One scalar summary value.
struct TaggedScalar {
  std::string_view tag;
  float value = 0.f;
};

// A serialized Event holding `scalars` (one Summary) at `step`.
std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<TaggedScalar>& scalars);

}  // namespace zrt::train
