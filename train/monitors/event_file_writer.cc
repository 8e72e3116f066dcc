#include "train/monitors/event_file_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <spdlog/fmt/fmt.h>

#include "runtime/common/error.h"
#include "train/monitors/tfrecord.h"

namespace zrt::train {

namespace fs = std::filesystem;

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZRT_THROW(Error, "tensorboard: cannot create {}: {}", dir, ec.message());
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const double now = unix_seconds();
  // TensorBoard's own writers name files so; readers match "*tfevents*".
  const std::string name =
      fmt::format("events.out.tfevents.{}.{}", static_cast<std::int64_t>(std::floor(now)), host);
  fs::path path = fs::path(dir) / name;
  if (fs::exists(path, ec)) path = fs::path(dir) / fmt::format("{}.{}", name, getpid());
  path_ = path.string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) ZRT_THROW(Error, "tensorboard: cannot create {}: {}", path_, std::strerror(errno));
  write_record(encode_file_version_event(now, "brain.Event:2"));
  flush();
}

void EventFileWriter::add_session_start(std::int64_t step, double wall_time) {
  write_record(encode_session_start_event(wall_time, step));
}

void EventFileWriter::add_scalars(std::int64_t step, const std::vector<TaggedScalar>& scalars,
                                  double wall_time) {
  write_record(encode_scalars_event(wall_time, step, scalars));
}

void EventFileWriter::flush() {
  out_.flush();
  if (!out_) ZRT_THROW(Error, "tensorboard: writing {} failed: {}", path_, std::strerror(errno));
}

void EventFileWriter::write_record(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

}  // namespace zrt::train
