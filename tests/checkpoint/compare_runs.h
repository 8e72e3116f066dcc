// Comparing zrt-train runs through what they leave on disk (tests that launch zrt-train): the
// training losses of metrics.jsonl, the checkpoint `latest` names, and two checkpoints' state
// bit for bit.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpointer.h"
#include "runtime/checkpoint/consolidate.h"
#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/rank_file.h"

namespace zrt::test {

// Training losses by step from a metrics.jsonl.
inline std::map<std::int64_t, double> metrics_losses(const std::filesystem::path& metrics) {
  std::map<std::int64_t, double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("loss")) out[row["step"].get<std::int64_t>()] = row["loss"].get<double>();
  }
  return out;
}

// The directory of the checkpoint <save_dir>/latest names (which must exist).
inline std::string latest_dir(const std::string& save_dir) {
  const auto tag = checkpoint::read_latest(save_dir);
  REQUIRE(tag.has_value());
  return (std::filesystem::path(save_dir) / *tag).string();
}

// Every state dataset of every rank file of two checkpoints, bit for bit.
inline void require_identical_state(const std::string& a, const std::string& b) {
  using namespace checkpoint;
  const CheckpointIndex ia = open_index(a);
  const CheckpointIndex ib = open_index(b);
  REQUIRE(ia.world == ib.world);
  CHECK(ia.step == ib.step);
  CHECK(ia.optimizer_steps == ib.optimizer_steps);
  CHECK(ia.data.position == ib.data.position);
  for (int r = 0; r < ia.world; ++r) {
    const H5File fa = H5File::open_read((std::filesystem::path(a) / rank_file_name(r)).string());
    const H5File fb = H5File::open_read((std::filesystem::path(b) / rank_file_name(r)).string());
    REQUIRE(ia.state_datasets() == ib.state_datasets());
    for (const std::string& name : ia.state_datasets()) {
      std::vector<float> va(static_cast<std::size_t>(ia.slice_elements()));
      std::vector<float> vb(va.size());
      H5Dataset(fa, name, H5Elem::kFloat32, {ia.slice_elements()}).read_all(va.data());
      H5Dataset(fb, name, H5Elem::kFloat32, {ib.slice_elements()}).read_all(vb.data());
      INFO("rank " << r << " " << name);
      CHECK(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0);
    }
  }
}

}  // namespace zrt::test
