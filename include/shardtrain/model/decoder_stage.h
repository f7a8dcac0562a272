// A layer split of a decoder (decoder.h) across ranks: a pipeline of one stage per rank, for a model whose decoder
// does not fit one GPU (`shardtrain generate --split`). Stage s holds a contiguous range of the unit list (units.h:
// the embedding, the blocks, the head), at least one block each, and only those units' weights and its blocks'
// key/value caches: stage 0 embeds, the last stage applies the final norm and the classifier (a tied head's classifier
// is the embedding: that stage holds unit 0 as well). A forward crosses every rank once: stage s receives the hidden
// rows [n, n_embd] from rank s - 1, runs its blocks on them and sends them to rank s + 1; the last stage's logits (or
// its greedy tokens) are broadcast to every rank, so every rank samples the same tokens and the generation loop runs
// unchanged on each. The ranges balance what each stage holds (split_units).
//
//   const std::vector<UnitRange> ranges = split_units(cfg.model, max_batch, comm.world_size());
//   const DecoderStage stage{comm.rank(), comm.world_size(), ranges[comm.rank()], &comm};
//   std::unique_ptr<Decoder> d = make_unloaded_decoder(cfg, device, max_batch, stage);
//   read_init_from_weights(cfg, sink, d->held_units());   // this stage's units alone
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st {

class Communicator;

// How `generate` places a decoder on its ranks: auto splits the layers when the whole decoder does not fit one GPU
// and the stages do (never on the CPU), layers always splits them (one stage per rank), none never does.
enum class LayerSplit { kAuto, kLayers, kNone };

// Units [first, end) of the unit list.
struct UnitRange {
  int first = 0, end = 0;
};

// Layers [first, end): the blocks of units first + 1 .. end.
struct LayerRange {
  int first = 0, end = 0;
  int count() const { return end - first; }
};

// One rank's stage. The default is the whole model on its own: one stage, every unit, no communicator.
struct DecoderStage {
  int index = 0;                 // this rank's stage (its rank in comm)
  int count = 1;                 // the stages (comm's world size); 1: the whole model, units and comm unused
  UnitRange units;               // the stage's range of the unit list (split_units)
  Communicator* comm = nullptr;  // stage s is rank s; must outlive the decoder

  bool split() const { return count > 1; }
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
};

// The units `stage` holds, by unit index: its range, and on the last stage of a tied head the embedding too (its
// classifier); every unit for a whole model.
std::vector<bool> held_units(const ModelConfig& model, const DecoderStage& stage);
// The blocks `stage` runs; every layer for a whole model.
LayerRange stage_layers(const ModelConfig& model, const DecoderStage& stage);

// The elements a stage of a decoder of max_batch sequences holds: its units' weights (held_units) and, for each of its
// blocks, the keys and values of max_batch x seq_len positions. Weights and caches are in the same compute type, so
// these elements rank the stages by their bytes in any.
int64_t stage_elements(const ModelConfig& model, int max_batch, const DecoderStage& stage);

// The unit ranges of `stages` stages (stage s on rank s): contiguous, in order, covering every unit once, each with
// at least one block, stage 0 starting at the embedding and the last ending at the head; of all such splits, one whose
// largest stage_elements is the least. The same on every rank. kBadInput naming model.n_layer when the model has
// fewer blocks than stages.
std::vector<UnitRange> split_units(const ModelConfig& model, int max_batch, int stages);

// "embedding .. block.1", or "block.2" for a range of one unit.
std::string describe_units(const ModelConfig& model, const UnitRange& range);
// "rank 0: embedding .. block.1; rank 1: block.2 .. head (and embedding, the tied classifier)", for logs.
std::string describe_split(const ModelConfig& model, const std::vector<UnitRange>& ranges);

}  // namespace st
