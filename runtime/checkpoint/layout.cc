#include "runtime/checkpoint/layout.h"

#include <algorithm>

#include <cstring>

#include "runtime/checkpoint/h5.h"
#include "runtime/common/error.h"

namespace zrt::checkpoint {

namespace {

// Upper bounds for tables read without a model to compare with (zrt-ckpt): a corrupt count
// must not turn into a huge allocation.
constexpr std::int64_t kMaxParams = 1 << 20;
constexpr std::int64_t kMaxDims = 8;

std::vector<std::int64_t> read_ints(const H5File& file, const std::string& name,
                                    std::int64_t count) {
  H5Dataset ds(file, name, H5Elem::kInt64, {count});
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  ds.read_all(v.data());
  return v;
}

std::int64_t dataset_length(const H5File& file, const std::string& name) {
  if (!file.has(name)) ZRT_THROW(InvalidArgument, "{}: missing", where(file, name));
  H5Id ds(H5Dopen2(file.id(), name.c_str(), H5P_DEFAULT));
  H5Id space(H5Dget_space(ds.get()));
  if (H5Sget_simple_extent_ndims(space.get()) != 1) {
    ZRT_THROW(InvalidArgument, "{}: not one-dimensional", where(file, name));
  }
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  return static_cast<std::int64_t>(n);
}

// Format 2's unit and slice tables into index.units and index.rank_elements, checked: every
// slice inside its rank file, and the slices of each rank file tiling it exactly.
void read_slice_tables(const H5File& file, const std::string& path, std::int64_t U,
                       const std::vector<std::int64_t>& u_numel,
                       const std::vector<std::int64_t>& u_shard, CheckpointIndex& index) {
  const auto u_group = read_ints(file, "/unit_group", U);
  const auto u_slices = read_ints(file, "/unit_slices", U);
  if (dataset_length(file, "/rank_elements") != index.world) {
    ZRT_THROW(InvalidArgument, "{}: dataset '/rank_elements' does not have world = {} rows", path,
              index.world);
  }
  index.rank_elements = read_ints(file, "/rank_elements", index.world);
  std::int64_t S = 0;
  for (std::int64_t u = 0; u < U; ++u) {
    const std::int64_t n = u_slices[static_cast<std::size_t>(u)];
    if (n < 1 || n > index.world) {
      ZRT_THROW(InvalidArgument, "{}: dataset '/unit_slices': unit {} has {} slices (world {})",
                path, u, n, index.world);
    }
    S += n;
  }
  const auto s_rank = read_ints(file, "/slice_rank", S);
  const auto s_offset = read_ints(file, "/slice_offset", S);
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> per_rank(
      static_cast<std::size_t>(index.world));  // (offset, length) of each slice in a rank file
  std::int64_t at = 0;
  for (std::int64_t u = 0; u < U; ++u) {
    const auto i = static_cast<std::size_t>(u);
    UnitEntry e{u_numel[i], u_shard[i], u_group[i], {}};
    if (e.shard < 0 || e.numel != e.shard * u_slices[i] || e.group < 0) {
      ZRT_THROW(InvalidArgument,
                "{}: unit table row {} is inconsistent (numel {}, shard {}, {} slices, group {})",
                path, u, e.numel, e.shard, u_slices[i], e.group);
    }
    for (std::int64_t k = 0; k < u_slices[i]; ++k, ++at) {
      const SliceEntry slice{s_rank[static_cast<std::size_t>(at)],
                             s_offset[static_cast<std::size_t>(at)]};
      if (slice.rank < 0 || slice.rank >= index.world || slice.offset < 0 ||
          slice.offset + e.shard > index.rank_elements[static_cast<std::size_t>(slice.rank)]) {
        ZRT_THROW(InvalidArgument,
                  "{}: slice {} of unit {} (rank {}, offset {}, {} elements) is outside its rank "
                  "file (world {})",
                  path, k, u, slice.rank, slice.offset, e.shard, index.world);
      }
      per_rank[static_cast<std::size_t>(slice.rank)].emplace_back(slice.offset, e.shard);
      e.slices.push_back(slice);
    }
    index.units.push_back(std::move(e));
  }
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    std::sort(per_rank[r].begin(), per_rank[r].end());
    std::int64_t end = 0;
    for (const auto& [offset, length] : per_rank[r]) {
      if (offset != end) {
        ZRT_THROW(InvalidArgument,
                  "{}: the slices in rank file {} {} at element {} (the slice table is "
                  "inconsistent)",
                  path, r, offset < end ? "overlap" : "leave a gap", std::min(offset, end));
      }
      end += length;
    }
    if (end != index.rank_elements[r]) {
      ZRT_THROW(InvalidArgument,
                "{}: dataset '/rank_elements': rank file {} holds {} elements but its slices {}",
                path, r, index.rank_elements[r], end);
    }
  }
}

std::string show(const std::vector<std::int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

}  // namespace

std::int64_t RankShare::file_elements() const {
  std::int64_t n = 0;
  for (const StateRange& r : written) n += r.count;
  return n;
}

std::int64_t CheckpointIndex::slice_elements() const {
  ZRT_CHECK(!rank_elements.empty(), "checkpoint index with no rank files");
  for (std::int64_t n : rank_elements) {
    ZRT_CHECK(n == rank_elements.front(),
              "the rank files of this checkpoint differ in length ({} and {} elements): it was "
              "saved over several shard groups, read it unit by unit",
              rank_elements.front(), n);
  }
  return rank_elements.front();
}

std::vector<std::string> CheckpointIndex::state_datasets() const {
  std::vector<std::string> names = {kMasterDataset};
  for (const std::string& state : optimizer_states) names.push_back("/" + state);
  return names;
}

void fill_tables(CheckpointIndex& index, const std::vector<ParamSpec>& params,
                 const PartitionPlan& plan) {
  ZRT_CHECK(plan.group_count() == 1,
            "fill_tables: the plan's units live over {} shard groups; the tables of such a plan "
            "come from every rank (describe_engine and the checkpointer's gather)",
            plan.group_count());
  index.world = plan.world();
  index.params.clear();
  index.units.clear();
  for (std::size_t p = 0; p < params.size(); ++p) {
    const ParamPlacement& pl = plan.placement(static_cast<int>(p));
    index.params.push_back(
        ParamEntry{params[p].name, params[p].shape, params[p].numel(), pl.unit, pl.offset, -1});
  }
  for (const Unit& u : plan.units()) {
    UnitEntry entry{u.numel, u.shard, 0, {}};
    for (int r = 0; r < plan.world(); ++r) {
      entry.slices.push_back(SliceEntry{r, u.offset / plan.world()});
    }
    index.units.push_back(std::move(entry));
  }
  index.rank_elements.assign(static_cast<std::size_t>(plan.world()), plan.total_shard());
  index.share = RankShare{};
  index.share.held = plan.total_shard();
  index.share.written = {StateRange{0, plan.total_shard()}};
}

std::string rank_file_name(int rank) {
  return fmt::format("rank_{:05d}.h5", rank);
}

void write_index(const std::string& path, const CheckpointIndex& index) {
  H5File file = H5File::create(path);
  // The tables, the attributes (the config's JSON the largest) and room for HDF5's metadata,
  // allocated up front so a full disk is reported before HDF5 writes (h5.h).
  std::int64_t dims_total = 0, slices_total = 0;
  for (const ParamEntry& e : index.params) dims_total += static_cast<std::int64_t>(e.shape.size());
  for (const UnitEntry& u : index.units) slices_total += static_cast<std::int64_t>(u.slices.size());
  file.reserve((64 << 10) + static_cast<std::int64_t>(index.config_json.size()) +
               static_cast<std::int64_t>(index.params.size()) * (kNameBytes + 6 * 8) +
               dims_total * 8 + static_cast<std::int64_t>(index.units.size()) * 4 * 8 +
               slices_total * 2 * 8 + static_cast<std::int64_t>(index.world) * 8);
  const hid_t root = file.id();
  write_attr(root, "format", std::string(kIndexFormat));
  write_attr(root, "format_version", kFormatVersion);
  write_attr(root, "step", index.step);
  write_attr(root, "optimizer_steps", index.optimizer_steps);
  write_attr(root, "skipped_steps", index.skipped_steps);
  write_attr(root, "world", std::int64_t{index.world});
  write_attr(root, "stage", std::int64_t{index.stage});
  write_attr(root, "compute_dtype", index.compute_dtype);
  write_attr(root, "master_dtype", index.master_dtype);
  write_attr(root, "optimizer", index.optimizer);
  std::string states;
  for (const std::string& s : index.optimizer_states) states += (states.empty() ? "" : ",") + s;
  write_attr(root, "optimizer_states", states);
  write_attr(root, "seed", static_cast<std::int64_t>(index.seed));
  if (index.save_id != 0) write_attr(root, "save_id", index.save_id);
  write_attr(root, "loss_scale", index.loss_scale.scale);
  write_attr(root, "loss_scale_iteration", index.loss_scale.iteration);
  write_attr(root, "loss_scale_last_overflow", index.loss_scale.last_overflow_iteration);
  write_attr(root, "loss_scale_hysteresis_left", std::int64_t{index.loss_scale.hysteresis_left});
  write_attr(root, "data_position", index.data.position);
  write_attr(root, "data_shuffle", std::int64_t{index.data.shuffle ? 1 : 0});
  write_attr(root, "data_seed", static_cast<std::int64_t>(index.data.seed));
  write_attr(root, "data_seq_len", std::int64_t{index.data.seq_len});
  write_attr(root, "data_group", index.data.group);
  write_attr(root, "data_num_samples", index.data.num_samples);
  if (!index.data.fingerprint.empty()) {
    write_attr(root, "data_fingerprint", index.data.fingerprint);
  }
  write_attr(root, "scheduler", index.scheduler);
  write_attr(root, "config", index.config_json);

  const auto P = static_cast<std::int64_t>(index.params.size());
  std::vector<char> names(static_cast<std::size_t>(P * kNameBytes), '\0');
  std::vector<std::int64_t> ndim, dims, numel, unit, offset, steps;
  bool steps_known = true;
  for (std::int64_t p = 0; p < P; ++p) {
    const ParamEntry& e = index.params[static_cast<std::size_t>(p)];
    ZRT_CHECK(static_cast<std::int64_t>(e.name.size()) < kNameBytes,
              "parameter name '{}' is longer than {} bytes", e.name, kNameBytes - 1);
    std::memcpy(names.data() + p * kNameBytes, e.name.data(), e.name.size());
    ndim.push_back(static_cast<std::int64_t>(e.shape.size()));
    dims.insert(dims.end(), e.shape.begin(), e.shape.end());
    numel.push_back(e.numel);
    unit.push_back(e.unit);
    offset.push_back(e.offset);
    steps.push_back(e.steps);
    steps_known = steps_known && e.steps >= 0;
  }
  write_dataset(file, "/param_name", H5Elem::kString, {P}, names.data(), 0, kNameBytes);
  write_dataset(file, "/param_ndim", H5Elem::kInt64, {P}, ndim.data());
  write_dataset(file, "/param_dims", H5Elem::kInt64, {static_cast<std::int64_t>(dims.size())},
                dims.data());
  write_dataset(file, "/param_numel", H5Elem::kInt64, {P}, numel.data());
  write_dataset(file, "/param_unit", H5Elem::kInt64, {P}, unit.data());
  write_dataset(file, "/param_offset", H5Elem::kInt64, {P}, offset.data());
  if (steps_known) write_dataset(file, "/param_steps", H5Elem::kInt64, {P}, steps.data());
  std::vector<std::int64_t> u_numel, u_shard, u_group, u_slices, s_rank, s_offset;
  for (const UnitEntry& u : index.units) {
    u_numel.push_back(u.numel);
    u_shard.push_back(u.shard);
    u_group.push_back(u.group);
    u_slices.push_back(static_cast<std::int64_t>(u.slices.size()));
    for (const SliceEntry& slice : u.slices) {
      s_rank.push_back(slice.rank);
      s_offset.push_back(slice.offset);
    }
  }
  const auto U = static_cast<std::int64_t>(index.units.size());
  const auto S = static_cast<std::int64_t>(s_rank.size());
  ZRT_CHECK(static_cast<int>(index.rank_elements.size()) == index.world,
            "checkpoint index: {} rank file lengths for a world of {}", index.rank_elements.size(),
            index.world);
  write_dataset(file, "/unit_numel", H5Elem::kInt64, {U}, u_numel.data());
  write_dataset(file, "/unit_shard", H5Elem::kInt64, {U}, u_shard.data());
  write_dataset(file, "/unit_group", H5Elem::kInt64, {U}, u_group.data());
  write_dataset(file, "/unit_slices", H5Elem::kInt64, {U}, u_slices.data());
  write_dataset(file, "/slice_rank", H5Elem::kInt64, {S}, s_rank.data());
  write_dataset(file, "/slice_offset", H5Elem::kInt64, {S}, s_offset.data());
  write_dataset(file, "/rank_elements", H5Elem::kInt64, {static_cast<std::int64_t>(index.world)},
                index.rank_elements.data());
  file.close();
}

CheckpointIndex read_index(const std::string& path, const std::vector<ParamSpec>* expect) {
  H5File file = H5File::open_read(path);
  const hid_t root = file.id();
  if (!has_attr(root, "format", path) || read_attr_string(root, "format", path) != kIndexFormat) {
    ZRT_THROW(InvalidArgument,
              "{}: not a zrt checkpoint index (root attribute 'format' is not '{}')", path,
              kIndexFormat);
  }
  const std::int64_t version = read_attr_int(root, "format_version", path);
  if (version != kFormatVersion && version != kOneWorldFormatVersion) {
    ZRT_THROW(InvalidArgument,
              "{}: checkpoint format version {}, this zrt reads versions {} and {}", path, version,
              kOneWorldFormatVersion, kFormatVersion);
  }
  CheckpointIndex index;
  index.step = read_attr_int(root, "step", path);
  index.optimizer_steps = read_attr_int(root, "optimizer_steps", path);
  index.skipped_steps = read_attr_int(root, "skipped_steps", path);
  // Range-checked below; clamped here so a foreign value cannot wrap into range as an int.
  const auto small = [](std::int64_t v) {
    return static_cast<int>(std::clamp<std::int64_t>(v, -1, std::int64_t{1} << 30));
  };
  index.world = small(read_attr_int(root, "world", path));
  index.stage = small(read_attr_int(root, "stage", path));
  index.compute_dtype = read_attr_string(root, "compute_dtype", path);
  index.master_dtype = read_attr_string(root, "master_dtype", path);
  if (has_attr(root, "optimizer", path)) {
    index.optimizer = read_attr_string(root, "optimizer", path);
    index.optimizer_states.clear();
    const std::string states = read_attr_string(root, "optimizer_states", path);
    std::size_t begin = 0;
    while (begin <= states.size()) {
      const std::size_t end = std::min(states.find(',', begin), states.size());
      if (end > begin) index.optimizer_states.push_back(states.substr(begin, end - begin));
      begin = end + 1;
    }
    if (index.optimizer_states.empty()) {
      ZRT_THROW(InvalidArgument, "{}: optimizer '{}' with no state datasets", path,
                index.optimizer);
    }
  }  // else: written before the optimizer seam, by Adam (the defaults)
  index.seed = static_cast<std::uint64_t>(read_attr_int(root, "seed", path));
  index.save_id = has_attr(root, "save_id", path) ? read_attr_int(root, "save_id", path) : 0;
  index.loss_scale.scale = read_attr_double(root, "loss_scale", path);
  index.loss_scale.iteration = read_attr_int(root, "loss_scale_iteration", path);
  index.loss_scale.last_overflow_iteration = read_attr_int(root, "loss_scale_last_overflow", path);
  index.loss_scale.hysteresis_left =
      static_cast<int>(read_attr_int(root, "loss_scale_hysteresis_left", path));
  index.data.position = read_attr_int(root, "data_position", path);
  index.data.shuffle = read_attr_int(root, "data_shuffle", path) != 0;
  index.data.seed = static_cast<std::uint64_t>(read_attr_int(root, "data_seed", path));
  index.data.seq_len = static_cast<int>(read_attr_int(root, "data_seq_len", path));
  index.data.group = read_attr_int(root, "data_group", path);
  index.data.num_samples = read_attr_int(root, "data_num_samples", path);
  if (has_attr(root, "data_fingerprint", path)) {
    index.data.fingerprint = read_attr_string(root, "data_fingerprint", path);
  }
  index.scheduler = read_attr_string(root, "scheduler", path);
  index.config_json = read_attr_string(root, "config", path);
  if (index.world < 1 || index.world > (1 << 20) || index.stage < 0 || index.stage > 3 ||
      index.step < 0) {
    ZRT_THROW(InvalidArgument, "{}: world {}, stage {}, step {} out of range", path, index.world,
              index.stage, index.step);
  }
  if (index.master_dtype != "float32") {
    ZRT_THROW(InvalidArgument, "{}: master_dtype is '{}', zrt checkpoints hold float32", path,
              index.master_dtype);
  }

  // The parameter table: its length is checked against the model before anything sized by it.
  const std::int64_t P = dataset_length(file, "/param_name");
  if (expect != nullptr && P != static_cast<std::int64_t>(expect->size())) {
    ZRT_THROW(InvalidArgument,
              "{}: dataset '/param_name': the checkpoint has {} parameters, the model {} "
              "(another model?)",
              path, P, expect->size());
  }
  if (P < 1 || P > kMaxParams) {
    ZRT_THROW(InvalidArgument, "{}: dataset '/param_name': {} parameters", path, P);
  }
  std::vector<char> names(static_cast<std::size_t>(P * kNameBytes));
  H5Dataset(file, "/param_name", H5Elem::kString, {P}, kNameBytes).read_all(names.data());
  const auto ndim = read_ints(file, "/param_ndim", P);
  std::int64_t total_dims = 0;
  for (std::int64_t p = 0; p < P; ++p) {
    const std::int64_t n = ndim[static_cast<std::size_t>(p)];
    if (n < 0 || n > kMaxDims) {
      ZRT_THROW(InvalidArgument, "{}: dataset '/param_ndim': parameter {} has {} dimensions", path,
                p, n);
    }
    total_dims += n;
  }
  const auto dims = read_ints(file, "/param_dims", total_dims);
  const auto numel = read_ints(file, "/param_numel", P);
  const auto unit = read_ints(file, "/param_unit", P);
  const auto offset = read_ints(file, "/param_offset", P);
  // Absent in indexes written before it: every parameter then counts the run's steps.
  const auto steps = file.has("/param_steps") ? read_ints(file, "/param_steps", P)
                                              : std::vector<std::int64_t>(P, -1);
  const std::int64_t U = dataset_length(file, "/unit_numel");
  if (U < 1 || U > kMaxParams + 1) {
    ZRT_THROW(InvalidArgument, "{}: dataset '/unit_numel': {} units", path, U);
  }
  const auto u_numel = read_ints(file, "/unit_numel", U);
  const auto u_shard = read_ints(file, "/unit_shard", U);
  if (version == kOneWorldFormatVersion) {
    // Every unit sliced over `world`: slice r in rank file r, at the unit's slice offset there.
    const auto u_off = read_ints(file, "/unit_slice_offset", U);
    std::int64_t slice = 0;
    for (std::int64_t u = 0; u < U; ++u) {
      const auto i = static_cast<std::size_t>(u);
      if (u_shard[i] < 0 || u_numel[i] != u_shard[i] * index.world || u_off[i] != slice) {
        ZRT_THROW(InvalidArgument,
                  "{}: unit table row {} is inconsistent (numel {}, shard {}, slice offset {}, "
                  "world {})",
                  path, u, u_numel[i], u_shard[i], u_off[i], index.world);
      }
      UnitEntry e{u_numel[i], u_shard[i], 0, {}};
      for (int r = 0; r < index.world; ++r) e.slices.push_back(SliceEntry{r, u_off[i]});
      slice += u_shard[i];
      index.units.push_back(std::move(e));
    }
    index.rank_elements.assign(static_cast<std::size_t>(index.world), slice);
  } else {
    read_slice_tables(file, path, U, u_numel, u_shard, index);
  }
  std::int64_t cursor = 0;
  for (std::int64_t p = 0; p < P; ++p) {
    const auto i = static_cast<std::size_t>(p);
    ParamEntry e;
    const char* raw = names.data() + p * kNameBytes;
    e.name.assign(raw, strnlen(raw, static_cast<std::size_t>(kNameBytes)));
    e.shape.assign(dims.begin() + cursor, dims.begin() + cursor + ndim[i]);
    cursor += ndim[i];
    e.numel = numel[i];
    e.unit = unit[i];
    e.offset = offset[i];
    e.steps = steps[i];
    if (e.steps < -1 || e.steps > index.optimizer_steps) {
      ZRT_THROW(InvalidArgument,
                "{}: dataset '/param_steps': parameter {} ('{}') took {} optimizer steps of the "
                "checkpoint's {}",
                path, p, e.name, e.steps, index.optimizer_steps);
    }
    std::int64_t product = 1;
    for (std::int64_t d : e.shape) product *= d;
    if (product != e.numel || e.unit < 0 || e.unit >= U || e.offset < 0 ||
        e.offset + e.numel > index.units[static_cast<std::size_t>(e.unit)].numel) {
      ZRT_THROW(InvalidArgument,
                "{}: parameter table row {} ('{}') is inconsistent: shape {}, numel {}, unit {}, "
                "offset {}",
                path, p, e.name, show(e.shape), e.numel, e.unit, e.offset);
    }
    if (expect != nullptr) {
      const ParamSpec& want = (*expect)[i];
      if (want.name != e.name || want.shape != e.shape) {
        ZRT_THROW(InvalidArgument,
                  "{}: dataset '/param_name': parameter {} is '{}' {} in the checkpoint but '{}' "
                  "{} in the model (another model?)",
                  path, p, e.name, show(e.shape), want.name, show(want.shape));
      }
    }
    index.params.push_back(std::move(e));
  }
  return index;
}

}  // namespace zrt::checkpoint
