#include "runtime/checkpoint/rank_share.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_set>

#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace {

// Little-endian-as-the-host int64 words and length-prefixed strings: the ranks of one run share
// a byte order.
class ShareWriter {
 public:
  void put(std::int64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void put(const std::string& s) {
    put(static_cast<std::int64_t>(s.size()));
    bytes_.append(s);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class ShareReader {
 public:
  ShareReader(const std::string& bytes, const std::string& where) : bytes_(bytes), where_(where) {}
  std::int64_t get() {
    need(sizeof(std::int64_t));
    std::int64_t v = 0;
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  // A count of items that each take at least `min_bytes` of what is left.
  std::int64_t count(std::size_t min_bytes) {
    const std::int64_t n = get();
    if (n < 0 || static_cast<std::size_t>(n) * min_bytes > bytes_.size() - at_) fail();
    return n;
  }
  std::string text() {
    const auto n = static_cast<std::size_t>(count(1));
    std::string s = bytes_.substr(at_, n);
    at_ += n;
    return s;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  void need(std::size_t n) {
    if (bytes_.size() - at_ < n) fail();
  }
  [[noreturn]] void fail() const {
    ZRT_THROW(InvalidArgument, "checkpoint: the table rows from {} are malformed ({} bytes)",
              where_, bytes_.size());
  }
  const std::string& bytes_;
  std::string where_;
  std::size_t at_ = 0;
};

}  // namespace

std::string encode_share(const RankShare& share) {
  ShareWriter w;
  w.put(share.file_elements());
  w.put(static_cast<std::int64_t>(share.slices.size()));
  for (const WrittenSlice& s : share.slices) {
    w.put(s.unit_key);
    for (std::int64_t v : {s.local_unit, s.group, s.numel, s.shard, s.slices, s.slice, s.offset}) {
      w.put(v);
    }
    w.put(static_cast<std::int64_t>(s.params.size()));
    for (const ParamEntry& p : s.params) {
      w.put(p.name);
      w.put(static_cast<std::int64_t>(p.shape.size()));
      for (std::int64_t d : p.shape) w.put(d);
      w.put(p.numel);
      w.put(p.offset);
      w.put(p.steps);
    }
  }
  return w.take();
}

RankShare decode_share(const std::string& bytes, const std::string& where) {
  ShareReader r(bytes, where);
  RankShare share;
  const std::int64_t elements = r.get();
  const std::int64_t n = r.count(9 * sizeof(std::int64_t));
  for (std::int64_t i = 0; i < n; ++i) {
    WrittenSlice s;
    s.unit_key = r.text();
    s.local_unit = r.get();
    s.group = r.get();
    s.numel = r.get();
    s.shard = r.get();
    s.slices = r.get();
    s.slice = r.get();
    s.offset = r.get();
    const std::int64_t params = r.count(5 * sizeof(std::int64_t));
    for (std::int64_t k = 0; k < params; ++k) {
      ParamEntry p;
      p.name = r.text();
      const std::int64_t ndim = r.count(sizeof(std::int64_t));
      for (std::int64_t d = 0; d < ndim; ++d) p.shape.push_back(r.get());
      p.numel = r.get();
      p.offset = r.get();
      p.steps = r.get();
      s.params.push_back(std::move(p));
    }
    share.slices.push_back(std::move(s));
  }
  if (!r.done())
    ZRT_THROW(InvalidArgument, "checkpoint: trailing bytes in the rows from {}", where);
  // The file's extent as the rows describe it (the ranges of the state are the sender's own).
  share.written =
      elements > 0 ? std::vector<StateRange>{StateRange{0, elements}} : std::vector<StateRange>{};
  return share;
}

void merge_shares(CheckpointIndex& index, const std::vector<RankShare>& shares) {
  struct Found {
    const WrittenSlice* first = nullptr;      // slice 0's row: the unit's parameters
    const WrittenSlice* reference = nullptr;  // the first row seen, which the others must match
    int first_rank = -1;
    std::vector<SliceEntry> slices;
    std::vector<bool> seen;
  };
  std::map<std::string, Found> units;
  index.world = static_cast<int>(shares.size());
  index.rank_elements.clear();
  for (std::size_t r = 0; r < shares.size(); ++r) {
    index.rank_elements.push_back(shares[r].file_elements());
    for (const WrittenSlice& s : shares[r].slices) {
      Found& f = units[s.unit_key];
      if (f.seen.empty()) {
        if (s.slices < 1 || s.shard < 0 || s.numel != s.shard * s.slices) {
          ZRT_THROW(InvalidArgument,
                    "checkpoint: rank {} describes the unit of '{}' as {} slices of {} for {} "
                    "elements",
                    r, s.unit_key, s.slices, s.shard, s.numel);
        }
        f.seen.assign(static_cast<std::size_t>(s.slices), false);
        f.slices.assign(static_cast<std::size_t>(s.slices), SliceEntry{});
        f.reference = &s;
      }
      const WrittenSlice& ref = *f.reference;
      if (s.numel != ref.numel || s.shard != ref.shard || s.slices != ref.slices ||
          s.group != ref.group) {
        ZRT_THROW(InvalidArgument,
                  "checkpoint: the ranks disagree on the unit of '{}': rank {} has {} elements in "
                  "{} slices (group {}), another {} in {} (group {})",
                  s.unit_key, r, s.numel, s.slices, s.group, ref.numel, ref.slices, ref.group);
      }
      if (s.slice < 0 || s.slice >= s.slices) {
        ZRT_THROW(InvalidArgument, "checkpoint: rank {} writes slice {} of the unit of '{}' ({})",
                  r, s.slice, s.unit_key, s.slices);
      }
      const auto k = static_cast<std::size_t>(s.slice);
      if (f.seen[k]) {
        ZRT_THROW(InvalidArgument,
                  "checkpoint: slice {} of the unit of '{}' is written by two ranks ({} and {}): "
                  "each unit must be written by one shard group",
                  s.slice, s.unit_key, f.slices[k].rank, r);
      }
      f.seen[k] = true;
      f.slices[k] = SliceEntry{static_cast<std::int64_t>(r), s.offset};
      if (s.slice == 0) {
        f.first = &s;
        f.first_rank = static_cast<int>(r);
      }
    }
  }
  // Units in the writers' plan order; one local unit's copies (other experts) by rank.
  std::vector<std::tuple<std::int64_t, int, const Found*>> order;
  for (const auto& [key, f] : units) {
    for (std::size_t k = 0; k < f.seen.size(); ++k) {
      if (!f.seen[k]) {
        ZRT_THROW(InvalidArgument,
                  "checkpoint: slice {} of {} of the unit of '{}' is written by no rank", k,
                  f.seen.size(), key);
      }
    }
    order.emplace_back(f.first->local_unit, f.first_rank, &f);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) < std::get<0>(b)
                                            : std::get<1>(a) < std::get<1>(b);
  });
  index.params.clear();
  index.units.clear();
  std::unordered_set<std::string> names;
  for (const auto& [local, rank, f] : order) {
    const WrittenSlice& s = *f->first;
    const auto u = static_cast<std::int64_t>(index.units.size());
    index.units.push_back(UnitEntry{s.numel, s.shard, s.group, f->slices});
    for (ParamEntry p : s.params) {
      if (!names.insert(p.name).second) {
        ZRT_THROW(InvalidArgument,
                  "checkpoint: parameter '{}' is in two units (rank {} holds it in the unit of "
                  "'{}'): every parameter name must be one tensor across the ranks",
                  p.name, rank, s.unit_key);
      }
      p.unit = u;
      index.params.push_back(std::move(p));
    }
  }
}

}  // namespace zrt::checkpoint
