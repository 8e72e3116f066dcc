// The spec keys the Llama family and the mixtures of experts share: config.json's names for a
// decoder's shape, attention and positions (rope_scaling.*: models/rope_scaling.h). One setter for
// both configs (their fields carry the same names), so a key added here reaches both families, with
// the same defaults applied after.
#pragma once

#include <algorithm>
#include <string>

#include "models/rope_scaling.h"
#include "models/spec_values.h"

namespace zrt {

// Which of the keys with a derived default a spec gave.
struct DecoderShapeKeysGiven {
  bool key_value_heads = false;
  bool head_dim = false;
  bool rope_original = false;  // rope_scaling.original_max_position_embeddings (yarn needs it)
};

// Sets `c`'s field named `key` from `value` (InvalidArgument naming `family` if the value does not
// parse) and returns true; false for a key not in the shared set.
template <class Config>
bool set_decoder_shape_key(Config& c, const char* family, const std::string& key,
                           const std::string& value, DecoderShapeKeysGiven& given) {
  const auto int_key = [&](int& field) { field = spec_int(family, key, value); };
  if (set_rope_scaling_key(c.rope_scaling, family, key, value, given.rope_original)) return true;
  if (key == "hidden_size") {
    int_key(c.hidden_size);
  } else if (key == "intermediate_size") {
    int_key(c.intermediate_size);
  } else if (key == "num_hidden_layers") {
    int_key(c.num_hidden_layers);
  } else if (key == "num_attention_heads") {
    int_key(c.num_attention_heads);
  } else if (key == "num_key_value_heads") {
    int_key(c.num_key_value_heads);
    given.key_value_heads = true;
  } else if (key == "head_dim") {
    int_key(c.head_dim);
    given.head_dim = true;
  } else if (key == "vocab_size") {
    int_key(c.vocab_size);
  } else if (key == "max_position_embeddings") {
    int_key(c.max_position_embeddings);
  } else if (key == "seq_len") {
    int_key(c.seq_len);
  } else if (key == "rms_norm_eps") {
    c.rms_norm_eps = spec_double(family, key, value);
  } else if (key == "rope_theta") {
    c.rope_theta = spec_double(family, key, value);
  } else if (key == "tie_word_embeddings") {
    c.tie_word_embeddings = spec_bool(family, key, value);
  } else if (key == "attention_bias") {
    c.attention_bias = spec_bool(family, key, value);
  } else if (key == "sliding_window") {
    int_key(c.sliding_window);
  } else {
    return false;
  }
  return true;
}

// config.json's defaults for a spec without a preset: no num_key_value_heads is multi-head
// attention, no head_dim is hidden_size / num_attention_heads; seq_len defaults to the positions
// the model has, at most `max_default_seq_len`.
template <class Config>
void apply_decoder_shape_defaults(Config& c, const DecoderShapeKeysGiven& given,
                                  int max_default_seq_len) {
  if (!given.key_value_heads) c.num_key_value_heads = c.num_attention_heads;
  if (!given.head_dim && c.num_attention_heads > 0) {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.seq_len == 0) c.seq_len = std::min(c.max_position_embeddings, max_default_seq_len);
}

}  // namespace zrt
