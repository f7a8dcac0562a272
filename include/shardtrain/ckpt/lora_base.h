// The frozen base of a LoRA run, as a checkpoint names it (manifest.h, ManifestBase): init.from and the SHA-256 of
// the files the base was read from. Resuming, evaluating or exporting a LoRA checkpoint reads the base again from
// init.from, and refuses one whose files changed: the adapters only mean something on the base they were trained on.
//
//   const ManifestBase now = describe_lora_base(cfg.init.from);         // hashes every file (lead rank)
//   check_lora_base(manifest.base, now, "ckpt/step_00000100/manifest.json");
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/ckpt/manifest.h"

namespace st {

// init_from as given and the SHA-256 of each of its files: a file itself (named by its file name), or a Hugging Face
// directory's config.json, its model.safetensors.index.json when there is one, and every safetensors file the model
// is read from (named relative to the directory), in name order. An empty init_from (a base drawn from the seed)
// has no file. kBadInput naming a file that cannot be read.
ManifestBase describe_lora_base(const std::string& init_from);

// kBadInput unless `now` is the base `recorded` names: the same init.from and, file by file, the same digests; the
// error names the file and both digests, or the files one side has and the other lacks, and `where` (the manifest).
void check_lora_base(const ManifestBase& recorded, const ManifestBase& now, const std::string& where);

// What every reader of LoRA checkpoint `m` that reads its base again (resume, eval, generate) checks first: a base read
// from this run's `init_from` must be the one the manifest names (describe_lora_base, which hashes every file, then
// check_lora_base); a base drawn from the seed (no init.from) must be drawn from the checkpoint's train.seed, `seed`
// being this run's. kBadInput naming `where` (the manifest) otherwise. Returns the base as described (no file without
// init.from).
ManifestBase check_base_of_checkpoint(const Manifest& m, const std::string& init_from, uint64_t seed,
                                      const std::string& where);

// What a load says of the base it read, after "checkpoint: ": "LoRA base read from PATH (2 file(s), each as the
// checkpoint recorded it)", or "LoRA base drawn from train.seed 1337 (0 file(s), ...)".
std::string lora_base_read_text(const Manifest& m, const std::string& init_from, uint64_t seed);

// The base files a LoRA checkpoint's merged export reads: the manifest's init.from, checked against the digests it
// recorded (check_lora_base). kBadInput for a base drawn from the seed, which has no file (export the adapters).
std::string lora_base_to_merge(const Manifest& m, const std::string& step_dir);

}  // namespace st
