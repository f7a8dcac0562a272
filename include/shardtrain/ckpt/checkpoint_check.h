// What every reader of a committed checkpoint checks before it trusts a byte of it: resume
// (load_checkpoint), `shardtrain eval`, `ckpt export` and `ckpt verify` all go through these calls, so
// they refuse exactly the same checkpoints (docs/checkpoint-format.md, "What a reader checks"). `shardtrain generate`
// (decode_weights.h) makes the same checks but the rank files' digests, which would read the optimizer state too.
//
//   const Manifest m = open_checkpoint("ckpt/step_00000100");      // the manifest and the directory
//   const ShardFileReader f = open_rank_file(dir, m, 1);           // rank_00001.h5, checked against m
//   RankFileLoad load(dir, m, 1);                                  // a load: the same checks, one pass
//   load.read(slices_of_unit_0); ...; load.finish();               //   over the file, unit by unit
//
// Every problem is kBadInput naming the file and what disagrees, expected vs actual.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/shard_file.h"

namespace st {

// Requires `step_dir` to be an existing directory holding manifest.json ("... is not a committed
// checkpoint" otherwise), reads and validates the manifest (read_manifest), and checks that
//   * its units are the layout its own model config gives (model/units.h): names, numel, tensor names,
//     shapes and offsets;
//   * a directory named step_XXXXXXXX carries the manifest's step in its name (a directory under any other
//     name, e.g. a copy, is checked through the rank files' step attributes alone).
//   * lr_step == step and data_cursor == step * global_batch (the writer derives both from the step).
Manifest open_checkpoint(const std::string& step_dir);

// Existence and size of every rank file the directory holds (files_held: all of the manifest's, or a node-local
// copy's primaries and replicas); no file is opened. Cheap (one stat a file): load_checkpoint runs it on one rank
// (one a node, for node-local copies) so that a file no rank reads is still accounted for.
void check_rank_file_sizes(const std::string& step_dir, const Manifest& m);

// Whether open_rank_file hashes the file. kCheck: the whole file, before HDF5 parses a byte of it. kSkip: the reader
// reads one state of it (the parameters, for decoding: decode_weights.h) and would otherwise read all three to hash
// them; the other checks still run (`shardtrain ckpt verify` hashes every file).
enum class RankFileDigest { kCheck, kSkip };

// Opens rank file `file` of the manifest after checking, in this order:
//   1. it exists and its size and SHA-256 equal the manifest's (before HDF5 parses a byte of it; the size alone with
//      RankFileDigest::kSkip); a node-local copy that does not hold it says so, naming the files it holds;
//   2. it is a well-formed shard file (ShardFileReader's constructor);
//   3. its rank, world_size and step attributes equal `file`, the manifest's world_size and step;
//   4. it holds exactly the manifest's units, each with the manifest's span for this file.
ShardFileReader open_rank_file(const std::string& step_dir, const Manifest& m, int file,
                               RankFileDigest digest = RankFileDigest::kCheck);

// A load's read of rank file `file`, unit by unit: the same checks as open_rank_file, with the file read once, in
// order, across the read() calls, so that the reader needs one unit's slices in memory at a time. The constructor has
// HDF5 parse the file's structure (checks 2 to 4; should one fail, the digest is checked first, so that a file changed
// since its commit is named as such). Each read() copies its slices (one unit's, in the file's order) as the pass
// reaches them and hashes the same bytes (FilePassInParts); finish() reads the rest and requires the digest to equal
// the manifest's. A digest that differs is kBadInput as in open_rank_file, raised by finish(): the slices read
// before it then hold bytes that were not committed. A file with a dataset stored other than as this machine's
// contiguous fp32 (shardtrain writes none), or under a manifest whose digest is of the whole file (version 1), is
// hashed whole by the constructor, and its slices are then read through HDF5. `m` must outlive it; it holds three file
// descriptors (HDF5's, the reader's and the pass's) until destroyed.
class RankFileLoad {
 public:
  RankFileLoad(const std::string& step_dir, const Manifest& m, int file);
  void read(const std::vector<SliceRead>& reads);
  void finish();

 private:
  const Manifest& m_;
  int file_;
  std::string path_;
  std::optional<ShardFileReader> reader_;
  std::optional<FilePassInParts> pass_;  // empty when the digest was checked up front
};

}  // namespace st
