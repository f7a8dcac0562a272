// Which blocks recompute their activations in the backward (train.recompute, train.recompute_blocks): none, all, or
// the first n. A recomputed block keeps only its input through the forward and runs its forward again at the start of
// its backward, into one set of activations that every recomputed block shares; every other block keeps a set of its
// own. Models (CPU and CUDA) and their memory counts take the same layout from here.
//
//   const Recompute r = recompute_of(cfg.train);          // from the config
//   LlamaModel m(cfg.model, B, r);                         // or true (all) / false (none)
//   if (r.of(layer)) block_forward(layer, params);         // block_backward's first act
//   acts[r.set_of(layer)]; r.sets(cfg.model.n_layer);      // the activation sets and their count
#pragma once

#include <algorithm>
#include <climits>

namespace st {

struct TrainConfig;

class Recompute {
 public:
  // All blocks (true) or none (false).
  Recompute(bool all = false) : blocks_(all ? INT_MAX : 0) {}  // NOLINT(google-explicit-constructor): true/false
  Recompute(int) = delete;                                     // a count goes through first(n), never as a bool
  // The first n blocks (n >= 0; n at or past the model's layers: all of them).
  static Recompute first(int n) {
    Recompute r;
    r.blocks_ = std::max(n, 0);
    return r;
  }

  // Whether block `layer` recomputes.
  bool of(int layer) const { return layer < blocks_; }
  // How many of n_layer blocks recompute.
  int count(int n_layer) const { return std::min(blocks_, n_layer); }
  // The sets of block activations a model of n_layer blocks holds: one shared by the recomputed blocks (where any
  // do), one for each other block.
  int sets(int n_layer) const {
    const int r = count(n_layer);
    return (r > 0 ? 1 : 0) + n_layer - r;
  }
  // The set block `layer` uses.
  int set_of(int layer) const { return of(layer) ? 0 : (blocks_ > 0 ? 1 : 0) + layer - blocks_; }

 private:
  int blocks_ = 0;
};

// The config's: none without train.recompute, else the first train.recompute_blocks blocks (0: all).
Recompute recompute_of(const TrainConfig& train);

}  // namespace st
