#include "runtime/comm/collective_sequence_check.h"

#include <cstring>
#include <vector>

#include <spdlog/fmt/fmt.h>

#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/polled_wait.h"
#include "runtime/common/error.h"
#include "runtime/common/fnv1a.h"
#include "runtime/common/watchdog.h"

namespace zrt {

namespace {

constexpr std::size_t kDescriptionBytes = 192;  // what each rank reports of its operation

// The running hash continued over one operation's text and a separator, so that ("ab", "c") and
// ("a", "bc") hash apart.
std::uint64_t hash_operation(std::uint64_t hash, const std::string& text) {
  hash = fnv1a(hash, text.data(), text.size());
  hash ^= 0xffU;
  return hash * kFnv1aPrime;
}

}  // namespace

CollectiveSequenceCheck::CollectiveSequenceCheck(MPI_Comm members, std::string group,
                                                 double timeout_s, Watchdog* watchdog)
    : group_(std::move(group)), timeout_s_(timeout_s), watchdog_(watchdog) {
  ZRT_MPI_CHECK(MPI_Comm_dup(members, &comm_));
}

CollectiveSequenceCheck::~CollectiveSequenceCheck() {
  if (comm_ != MPI_COMM_NULL && !abandoned_) MPI_Comm_free(&comm_);
}

void CollectiveSequenceCheck::verify(const std::string& operation) {
  const std::int64_t index = verified_ + 1;
  const std::uint64_t next = hash_operation(hash_, operation);
  // max(h) and max(~h) in one all-reduce: every rank holds the same h exactly when
  // max(h) == ~max(~h), i.e. max == min.
  send_[0] = next;
  send_[1] = ~next;
  MPI_Request request = MPI_REQUEST_NULL;
  ZRT_MPI_CHECK(MPI_Iallreduce(send_, recv_, 2, MPI_UINT64_T, MPI_MAX, comm_, &request));
  polled_wait(
      {timeout_s_, PollPace::kSpin, watchdog_},
      [&] {
        int done = 0;
        ZRT_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      [&] {
        abandoned_ = true;
        return fmt::format(
            "collective sequence check on group '{}': operation #{} ({}) was not reached by "
            "every rank within {:.1f} s (comm_timeout_s){}",
            group_, index, operation, timeout_s_, watchdog_ ? watchdog_->step_phrase() : "");
      });
  if (recv_[0] == ~recv_[1]) {
    hash_ = next;
    verified_ = index;
    return;
  }
  // The sequences part here (they agreed up to the previous operation): say what each rank
  // issued. Every rank arrives here at the same operation, so this exchange pairs up too.
  std::vector<char> mine(kDescriptionBytes, '\0');
  std::memcpy(mine.data(), operation.data(), std::min(operation.size(), kDescriptionBytes - 1));
  int size = 0;
  ZRT_MPI_CHECK(MPI_Comm_size(comm_, &size));
  std::vector<char> all(kDescriptionBytes * static_cast<std::size_t>(size), '\0');
  request = MPI_REQUEST_NULL;
  ZRT_MPI_CHECK(MPI_Iallgather(mine.data(), static_cast<int>(kDescriptionBytes), MPI_CHAR,
                               all.data(), static_cast<int>(kDescriptionBytes), MPI_CHAR, comm_,
                               &request));
  const bool exchanged = poll_until_done(timeout_s_, PollPace::kSpin, [&] {
    int done = 0;
    ZRT_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  });
  std::string ranks;
  if (exchanged) {
    for (int r = 0; r < size; ++r) {
      ranks +=
          fmt::format("{}rank {}: {}", r == 0 ? "" : "; ", r,
                      std::string(all.data() + static_cast<std::size_t>(r) * kDescriptionBytes));
    }
  } else {
    abandoned_ = true;
    ranks = fmt::format("this rank: {} (the others' did not arrive)", operation);
  }
  ZRT_THROW(Error,
            "collective sequence check on group '{}': the ranks issue different operations at "
            "#{} (after {} that agreed) — {}. Every rank must issue the same collectives in the "
            "same order (comm.check_collective_sequence)",
            group_, index, verified_, ranks);
}

std::unique_ptr<CollectiveSequenceCheck> CollectiveSequenceCheck::split(int color, int key,
                                                                        std::string group) const {
  MPI_Comm child = MPI_COMM_NULL;
  ZRT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
  auto check =
      std::make_unique<CollectiveSequenceCheck>(child, std::move(group), timeout_s_, watchdog_);
  MPI_Comm_free(&child);
  return check;
}

}  // namespace zrt
