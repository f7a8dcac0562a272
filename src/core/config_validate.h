// Private to src/core: the checks a parsed Config must pass before it is used.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st::config_internal {

// Every problem of `c`, each a message such as "optim.beta1 must be in [0, 1) (got 1)" or "model.n_embd (100) must
// be a multiple of model.n_head (3)"; empty when `c` is valid. All are collected so that one run of a bad config
// shows all of them.
std::vector<std::string> find_problems(const Config& c);

}  // namespace st::config_internal
