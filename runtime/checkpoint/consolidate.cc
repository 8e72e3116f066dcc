#include "runtime/checkpoint/consolidate.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "models/gpt/gpt_config.h"
#include "models/safetensors.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace fs = std::filesystem;

CheckpointIndex open_index(const std::string& dir) {
  return read_index((fs::path(dir) / "index.h5").string());
}

std::vector<std::vector<float>> read_full_params(const std::string& dir,
                                                 const CheckpointIndex& index) {
  std::vector<std::vector<float>> out;
  std::vector<unsigned char> scratch;
  std::vector<std::unique_ptr<H5File>> files;
  std::vector<std::unique_ptr<H5Dataset>> master;
  for (int r = 0; r < index.world; ++r) {
    const std::string path = (fs::path(dir) / rank_file_name(r)).string();
    files.push_back(std::make_unique<H5File>(H5File::open_read(path)));
    if (read_attr_string(files.back()->id(), "format", path) != kRankFormat) {
      ZRT_THROW(InvalidArgument, "{}: not a zrt checkpoint rank file", path);
    }
    master.push_back(
        std::make_unique<H5Dataset>(*files.back(), kMasterDataset, H5Elem::kFloat32,
                                    std::vector<std::int64_t>{index.slice_elements()}));
  }
  for (const ParamEntry& e : index.params) {
    const UnitEntry& u = index.units[static_cast<std::size_t>(e.unit)];
    std::vector<float> values(static_cast<std::size_t>(e.numel));
    std::int64_t done = 0;
    while (done < e.numel) {
      const std::int64_t idx = e.offset + done;
      const auto rank = static_cast<std::size_t>(idx / u.shard);
      const std::int64_t within = idx % u.shard;
      const std::int64_t n = std::min(e.numel - done, u.shard - within);
      master[rank]->read(u.slice_offset + within, n, values.data() + done, true, scratch);
      done += n;
    }
    out.push_back(std::move(values));
  }
  return out;
}

std::int64_t verify_checkpoint(const std::string& dir) {
  const CheckpointIndex index = open_index(dir);  // verifies the index's own datasets
  std::int64_t bytes = 0;
  for (int r = 0; r < index.world; ++r) {
    bytes += verify_rank_file((fs::path(dir) / rank_file_name(r)).string(), index, r);
  }
  return bytes;
}

void write_consolidated(const std::string& dir, const std::string& out) {
  const CheckpointIndex index = open_index(dir);
  const auto values = read_full_params(dir, index);
  const std::string tmp = out + ".tmp";
  {
    H5File file = H5File::create(tmp);
    write_attr(file.id(), "format", std::string("zrt-consolidated"));
    write_attr(file.id(), "step", index.step);
    H5Id group(H5Gcreate2(file.id(), "/params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    for (std::size_t p = 0; p < index.params.size(); ++p) {
      write_dataset(file, "/params/" + index.params[p].name, H5Elem::kFloat32,
                    index.params[p].shape, values[p].data(), kTensorBlockBytes);
    }
    group.reset();
    file.close();
  }
  fsync_path(tmp);
  fs::rename(tmp, out);
}

void export_safetensors(const std::string& dir, const std::string& out) {
  const CheckpointIndex index = open_index(dir);
  auto values = read_full_params(dir, index);
  std::vector<std::pair<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>>
      tensors;
  int n_layer = 0;
  std::int64_t vocab = 0, n_positions = 0, n_embd = 0;
  for (std::size_t p = 0; p < index.params.size(); ++p) {
    const ParamEntry& e = index.params[p];
    if (e.name == "transformer.wte.weight" && e.shape.size() == 2) {
      vocab = e.shape[0];
      n_embd = e.shape[1];
    }
    if (e.name == "transformer.wpe.weight" && e.shape.size() == 2) n_positions = e.shape[0];
    if (e.name.rfind("transformer.h.", 0) == 0) {
      n_layer = std::max(n_layer, std::stoi(e.name.substr(14)) + 1);
    }
    tensors.emplace_back(e.name, std::make_pair(e.shape, std::move(values[p])));
  }
  if (vocab == 0 || n_positions == 0 || n_layer == 0) {
    ZRT_THROW(InvalidArgument,
              "{}: not a GPT-2 checkpoint (no transformer.wte / wpe / h.* parameters)", dir);
  }
  // n_head is not visible in the shapes: it comes from the run's config.
  int n_head = 0;
  const auto config = nlohmann::json::parse(index.config_json, nullptr, false);
  if (!config.is_discarded() && config.contains("model")) {
    const auto& m = config["model"];
    if (m.contains("n_head")) n_head = m["n_head"].get<int>();
    if (n_head == 0 && m.contains("preset")) {
      n_head = gpt::GptConfig::preset(m["preset"].get<std::string>()).n_head;
    }
  }
  if (n_head == 0) {
    ZRT_THROW(InvalidArgument, "{}: the saved config does not give model.n_head", dir);
  }
  write_safetensors(out, tensors, {{"format", "pt"}});
  nlohmann::json hf;
  hf["architectures"] = {"GPT2LMHeadModel"};
  hf["model_type"] = "gpt2";
  hf["vocab_size"] = vocab;
  hf["n_positions"] = n_positions;
  hf["n_ctx"] = n_positions;
  hf["n_embd"] = n_embd;
  hf["n_layer"] = n_layer;
  hf["n_head"] = n_head;
  hf["activation_function"] = "gelu_new";
  hf["layer_norm_epsilon"] = 1e-5;
  hf["tie_word_embeddings"] = true;
  hf["torch_dtype"] = "float32";
  const fs::path config_path = fs::path(out).parent_path() / "config.json";
  std::ofstream config_file(config_path);
  config_file << hf.dump(2) << "\n";
  config_file.flush();
  if (!config_file) {
    ZRT_THROW(Error, "{}: cannot write: {}", config_path.string(), std::strerror(errno));
  }
}

}  // namespace zrt::checkpoint
