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

}  // namespace zrt::train
