// zrt::Config: the one JSON file that describes a run, validated strictly. DeepSpeed's keys
// (batch sizes, zero_optimization, fp16/bf16, optimizer, scheduler, gradient_clipping,
// communication_data_type, data_types, checkpoint, ...) plus zrt's blocks (model, data, train,
// device, comm, trace, seed, output_dir, log_level). The keys, what zrt does with each and
// their defaults are in key_table.h (and docs/config-keys.md, generated from it); the guide is
// docs/config.md.
//
// Validation is strict: unknown keys (with the closest valid key), wrong types, out-of-range
// values, impossible combinations and DeepSpeed features zrt does not implement are errors
// (zrt::InvalidArgument) whose message starts with the file name and names the key path, e.g.
//   run.json: zero_optimization.stge: unknown key; did you mean 'stage'?
// Harmless DeepSpeed keys are accepted with a warning (logged through spdlog and kept in
// Config::warnings).
//
// Thread-safety: parsing has no shared state; a Config is a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "optimizers/optimizer_config.h"
#include "runtime/checkpoint/checkpoint_options.h"
#include "runtime/comm/process_group.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/model_interface.h"

namespace zrt {

// DeepSpeed's batch rule, solved: train_batch_size = micro_batch_size x
// gradient_accumulation_steps x world_size. (gradient_accumulation_steps is also in
// Config::engine, where the engine reads it.)
struct BatchConfig {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch_size = 0;  // train_micro_batch_size_per_gpu
  int gradient_accumulation_steps = 1;
  int world_size = 1;
};

// The model, as given: a preset plus overrides, a plain description. The model registry
// (models/model_registry.h) resolves it: model.type picks the architecture's entry, which turns
// the block into the model's own config; this library does not depend on models/.
struct ModelConfig {
  // gpt2 | llama | qwen2 | qwen3 | mistral | mixtral | qwen2_moe | qwen3_moe
  std::string type = "gpt2";
  std::string preset;  // "" or one of the type's presets (docs/config-keys.md)
  // GPT-2's dimensions (model.type gpt2).
  std::optional<int> n_layer, n_head, n_embd;
  // Shared by every type.
  std::optional<int> vocab_size, seq_len;
  // The Llama family's (llama, qwen2, qwen3, mistral), named after Hugging Face config.json's keys.
  std::optional<int> hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, head_dim, max_position_embeddings, sliding_window, max_window_layers;
  std::optional<double> rms_norm_eps, rope_theta;
  std::optional<bool> tie_word_embeddings, attention_bias;
  struct RopeScaling {
    std::optional<std::string> rope_type;  // default | linear | llama3 | yarn
    std::optional<double> factor, low_freq_factor, high_freq_factor;
    std::optional<int> original_max_position_embeddings;
    // yarn's (kernels/rope_table.h)
    std::optional<double> attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
    std::optional<bool> truncate;
  } rope_scaling;
  // The mixtures of experts' (mixtral, qwen2_moe, qwen3_moe), config.json's names.
  std::optional<int> num_experts, num_experts_per_tok, moe_intermediate_size,
      shared_expert_intermediate_size, decoder_sparse_step;
  std::optional<bool> norm_topk_prob;
  std::optional<std::vector<int>> mlp_only_layers;
  std::optional<double> router_aux_loss_coef, router_z_loss_coef, capacity_factor;
  bool activation_checkpointing = false;
  // activation_checkpointing.cpu_checkpointing (DeepSpeed's block): the checkpointed block
  // inputs in pinned host memory; only with activation_checkpointing.
  bool cpu_checkpointing = false;
  // model.tiling.head_rows / mlp_rows: rows per tile, 0 automatic, -1 never
  // (models/transformer/tiling.h).
  int head_tile_rows = 0;
  int mlp_tile_rows = 0;
  // model.expert_rows_reserve: under expert parallelism, the rows the local experts' buffers
  // hold at first over the balanced share (models/moe/expert_rows.h).
  double expert_rows_reserve = kDefaultExpertRowsReserve;
  std::string init_from;  // safetensors path, "" for a random init
  // model.frozen / model.trainable: patterns over parameter names (runtime/common/name_pattern.h)
  // of the parameters not trained, or of the only ones trained; at most one of them non-empty
  // (train/frozen_parameters.h applies them).
  std::vector<std::string> frozen, trainable;

  // "gpt2-tiny", "gpt2-tiny:seq_len=128", "n_layer=2,n_head=4,...": the preset, then every key
  // given as key=value (rope_scaling's as rope_scaling.factor=8), the spec syntax of the
  // registry's entries, which resolve the block from it.
  std::string spec() const;
};

struct DataConfig {
  std::string train;  // a path or a glob of llm.c shards, or of packed SFT shards or their folder
  std::string val;    // "" when there is no validation set
  bool shuffle = true;
  std::uint64_t seed = 1234;  // default: Config::seed
  // llm.c shards: attention stops at each document separator and positions restart (Llama 3's
  // intra-document masking); packed SFT shards carry their own boundaries.
  bool document_mask = false;
  std::int64_t document_separator = -1;  // -1: 50256 for 16-bit shards, 128000 for 32-bit ones
};

struct TrainConfig {
  std::int64_t steps = 0;          // optimizer steps
  std::int64_t eval_interval = 0;  // 0: never
  int eval_batches = 10;
  std::int64_t log_interval = 10;
  int sample_tokens = 0;
};

// DeepSpeed's tensorboard and csv_monitor blocks: rank 0 writes the run's scalars under
// <output_path>/<job_name>/ (docs/config.md, "Monitors").
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;  // default: Config::output_dir (DeepSpeed: the launch directory)
  std::string job_name = "DeepSpeedJobName";
  // output_path/job_name (output_path alone when job_name is "", as DeepSpeed joins them).
  std::string log_dir() const {
    return job_name.empty() ? output_path : output_path + "/" + job_name;
  }
};

enum class OffloadDevice { kNone, kCpu, kNvme };
const char* offload_device_name(OffloadDevice d);  // "none", "cpu", "nvme"

// zero_optimization.offload_optimizer / offload_param as written. nvme is rejected at parse
// time (not implemented), so device is kNone or kCpu in a parsed Config; the engine's part
// (enabled, pin_memory) is also copied into Config::engine.offload_*.
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = OffloadOptions{}.pin_memory;
  std::string nvme_path;
  int buffer_count = 0;                   // DeepSpeed: 4 (optimizer), 5 (param)
  std::int64_t buffer_size = 100000000;   // param only
  std::int64_t max_in_cpu = 1000000000;   // param only
  double ratio = OffloadOptions{}.ratio;  // optimizer only: the share offloaded (stage 3)
  std::string split_step = "auto";        // optimizer only: auto, on, off (zrt)
  bool enabled() const { return device != OffloadDevice::kNone; }
};

enum class DeviceChoice { kCpu, kCuda, kAuto };

struct DeviceConfig {
  DeviceChoice type = DeviceChoice::kAuto;
  double memory_limit_gb = 0.0;  // 0: no limit (CPU) / the GPU's memory (CUDA)
  int stream_delay_us = 0;       // CPU debug

  // The DeviceOptions for a rank: `gpu_count` resolves "auto"; `local_rank` picks the GPU.
  // Throws InvalidArgument if type is cuda and no GPU is available.
  // `gpu_count`: the GPUs this process can use (0: none); a node's ranks share them round-robin.
  DeviceOptions options(int gpu_count, int local_rank, std::uint64_t seed) const;
};

struct TraceConfig {
  std::string path;  // "" : off
  std::int64_t first_step = 2;
  std::int64_t last_step = 3;
  bool enabled() const { return !path.empty(); }
};

struct Config {
  std::string source;       // the file name (or the name given to parse_config)
  nlohmann::json document;  // the parsed JSON as written (for checkpoints and logs)

  BatchConfig batch;
  // stage, compute/communication/accumulation dtypes, gradient_accumulation_steps,
  // gradient_clipping, bucket sizes, stage-3 knobs, overlap_comm, fp16 loss scaling.
  EngineOptions engine;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  DeviceConfig device;
  CommOptions comm;
  TraceConfig trace;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  std::uint64_t seed = 1234;
  std::string output_dir = "output";
  std::string log_level = "info";

  std::vector<std::string> warnings;  // "<path>: ..." for every accepted-with-warning key

  bool fp16() const { return engine.compute_dtype == DType::kFloat16; }
  bool bf16() const { return engine.compute_dtype == DType::kBFloat16; }
};

// Reads, parses and validates the config file at `path` for a run on `world_size` ranks.
// world_size <= 0 takes the world size from the file's three batch numbers (all three must
// then be given). Throws InvalidArgument with "<path>: ..." (or "<path>:<line>:<col>: ..." for
// JSON syntax errors and duplicate keys). Every problem of the file is reported in one throw,
// one per line, the most fundamental first: unsupported features and types, unknown keys,
// wrong types and ranges, missing keys, then combinations. (A syntax error stops the reading,
// so it comes alone.) Warnings go to spdlog and Config::warnings.
Config load_config(const std::string& path, int world_size);

// Command-line overrides, in torchtitan's form: {"train.steps", "5"} for --train.steps 5.
using ConfigOverrides = std::vector<std::pair<std::string, std::string>>;

// As load_config, with `overrides` applied (apply_overrides) before validation; a problem with
// an overridden value reads "--train.stpes: unknown key; did you mean 'steps'?".
Config load_config(const std::string& path, int world_size, const ConfigOverrides& overrides);

// Sets each dotted path of `overrides`, in order, in `document` (an object), creating the
// blocks on the way (a null or non-object value on the way is replaced by a block). The value
// is the text parsed as JSON when it is valid JSON (numbers, true/false, null, arrays,
// objects), otherwise the text as a string; a key whose form is a string (or a choice of
// strings) always takes the text, so "--checkpoint.load 100" names tag "100". Returns the
// paths set and the blocks created on the way, for parse_config's messages. Throws
// InvalidArgument for an empty path or one with an empty part ("--a..b").
std::vector<std::string> apply_overrides(nlohmann::json& document,
                                         const ConfigOverrides& overrides);

// As load_config, for an already parsed document; `source_name` starts every message.
Config parse_config(const nlohmann::json& document, int world_size, const std::string& source_name);

// As above; problems at or under `command_line_paths` (apply_overrides' result) are reported
// as coming from the command line ("--path: ...") rather than from `source_name`.
Config parse_config(const nlohmann::json& document, int world_size, const std::string& source_name,
                    const std::vector<std::string>& command_line_paths);

// What parse_config read of a document, problems and all: `problems` are its error lines, most
// fundamental first (empty: the config is valid, and `config` is parse_config's result), and
// `problem_keys` the key path each is about ("" for one about no single key). With problems,
// `config` is what was read, every rejected value at its default: usable only for checks that
// read no key a problem is about (zrt-train --check runs the model's own checks on it when the
// problems lie elsewhere, so that they are reported with the config's).
struct ConfigDraft {
  Config config;
  std::vector<std::string> problems;
  std::vector<std::string> problem_keys;
};
// Throws only where nothing can be read (the document is not an object).
ConfigDraft draft_config(const nlohmann::json& document, int world_size,
                         const std::string& source_name,
                         const std::vector<std::string>& command_line_paths);

// The config as zrt runs it, as a config document: every key zrt reads, with the batch rule
// solved and the defaults filled in (keys that would only draw a warning, such as stage-3
// knobs below stage 3, are left out). parse_config of the result, at the same world size,
// gives the same Config. Shown by zrt-train --check.
nlohmann::json resolved_document(const Config& config);

// As load_config, for JSON text (syntax and duplicate-key checks included).
Config parse_config_text(const std::string& text, int world_size, const std::string& source_name);

}  // namespace zrt
