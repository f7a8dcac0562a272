// The config of a command that reads a committed checkpoint (eval, generate): the one saved in its manifest, with
// command-line --section.key=value overrides that may change anything but the model (a changed model key is
// kBadInput naming it).
#pragma once

#include <string>
#include <vector>

#include "shardtrain/core/config.h"

// Opens `dir` with the checks of every checkpoint reader (open_checkpoint) and returns its config with `overrides`
// applied.
st::Config checkpoint_config(const std::string& dir, const std::vector<std::string>& overrides);
