// A short byte-level sample of the trained model: train.sample_tokens bytes after the prompt
// "And God said", drawn at temperature 0.8 with the run's seed. Every rank runs the same
// forwards (stage 3 gathers are collective) with the same seed, so every rank draws the same
// text. For byte-level models (vocabulary 256) only.
#pragma once

#include <string>

#include "config/config.h"
#include "runtime/device/device.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/model_interface.h"

namespace zrt::train {

// The prompt and the sampled bytes. `seq_len` and `vocab_size` are the model's (ModelFactory).
// Collective over the engine's groups.
std::string sample_text(const Config& config, Device& device, Stream& compute, Model& model,
                        ZeroEngine& engine, int seq_len, int vocab_size);

// A byte-level model's sample as one log line: UTF-8 text kept, a newline as "\n", other
// control bytes and bytes that are no UTF-8 as \xNN (a terminal or grep would take the line as
// binary otherwise).
std::string printable_sample(const std::string& bytes);

}  // namespace zrt::train
