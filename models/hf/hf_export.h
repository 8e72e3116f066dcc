// A checkpoint written as a Hugging Face model directory (zrt-ckpt export --hf), loadable by
// transformers' from_pretrained:
//   config.json             the architecture's (ModelEntry::hf_config) over the init_from
//                           directory's own config.json when the run started from one (its other
//                           keys, e.g. token ids, kept), torch_dtype set to the written dtype
//   generation_config.json  the init_from directory's, else bos/eos ids from config.json
//   model.safetensors       or model-0000i-of-0000N.safetensors + model.safetensors.index.json
//                           above the shard size; every parameter under its own name
//   tokenizer files         copied from the init_from directory when it has them
#pragma once

#include <string>
#include <vector>

#include "models/model_registry.h"

namespace zrt::hf {

// The tokenizer files copied from an init_from directory (those present).
const std::vector<std::string>& tokenizer_file_names();

// Writes the directory; returns the files written. `init_from` is the run's model.init_from
// ("" or a file when it did not start from a directory). Throws InvalidArgument naming what
// is wrong, Error when a write fails.
std::vector<std::string> write_hf_directory(ExportInput input, const std::string& config_json,
                                            const std::string& init_from,
                                            const std::string& out_dir,
                                            const HfExportOptions& options);

}  // namespace zrt::hf
