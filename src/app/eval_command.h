// `shardtrain eval --ckpt DIR [--section.key=value ...]`: the mean loss of a checkpoint over
// train.eval_batches sequential batches of data.path (see eval_command.cc for the batch layout).
#pragma once

#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"

int cmd_eval(const std::vector<std::string>& args, st::Communicator& comm);
