#include "byte_mlp.h"

#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace custom_model {

namespace k = zrt::kernels;
using zrt::DType;
using zrt::Phase;

namespace {

enum Param {
  kTokenEmbedding,
  kPositionEmbedding,
  kHiddenWeight,
  kHiddenBias,
  kHeadWeight,
  kHeadBias
};

// A standard normal that depends only on (seed, parameter, element), so every rank computes
// the same value for an element whichever shard it initialises (Model::init_parameter's rule).
float normal_at(std::uint64_t seed, int index, std::int64_t element) {
  auto mix = [](std::uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const std::uint64_t key =
      mix(seed ^ mix(static_cast<std::uint64_t>(index) + 0x9e3779b97f4a7c15ULL) ^
          mix(static_cast<std::uint64_t>(element)));
  // Two uniforms in (0, 1) from the two halves, then Box-Muller.
  const double u1 = (static_cast<double>(key >> 40) + 0.5) / 16777216.0;
  const double u2 = (static_cast<double>(key & 0xffffff) + 0.5) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

std::int64_t bytes_of(std::int64_t elements, DType dtype) {
  // Each activation starts 256-byte aligned, as device allocations are.
  const std::int64_t bytes = elements * static_cast<std::int64_t>(zrt::dtype_size(dtype));
  return (bytes + 255) / 256 * 256;
}

}  // namespace

std::int64_t ByteMlpDims::num_parameters() const {
  const std::int64_t V = vocab_size, T = seq_len, C = width, H = hidden;
  return V * C + T * C + C * H + H + H * V + V;
}

std::string ByteMlpDims::describe() const {
  return fmt::format("byte MLP (V{} T{} C{} H{}, {:.2f}M params)", vocab_size, seq_len, width,
                     hidden, static_cast<double>(num_parameters()) / 1e6);
}

ByteMlp::ByteMlp(ByteMlpDims dims, k::KernelContext& ctx) : dims_(dims), ctx_(ctx) {
  if (dims_.vocab_size <= 0 || dims_.seq_len <= 0 || dims_.width <= 0 || dims_.hidden <= 0) {
    ZRT_THROW(zrt::InvalidArgument, "byte MLP: every dimension must be positive ({})",
              dims_.describe());
  }
  const std::int64_t V = dims_.vocab_size, T = dims_.seq_len, C = dims_.width, H = dims_.hidden;
  // Index order = Param; modules name the pass that reads each parameter.
  params_ = {
      {"embedding.token", {V, C}, {kEmbedding}, false},
      {"embedding.position", {T, C}, {kEmbedding}, false},
      {"hidden.weight", {C, H}, {kHidden}, false},
      {"hidden.bias", {H}, {kHidden}, true},
      {"head.weight", {H, V}, {kHead}, false},
      {"head.bias", {V}, {kHead}, true},
  };
  loss_ = ctx_.device().allocate(4, zrt::MemCategory::kActivations, "byte MLP loss",
                                 zrt::MemorySpace::kDevice, &ctx_.stream());
}

void ByteMlp::init_parameter(int index, std::uint64_t seed, std::int64_t begin, std::int64_t count,
                             float* out) const {
  if (index == kHiddenBias || index == kHeadBias) {
    for (std::int64_t i = 0; i < count; ++i) out[i] = 0.0f;
    return;
  }
  // GPT-2's scale for the embeddings; fan-in scaling for the two matrices keeps the hidden
  // pre-activations and the first logits near unit size.
  const double scale = index == kHiddenWeight ? 1.0 / std::sqrt(static_cast<double>(dims_.width))
                       : index == kHeadWeight ? 1.0 / std::sqrt(static_cast<double>(dims_.hidden))
                                              : 0.02;
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<float>(scale * normal_at(seed, index, begin + i));
  }
}

void ByteMlp::prepare(zrt::ParamAccess& access, const zrt::TokenBatch& batch, bool need_targets) {
  k::check_dtypes(access.compute_dtype(), access.grad_dtype());
  if (batch.batch <= 0 || batch.seq_len <= 0 || batch.seq_len > dims_.seq_len) {
    ZRT_THROW(zrt::InvalidArgument, "byte MLP: batch {}x{} (need B >= 1 and 1 <= T <= {})",
              batch.batch, batch.seq_len, dims_.seq_len);
  }
  if (!batch.inputs || (need_targets && !batch.targets)) {
    ZRT_THROW(zrt::InvalidArgument, "byte MLP: the batch has no {}",
              batch.inputs ? "targets" : "input tokens");
  }
  grad_dtype_ = access.grad_dtype();
  if (batch.batch == batch_ && batch.seq_len == seq_len_ && access.compute_dtype() == dtype_ &&
      !act_buffer_.empty()) {
    return;
  }
  batch_ = batch.batch;
  seq_len_ = batch.seq_len;
  dtype_ = access.compute_dtype();
  const std::int64_t N = std::int64_t{batch_} * seq_len_;
  const std::int64_t C = dims_.width, H = dims_.hidden, V = dims_.vocab_size;
  const std::pair<zrt::DevicePtr<std::byte>*, std::int64_t> fields[] = {
      {&acts_.x, bytes_of(N * C, dtype_)},  {&acts_.pre, bytes_of(N * H, dtype_)},
      {&acts_.h, bytes_of(N * H, dtype_)},  {&acts_.logits, bytes_of(N * V, dtype_)},
      {&acts_.dx, bytes_of(N * C, dtype_)}, {&acts_.dpre, bytes_of(N * H, dtype_)},
      {&acts_.dh, bytes_of(N * H, dtype_)}};
  std::int64_t total = bytes_of(N, DType::kFloat32);  // the per-position losses
  for (const auto& field : fields) total += field.second;
  // Stream-ordered: passes already enqueued keep the old buffer until they have run.
  act_buffer_.reset();
  act_buffer_ =
      ctx_.device().allocate(total, zrt::MemCategory::kActivations,
                             fmt::format("byte MLP activations (B={} T={})", batch_, seq_len_),
                             zrt::MemorySpace::kDevice, &ctx_.stream());
  zrt::DevicePtr<std::byte> next = act_buffer_.device<std::byte>();
  acts_.losses = next.as<float>();
  next = next + bytes_of(N, DType::kFloat32);
  for (const auto& [field, bytes] : fields) {
    *field = next;
    next = next + bytes;
  }
}

void ByteMlp::run_forward(zrt::ParamAccess& a, const zrt::TokenBatch& batch, Phase phase) {
  const int B = batch_, T = seq_len_, N = B * T;
  const int C = dims_.width, H = dims_.hidden, V = dims_.vocab_size;
  const DType dt = dtype_;

  a.acquire(kEmbedding, phase);
  k::encoder_forward(ctx_, dt, acts_.x, batch.inputs, a.param(kTokenEmbedding),
                     a.param(kPositionEmbedding), B, T, C, V);
  a.release(kEmbedding, phase);

  a.acquire(kHidden, phase);
  k::matmul_forward(ctx_, dt, acts_.pre, acts_.x, a.param(kHiddenWeight), a.param(kHiddenBias), N,
                    C, H);
  k::gelu_forward(ctx_, dt, acts_.h, acts_.pre, std::int64_t{N} * H);
  a.release(kHidden, phase);

  a.acquire(kHead, phase);
  k::matmul_forward(ctx_, dt, acts_.logits, acts_.h, a.param(kHeadWeight), a.param(kHeadBias), N, H,
                    V);
  if (batch.targets) {
    k::crossentropy_forward(ctx_, dt, acts_.losses, acts_.logits, batch.targets, N, V);
    k::loss_mean(ctx_, loss_.device<float>(), acts_.losses, N);
  }
  a.release(kHead, phase);
}

void ByteMlp::forward(zrt::ParamAccess& access, const zrt::TokenBatch& batch) {
  prepare(access, batch, /*need_targets=*/false);
  run_forward(access, batch, Phase::kEval);
}

void ByteMlp::forward_backward(zrt::ParamAccess& a, const zrt::TokenBatch& batch,
                               float loss_scale) {
  prepare(a, batch, /*need_targets=*/true);
  run_forward(a, batch, Phase::kForward);

  const int B = batch_, T = seq_len_, N = B * T;
  const int C = dims_.width, H = dims_.hidden, V = dims_.vocab_size;
  const DType dt = dtype_;
  const DType gt = grad_dtype_;
  zrt::Device& device = ctx_.device();
  zrt::Stream& stream = ctx_.stream();
  auto zero = [&](zrt::DevicePtr<std::byte> p, std::int64_t elements) {
    device.fill_zero(p, static_cast<std::size_t>(elements) * zrt::dtype_size(dt), stream);
  };

  // Input gradients accumulate in the kernels, so each is zeroed before its first use.
  a.acquire(kHead, Phase::kBackward);
  // The loss is a mean over N positions: each row's gradient carries loss_scale / N. The
  // logits' gradient replaces the logits in place.
  k::crossentropy_backward(ctx_, dt, acts_.logits, acts_.logits, batch.targets,
                           loss_scale / static_cast<float>(N), N, V);
  zero(acts_.dh, std::int64_t{N} * H);
  k::matmul_backward(ctx_, dt, gt, acts_.dh, a.grad(kHeadWeight), a.grad(kHeadBias), acts_.logits,
                     acts_.h, a.param(kHeadWeight), N, H, V);
  a.release(kHead, Phase::kBackward);

  a.acquire(kHidden, Phase::kBackward);
  zero(acts_.dpre, std::int64_t{N} * H);
  k::gelu_backward(ctx_, dt, acts_.dpre, acts_.pre, acts_.dh, std::int64_t{N} * H);
  zero(acts_.dx, std::int64_t{N} * C);
  k::matmul_backward(ctx_, dt, gt, acts_.dx, a.grad(kHiddenWeight), a.grad(kHiddenBias), acts_.dpre,
                     acts_.x, a.param(kHiddenWeight), N, C, H);
  a.release(kHidden, Phase::kBackward);

  a.acquire(kEmbedding, Phase::kBackward);
  k::encoder_backward(ctx_, dt, gt, a.grad(kTokenEmbedding), a.grad(kPositionEmbedding), acts_.dx,
                      batch.inputs, B, T, C, V);
  a.release(kEmbedding, Phase::kBackward);
}

}  // namespace custom_model
