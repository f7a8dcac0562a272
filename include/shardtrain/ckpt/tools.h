// Offline tools over one committed checkpoint directory (step_XXXXXXXX/): inspect it, verify every byte
// of it, and export its weights for Hugging Face: one consolidated GPT-2 file, or a llama-family model directory. Single-process: they read
// the rank files directly and need no communicator, whatever world size wrote the checkpoint.
//
//   std::cout << inspect_checkpoint("ckpt/step_00000100");
//   VerifyReport r = verify_checkpoint("ckpt/step_00000100");          // throws kBadInput on a problem
//   export_checkpoint("ckpt/step_00000100", "out/model.safetensors");  // + out/config.json
//
// Every function first opens `step_dir` with open_checkpoint (checkpoint_check.h): a committed checkpoint
// whose manifest is valid, names the directory's step and describes its own model's layout; verify and
// export then check each rank file with open_rank_file before reading it, as resume and eval do
// (docs/checkpoint-format.md, "What a reader checks").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/safetensors.h"

namespace st {

// A human-readable description, one "key value" per line (no hashing, no rank file is opened):
//
//   checkpoint ckpt/step_00000003
//   step 3
//   world_size 2
//   format_version 2
//   optimizer_updates 3
//   data_cursor 48
//   model n_layer=4 n_head=4 n_embd=128 vocab_size=256 seq_len=128
//   units 6
//     embedding numel=49152
//       wte [256, 128]
//       wpe [128, 128]
//     block.0 numel=198272
//       ln1.weight [128]
//       ...
//   files 2 bytes=6554528
//     rank_00000.h5 bytes=3277264 piece_sha256=97fd...   (format version 1: sha256=)
//     rank_00001.h5 bytes=3277264 piece_sha256=1c2a...
std::string inspect_checkpoint(const std::string& step_dir);

struct VerifyReport {
  int files = 0;       // rank files checked (== world_size, or a node-local copy's primaries and replicas)
  int64_t bytes = 0;   // their total size
  // A node-local copy (ckpt.replicas = 1; manifest node_local): whose it is, and its files by role (names).
  bool node_local = false;
  int node = 0, nodes = 0;
  std::vector<std::string> primaries, replicas, elsewhere;  // elsewhere: on other nodes' disks, not checked here
};

// Checks the whole checkpoint: open_checkpoint, then open_rank_file on every rank file the directory holds (all of
// them, or a node-local copy's primaries and replicas) in rank order (size, SHA-256, structure, rank / world_size /
// step attributes, units and spans), stopping at the first problem, which is kBadInput naming the file and what
// mismatched, expected vs actual.
VerifyReport verify_checkpoint(const std::string& step_dir);

enum class ExportFormat { kSafetensors, kHdf5 };

// By suffix: ".safetensors" or ".h5"; nullopt for anything else.
std::optional<ExportFormat> export_format_for(const std::string& path);

struct ExportReport {
  std::string path;         // the weights file written
  std::string config_path;  // config.json beside it
  int tensors = 0;
  int64_t bytes = 0;        // size of the weights file
};

// Writes the checkpoint's fp32 weights (param) as full tensors under Hugging Face GPT-2 names and layouts,
// exactly the tensors and order of write_hf_gpt2 (hf_export.h): Conv1D matrices transposed, wte cut to
// vocab_size rows, lm_head omitted (tied). The format follows out_path's suffix (export_format_for;
// kBadInput naming the path and the allowed suffixes otherwise): safetensors (safetensors.h) or HDF5
// with one dataset per tensor (what ckpt.export writes).
//
// Streamed: for each tensor only its elements are read, by hyperslab, from the rank files whose spans
// meet them; peak memory is about two copies of the largest tensor, never the whole model. Each rank file
// is checked by open_rank_file before its first read. The output goes to out_path + ".tmp", is fsynced and
// renamed over out_path; then config.json (GPT2Config's fields, GPT2LMHeadModel) is written atomically
// into out_path's directory, replacing any config.json there. The output directory must exist.
ExportReport export_checkpoint(const std::string& step_dir, const std::string& out_path);

struct HfDirExportOptions {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  // Largest tensor data per file before the model is split into shards, in bytes: Hugging Face's max_shard_size
  // (5GB = 5e9). A tensor larger than this gets a file of its own.
  int64_t max_shard_bytes = 5'000'000'000;
};

struct HfDirExportReport {
  std::string dir;
  int tensors = 0;
  int files = 0;       // safetensors files
  int64_t bytes = 0;   // their total size
};

// A llama-family checkpoint as a Hugging Face model directory that LlamaForCausalLM / Qwen2ForCausalLM
// from_pretrained loads: config.json (hf_llama_config_json, core/hf_config.h), and the tensors of
// model/llama/llama_hf.h (embed_tokens and lm_head cut to vocab_size rows, q/k/v and gate/up split) in F32 or BF16,
// in model.safetensors or, past max_shard_bytes, model-0000i-of-0000N.safetensors with model.safetensors.index.json
// (metadata.total_size, weight_map). Streamed one tensor at a time from the rank files, as export_checkpoint.
// Written into out_dir + ".tmp" and renamed into place: out_dir must not exist or be an empty directory, and its
// parent must exist (kBadInput naming it otherwise).
HfDirExportReport export_checkpoint_hf_dir(const std::string& step_dir, const std::string& out_dir,
                                           const HfDirExportOptions& options);

// The config.json text for a model: what Hugging Face's GPT2Config accepts, with dropout 0 and fp32.
std::string hf_gpt2_config_json(const ModelConfig& model);

}  // namespace st
