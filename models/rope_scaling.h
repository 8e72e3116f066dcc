// Rotary scaling as config.json writes it ("rope_scaling", or transformers v5's
// "rope_parameters"), shared by the Llama family, the mixtures of experts and the config.json
// reader: the fields under their config.json names, what the kernels' table takes
// (kernels/rope_table.h says what each rope_type does), the spec keys that set them
// (decoder_shape_keys.h: model.rope_scaling.* of a run config) and the config.json value an export
// writes; rope_scaling_check.h checks a run's keys against a Hugging Face directory's.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kernels/rope_table.h"

namespace zrt {

struct RopeScaling {
  std::string rope_type = "default";  // "default" (none), "linear", "llama3" or "yarn"
  double factor = 1.0;                // llama3: 8 for Llama 3.1, 32 for Llama 3.2; yarn: 4 (Qwen3)
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  // llama3, yarn (yarn: required in a run config; config.json without it: max_position_embeddings)
  int original_max_position_embeddings = 8192;
  // yarn; 0 where the key is absent (kernels::RopeScalingParams's defaults).
  double attention_factor = 0;
  double beta_fast = 0, beta_slow = 0;
  double mscale = 0, mscale_all_dim = 0;
  bool truncate = true;

  // The kernels' form (kernels/rope_table.h).
  kernels::RopeScalingParams params() const;
  // transformers' config.json value: null for default, else the rope_type's keys (yarn's
  // optional ones only where given).
  nlohmann::json hf_json() const;
  // The longest sequence a model of `max_position_embeddings` positions trains at: those, or with
  // yarn up to original_max_position_embeddings x factor (Qwen's model cards add the yarn block
  // alone, leaving max_position_embeddings at the pretrained 40960, and set the length in the
  // serving engine). Every position is rotated, never looked up, so nothing else bounds it.
  std::int64_t position_limit(int max_position_embeddings) const;
  // The error of a seq_len past position_limit, naming both fixes.
  std::string position_limit_error(int seq_len, int max_position_embeddings) const;
  // For a model's one-line description: " yarn x4 of 32768", " linear x2"; "" for default and
  // llama3 (the Llama 3.1/3.2 presets' own, which their names say).
  std::string describe() const;
};

// Sets the field of spec key `key` ("rope_scaling.factor", ...) from `value` (InvalidArgument
// naming `family` if it does not parse) and returns true; false for any other key.
// `original_given` records rope_scaling.original_max_position_embeddings.
bool set_rope_scaling_key(RopeScaling& s, const char* family, const std::string& key,
                          const std::string& value, bool& original_given);

// YaRN measures its ramp against the context the model was pretrained at: a run config that asks
// for yarn without rope_scaling.original_max_position_embeddings is refused (8192, llama3's
// default, would silently be another model).
void require_yarn_original(const RopeScaling& s, bool original_given,
                           const std::string& architecture);

}  // namespace zrt
