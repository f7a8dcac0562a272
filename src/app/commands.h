// The subcommands of the shardtrain binary beyond `train` (which lives in main.cc). Each takes the
// arguments after its name, returns an exit code on success and throws st::Error otherwise; main() turns
// errors into exit codes.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"

// shardtrain ckpt inspect|verify|export ...: offline checkpoint tools (ckpt/tools.h). Single-process.
int cmd_ckpt(const std::vector<std::string>& args);

// shardtrain topo [--config FILE] [--section.key=value ...]: nodes, measured link bandwidths per communicator
// group, and the sharding plan for the config (topo_command.cc). Collective, like train.
int cmd_topo(const std::vector<std::string>& args, st::Communicator& world);

// shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB] [...]: the run's
// device and host memory plan on that target, without a GPU, and the smallest change that fits when it does not
// (plan_command.cc). Single-process. Returns kExitOk when the config fits, kExitDoesNotFit when it does not.
inline constexpr int kExitDoesNotFit = 3;
int cmd_plan(const std::vector<std::string>& args);

// shardtrain generate (--ckpt DIR | --init.from PATH) (--prompt TEXT | --prompt-ids 1,2,3 | --prompts FILE) [...]: a
// checkpoint's model, or init.from's, continues each prompt, decoding with a key/value cache (generate_command.cc).
// Every rank reads the weights and decodes the same; the ranks check each token together (collective); rank 0 prints.
int cmd_generate(const std::vector<std::string>& args, st::Communicator& world);

// shardtrain plot METRICS.jsonl [--out FILE.svg]: the run's curves as a self-contained SVG (plot_command.cc).
// Single-process.
int cmd_plot(const std::vector<std::string>& args);

// shardtrain tokenize --tokenizer FILE --out PREFIX [options] INPUT...: text or JSONL to llm.c token shards
// (text/tokenize_job.h; tokenize_command.cc). Single-process, one encoding thread per core.
int cmd_tokenize(const std::vector<std::string>& args);
