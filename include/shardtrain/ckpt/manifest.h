// manifest.json: the description of one committed checkpoint, written last by rank 0 (see
// docs/checkpoint-format.md). A step directory without it is uncommitted and never loaded.
//
//   Manifest m = read_manifest("ckpt/step_00000100/manifest.json");   // validates every field
//   check_model_matches(m, cfg.model, path);                           // names the field and both values
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/gemm_algorithms.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

// The format version writers put in manifest.json and in each rank file. Readers take every version from
// kOldestReadableFormatVersion on: version 1 differs only in its files' digests (the SHA-256 of each whole file,
// files[i].sha256, where version 2 has digest_piece_bytes and files[i].piece_sha256).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestReadableFormatVersion = 1;

// kBadInput naming `path` unless this build reads format `version`.
void check_format_version(int64_t version, const std::string& path);

struct ManifestTensor {
  std::string name;  // as in model/units.h, e.g. "attn.qkv.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the unit's flat buffer
};

struct ManifestUnit {
  std::string name;  // "embedding", "block.3", "head"
  int64_t numel = 0;
  std::vector<ManifestTensor> tensors;
};

struct ManifestFile {
  std::string name;  // "rank_00001.h5", relative to the step directory
  int rank = 0;
  int64_t bytes = 0;
  std::string digest;            // file_digest(file, Manifest::digest_piece_bytes), 64 lowercase hex digits
  std::vector<ShardSpan> spans;  // per unit, in unit order: the [offset, count) this file holds
};

// What one node-local checkpoint directory holds (ckpt.replicas = 1, ckpt/node_local.h): the manifest of every node's
// copy of a step lists every file of the checkpoint, and this says which of them sit in this directory.
struct ManifestNodeLocal {
  int node = 0;                // whose ckpt.dir this is, in the writing run's node numbering
  int nodes = 2;               // nodes of the writing run (>= 2)
  std::vector<int> primaries;  // files (manifest indices) this node's ranks wrote, ascending
  std::vector<int> replicas;   // files of other nodes held here (node + 1's, the last node: node 0's), ascending
};

// The frozen base a LoRA checkpoint's adapters were trained on (manifest "lora.base"): init.from as the run gave it
// and the SHA-256 of each of its files (a directory: config.json, the safetensors index if any, and each safetensors
// file, by name inside it), or no path and no file for a base drawn from the seed.
struct ManifestBaseFile {
  std::string name;
  std::string sha256;  // 64 lowercase hex digits
  bool operator==(const ManifestBaseFile& o) const { return name == o.name && sha256 == o.sha256; }
};
struct ManifestBase {
  std::string init_from;
  std::vector<ManifestBaseFile> files;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;        // optimizer steps completed when saved
  int world_size = 1;      // ranks that wrote it
  std::string config_ini;  // to_ini() of the run's config
  ModelConfig model;
  std::vector<ManifestUnit> units;
  std::vector<ManifestFile> files;  // one per rank, in rank order
  // The files' digests (ckpt/digest.h): SHA-256 over pieces of this many bytes (format version 2: the field
  // digest_piece_bytes, with files[i].piece_sha256); 0: of each whole file (version 1: files[i].sha256).
  int64_t digest_piece_bytes = kDigestPieceBytes;
  // Training state beyond the tensors.
  int64_t optimizer_updates = 0;  // AdamW's t (applied steps; skipped steps do not count)
  int64_t lr_step = 0;            // the LR schedule position of the next step (== step)
  int64_t data_cursor = 0;        // global sequences consumed: step * train.global_batch
  int64_t global_batch = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t train_windows = 0;           // the training data's windows (data/sampler.h); optional (0: not recorded)
  std::vector<uint64_t> rng_counters;  // per rank: the counter of its sequential RNG (seed is `seed`)
  double loss_scale = 1.0;             // fp16 dynamic loss scale (1 in fp32/bf16 runs)
  int64_t loss_scale_good_steps = 0;   // finite steps since the scale last changed (optional on read: 0)
  int64_t skipped_steps = 0;           // non-finite steps skipped so far
  GemmAlgorithms gemm_algorithms;      // optional (absent: none recorded, e.g. the cpu backend)
  // train.fp8=delayed: the amax history (model/fp8_history.h), newest entry first, each the maxima of every site's
  // x, W and dy; optional (absent: none, as under any other recipe or before the first applied step).
  std::vector<std::vector<float>> fp8_amax_history;
  std::optional<ManifestNodeLocal> node_local;  // optional (absent: a shared ckpt.dir holding every file)
  // LoRA checkpoints (model.lora.rank > 0, the manifest's "lora" object): the units and files hold the adapters
  // (the trainable tensors) only, and this names the base they apply to.
  ManifestBase base;
};

// The files a directory holds: every file of the manifest, or with node_local its primaries and replicas
// (ascending).
std::vector<int> files_held(const Manifest& m);

// The JSON name of the files' digest: "piece_sha256" (digest_piece_bytes > 0), or "sha256" (whole files).
const char* digest_field(const Manifest& m);

std::string manifest_to_json(const Manifest& m);
// Parses and validates (types, required fields, a format version this build reads, one file per
// rank, spans that cover every unit exactly once). Errors are kBadInput naming `path` and the field.
Manifest manifest_from_json(const std::string& text, const std::string& path);
Manifest read_manifest(const std::string& path);
// The checks manifest_from_json makes after parsing, on a Manifest in memory: format version, value ranges,
// units whose tensors tile [0, numel) in order, files[i].rank == i, digests as 64 lowercase hex digits, one
// span per unit per file, and spans that cover every unit exactly once. kBadInput naming `path` and the
// field. A writer can call it before committing so that it never writes a checkpoint it cannot read.
void validate_manifest(const Manifest& m, const std::string& path);

// A tensor shape for messages and listings: "[768, 2304]".
std::string shape_text(const std::vector<int64_t>& shape);

// kBadInput unless the checkpoint's model equals `model` (its lora.* adapters included): names the field
// (model.n_embd, lora.rank, ...) and both values.
void check_model_matches(const Manifest& m, const ModelConfig& model, const std::string& path);

}  // namespace st
