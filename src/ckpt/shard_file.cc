#include "shardtrain/ckpt/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_read.h"
#include "shardtrain/ckpt/file_write.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

constexpr ShardState kStates[] = {ShardState::kParam, ShardState::kExpAvg, ShardState::kExpAvgSq};
constexpr int kNumStates = 3;

std::string unit_group(const std::string& unit) { return "/units/" + unit; }
std::string dataset_path(const std::string& unit, ShardState s) { return unit_group(unit) + "/" + dataset_name(s); }

const float* state_data(const UnitSlice& s, ShardState state) {
  switch (state) {
    case ShardState::kParam:
      return s.param;
    case ShardState::kExpAvg:
      return s.exp_avg;
    case ShardState::kExpAvgSq:
      return s.exp_avg_sq;
  }
  return nullptr;
}

std::string span_text(const ShardSpan& s) { return str_cat("[", s.offset, ", ", s.end(), ")"); }

}  // namespace

const char* dataset_name(ShardState s) {
  switch (s) {
    case ShardState::kParam:
      return "param";
    case ShardState::kExpAvg:
      return "exp_avg";
    case ShardState::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

namespace {

// write_shard_file's checks of the layout (names and spans; the pointers are the callers' to check).
void check_layout(int rank, int world_size, int64_t step, const std::vector<UnitSlice>& slices) {
  ST_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " of world_size ", world_size);
  ST_CHECK(step >= 0, "step = ", step);
  std::set<std::string> seen;
  for (const UnitSlice& s : slices) {
    ST_CHECK(!s.unit.empty() && s.unit.find('/') == std::string::npos, "unit name \"", s.unit,
             "\" is not a plain HDF5 group name");
    ST_CHECK(seen.insert(s.unit).second, "unit ", s.unit, " appears twice");
    ST_CHECK(s.span.offset >= 0 && s.span.count >= 0, "unit ", s.unit, " span ", span_text(s.span));
  }
}

void check_data(const UnitSlice& s) {
  for (ShardState state : kStates)
    ST_CHECK(s.span.count == 0 || state_data(s, state) != nullptr, "unit ", s.unit, ": ", dataset_name(state),
             " is null for ", s.span.count, " elements");
}

// HDF5 lays the file out and writes everything but the floats: returns where each slice's datasets keep them (-1 for
// an empty one), for overwrite_file to put them there.
std::vector<std::array<int64_t, kNumStates>> lay_out(const std::string& path, int rank, int world_size, int64_t step,
                                                     const std::vector<UnitSlice>& slices) {
  std::vector<std::array<int64_t, kNumStates>> at;
  H5File f = H5File::create(path);
  h5_write_attr_i64(f, f.id(), "/", "format_version", kCheckpointFormatVersion);
  h5_write_attr_i64(f, f.id(), "/", "rank", rank);
  h5_write_attr_i64(f, f.id(), "/", "world_size", world_size);
  h5_write_attr_i64(f, f.id(), "/", "step", step);
  // The groups track creation order, so a reader lists units in the order they were written.
  h5_create_group(f, "/units");
  for (const UnitSlice& s : slices) {
    const std::string group_name = unit_group(s.unit);
    H5Handle g = h5_create_group(f, group_name);
    h5_write_attr_i64(f, g.get(), group_name, "offset", s.span.offset);
    h5_write_attr_i64(f, g.get(), group_name, "count", s.span.count);
    std::array<int64_t, kNumStates>& unit_at = at.emplace_back();
    for (int k = 0; k < kNumStates; ++k) {
      const std::string name = dataset_path(s.unit, kStates[k]);
      const H5Handle ds = h5_create_f32_unfilled(f, name, s.span.count);
      unit_at[static_cast<size_t>(k)] = -1;
      if (s.span.count == 0) continue;
      unit_at[static_cast<size_t>(k)] = h5_dataset_offset(f, ds.get(), name);
      ST_CHECK(unit_at[static_cast<size_t>(k)] >= 0, path, ": dataset ", name, " of ", s.span.count,
               " elements has no storage");
    }
  }
  f.close();
  return at;
}

// The raw floats of slice `s` at the offsets lay_out gave.
void place(const UnitSlice& s, const std::array<int64_t, kNumStates>& at, std::vector<PlacedBytes>* raw) {
  for (int k = 0; k < kNumStates; ++k)
    if (at[static_cast<size_t>(k)] >= 0)
      raw->push_back(PlacedBytes{at[static_cast<size_t>(k)], state_data(s, kStates[k]),
                                 s.span.count * static_cast<int64_t>(sizeof(float))});
}

}  // namespace

WrittenFile write_shard_file(const std::string& path, int rank, int world_size, int64_t step,
                             const std::vector<UnitSlice>& slices) {
  check_layout(rank, world_size, step, slices);
  for (const UnitSlice& s : slices) check_data(s);
  const std::vector<std::array<int64_t, kNumStates>> at = lay_out(path, rank, world_size, step, slices);
  std::vector<PlacedBytes> raw;
  for (size_t i = 0; i < slices.size(); ++i) place(slices[i], at[i], &raw);
  return overwrite_file(path, std::move(raw), kDigestPieceBytes);
}

WrittenFile write_shard_file(const std::string& path, int rank, int world_size, int64_t step,
                             const std::vector<UnitSlice>& layout, const UnitSource& source) {
  check_layout(rank, world_size, step, layout);
  const std::vector<std::array<int64_t, kNumStates>> at = lay_out(path, rank, world_size, step, layout);
  if (layout.empty()) return overwrite_file(path, {}, kDigestPieceBytes);
  return overwrite_file_in_groups(
      path, static_cast<int64_t>(layout.size()),
      [&](int64_t i) {
        const UnitSlice s = source.open(static_cast<size_t>(i));
        const UnitSlice& want = layout[static_cast<size_t>(i)];
        ST_CHECK(s.unit == want.unit && s.span == want.span, "unit ", i, " opened as ", s.unit, " ", span_text(s.span),
                 ", laid out as ", want.unit, " ", span_text(want.span));
        check_data(s);
        std::vector<PlacedBytes> raw;
        place(s, at[static_cast<size_t>(i)], &raw);
        return raw;
      },
      [&](int64_t i) { source.close(static_cast<size_t>(i)); }, kDigestPieceBytes);
}

struct ShardFileReader::Impl {
  struct Unit {
    ShardSpan span;
    H5Handle datasets[kNumStates];
    // Where the file holds each dataset's elements as this machine's fp32, back to back (-1: read through HDF5).
    int64_t native_at[kNumStates] = {-1, -1, -1};
  };
  // Declared first, destroyed last: the datasets close before the file.
  H5File file;
  UniqueFd fd;  // the same file, for plain reads of the datasets that native_at locates
  int rank = 0;
  int world_size = 0;
  int64_t step = 0;
  std::vector<std::string> unit_order;
  std::map<std::string, Unit> units;

  const Unit& unit(const std::string& name) const {
    const auto it = units.find(name);
    if (it == units.end())
      ST_BAD_INPUT(file.path(), ": unit ", name, " is not in this file (no group /units/", name, ")");
    return it->second;
  }
  const Unit& unit_holding(const std::string& name, const ShardSpan& want) const;
  static WantedBytes plain_bytes(const Unit& u, ShardState state, const ShardSpan& want, float* out);
};

ShardFileReader::ShardFileReader(const std::string& path) : impl_(new Impl) {
  // Holds impl_ until the constructor finishes: a throwing constructor runs no destructor.
  std::unique_ptr<Impl> guard(impl_);
  Impl& d = *impl_;
  d.file = H5File::open_read(path);
  const H5File& f = d.file;
  d.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!d.fd || ::fstat(d.fd.get(), &st) != 0) ST_FAULT("cannot open ", path, " to read it: ", errno_text());
  const int64_t size = static_cast<int64_t>(st.st_size);

  const int64_t version = h5_read_attr_i64(f, f.id(), "/", "format_version");
  check_format_version(version, path);
  const int64_t world_size = h5_read_attr_i64(f, f.id(), "/", "world_size");
  const int64_t rank = h5_read_attr_i64(f, f.id(), "/", "rank");
  d.step = h5_read_attr_i64(f, f.id(), "/", "step");
  if (world_size < 1 || world_size > INT_MAX)
    ST_BAD_INPUT(path, ": attribute world_size of / is ", world_size, ", expected >= 1");
  if (rank < 0 || rank >= world_size)
    ST_BAD_INPUT(path, ": attribute rank of / is ", rank, ", expected 0 <= rank < world_size = ", world_size);
  if (d.step < 0) ST_BAD_INPUT(path, ": attribute step of / is ", d.step, ", expected >= 0");
  d.world_size = static_cast<int>(world_size);
  d.rank = static_cast<int>(rank);

  H5Handle units_group = h5_open_group(f, "/units");
  d.unit_order = h5_list_group(f, units_group.get(), "/units");
  for (const std::string& name : d.unit_order) {
    const std::string group_name = unit_group(name);
    H5Handle g = h5_open_group(f, group_name);
    Impl::Unit u;
    u.span.offset = h5_read_attr_i64(f, g.get(), group_name, "offset");
    u.span.count = h5_read_attr_i64(f, g.get(), group_name, "count");
    // offset + count is the span's end, which reads compare against: it must not wrap.
    if (u.span.offset < 0 || u.span.count < 0 || u.span.offset > std::numeric_limits<int64_t>::max() - u.span.count)
      ST_BAD_INPUT(path, ": group ", group_name, " has offset ", u.span.offset, " and count ", u.span.count,
                   ", expected both >= 0 and offset + count <= ", std::numeric_limits<int64_t>::max());
    for (int s = 0; s < kNumStates; ++s) {
      const std::string ds_name = dataset_path(name, kStates[s]);
      u.datasets[s] = h5_open_dataset(f, ds_name);
      const std::vector<int64_t> shape = h5_dataset_shape(f, u.datasets[s].get(), ds_name);
      if (shape == std::vector<int64_t>{u.span.count}) {
        const int64_t at = h5_native_f32_offset(f, u.datasets[s].get(), ds_name);
        if (at >= 0 && (at > size || u.span.count > (size - at) / static_cast<int64_t>(sizeof(float))))
          ST_BAD_INPUT(path, ": dataset ", ds_name, " of ", u.span.count, " elements at byte ", at,
                       " passes the end of the ", size, "-byte file");
        u.native_at[s] = at;
      } else {
        std::string shown = "[";
        for (size_t i = 0; i < shape.size(); ++i) shown += (i ? ", " : "") + std::to_string(shape[i]);
        ST_BAD_INPUT(path, ": dataset ", ds_name, " has shape ", shown, "], expected [", u.span.count,
                     "] (the count attribute of ", group_name, ")");
      }
    }
    d.units.emplace(name, std::move(u));
  }
  // Reads of one dataset must never see another's bytes (a file edited so that m points at param's data).
  std::vector<std::pair<std::string, hid_t>> datasets;
  for (const auto& [name, u] : d.units)
    for (int s = 0; s < kNumStates; ++s) datasets.emplace_back(dataset_path(name, kStates[s]), u.datasets[s].get());
  h5_check_disjoint(f, datasets);
  guard.release();
}

ShardFileReader::ShardFileReader(ShardFileReader&& o) noexcept : impl_(o.impl_) { o.impl_ = nullptr; }

ShardFileReader& ShardFileReader::operator=(ShardFileReader&& o) noexcept {
  if (this != &o) {
    delete impl_;
    impl_ = o.impl_;
    o.impl_ = nullptr;
  }
  return *this;
}

ShardFileReader::~ShardFileReader() { delete impl_; }

int ShardFileReader::rank() const { return impl_->rank; }
int ShardFileReader::world_size() const { return impl_->world_size; }
int64_t ShardFileReader::step() const { return impl_->step; }
const std::string& ShardFileReader::path() const { return impl_->file.path(); }
const std::vector<std::string>& ShardFileReader::unit_names() const { return impl_->unit_order; }
bool ShardFileReader::has_unit(const std::string& unit) const { return impl_->units.count(unit) != 0; }

ShardSpan ShardFileReader::span(const std::string& unit) const { return impl_->unit(unit).span; }

// The unit `want` is read from, after checking that it holds `want`.
const ShardFileReader::Impl::Unit& ShardFileReader::Impl::unit_holding(const std::string& name,
                                                                       const ShardSpan& want) const {
  const Unit& u = unit(name);
  if (want.count < 0 || want.offset < u.span.offset || want.end() > u.span.end())
    ST_BAD_INPUT(file.path(), ": unit ", name, " holds elements ", span_text(u.span), ", cannot read ",
                 span_text(want));
  return u;
}

// Where the file holds `want` as plain floats.
WantedBytes ShardFileReader::Impl::plain_bytes(const Unit& u, ShardState state, const ShardSpan& want, float* out) {
  return WantedBytes{
      u.native_at[static_cast<int>(state)] + (want.offset - u.span.offset) * static_cast<int64_t>(sizeof(float)),
      want.count * static_cast<int64_t>(sizeof(float)), out};
}

void ShardFileReader::read(const std::string& unit, ShardState state, const ShardSpan& want, float* out) const {
  const Impl::Unit& u = impl_->unit_holding(unit, want);
  if (want.count == 0) return;
  const int s = static_cast<int>(state);
  if (u.native_at[s] >= 0) {  // the bytes are the floats: read them straight into out, several reads at once
    const WantedBytes w = Impl::plain_bytes(u, state, want, out);
    read_at(impl_->fd.get(), path(), w.offset, w.bytes, w.out);
    return;
  }
  h5_read_f32_range(impl_->file, u.datasets[s].get(), dataset_path(unit, state), want.offset - u.span.offset,
                    want.count, out);
}

bool ShardFileReader::stored_plain(const std::string& unit, ShardState state) const {
  return impl_->unit(unit).native_at[static_cast<int>(state)] >= 0;
}

std::vector<WantedBytes> ShardFileReader::plain_bytes(const std::vector<SliceRead>& reads) const {
  std::vector<WantedBytes> wanted;
  for (const SliceRead& r : reads) {
    const Impl::Unit& u = impl_->unit_holding(r.unit, r.want);
    if (r.want.count > 0 && u.native_at[static_cast<int>(r.state)] >= 0)
      wanted.push_back(Impl::plain_bytes(u, r.state, r.want, r.out));
  }
  return wanted;
}

std::string ShardFileReader::read_plain_and_digest(const std::vector<SliceRead>& reads, int64_t piece_bytes) const {
  return digest_and_read(path(), piece_bytes, plain_bytes(reads));
}

bool ShardFileReader::all_plain() const {
  for (const auto& [name, u] : impl_->units)
    for (int64_t at : u.native_at)
      if (at < 0) return false;
  return true;
}

}  // namespace st
