#include "runtime/checkpoint/checkpointer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/checkpoint/load_plan.h"
#include "runtime/checkpoint/rank_share.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/error.h"
#include "runtime/common/fault.h"
#include "runtime/common/synced_file.h"

namespace zrt::checkpoint {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? -1 : std::atoi(v);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void write_text_durably(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  write_synced_file(tmp.string(), text);
  fs::rename(tmp, path);
  fsync_path(path.parent_path().string(), true);
}

// The parts of `runs` (one array's memory, in order) that hold the element ranges `ranges`, in
// the ranges' order: what a rank file holds of the rank's whole state.
std::vector<HostBytes> select_ranges(const std::vector<HostBytes>& runs,
                                     const std::vector<StateRange>& ranges) {
  std::vector<HostBytes> out;
  for (const StateRange& range : ranges) {
    std::int64_t begin = range.first * 4;
    const std::int64_t end = (range.first + range.count) * 4;
    std::int64_t run_start = 0;
    for (const HostBytes& run : runs) {
      const std::int64_t run_end = run_start + run.bytes;
      if (begin < run_end && begin < end) {
        const std::int64_t take = std::min(end, run_end) - begin;
        out.push_back({static_cast<const std::byte*>(run.data) + (begin - run_start), take});
        begin += take;
      }
      run_start = run_end;
    }
    ZRT_CHECK(begin == end, "checkpoint: elements {}..{} are outside the rank's state ({} bytes)",
              range.first, range.first + range.count, run_start);
  }
  return out;
}

}  // namespace

TestHooks TestHooks::from_env() {
  TestHooks h;
  h.kill_rank = env_int("ZRT_TEST_CKPT_KILL_RANK");
  h.probe_elsewhere_rank = env_int("ZRT_TEST_CKPT_PROBE_RANK");
  h.unwritable_rank = env_int("ZRT_TEST_CKPT_UNWRITABLE_RANK");
  h.copy_delay_ms = env_int("ZRT_TEST_CKPT_COPY_DELAY_MS");
  h.write_delay_ms = env_int("ZRT_TEST_CKPT_WRITE_DELAY_MS");
  h.write_delay_step = env_int("ZRT_TEST_CKPT_WRITE_DELAY_STEP");
  return h;
}

std::optional<std::string> read_latest(const std::string& save_dir) {
  const fs::path latest = fs::path(save_dir) / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::ifstream in(latest);
  std::string line;
  std::getline(in, line);
  // Whitespace around the tag is not part of it (DeepSpeed strips it too): an editor's CRLF
  // or a trailing space would otherwise name a directory that does not exist.
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  std::size_t begin = 0, end = line.size();
  while (begin < end && is_space(line[begin])) ++begin;
  while (end > begin && is_space(line[end - 1])) --end;
  const std::string tag = line.substr(begin, end - begin);
  bool printable = true;
  for (unsigned char c : tag) printable = printable && c >= 0x20 && c != 0x7f;
  if (tag.empty() || !printable || tag.find('/') != std::string::npos || tag == "." ||
      tag == "..") {
    std::string shown;  // control characters escaped, so the message cannot garble a terminal
    for (unsigned char c : line) {
      shown += c >= 0x20 && c != 0x7f ? std::string(1, static_cast<char>(c))
                                      : fmt::format("\\x{:02x}", c);
    }
    ZRT_THROW(InvalidArgument,
              "{}: does not name a checkpoint tag ('{}'): it holds one line, the name of a "
              "checkpoint directory beside it (e.g. global_step100)",
              latest.string(), shown);
  }
  return tag;
}

Checkpointer::Checkpointer(const CheckpointConfig& config, double timeout_s, TestHooks hooks,
                           MPI_Comm ranks)
    : config_(config), timeout_s_(timeout_s), hooks_(hooks) {
  ZRT_MPI_CHECK(MPI_Comm_dup(ranks, &comm_));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_);
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("checkpoint save failed: {}", e.what());
  }
  if (pruner_.joinable()) pruner_.join();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string Checkpointer::tag_for_step(std::int64_t step) {
  return fmt::format("global_step{}", step);
}

void Checkpointer::wait_for(MPI_Request& request, const std::string& what) {
  // The checkpointer's collectives are rare and small: testing with backoff leaves the CPU to
  // the async writer.
  wait_mpi_request(request, {timeout_s_, PollPace::kBackoff, nullptr}, [&] {
    return fmt::format("checkpoint: {} within {} s (a rank died or hangs)", what, timeout_s_);
  });
}

std::vector<std::int64_t> Checkpointer::agree(std::vector<std::int64_t> values,
                                              const std::string& what) {
  std::vector<std::int64_t> out(values.size());
  MPI_Request request;
  ZRT_MPI_CHECK(MPI_Iallreduce(values.data(), out.data(), static_cast<int>(values.size()),
                               MPI_INT64_T, MPI_MAX, comm_, &request));
  wait_for(request, what + ": the ranks did not agree");
  return out;
}

CheckpointIndex Checkpointer::gather_tables(const CheckpointIndex& index, std::string* error) {
  const std::string mine = encode_share(index.share);
  std::int64_t length = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lengths(rank_ == 0 ? static_cast<std::size_t>(world_) : 0);
  MPI_Request request;
  ZRT_MPI_CHECK(
      MPI_Igather(&length, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T, 0, comm_, &request));
  wait_for(request, "the ranks' table rows did not arrive");
  std::vector<int> counts, displs;
  std::string all;
  if (rank_ == 0) {
    std::int64_t total = 0;
    for (std::int64_t n : lengths) {
      ZRT_CHECK(total + n < std::numeric_limits<int>::max(),
                "checkpoint: the ranks' table rows exceed 2 GB");
      counts.push_back(static_cast<int>(n));
      displs.push_back(static_cast<int>(total));
      total += n;
    }
    all.resize(static_cast<std::size_t>(total));
  }
  ZRT_MPI_CHECK(MPI_Igatherv(mine.data(), static_cast<int>(length), MPI_CHAR, all.data(),
                             counts.data(), displs.data(), MPI_CHAR, 0, comm_, &request));
  wait_for(request, "the ranks' table rows did not arrive");
  CheckpointIndex out = index;
  out.world = world_;
  if (rank_ != 0) return out;
  try {
    std::vector<RankShare> shares;
    for (int r = 0; r < world_; ++r) {
      shares.push_back(decode_share(
          all.substr(static_cast<std::size_t>(displs[r]), static_cast<std::size_t>(counts[r])),
          fmt::format("rank {}", r)));
    }
    merge_shares(out, shares);
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return out;
}

void Checkpointer::check_all(const std::string& stage, const std::string& tag,
                             const std::string& local_error) {
  const auto failed =
      agree({local_error.empty() ? 0 : rank_ + 1}, fmt::format("{}, {}", tag, stage))[0];
  if (failed == 0) return;
  // Every rank's error carries the failing rank's reason (the path, the errno text), so the
  // log a user reads first, rank 0's, says what went wrong and where.
  const int root = static_cast<int>(failed - 1);
  const std::string reason = broadcast_text(rank_ == root ? local_error : std::string(), root);
  ZRT_THROW(Error, "checkpoint {}: {} failed on rank {}: {}", tag, stage, root, reason);
}

std::string Checkpointer::broadcast_text(const std::string& text, int root) {
  std::int64_t length = static_cast<std::int64_t>(text.size());
  std::string out = text;
  const std::string what = fmt::format("rank {}'s error did not arrive", root);
  MPI_Request request;
  ZRT_MPI_CHECK(MPI_Ibcast(&length, 1, MPI_INT64_T, root, comm_, &request));
  wait_for(request, what);
  out.resize(static_cast<std::size_t>(length));
  if (length > 0) {
    ZRT_MPI_CHECK(
        MPI_Ibcast(out.data(), static_cast<int>(length), MPI_CHAR, root, comm_, &request));
    wait_for(request, what);
  }
  return out;
}

void Checkpointer::save(SaveRequest request, const SnapshotFiller& fill,
                        const SnapshotIssuer& issue, const StateView& view) {
  wait();  // the writer may still be reading the snapshot buffer
  RankState state;
  state.rank = rank_;
  const RankShare& share = request.index.share;
  // The rank file: ranges of the rank's whole state (all of it for a one-group index, written
  // by the ranks below its world).
  const bool writes = share.gather ? !share.written.empty() : rank_ < request.index.world;
  if (writes) {
    const std::int64_t held = share.held > 0 ? share.held : request.index.slice_elements();
    const std::vector<StateRange> ranges =
        share.held > 0 ? share.written : std::vector<StateRange>{StateRange{0, held}};
    for (const StateRange& range : ranges) state.elements += range.count;
    state.datasets = request.index.state_datasets();
    const bool synchronous = !config_.async || request.synchronous;
    if (synchronous && view) {
      const std::vector<std::vector<HostBytes>> whole = view();
      if (!whole.empty()) {
        ZRT_CHECK(whole.size() == state.datasets.size(),
                  "checkpoint {}: the state view has {} arrays for {} datasets", request.tag,
                  whole.size(), state.datasets.size());
        for (const auto& runs : whole) {
          std::int64_t bytes = 0;
          for (const HostBytes& run : runs) bytes += run.bytes;
          ZRT_CHECK(bytes == held * 4,
                    "checkpoint {}: the state view holds {} bytes per array, the index {}",
                    request.tag, bytes, held * 4);
          state.arrays.push_back(select_ranges(runs, ranges));
        }
        start(std::move(request), state);
        return;
      }
    }
    const std::int64_t bytes = held * static_cast<std::int64_t>(state.datasets.size()) * 4;
    if (snapshot_bytes_ != bytes) {
      snapshot_.reset();
      snapshot_bytes_ = 0;
      if (allocate_) {
        snapshot_ = allocate_(bytes);
      } else {
        snapshot_ = std::shared_ptr<float[]>(new float[static_cast<std::size_t>(bytes / 4)]);
      }
      ZRT_CHECK(snapshot_ != nullptr, "checkpoint: no snapshot buffer of {} bytes", bytes);
      snapshot_bytes_ = bytes;
    }
    auto* base = static_cast<float*>(snapshot_.get());
    std::vector<float*> arrays;
    for (std::size_t a = 0; a < state.datasets.size(); ++a) {
      arrays.push_back(base + static_cast<std::int64_t>(a) * held);
      state.arrays.push_back(select_ranges({{arrays.back(), held * 4}}, ranges));
    }
    if (config_.async && issue) {
      std::function<void()> copied = issue(arrays);
      start(std::move(request), state, std::move(copied));
      return;
    }
    fill(arrays);
  }
  start(std::move(request), state);
}

void Checkpointer::save(SaveRequest request) {
  wait();
  start(std::move(request), RankState{});
}

void Checkpointer::start(SaveRequest request, const RankState& state,
                         std::function<void()> copied) {
  // An empty state means the request's own snapshot, viewed where the request then lives.
  const bool own = state.empty();
  if (!config_.async || request.synchronous) {
    commit(request, own ? request.snapshot.view() : state);
    return;
  }
  writer_ =
      std::thread([this, own, state, request = std::move(request), copied = std::move(copied)] {
        // The snapshot buffer is being filled on the state's stream: wait for it first, always (the
        // buffer must not be written after this thread ends).
        std::string copy_error;
        if (copied) {
          try {
            copied();
          } catch (const std::exception& e) {
            copy_error = fmt::format("copying the state into the snapshot: {}", e.what());
          }
        }
        try {
          commit(request, own ? request.snapshot.view() : state, copy_error);
        } catch (const std::exception& e) {
          // Logged now, from the writer thread: the training loop hears of it only at its next
          // save or at the end of the run.
          spdlog::error("checkpoint {}: async save failed: {}", request.tag, e.what());
          error_ = std::current_exception();
        } catch (...) {
          spdlog::error("checkpoint {}: async save failed (unknown error)", request.tag);
          error_ = std::current_exception();
        }
      });
}

SaveTimings Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (pruner_.joinable()) pruner_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  return timings_;
}

void Checkpointer::commit(const SaveRequest& request, const RankState& state,
                          const std::string& copy_error) {
  const auto start = Clock::now();
  const fs::path save_dir = config_.save_dir;
  const fs::path tmp = save_dir / (request.tag + ".tmp");
  const fs::path final_dir = save_dir / request.tag;
  const fs::path probe = tmp / ".shared_fs_probe";
  SaveTimings timings;

  // 1. The directory, and proof that every rank sees what rank 0 writes.
  std::string error;
  std::int64_t nonce = 0;
  if (rank_ == 0) {
    try {
      fs::create_directories(save_dir);
      fs::remove_all(tmp);  // an abandoned attempt at this tag
      fs::create_directories(tmp);
      // Also the save's id (CheckpointIndex::save_id): 62 random bits, never 0.
      std::random_device draw;
      nonce = static_cast<std::int64_t>(
                  ((std::uint64_t{draw()} << 32) ^ draw() ^ static_cast<std::uint64_t>(getpid())) >>
                  2) |
              1;
      std::ofstream(probe) << nonce << "\n";
      fsync_path(probe.string());
      fsync_path(tmp.string(), true);
    } catch (const std::exception& e) {
      error = fmt::format("cannot create {}: {}", tmp.string(), e.what());
    }
  }
  const auto agreed = agree({error.empty() ? 0 : 1, nonce},
                            fmt::format("{}, preparing the directory", request.tag));
  if (agreed[0] != 0) {
    check_all("preparing the directory", request.tag, error);
  }
  nonce = agreed[1];
  if (rank_ != 0) {
    fs::path mine = probe;
    if (rank_ == hooks_.probe_elsewhere_rank) {
      mine =
          fs::path(save_dir.string() + "_not_shared") / (request.tag + ".tmp") / probe.filename();
    }
    std::int64_t seen = -1;
    std::ifstream in(mine);
    if (in) in >> seen;
    if (seen != nonce) {
      error = fmt::format(
          "checkpoint.save_dir '{}' is not shared: rank {} cannot see {} written by rank 0{} "
          "(saving on several nodes needs a shared file system)",
          save_dir.string(), rank_, mine.string(), in ? " (other contents)" : "");
    }
  }
  check_all("the shared file system check", request.tag, error);
  // Several groups: rank 0 assembles the tables from every rank's rows.
  CheckpointIndex gathered;
  const CheckpointIndex* index = &request.index;
  if (request.index.share.gather) {
    gathered = gather_tables(request.index, &error);
    index = &gathered;
    try {
      check_all("assembling the index", request.tag, error);
    } catch (const Error&) {
      if (rank_ == 0) {
        std::error_code ignored;
        fs::remove_all(tmp, ignored);
      }
      throw;
    }
  }
  timings.prepare_s = seconds_since(start);

  // 2. Every rank's file (and the index), closed and fsynced, then agreement.
  error = copy_error;  // a failed snapshot copy fails this stage on every rank
  if (error.empty()) {
    try {
      const auto t = Clock::now();
      fault_point("checkpoint.write", request.index.step, rank_);  // test hook (fault.h)
      if (hooks_.write_delay_ms > 0 &&
          (hooks_.write_delay_step < 0 || hooks_.write_delay_step == request.index.step)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(hooks_.write_delay_ms));
      }
      if (rank_ == 0) {
        // The save's id is the directory probe's number, agreed by every rank above.
        CheckpointIndex with_id = *index;
        with_id.save_id = nonce;
        write_index((tmp / "index.h5").string(), with_id);
      }
      if (rank_ == 0) fsync_path((tmp / "index.h5").string());
      const std::int64_t expected = index->share.gather ? index->share.file_elements()
                                    : rank_ < index->world
                                        ? index->rank_elements[static_cast<std::size_t>(rank_)]
                                        : 0;
      if (expected > 0) {
        ZRT_CHECK(state.rank == rank_ && state.elements == expected,
                  "rank {}: snapshot of rank {} with {} elements, the index expects {}", rank_,
                  state.rank, state.elements, expected);
        ZRT_CHECK(state.datasets == index->state_datasets(),
                  "rank {}: snapshot of {} state datasets, the index's optimizer {} has {}", rank_,
                  state.datasets.size(), index->optimizer, index->state_datasets().size());
        write_rank_file((tmp / rank_file_name(rank_)).string(), state, index->world, index->seed,
                        nonce, rank_ == hooks_.kill_rank, &timings.file, config_.direct_io);
        timings.bytes = state.bytes();
      }
      timings.write_s = seconds_since(t);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const auto agree_start = Clock::now();
  try {
    check_all("writing the files", request.tag, error);
  } catch (const Error&) {
    // Every rank has stopped writing (the agreement): the partial files go now, so a full disk
    // gets its space back for the next save; `latest` never named them.
    if (rank_ == 0) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    }
    throw;
  }

  timings.agree_s = seconds_since(agree_start);

  // 3. Rank 0 commits: rename, latest, then pruning.
  if (rank_ == 0) {
    try {
      const auto rename_start = Clock::now();
      fs::remove(probe);
      fsync_path(tmp.string(), true);
      if (fs::exists(final_dir)) {
        // Saving a tag again (a re-run): the old copy goes only after the new one is complete.
        const fs::path old = save_dir / (request.tag + ".old");
        fs::remove_all(old);
        fs::rename(final_dir, old);
        fs::rename(tmp, final_dir);
        fs::remove_all(old);
      } else {
        fs::rename(tmp, final_dir);
      }
      fsync_path(save_dir.string(), true);
      write_text_durably(save_dir / "latest", request.tag + "\n");
      timings.rename_s = seconds_since(rename_start);
      // Deleting old checkpoints is not part of the commit (`latest` already names the new
      // one): it runs beside training, and the next save (or the end) waits for it.
      const auto prune_start = Clock::now();
      if (pruner_.joinable()) pruner_.join();
      timings.prune_s = seconds_since(prune_start);  // only a previous prune still running
      pruner_ = std::thread([this, keep = step_of_tag(request.tag)] {
        try {
          prune(keep);
        } catch (const std::exception& e) {
          spdlog::warn("checkpoint: removing old checkpoints in {} failed: {}", config_.save_dir,
                       e.what());
        }
      });
    } catch (const std::exception& e) {
      error = fmt::format("committing {}: {}", final_dir.string(), e.what());
    }
  }
  check_all("the commit", request.tag, error);
  timings.commit_s = seconds_since(start);
  timings_ = timings;
  if (rank_ == 0) {
    spdlog::info("checkpoint {} saved ({:.2f} s)", final_dir.string(), timings.commit_s);
  }
}

void Checkpointer::prune(std::int64_t keep_step) {
  std::vector<std::pair<std::int64_t, fs::path>> complete;
  for (const auto& entry : fs::directory_iterator(config_.save_dir)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    const bool is_tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const std::int64_t step = step_of_tag(is_tmp ? name.substr(0, name.size() - 4) : name);
    if (step < 0) continue;
    if (is_tmp) {
      if (step < keep_step) fs::remove_all(entry.path());  // abandoned by a killed save
    } else if (step <= keep_step) {
      // Checkpoints past the one just saved are another timeline's (this run resumed from an
      // older tag): neither counted nor removed (the resume warned of them).
      complete.emplace_back(step, entry.path());
    }
  }
  if (config_.keep_last <= 0) return;
  std::sort(complete.begin(), complete.end());
  const auto keep = static_cast<std::size_t>(config_.keep_last);
  for (std::size_t i = 0; i + keep < complete.size(); ++i) {
    if (complete[i].first == keep_step) continue;
    fs::remove_all(complete[i].second);
    spdlog::info("checkpoint {} removed (keep_last {})", complete[i].second.string(),
                 config_.keep_last);
  }
}

std::optional<std::string> Checkpointer::resolve_load() const {
  return plan_load(config_).dir;
}

}  // namespace zrt::checkpoint
