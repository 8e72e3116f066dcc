#include "tools/mem/longest_sequence.h"

#include <optional>

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

Trial try_length(const ModelDef& model, Inputs in, const Setting& setting, int T,
                 std::int64_t device_capacity, std::int64_t host_capacity) {
  Trial t;
  std::shared_ptr<const ModelDef> at_T;
  try {
    at_T = model.with_seq_len(T);
  } catch (const InvalidArgument& e) {
    t.limit = e.what();  // the model's own bound (max_position_embeddings)
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

// The longest multiple of `multiple` that fits, for a footprint that grows with T: doubling from
// `multiple`, then bisection between the last fit and the first miss. `bad` (> 0), when given, is
// a length already known not to fit (`bad_trial`): the doubling stops below it.
template <typename Attempt>
SequenceFit search(const Attempt& attempt, int multiple, int bad, Trial bad_trial) {
  SequenceFit fit;
  Trial first = attempt(multiple);
  if (!first.fits) {
    fit.limit = first.limit;
    return fit;
  }
  // Doubling: `good` fits, `bad` (once found) does not.
  int good = multiple;
  Trial good_trial = std::move(first);
  while (bad == 0 || good * 2 < bad) {
    if (good > kMaxSeqLen / 2) {
      bad_trial.limit = "beyond " + std::to_string(kMaxSeqLen) + " tokens (the search's end)";
      bad = 0;
      break;
    }
    Trial next = attempt(good * 2);
    if (next.fits) {
      good *= 2;
      good_trial = std::move(next);
    } else {
      bad = good * 2;
      bad_trial = std::move(next);
    }
  }
  // Bisection over multiples of `multiple` in (good, bad).
  while (bad != 0 && bad - good > multiple) {
    const int mid = good + ((bad - good) / multiple / 2) * multiple;
    Trial t = attempt(mid);
    if (t.fits) {
      good = mid;
      good_trial = std::move(t);
    } else {
      bad = mid;
      bad_trial = std::move(t);
    }
  }
  fit.seq_len = good;
  fit.estimate = *good_trial.estimate;
  fit.limit = bad_trial.limit;
  return fit;
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
  // cuDNN's attention on a GPU (when planned: kernels/ops.h) asks for a workspace that grows with
  // T^2 up to its limit and then for none, the calls passing to zrt's kernels (where those are
  // the fused ones): the footprint drops there. So besides the plain search, one on zrt's kernels
  // throughout (what packed documents run), whose answer bounds the answer from above where
  // zrt's kernels run fused; where cuDNN's attention would take that length and it does not fit,
  // a search below it with cuDNN's. The longest length any of them found fitting is the answer.
  const auto with = attempt_with(in);
  SequenceFit plain = search(with, multiple, 0, Trial{});
  if (in.documents) return plain;
  Inputs own = in;
  own.documents = true;
  SequenceFit upper = search(attempt_with(own), multiple, 0, Trial{});
  if (upper.seq_len <= plain.seq_len) return plain;
  Trial at_upper = with(upper.seq_len);
  if (at_upper.fits) {
    upper.estimate = *at_upper.estimate;
    return upper;
  }
  SequenceFit below = search(with, multiple, upper.seq_len, std::move(at_upper));
  return below.seq_len > plain.seq_len ? below : plain;
}

}  // namespace zrt::mem
