#include "train/monitors/tfrecord.h"

#include <cstring>

#include "runtime/checkpoint/crc32c.h"

namespace zrt::train {

namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}

// Little-endian, as protobuf's fixed types and TFRecord's header are (on any host).
template <typename UInt>
void put_fixed(std::string& out, UInt value) {
  for (std::size_t i = 0; i < sizeof(UInt); ++i) {
    out.push_back(static_cast<char>(static_cast<std::uint64_t>(value) >> (8 * i)));
  }
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_wall_time(std::string& event, double wall_time) {
  put_key(event, 1, kFixed64);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &wall_time, 8);
  put_fixed(event, bits);
}

void put_step(std::string& event, std::int64_t step) {
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<std::uint64_t>(step));  // int64: two's complement (10 bytes if < 0)
}

}  // namespace

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t crc = checkpoint::crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view payload) {
  std::string header;
  put_fixed(header, static_cast<std::uint64_t>(payload.size()));
  std::string record = header;
  put_fixed(record, masked_crc32c(header));
  record.append(payload.data(), payload.size());
  put_fixed(record, masked_crc32c(payload));
  return record;
}

std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string event;
  put_wall_time(event, wall_time);
  put_bytes(event, 3, version);
  return event;
}

std::string encode_session_start_event(double wall_time, std::int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);  // SessionStatus START
  std::string event;
  put_wall_time(event, wall_time);
  put_step(event, step);
  put_bytes(event, 7, session_log);
  return event;
}

std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<TaggedScalar>& scalars) {
  std::string summary;
  for (const TaggedScalar& scalar : scalars) {
    std::string value;
    put_bytes(value, 1, scalar.tag);
    put_key(value, 2, kFixed32);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &scalar.value, 4);
    put_fixed(value, bits);
    put_bytes(summary, 1, value);
  }
  std::string event;
  put_wall_time(event, wall_time);
  put_step(event, step);
  put_bytes(event, 5, summary);
  return event;
}

}  // namespace zrt::train
