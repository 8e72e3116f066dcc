// The model registry: the one seam between the tools (zrt-train, zrt-mem, zrt-bench, zrt-ckpt)
// and the architectures in models/. A tool names no model; it hands the config's model block
// (config's ModelConfig, a plain description) to the registry, which picks the entry
// for model.type and lets it resolve the block into a ModelDef: the architecture's own
// validated configuration with the hooks the tools need (parameters, FLOPs per token,
// activation memory, the initialiser, construction). Export of a checkpoint to Hugging Face
// safetensors is a hook of the entry itself, since it starts from a saved config.
//
// The entries are listed explicitly in builtin_models() (models/builtin_models.cc), the only
// file that names the architectures; adding one is described in docs/extending.md.
//
// Thread-safety: a ModelRegistry and a ModelDef are immutable once built; their functions may
// be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "kernels/kernel_context.h"
#include "runtime/comm/process_group.h"
#include "runtime/common/dtype.h"
#include "runtime/model_interface.h"

namespace zrt {

// How to build a model, beyond its architecture (what the run asks of it).
struct ModelOptions {
  bool activation_checkpointing = false;
  // Ulysses sequence parallelism (sequence_parallel_size): the group sharing each sequence
  // (ParallelLayout::sequence_group), null at 1. A model that cannot split its attention's heads
  // over it refuses to be built.
  ProcessGroup* sequence_group = nullptr;
  // For counting only (activation_footprint, kernel_workspace_bytes, without a group): the
  // sequence_parallel_size to count for. Building a model with it above 1 is refused.
  int planned_sequence_parallel_size = 1;
  // Expert parallelism (expert_parallel.autoep_size): the group splitting each mixture-of-experts
  // layer's experts (ParallelLayout::expert_parallel_group), null at 1. A model without experts
  // ignores it (the trainer refuses the setting for it).
  ProcessGroup* expert_group = nullptr;
  // For counting only (parameters_for, activation_footprint, without a group): the
  // expert_parallel.autoep_size to count for, as the rank at expert-parallel position 0 (every
  // position has the same shapes). Building a model with it above 1 is refused.
  int planned_expert_parallel_size = 1;
  // Expert parallelism: the rows the local experts' buffers hold at first, as a multiple of the
  // balanced share (tokens x top-k; model.expert_rows_reserve, models/moe/expert_rows.h); they
  // grow when a step's routing asks for more.
  double expert_rows_reserve = kDefaultExpertRowsReserve;
  // For counting only: the rows those buffers hold (a run's metrics.jsonl expert_rows_capacity);
  // 0: what expert_rows_reserve starts them at; -1: the dropless worst case.
  std::int64_t planned_expert_rows = 0;
  // For counting only (activation_footprint): the lowest module whose backward runs
  // (ParamAccess::first_backward_module; model.frozen on the lower modules). A built model takes
  // it from its ParamAccess at each pass; building one with it above 0 is refused.
  int planned_first_backward_module = 0;
  // With activation_checkpointing: the kept block inputs in pinned host memory
  // (activation_checkpointing.cpu_checkpointing).
  bool cpu_checkpointing = false;
  // Rows of the sequence per tile of the head and of the MLP (model.tiling.head_rows /
  // mlp_rows): 0 automatic, -1 never, else the count (models/transformer/tiling.h).
  int head_tile_rows = 0;
  int mlp_tile_rows = 0;
  // For counting only (kernel_workspace_bytes): the batches carry packed documents
  // (data.document_mask), whose attention cuDNN leaves to zrt's kernels.
  bool planned_documents = false;
};

// A training pass's activations: device bytes (as activation_bytes counts them) and pinned host
// bytes (cpu_checkpointing's block inputs).
// Under expert parallelism also the device bytes the model keeps for its exchanges in the comm
// category (the count vectors the dispatch exchanges), allocated once when it is built.
struct ActivationFootprint {
  std::int64_t device = 0;
  std::int64_t pinned_host = 0;
  std::int64_t device_comm = 0;
};

// Fills elements [first, first + count) of parameter `index` with fp32 initial values, as
// ZeroEngine::initialize asks for them.
using ParamInitializer =
    std::function<void(int index, std::int64_t first, std::int64_t count, float* out)>;

// One architecture resolved from a model block: everything about the model that can be known
// without a device, and how to build it.
class ModelDef {
 public:
  virtual ~ModelDef() = default;

  virtual const std::string& type() const = 0;  // model.type, e.g. "gpt2"
  // The preset it came from, or "custom" when dimensions were given (a table label).
  virtual std::string name() const = 0;
  // One line for logs and reports, e.g. "gpt2 (L12 H12 C768 V50257 T1024, 124.4M params)".
  virtual std::string describe() const = 0;
  // The architecture's dimensions in its spec's key order (for a GPT: n_layer, n_head,
  // n_embd, vocab_size, seq_len), e.g. to build the same model in another framework.
  virtual std::vector<std::pair<std::string, std::int64_t>> dimensions() const = 0;

  virtual int seq_len() const = 0;     // the longest sequence; zrt-train trains at this length
  virtual int vocab_size() const = 0;  // token ids must be below it
  // The same model with another seq_len (validated), for estimates at other lengths.
  virtual std::unique_ptr<ModelDef> with_seq_len(int seq_len) const = 0;

  // The parameter table the model will report (names, shapes, module uses), and its module
  // count, computed from the dimensions (no device needed).
  virtual std::vector<ParamSpec> parameters() const = 0;
  // The table a model built with `options` reports: parameters(), except under expert
  // parallelism (options' expert_group, or planned_expert_parallel_size without one), where a
  // mixture of experts reports only its rank's E/ep experts of each layer, as group-1 parameters
  // (ParamSpec::group). A model without experts ignores it.
  virtual std::vector<ParamSpec> parameters_for(const ModelOptions& options) const {
    (void)options;
    return parameters();
  }
  virtual int num_modules() const = 0;
  virtual std::int64_t num_parameters() const = 0;
  // The parameters one token's forward and backward read: num_parameters() for a dense model;
  // for a mixture of experts all but the routed experts a token does not choose.
  virtual std::int64_t num_active_parameters() const { return num_parameters(); }
  // Whether the model ends its backward at the lowest module with a trained parameter
  // (Model::stops_backward_early), so zrt-mem replays the schedule the engine runs for it.
  virtual bool stops_backward_early() const { return false; }
  // Whether the model never asks for a frozen parameter's gradient
  // (Model::skips_frozen_gradients): zrt-mem then counts no gradient bucket for frozen units.
  virtual bool skips_frozen_gradients() const { return false; }
  // The modules whose forward is recomputed in backward under activation checkpointing.
  virtual std::vector<int> recomputed_modules() const = 0;

  // Training FLOPs per token at sequence length `seq_len` (forward and backward), for MFU.
  virtual double flops_per_token(int seq_len) const = 0;
  // Device bytes of activations a training pass of one micro-batch (B, T) in `dtype`
  // allocates, as the model lays them out (zrt-mem).
  virtual std::int64_t activation_bytes(int B, int T, DType dtype,
                                        bool activation_checkpointing) const = 0;
  // The same for a model built with `options`. By default a model has neither cpu_checkpointing
  // nor tiling: activation_bytes on the device, nothing on the host.
  // At sequence parallelism (options' group or planned size, sp) T is a rank's chunk of each
  // sequence, the whole sequence being sp * T.
  // The rows a pass's tiled operations take at a time (model.tiling, models/transformer/
  // tiling.h), T as in activation_footprint: each B * T where whole, 0 where the model has no
  // such operation (zrt-mem reports them).
  struct TileRows {
    int head = 0;  // the head's logits, loss and backward
    int mlp = 0;   // the SwiGLU MLP: the Llama family's, a mixture of experts' dense layers
    int moe = 0;   // a mixture of experts' MoE layers
  };
  virtual TileRows tile_rows(int B, int T, DType dtype, const ModelOptions& options) const {
    (void)B;
    (void)T;
    (void)dtype;
    (void)options;
    return {};
  }
  virtual ActivationFootprint activation_footprint(int B, int T, DType dtype,
                                                   const ModelOptions& options) const {
    return {activation_bytes(B, T, dtype, options.activation_checkpointing), 0};
  }
  // The kernel workspace (KernelContext::workspace, MemCategory::kWorkspace) training on
  // micro-batches (B, T) grows it to, on the CPU backend (`on_cpu`) or a GPU, T as in
  // activation_footprint: the attention's requests (over the whole sequence, this rank's heads),
  // the forward's then the backward's, through KernelContext::grown_workspace_bytes. The other
  // kernels' requests are not counted (on the CPU backend the linear layers' and the head's
  // 16-bit conversions), so it is exact where the attention asks the most: fp32 on the CPU
  // backend, long sequences on either. 0 for a model that does not say.
  virtual std::int64_t kernel_workspace_bytes(int B, int T, DType dtype,
                                              const ModelOptions& options, bool on_cpu) const {
    (void)B;
    (void)T;
    (void)dtype;
    (void)options;
    (void)on_cpu;
    return 0;
  }

  // Why the model cannot train at sequence_parallel_size `sp` (its heads or its sequence do not
  // split), each naming the keys and the fix; empty when it can, or for a model without
  // sequence parallelism to say (its build refuses sp > 1 itself). zrt-mem and --check ask it,
  // so they refuse what the model's build would.
  virtual std::vector<std::string> sequence_parallel_problems(int sp) const {
    (void)sp;
    return {};
  }

  // Whether the model adds an auxiliary loss to the training loss (Model::aux_loss(): a mixture
  // of experts' load-balancing term), which zrt-train accumulates for its metrics.
  virtual bool has_auxiliary_loss() const { return false; }
  // Under sequence parallelism: the most fp32 values one of the model's all-reduces over the
  // sequence-parallel group sums per pass (statistics over a forward's tokens, which the group
  // holds a chunk each of: a mixture of experts' load-balancing counts), for zrt-mem's count of
  // that group's collective scratch; 0 for none (the attention's all-to-alls need none).
  virtual std::int64_t sequence_group_sum_floats() const { return 0; }

  virtual std::unique_ptr<Model> build(kernels::KernelContext& ctx,
                                       const ModelOptions& options) const = 0;
  // The initial values: read from `init_from` (a Hugging Face safetensors file, checked against
  // model.parameters()) when it is not empty, else the model's own random initialisation from
  // `seed`. `model` must outlive the returned function.
  virtual ParamInitializer initializer(const Model& model, std::uint64_t seed,
                                       const std::string& init_from) const = 0;
};

// A checkpoint's whole model, for export: every parameter's full fp32 value in index order,
// and the run's config as saved (JSON text).
struct ExportTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};
struct ExportInput {
  std::string checkpoint;  // the directory, for messages
  std::string config_json;
  std::vector<ExportTensor> tensors;
};

// One architecture as the registry knows it.
struct ModelEntry {
  std::string type;     // model.type
  std::string summary;  // one line, e.g. "GPT-2 (presets gpt2-tiny ... gpt2-xl)"
  // The preset names its specs accept: a bare spec naming one (parse_spec(spec)) is this
  // entry's.
  std::vector<std::string> presets;
  // The config's model block, resolved and validated (InvalidArgument naming the problem).
  std::function<std::unique_ptr<ModelDef>(const ModelConfig&)> resolve;
  // A command-line spec in the architecture's own syntax (e.g. "gpt2-tiny:seq_len=128").
  std::function<std::unique_ptr<ModelDef>(const std::string& spec)> parse_spec;
  // Writes `out` (Hugging Face safetensors, the architecture's names and layout) and
  // config.json beside it.
  std::function<void(ExportInput input, const std::string& out)> export_safetensors;
  // Optional: the text of transformers' config.json for the checkpoint (zrt-ckpt export --hf;
  // the tensors are written under their own names, which are transformers'). An entry without
  // it cannot export a Hugging Face directory.
  std::function<std::string(const ExportInput& input)> hf_config;
  // Optional: the tensors as the Hub's files hold them, when that differs from the parameters
  // (a mixture of experts' fused experts split per expert); export_hf writes these. Without
  // it every parameter is written under its own name.
  std::function<std::vector<ExportTensor>(const ExportInput& input,
                                          std::vector<ExportTensor> tensors)>
      hub_tensors;
};

// What zrt-ckpt export --hf writes (models/hf/hf_export.h).
struct HfExportOptions {
  DType dtype = DType::kFloat32;                  // the checkpoint's compute dtype, or --dtype
  std::uint64_t max_shard_bytes = 5000000000ull;  // --max-shard-size (transformers' 5GB)
};

class ModelRegistry {
 public:
  // Throws InvalidArgument if the type is empty, already registered, or a hook is missing.
  void add(ModelEntry entry);

  std::vector<std::string> types() const;  // in registration order
  bool contains(const std::string& type) const;
  // Throws InvalidArgument "unknown model.type 'x' (known: gpt2)" for a type not registered.
  const ModelEntry& entry(const std::string& type) const;

  std::unique_ptr<ModelDef> resolve(const ModelConfig& config) const;
  std::unique_ptr<ModelDef> parse_spec(const std::string& type, const std::string& spec) const;
  // A spec for tools' --model flags (zrt-mem, zrt-bench): one whose preset (the text before
  // ':') belongs to an entry goes to that entry ("llama-3.1-8b", "llama-tiny:seq_len=128");
  // "TYPE:spec" names the entry ("llama:hidden_size=64,..."); anything else is a spec of the
  // default model.type (ModelConfig's), e.g. "n_layer=2,n_head=4,...".
  std::unique_ptr<ModelDef> parse_spec(const std::string& spec) const;
  // Exports a checkpoint with the entry of the saved config's model.type ("gpt2" when the
  // saved config has none, as the config's default).
  void export_safetensors(ExportInput input, const std::string& out) const;
  // Writes a Hugging Face model directory `out_dir` (config.json, generation_config.json, the
  // weights, the tokenizer files of the run's init_from directory) with the entry of the saved
  // config's model.type. Returns the files written, in `out_dir`.
  std::vector<std::string> export_hf(ExportInput input, const std::string& out_dir,
                                     const HfExportOptions& options) const;

 private:
  std::vector<ModelEntry> entries_;
};

// The model block of a saved run config (the JSON text a checkpoint keeps): model.type (the
// config's default when absent), preset, dimensions, init_from. `where` names the checkpoint in
// messages.
ModelConfig saved_model_config(const std::string& config_json, const std::string& where);

// The architectures zrt ships, registered in models/builtin_models.cc.
const ModelRegistry& builtin_models();

// The model of a config's model block, built on `ctx` (the registry's resolve, then build).
// Throws InvalidArgument for an unknown model.type or an invalid block.
std::unique_ptr<Model> make_model(const ModelConfig& config, kernels::KernelContext& ctx,
                                  const ModelOptions& options);

}  // namespace zrt
