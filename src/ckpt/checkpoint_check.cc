#include "shardtrain/ckpt/checkpoint_check.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <system_error>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/units.h"

namespace fs = std::filesystem;

namespace st {
namespace {

std::string span_str(const ShardSpan& s) { return str_cat("[", s.offset, ", ", s.end(), ")"); }

// The manifest's units must be the layout its own model config gives, or a reader that builds its model from
// that config (resume, eval, the HF export's names and transposes) would not describe the stored buffers.
void check_units_match_model(const Manifest& m, const std::vector<UnitLayout>& units, const std::string& path) {
  if (m.units.size() != units.size())
    ST_BAD_INPUT(path, ": units has ", m.units.size(), " entries, the model config (n_layer ", m.model.n_layer,
                 ") gives ", units.size());
  for (const UnitLayout& u : units) {
    const ManifestUnit& mu = m.units[static_cast<size_t>(u.index)];
    const std::string where = str_cat("units[", u.index, "]");
    if (mu.name != u.name || mu.numel != u.numel)
      ST_BAD_INPUT(path, ": ", where, " is ", mu.name, " of ", mu.numel, " elements, the model config gives ", u.name,
                   " of ", u.numel);
    // The files hold the trainable tensors: all of them, or a LoRA model's adapters.
    std::vector<const TensorSpec*> stored;
    for (const TensorSpec& t : u.tensors)
      if (!t.frozen) stored.push_back(&t);
    if (mu.tensors.size() != stored.size())
      ST_BAD_INPUT(path, ": ", where, ".tensors has ", mu.tensors.size(), " entries, the model config gives ",
                   stored.size());
    for (size_t k = 0; k < stored.size(); ++k) {
      const ManifestTensor& mt = mu.tensors[k];
      const TensorSpec& t = *stored[k];
      if (mt.name != t.name || mt.shape != t.shape || mt.offset != t.offset)
        ST_BAD_INPUT(path, ": ", where, ".tensors[", k, "] is ", mt.name, " ", shape_text(mt.shape), " at ", mt.offset,
                     ", the model config gives ", t.name, " ", shape_text(t.shape), " at ", t.offset);
    }
  }
}

// A committed directory is named after its step (step_dir_name); an edited manifest step shows here first.
void check_dir_name(const std::string& step_dir, const Manifest& m, const std::string& path) {
  static const std::regex name_re("step_([0-9]{8})");
  fs::path dir = fs::path(step_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "ckpt/step_00000004/"
  const std::string name = dir.filename().string();
  std::smatch match;
  if (!std::regex_match(name, match, name_re)) return;
  const int64_t named = std::stoll(match[1].str());
  if (named != m.step)
    ST_BAD_INPUT(path, ": step mismatch: expected ", named, " (the directory name ", name, "), actual ", m.step,
                 " (manifest step)");
}

// Fields the writer derives from the step: an edit of one of them alone shows here.
void check_step_fields(const Manifest& m, const std::string& path) {
  if (m.lr_step != m.step)
    ST_BAD_INPUT(path, ": lr_step mismatch: expected ", m.step, " (manifest step), actual ", m.lr_step);
  const int64_t cursor = m.step * m.global_batch;
  if (m.data_cursor != cursor)
    ST_BAD_INPUT(path, ": data_cursor mismatch: expected ", cursor, " (step ", m.step, " x global_batch ",
                 m.global_batch, "), actual ", m.data_cursor);
}

std::string file_path_of(const std::string& step_dir, const ManifestFile& f) {
  return (fs::path(step_dir) / f.name).string();
}

// `path`, and in a node-local copy what the file is there: "ck/node0/step_00000008/rank_00002.h5 (a replica:
// another node's file, kept in node 0's copy)".
std::string labelled(const std::string& path, const Manifest& m, int file) {
  if (!m.node_local) return path;
  const ManifestNodeLocal& n = *m.node_local;
  const auto in = [&](const std::vector<int>& v) { return std::binary_search(v.begin(), v.end(), file); };
  if (in(n.primaries)) return str_cat(path, " (a primary: node ", n.node, "'s own file)");
  if (in(n.replicas)) return str_cat(path, " (a replica: another node's file, kept in node ", n.node, "'s copy)");
  return path;
}

void check_size(const std::string& path, const std::string& label, const ManifestFile& f) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    ST_BAD_INPUT(label, ": missing (the manifest lists it as rank ", f.rank, "'s file of ", f.bytes, " bytes)");
  const int64_t bytes = file_size(path);
  if (bytes != f.bytes)
    ST_BAD_INPUT(label, ": size mismatch: expected ", f.bytes, " bytes (manifest), actual ", bytes,
                 " (truncated or replaced)");
}

// "files 0, 1 (primaries) and 2, 3 (replicas)" of a node-local manifest.
std::string held_text(const Manifest& m) {
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out.empty() ? std::string("none") : out;
  };
  return str_cat("files ", list(m.node_local->primaries), " (primaries) and ", list(m.node_local->replicas),
                 " (replicas)");
}

}  // namespace

Manifest open_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(step_dir, ec);
  if (st.type() == fs::file_type::not_found)
    ST_BAD_INPUT(step_dir, " is not a committed checkpoint: no such file or directory");
  if (ec) ST_BAD_INPUT(step_dir, " is not a committed checkpoint: cannot look at it: ", ec.message());
  if (st.type() == fs::file_type::regular)
    ST_BAD_INPUT(step_dir,
                 " is a file, not a checkpoint directory (a committed checkpoint is a step_NNNNNNNN "
                 "directory holding manifest.json and the rank files)");
  if (st.type() != fs::file_type::directory)
    ST_BAD_INPUT(step_dir,
                 " is not a directory, so not a checkpoint (a committed checkpoint is a step_NNNNNNNN "
                 "directory holding manifest.json and the rank files)");
  const std::string manifest = (fs::path(step_dir) / "manifest.json").string();
  if (!fs::is_regular_file(manifest, ec))
    ST_BAD_INPUT(step_dir, " is not a committed checkpoint: it has no manifest.json");
  Manifest m = read_manifest(manifest);
  check_units_match_model(m, build_units(m.model), manifest);
  check_dir_name(step_dir, m, manifest);
  check_step_fields(m, manifest);
  return m;
}

void check_rank_file_sizes(const std::string& step_dir, const Manifest& m) {
  for (int f : files_held(m)) {
    const ManifestFile& mf = m.files[static_cast<size_t>(f)];
    const std::string path = file_path_of(step_dir, mf);
    check_size(path, labelled(path, m, f), mf);
  }
}

namespace {

// The rank file's path, after checking that it is there with the manifest's size; a node-local copy that does not hold
// it says so, naming the files it holds.
std::string located_rank_file(const std::string& step_dir, const Manifest& m, int file) {
  const ManifestFile& f = m.files[static_cast<size_t>(file)];
  const std::string path = file_path_of(step_dir, f);
  std::error_code ec;
  if (m.node_local && !fs::exists(path, ec)) {
    const std::vector<int> held = files_held(m);
    if (!std::binary_search(held.begin(), held.end(), file))
      ST_BAD_INPUT(path, ": not in this node-local directory (ckpt.replicas=1): node ", m.node_local->node,
                   "'s copy holds ", held_text(m), "; rank ", f.rank,
                   "'s file is on another node's disk. A run with "
                   "ckpt.replicas=1 restores the files its ranks read from the other nodes; elsewhere, copy it here");
  }
  check_size(path, labelled(path, m, file), f);
  return path;
}

void check_digest(const std::string& path, const Manifest& m, int file, const std::string& digest) {
  const ManifestFile& f = m.files[static_cast<size_t>(file)];
  if (digest != f.digest)
    ST_BAD_INPUT(labelled(path, m, file), ": SHA-256 mismatch: expected ", f.digest, " (manifest), actual ", digest);
}

// Steps 2 to 4 of open_rank_file.
ShardFileReader parse_rank_file(const std::string& path, const Manifest& m, int file) {
  const ManifestFile& f = m.files[static_cast<size_t>(file)];
  ShardFileReader reader(path);
  const std::string field = str_cat("manifest files[", f.rank, "]");
  if (reader.rank() != f.rank)
    ST_BAD_INPUT(path, ": rank attribute mismatch: expected ", f.rank, " (", field, ".rank), actual ", reader.rank());
  if (reader.world_size() != m.world_size)
    ST_BAD_INPUT(path, ": world_size attribute mismatch: expected ", m.world_size, " (manifest world_size), actual ",
                 reader.world_size());
  if (reader.step() != m.step)
    ST_BAD_INPUT(path, ": step attribute mismatch: expected ", m.step, " (manifest step), actual ", reader.step());
  if (reader.unit_names().size() != m.units.size())
    ST_BAD_INPUT(path, ": holds ", reader.unit_names().size(), " units, expected ", m.units.size(), " (manifest)");
  for (size_t u = 0; u < m.units.size(); ++u) {
    const std::string& unit = m.units[u].name;
    if (!reader.has_unit(unit)) ST_BAD_INPUT(path, ": unit ", unit, " is missing (the manifest lists it)");
    const ShardSpan actual = reader.span(unit);
    const ShardSpan& expected = f.spans[u];
    if (!(actual == expected))
      ST_BAD_INPUT(path, ": unit ", unit, " span mismatch: expected ", span_str(expected), " (", field, ".spans[", u,
                   "]), actual ", span_str(actual));
  }
  return reader;
}

}  // namespace

ShardFileReader open_rank_file(const std::string& step_dir, const Manifest& m, int file, RankFileDigest digest) {
  const std::string path = located_rank_file(step_dir, m, file);
  // The whole file is hashed before HDF5 parses it, so HDF5 only ever sees the bytes that were committed.
  if (digest == RankFileDigest::kCheck) check_digest(path, m, file, file_digest(path, m.digest_piece_bytes));
  return parse_rank_file(path, m, file);
}

RankFileLoad::RankFileLoad(const std::string& step_dir, const Manifest& m, int file)
    : m_(m), file_(file), path_(located_rank_file(step_dir, m, file)) {
  try {
    reader_.emplace(parse_rank_file(path_, m, file));
  } catch (const Error&) {
    // A file that fails these checks has most likely changed since its commit: the digest says whether it has.
    check_digest(path_, m, file, file_digest(path_, m.digest_piece_bytes));
    throw;
  }
  if (reader_->all_plain() && m.digest_piece_bytes > 0)
    pass_.emplace(path_, m.digest_piece_bytes);
  else
    check_digest(path_, m, file, file_digest(path_, m.digest_piece_bytes));
}

void RankFileLoad::read(const std::vector<SliceRead>& reads) {
  if (!pass_) {
    for (const SliceRead& r : reads) reader_->read(r.unit, r.state, r.want, r.out);
    return;
  }
  pass_->read(reader_->plain_bytes(reads));
}

void RankFileLoad::finish() {
  if (pass_) check_digest(path_, m_, file_, pass_->finish());
}

}  // namespace st
