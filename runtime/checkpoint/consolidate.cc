#include "runtime/checkpoint/consolidate.h"

#include <filesystem>

#include "runtime/checkpoint/h5.h"
#include "runtime/checkpoint/rank_file.h"
#include "runtime/common/error.h"
#include "runtime/common/synced_file.h"

namespace zrt::checkpoint {

namespace fs = std::filesystem;

CheckpointIndex open_index(const std::string& dir) {
  return read_index((fs::path(dir) / "index.h5").string());
}

std::vector<std::vector<float>> read_full_params(const std::string& dir,
                                                 const CheckpointIndex& index,
                                                 const std::string& dataset) {
  std::vector<std::vector<float>> out;
  std::vector<unsigned char> scratch;
  std::vector<std::unique_ptr<H5File>> files;
  std::vector<std::unique_ptr<H5Dataset>> master;  // per rank file; null where none was written
  for (int r = 0; r < index.world; ++r) {
    const std::int64_t elements = index.rank_elements[static_cast<std::size_t>(r)];
    if (elements == 0) {
      files.emplace_back();
      master.emplace_back();
      continue;
    }
    const std::string path = (fs::path(dir) / rank_file_name(r)).string();
    files.push_back(std::make_unique<H5File>(H5File::open_read(path)));
    check_rank_file(*files.back(), index, r);  // the format, its rank and world, the save
    master.push_back(std::make_unique<H5Dataset>(*files.back(), dataset, H5Elem::kFloat32,
                                                 std::vector<std::int64_t>{elements}));
  }
  for (const ParamEntry& e : index.params) {
    const UnitEntry& u = index.units[static_cast<std::size_t>(e.unit)];
    std::vector<float> values(static_cast<std::size_t>(e.numel));
    std::int64_t done = 0;
    while (done < e.numel) {
      const std::int64_t idx = e.offset + done;
      const SliceEntry& slice = u.slices[static_cast<std::size_t>(idx / u.shard)];
      const std::int64_t within = idx % u.shard;
      const std::int64_t n = std::min(e.numel - done, u.shard - within);
      master[static_cast<std::size_t>(slice.rank)]->read(slice.offset + within, n,
                                                         values.data() + done, true, scratch);
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
    if (index.rank_elements[static_cast<std::size_t>(r)] == 0) continue;  // no file written
    bytes += verify_rank_file((fs::path(dir) / rank_file_name(r)).string(), index, r);
  }
  return bytes;
}

void write_consolidated(const std::string& dir, const std::string& out) {
  const CheckpointIndex index = open_index(dir);
  const auto values = read_full_params(dir, index);
  const std::string tmp = out + ".tmp";
  try {
    H5File file = H5File::create(tmp);
    // The data and a generous bound on HDF5's metadata (each dataset's checksum array and
    // object header), allocated before anything is written, as a rank file's are: a full disk
    // is reported here, not by a failed close, after which HDF5 crashes at exit.
    std::int64_t bytes = 64 << 10;
    for (const auto& v : values) {
      const std::int64_t data = static_cast<std::int64_t>(v.size()) * 4;
      bytes += data + 4 * ((data + kTensorBlockBytes - 1) / kTensorBlockBytes) + (4 << 10);
    }
    file.reserve(bytes);
    write_attr(file.id(), "format", std::string("zrt-consolidated"));
    write_attr(file.id(), "step", index.step);
    H5Id group(H5Gcreate2(file.id(), "/params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    for (std::size_t p = 0; p < index.params.size(); ++p) {
      write_dataset(file, "/params/" + index.params[p].name, H5Elem::kFloat32,
                    index.params[p].shape, values[p].data(), kTensorBlockBytes);
    }
    group.reset();
    file.close();
    fsync_path(tmp);
    fs::rename(tmp, out);
  } catch (...) {
    // A failed write (a full disk) takes its partial file with it (it would only fill the disk
    // and look like an output); the error goes on.
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

}  // namespace zrt::checkpoint
