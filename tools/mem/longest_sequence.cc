#include "tools/mem/longest_sequence.h"

#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/error.h"

namespace zrt::mem {

namespace {

constexpr int kMaxSeqLen = 1 << 28;  // far past any device: where the doubling stops

// The estimate at seq_len T and whether it fits; `limit` says why not.
struct Trial {
  bool fits = false;
  std::optional<Estimate> estimate;
  std::string limit;
};

// The model's refusal as a table cell: "model.seq_len=8256 exceeds max_position_embeddings=8192",
// without the source location, the model's name and the remedy (zrt-train gives them all).
std::string brief_reason(const std::string& message) {
  static const std::regex location(R"(^[A-Za-z0-9_./-]+:[0-9]+: )");
  static const std::regex model_name(R"(^\S+ config \S+: )");
  std::string text =
      std::regex_replace(message, location, "", std::regex_constants::format_first_only);
  text = std::regex_replace(text, model_name, "", std::regex_constants::format_first_only);
  const std::size_t remedy = text.find(": ");
  return remedy == std::string::npos ? text : text.substr(0, remedy);
}

Trial try_length(const ModelDef& model, Inputs in, const Setting& setting, int T,
                 std::int64_t device_capacity, std::int64_t host_capacity) {
  Trial t;
  std::shared_ptr<const ModelDef> at_T;
  try {
    at_T = model.with_seq_len(T);
  } catch (const InvalidArgument& e) {
    t.limit = brief_reason(e.what());  // the model's own bound (max_position_embeddings)
    return t;
  }
  in.model = model_spec(at_T);
  in.seq_len = T;
  t.estimate = estimate(in, setting);
  if (t.estimate->device_total() > device_capacity) {
    t.limit = "device";
  } else if (host_capacity > 0 && t.estimate->host_node_total() > host_capacity) {
    t.limit = "host";
  } else {
    t.fits = true;
  }
  return t;
}

// The longest multiple of `multiple` in [lo, hi) that fits (hi 0: unbounded), for a footprint
// that grows with T there and a `lo` that fits (`lo_trial`): doubling from lo, then bisection
// between the last fit and the first miss (or hi). Returns the length and its trial.
template <typename Attempt>
std::pair<int, Trial> longest_in(const Attempt& attempt, int multiple, int lo, Trial lo_trial,
                                 int hi) {
  int good = lo;
  Trial good_trial = std::move(lo_trial);
  int bad = hi;
  while (bad == 0 || good * 2 < bad) {
    if (good > kMaxSeqLen / 2) return {good, std::move(good_trial)};
    Trial next = attempt(good * 2);
    if (!next.fits) {
      bad = good * 2;
      break;
    }
    good *= 2;
    good_trial = std::move(next);
  }
  while (bad - good > multiple) {
    const int mid = good + ((bad - good) / multiple / 2) * multiple;
    Trial t = attempt(mid);
    if (t.fits) {
      good = mid;
      good_trial = std::move(t);
    } else {
      bad = mid;
    }
  }
  return {good, std::move(good_trial)};
}

// The first multiple of `multiple` in [multiple, end] where `on` holds, for a switch that stays
// on once on (0: not by `end`, a multiple of `multiple`).
template <typename Switch>
int first_on(const Switch& on, int multiple, int end) {
  if (on(multiple)) return multiple;
  int off = multiple, at = 0;
  while (at == 0) {
    if (off >= end) return 0;
    const int next = std::min(off * 2, end);
    if (on(next)) {
      at = next;
    } else {
      off = next;
    }
  }
  while (at - off > multiple) {
    const int mid = off + ((at - off) / multiple / 2) * multiple;
    (on(mid) ? at : off) = mid;
  }
  return at;
}

}  // namespace

SequenceFit longest_sequence(const ModelDef& model, Inputs in, const Setting& setting,
                             std::int64_t device_capacity_bytes, std::int64_t host_capacity_bytes,
                             int multiple) {
  if (multiple < 1) {
    ZRT_THROW(InvalidArgument, "--max-seq-len: lengths are multiples of {}, which must be >= 1",
              multiple);
  }
  const auto attempt_with = [&](const Inputs& inputs) {
    return [&, inputs](int T) {
      return try_length(model, inputs, setting, T, device_capacity_bytes, host_capacity_bytes);
    };
  };
  const auto attempt = attempt_with(in);
  Inputs own = in;
  own.documents = true;  // packed documents run zrt's attention kernels throughout
  const auto own_attempt = attempt_with(own);
  // The footprint grows with T but where an automatic switch turns on, and each stays on as T
  // grows: the head's, the MLP's and the MoE layers' tiles (model.tiling: once the whole passes
  // its budget; the MLP's footprint drops there) and, on a GPU, zrt's attention kernels taking
  // the calls from cuDNN's (whose workspace grows with T^2 up to its limit, then is none: the
  // footprint drops). Between two switches it grows, so each stretch is searched on its own and
  // the longest length found fitting is the answer.
  const int sp = std::max(1, in.engine.sequence_parallel_size);
  const std::int64_t B = std::max(1, in.micro_batch);
  const ModelOptions options = in.model_options(in.activation_checkpointing);
  const auto rows = [&](int T) { return B * std::max(1, T / sp); };
  const auto tiled = [&](int tile, int T) { return tile > 0 && tile < rows(T); };
  const auto tiles = [&](int T) {
    return model.tile_rows(in.micro_batch, std::max(1, T / sp), in.engine.compute_dtype, options);
  };
  // The tiles' switches come from the shapes alone, over the lengths whose rows a pass stay
  // well within int.
  const int tile_end = static_cast<int>(std::max<std::int64_t>(
      multiple,
      std::min<std::int64_t>(kMaxSeqLen, (std::int64_t{1} << 30) / B * sp) / multiple * multiple));
  std::vector<int> switches;
  const auto note = [&](int at) {
    if (at > multiple) switches.push_back(at);
  };
  note(first_on([&](int T) { return tiled(tiles(T).head, T); }, multiple, tile_end));
  note(first_on([&](int T) { return tiled(tiles(T).mlp, T); }, multiple, tile_end));
  note(first_on([&](int T) { return tiled(tiles(T).moe, T); }, multiple, tile_end));
  // Past `end` nothing fits: from the length where the tiles last switched, doubling until
  // neither the plan nor zrt's attention kernels fit. Beyond it the tiles are fixed, so each
  // attention's footprint grows with T, and the attention switch only moves the calls from
  // cuDNN's (which missed there, or had already let go) to zrt's kernels (which missed). 0: the
  // search's end still fits.
  int end = switches.empty() ? multiple : *std::max_element(switches.begin(), switches.end());
  while (attempt(end).fits || (!in.documents && own_attempt(end).fits)) {
    if (end > kMaxSeqLen / 2) {
      end = 0;
      break;
    }
    end *= 2;
  }
  if (!in.documents) {
    // cuDNN's calls, where the plan has them, ask for another workspace than zrt's kernels.
    // Past the model's own limit nothing fits: counted as on.
    note(first_on(
        [&](int T) {
          const Trial a = attempt(T), b = own_attempt(T);
          return !a.estimate || !b.estimate ||
                 a.estimate->kernel_workspace == b.estimate->kernel_workspace;
        },
        multiple, end == 0 ? kMaxSeqLen / multiple * multiple : end));
  }
  std::sort(switches.begin(), switches.end());
  switches.erase(std::unique(switches.begin(), switches.end()), switches.end());
  if (end != 0) {
    switches.erase(
        std::remove_if(switches.begin(), switches.end(), [&](int at) { return at >= end; }),
        switches.end());
  }

  SequenceFit fit;
  int starts_at = multiple;
  for (std::size_t k = 0; k <= switches.size(); ++k) {
    const int lo = starts_at, hi = k < switches.size() ? switches[k] : end;
    starts_at = hi;
    Trial first = attempt(lo);
    if (!first.fits) {
      if (fit.seq_len == 0 && k == 0) fit.limit = first.limit;
      continue;
    }
    auto [length, trial] = longest_in(attempt, multiple, lo, std::move(first), hi);
    if (length > fit.seq_len) {
      fit.seq_len = length;
      fit.estimate = *trial.estimate;
    }
  }
  if (fit.seq_len > 0) {
    if (fit.seq_len > kMaxSeqLen / 2) {
      fit.limit = "beyond " + std::to_string(kMaxSeqLen) + " tokens (the search's end)";
    } else {
      const Trial next = attempt(fit.seq_len + multiple);
      // It fits only where the footprint does not grow between the switches: zrt's attention
      // kernels take lengths that are multiples of 64 and leave the others to a T^2 path.
      fit.limit = next.fits ? "a longer length fits again: the footprint is not monotone in "
                              "multiples of " +
                                  std::to_string(multiple) + " (use a multiple of 64)"
                            : next.limit;
    }
  } else if (fit.limit.empty()) {
    fit.limit = attempt(multiple).limit;
  }
  return fit;
}

}  // namespace zrt::mem
