// Append-only history files of a training (metrics.jsonl, the CSV monitor's files) across the
// runs that resume it. A resumed run continues from its checkpoint's step, so rows a previous
// run wrote after that step describe a timeline that no longer exists; they are dropped before
// the new run appends, leaving one clean timeline per file (docs/checkpoints.md, "Resuming").
//
// Thread-safety: one caller per file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace zrt::train {

struct HistoryTrim {
  std::int64_t kept = 0;
  std::int64_t dropped = 0;
};

// Keeps the lines of `path` for which `keep(line)` is true. The file is rewritten (to a temporary
// file beside it, then renamed over it, so a crash leaves the old or the new file, never half of
// one) only when a line goes. A missing file keeps nothing and drops nothing. Throws zrt::Error
// naming the file and the system's reason if it cannot be read or written.
HistoryTrim keep_history_lines(const std::string& path,
                               const std::function<bool(const std::string& line)>& keep);

}  // namespace zrt::train
