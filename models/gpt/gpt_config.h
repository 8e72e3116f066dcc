// GptConfig: the GPT-2 architecture's dimensions, with the Hugging Face presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zrt::gpt {

struct GptConfig {
  std::string name = "custom";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;      // C; a multiple of n_head
  int vocab_size = 0;  // V
  int seq_len = 0;     // maximum T (rows of wpe)

  // gpt2-tiny (2 layers, 4 heads, 64 wide, 256 byte-level tokens, seq 256: for tests), gpt2
  // (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.5B). Throws InvalidArgument
  // naming the presets for anything else.
  static GptConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // "gpt2", "gpt2-tiny:seq_len=128", or "n_layer=4,n_head=4,n_embd=128,vocab_size=256,
  // seq_len=128": an optional preset, then key=value overrides. Validated.
  static GptConfig parse(const std::string& spec);

  // Throws InvalidArgument unless every dimension is positive and n_embd % n_head == 0.
  void validate() const;
  std::int64_t num_parameters() const;
  std::string describe() const;  // "gpt2 (L12 H12 C768 V50257 T1024, 124.4M params)"
};

}  // namespace zrt::gpt
