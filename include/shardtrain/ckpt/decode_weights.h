// The weights a decoder computes with (model/decoder.h's make_decoder: every unit's full flat fp32 buffer), read
// straight from where they are stored, without a training engine: no optimizer state, no shards, no collectives. Each
// rank that decodes reads them on its own.
//
//   const CheckpointWeights w = read_checkpoint_weights("ckpt/step_00000100", cfg);   // a committed checkpoint
//   std::vector<std::vector<float>> hf = read_init_from_weights(cfg);                 // cfg.init.from
//   Config decode = cfg;
//   decode.model = base_model(cfg.model);
//   std::unique_ptr<Decoder> d = make_decoder(decode, std::move(w.units));
//
// or, streamed into a decoder without the whole model in fp32 on the host:
//   std::unique_ptr<Decoder> d = make_unloaded_decoder(decode);
//   read_init_from_weights(cfg, [&](int u, std::vector<float>& values) { d->load_unit(u, values); });
//
// Both give the buffers a training engine of `cfg` gives after loading the same source (StepEngine::gather_params,
// merged with merge_lora), bit for bit (tests/ckpt/decode_weights_test.cc, on the CPU backend; for train.device = cuda
// by storing the base as the CUDA backend stores it):
//  * the trainable tensors as stored, in fp32;
//  * a LoRA checkpoint's frozen base (the files of init.from, else drawn from train.seed) as the backend stores it:
//    an NF4 block's (lora.base_dtype = nf4) quantised and dequantised (model/nf4_base.h); any other frozen tensor
//    rounded to the compute dtype on train.device = cuda (kept in fp32 on the CPU); then the adapters merged in;
//  * every element init.from does not hold (the padding rows of the vocabulary) as the seed draws it
//    (init_unit_range).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/core/config.h"

namespace st {

// Where a streamed read hands each unit: called once per unit of base_model(cfg.model), in unit order, with the unit's
// full flat fp32 buffer, which it may take over (Decoder::load_unit does on the CPU). The reads that stream hold one
// unit's buffer on the host at a time (a LoRA checkpoint's, merged with its base, is read whole first).
using UnitSink = std::function<void(int unit, std::vector<float>& values)>;
// The streamed reads take `held`, the units wanted by index (a layer split's stage, Decoder::held_units(); empty:
// every unit): the sink sees those alone, and the others are not read (no rank file's span of them, no init.from
// tensor of theirs; a LoRA checkpoint's base and adapters of them neither).

// Whether read_checkpoint_weights checks a LoRA checkpoint's base (check_base_of_checkpoint, lora_base.h: it hashes
// every file of init.from). kSkip is for ranks that read the same files as one that checks them and agree with it
// on the outcome (comm/on_all_ranks.h) before they decode.
enum class LoraBaseCheck { kCheck, kSkip };

struct CheckpointWeights {
  std::vector<std::vector<float>> units;  // base_model(cfg.model)'s units, each its full flat fp32 buffer
  Manifest manifest;                      // the checkpoint's: its step, the ranks that wrote it, a LoRA base's files
};

// The weights of committed checkpoint `step_dir`, whatever world size wrote it. The checkpoint is checked as every
// reader checks it (checkpoint_check.h: open_checkpoint; each rank file's size, structure, attributes and spans),
// except the rank files' digests (RankFileDigest::kSkip), since hashing a file reads its optimizer state; then only
// the "param" datasets are read, one rank file at a time. `cfg.model` must be the checkpoint's (check_model_matches);
// a LoRA checkpoint's base is cfg.init.from (this run's, which may have moved: its files must have the digests the
// manifest recorded) or, without init.from, drawn from cfg.train.seed, which must be the checkpoint's. kBadInput
// naming the file and what disagrees: a missing rank file, a missing or misshapen dataset, a changed base file.
CheckpointWeights read_checkpoint_weights(const std::string& step_dir, const Config& cfg,
                                          LoraBaseCheck base_check = LoraBaseCheck::kCheck);
// The same weights streamed to `sink`, a unit at a time, every rank file open at once; returns the manifest.
Manifest read_checkpoint_weights(const std::string& step_dir, const Config& cfg, LoraBaseCheck base_check,
                                 const UnitSink& sink, const std::vector<bool>& held = {});

// The weights of cfg.init.from (a Hugging Face model directory or a GPT-2 file: init_from.h, with every check of
// init_from_weights) for the model cfg.model, which load_config derived from it as it does for training. kBadInput
// for a LoRA model (model.lora.rank > 0: adapters come from a checkpoint).
std::vector<std::vector<float>> read_init_from_weights(const Config& cfg);
// The same weights streamed to `sink`, a unit at a time.
void read_init_from_weights(const Config& cfg, const UnitSink& sink, const std::vector<bool>& held = {});

}  // namespace st
