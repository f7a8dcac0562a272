// shardtrain: the command-line entry point. The only place an error becomes an exit code.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <memory>

#include "commands.h"
#include "config_args.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/launcher.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/preempt.h"
#include "shardtrain/train/trainer.h"
#include "eval_command.h"

namespace {

constexpr const char* kUsage =
    "usage: shardtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train    train a GPT-2 or Llama-family model: shardtrain train [--config FILE] [--section.key=value ...]\n"
    "           without --config it runs configs/default.ini (the tiny model on the built-in corpus); one\n"
    "           --config at most, a regular file of at most 1 MiB\n"
    "  ckpt     checkpoint tools: shardtrain ckpt inspect|verify DIR, shardtrain ckpt export DIR --out PATH\n"
    "  eval     mean loss of a checkpoint: shardtrain eval --ckpt DIR [--data.path=FILE] [--train.eval_batches=N]\n"
    "  generate text from a checkpoint or init.from weights, with a key/value cache: shardtrain generate\n"
    "           (--ckpt DIR | --init.from PATH) (--prompt TEXT | --prompt-ids 1,2,3 | --prompts FILE) [--chat]\n"
    "           [--stop STR] [--jsonl] [--max-tokens N] [--temperature T] [--top-k K] [--seed S]\n"
    "           [--train.device=cuda] (shardtrain generate --help for more)\n"
    "  topo     nodes, measured link bandwidths and the sharding plan: shardtrain topo [--config FILE] [...]\n"
    "  plan     the memory plan of a run per rank and node, and what would make it fit, without a GPU:\n"
    "           shardtrain plan --config FILE [--world N] [--ranks-per-node N] [--gpu-mem GiB] [--host-mem GiB]\n"
    "  plot     a metrics file's curves as an SVG: shardtrain plot METRICS.jsonl [--out run.svg]\n"
    "  tokenize text or JSONL to token shards: shardtrain tokenize --tokenizer tokenizer.json --out PREFIX INPUT...\n"
    "\n"
    "options:\n"
    "  --help, -h                this text (with every config key)\n"
    "  --help-config             every config key, without the commands\n"
    "  --help-config=markdown    every config key as Markdown: docs/config.md is this output\n"
    "  --help-env                the environment variables shardtrain reads\n"
    "\n"
    "exit codes: 0 success, 2 bad input (config, data, checkpoint, a ckpt.dir in use or not writable, a run whose\n"
    "every step was skipped: do not retry), 75 fault (retry from the last checkpoint), 76 preempted (SIGTERM,\n"
    "SIGINT or SIGUSR1: checkpoint committed, or none without ckpt.dir; resume with ckpt.resume=auto), 130 / 143\n"
    "tokenize or generate stopped by SIGINT / SIGTERM (tokenize removed its files, generate kept what it printed),\n"
    "3 plan: the config does not fit the target, 1 internal error\n";

void print_help(bool with_usage) {
  if (with_usage) std::fputs(kUsage, stdout);
  std::printf("\nconfig keys (INI [section] key = value, or --section.key=value on the command line):\n%s",
              st::config_help().c_str());
}

void print_env() {
  std::puts("environment variables:");
  for (const st::EnvVar& v : st::env_table())
    std::printf("  %-26s (default: %s)\n      %s\n", v.name, v.default_value[0] ? v.default_value : "\"\"", v.help);
}

// What `train` runs without --config.
std::string default_config_path() {
  return (std::filesystem::path(st::env_get("SHARDTRAIN_CONFIG_DIR")) / "default.ini").string();
}

int cmd_train(const std::vector<std::string>& args, st::Communicator& comm) {
  const ConfigArgs parsed = parse_config_args(args);
  if (parsed.help) {
    std::puts("usage: shardtrain train [--config FILE] [--section.key=value ...]");
    print_help(false);
    return st::kExitOk;
  }
  std::optional<std::string> config = parsed.config;
  const std::vector<std::string>& overrides = parsed.overrides;
  st::ConfigFileRole role = st::ConfigFileRole::kChosen;
  if (!config) {
    config = default_config_path();
    role = st::ConfigFileRole::kDefaults;
    if (comm.rank() == 0) ST_LOG_INFO("no --config given: running ", *config);
  }
  const st::Config cfg = st::load_config(config, overrides, role);
  st::install_preemption_handlers();
  const st::TrainSummary s = st::run_training(cfg, comm);
  if (s.preempted) return st::kExitPreempted;
  if (comm.rank() != 0) return st::kExitOk;
  if (s.nothing_to_train) {
    std::printf("done: nothing to train: the checkpoint is at step %lld, train.steps is %lld\n",
                static_cast<long long>(s.steps), static_cast<long long>(cfg.train.steps));
    return st::kExitOk;
  }
  std::printf("done: %lld steps (%lld skipped), final loss %.4f, val_loss %.4f, median %.0f tok/s\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.skipped), s.last_loss, s.val_loss,
              s.median_tokens_per_s);
  return st::kExitOk;
}

int run(int argc, char** argv, st::Communicator& comm) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return st::kExitBadInput;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_help(true);
    return st::kExitOk;
  }
  if (cmd == "--help-env") {
    print_env();
    return st::kExitOk;
  }
  if (cmd == "--help-config") {
    print_help(false);
    return st::kExitOk;
  }
  if (cmd == "--help-config=markdown") {
    std::fputs(st::config_markdown().c_str(), stdout);
    return st::kExitOk;
  }
  if (cmd.rfind("--help-config=", 0) == 0)
    ST_BAD_INPUT("unknown format in '", st::excerpt(cmd),
                 "' (expected --help-config=markdown, or --help-config for plain text)");
  if (cmd == "train") return cmd_train(rest, comm);
  if (cmd == "ckpt") return cmd_ckpt(rest);
  if (cmd == "eval") return cmd_eval(rest, comm);
  if (cmd == "generate") return cmd_generate(rest, comm);
  if (cmd == "topo") return cmd_topo(rest, comm);
  if (cmd == "plan") return cmd_plan(rest);
  if (cmd == "plot") return cmd_plot(rest);
  if (cmd == "tokenize") return cmd_tokenize(rest);
  ST_BAD_INPUT("unknown command '", st::excerpt(cmd),
               "' (expected: train, eval, generate, topo, plan, plot, tokenize or ckpt; see shardtrain --help)");
}

}  // namespace

// Every rank runs this (under mpirun, or started with the env bootstrap's variables). A rank that fails prints
// its error and ends the whole job: under MPI it aborts it (MPI_Abort with the error's exit code), so mpirun
// exits non-zero; with the env bootstrap it exits with that code, and its closed connections make the other
// ranks fail (kFault). No rank waits forever in a collective. The MpiSession lives outside the try so that
// the error path can still abort.
int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f, RLIMIT_FSIZE) raises SIGXFSZ, whose default action kills the
  // process with no message and a half-written file. Ignored, the write fails with EFBIG instead, and the error
  // path reports it (kFault, naming the file) and removes what it had written, as for a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  std::optional<st::MpiSession> mpi;
  try {
    const std::string cmd = argc >= 2 ? argv[1] : "";
    st::WorldOptions world = st::world_options_from_args(
        argc, argv, cmd == "train" ? std::optional<std::string>(default_config_path()) : std::nullopt);
    world.single_process = cmd != "train" && cmd != "eval" && cmd != "generate" && cmd != "topo";
    const std::unique_ptr<st::Communicator> comm = st::join_world(&argc, &argv, world, &mpi);
    return run(argc, argv, *comm);  // comm is destroyed before the session finalises MPI
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::fail_world(mpi, e.kind());
  } catch (const std::bad_alloc& e) {
    // Host memory ran out after the memory plan fitted (shard/memory_plan.h refuses a config that cannot
    // fit with kBadInput, before allocating): other processes took it, or an allocation outside the plan did.
    std::fprintf(stderr,
                 "error: out of host memory (%s): an allocation failed after start-up; free memory on this host, or "
                 "lower train.micro_batch, set train.recompute=true or use more ranks\n",
                 e.what());
    return st::fail_world(mpi, st::ErrorKind::kFault);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal: %s\n", e.what());
    return st::fail_world(mpi, st::ErrorKind::kInternal);
  }
}
