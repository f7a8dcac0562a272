// Private to src/ckpt: what the checkpoint exports share (tools.cc, peft_adapter.cc): reading a checkpoint's
// parameters by range, and writing a new output directory that appears whole or not at all.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "shardtrain/ckpt/hf_dir.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/model/llama/llama_hf.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/shard_span.h"

namespace st::ckpt_internal {

// The checkpoint's parameters by range. Rank files are opened lazily, each checked (open_rank_file) before its
// first read, and kept open for later ranges.
class ParamGather {
 public:
  ParamGather(const std::string& step_dir, const Manifest& m) : step_dir_(step_dir), m_(m) {}

  // Elements `want` of unit u's parameters (its trainable tensors: what the files hold), from every rank file whose
  // span meets them.
  void read(const UnitLayout& u, ShardSpan want, float* out);

 private:
  const ShardFileReader& reader(int r);

  const std::string& step_dir_;
  const Manifest& m_;
  std::map<int, std::unique_ptr<ShardFileReader>> readers_;
};

// The values of a llama checkpoint's Hugging Face tensors (llama_hf.h's ranges of its units): the checkpoint's own,
// or for a LoRA checkpoint its base read from the manifest's init.from (whose files must have the digests it
// recorded) with every adapter of the tensor merged in (add_lora_delta).
class LlamaExportValues {
 public:
  LlamaExportValues(const std::string& step_dir, const Manifest& m, const std::vector<UnitLayout>& units);
  void read(const HfRange& r, float* out);

 private:
  const Manifest& m_;
  const std::vector<UnitLayout>& units_;
  ParamGather gather_;
  std::unique_ptr<HfDirWeights> base_;  // LoRA only
  std::vector<float> a_, b_;
};

// An output directory written under a temporary name of this process beside it, then renamed into place: `dir` must
// not exist or be an empty directory, and its parent must exist (kBadInput naming it otherwise, with `what`, the
// option that named it). Destroyed without commit(), it removes what it wrote.
class NewDirectory {
 public:
  NewDirectory(std::string dir, std::string what);
  ~NewDirectory();
  NewDirectory(const NewDirectory&) = delete;
  NewDirectory& operator=(const NewDirectory&) = delete;

  const std::string& dir() const { return dir_; }
  // The path of `name` in the temporary directory.
  std::string file(const std::string& name) const;
  // fsyncs and renames the temporary directory to dir().
  void commit();

 private:
  std::string dir_, what_, tmp_;
  bool exists_ = false, committed_ = false;
};

}  // namespace st::ckpt_internal
