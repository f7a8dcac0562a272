// `shardtrain eval`: evaluate a committed checkpoint.
//
// The model config comes from the checkpoint's manifest; command-line overrides may change the data and
// batch keys but not the model (a changed model key is an error naming it). The data is data.path read
// whole (no validation holdout). With B = train.micro_batch and T = model.seq_len, batch b is B rows of
// T+1 tokens and row j starts at token (b*B + j)*T. With W ranks (under mpirun), rank r evaluates
// batches r, r+W, ...; train.eval_batches must be a multiple of W. Where the data has loss masks (data.loss_mask),
// the loss is the mean over the targets they mark, as in training.
#include "eval_command.h"

#include <cstdio>

#include "checkpoint_config.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/data/source_factory.h"
#include "shardtrain/train/step_engine.h"

int cmd_eval(const std::vector<std::string>& args, st::Communicator& comm) {
  std::string dir;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::puts(
          "usage: shardtrain eval --ckpt DIR [--data.path=FILE] [--train.eval_batches=N] [--section.key=value ...]\n"
          "  mean loss of checkpoint DIR over N sequential batches of data.path (read whole):\n"
          "  batch b is train.micro_batch rows of model.seq_len+1 tokens; row j starts at token (b*B + j)*T;\n"
          "  with loss masks beside llm.c shards (data.loss_mask=auto), over the targets they mark");
      return st::kExitOk;
    }
    if (a == "--ckpt") {
      if (i + 1 >= args.size()) ST_BAD_INPUT("--ckpt needs a checkpoint directory");
      dir = args[++i];
    } else if (a.rfind("--ckpt=", 0) == 0) {
      dir = a.substr(7);
    } else {
      overrides.push_back(a);
    }
  }
  if (dir.empty()) ST_BAD_INPUT("shardtrain eval needs --ckpt DIR (a committed step directory)");
  const st::Config cfg = checkpoint_config(dir, overrides);

  const int world = comm.world_size();
  const int64_t batches = cfg.train.eval_batches;
  if (batches % world != 0)
    ST_BAD_INPUT("train.eval_batches (", batches, ") must be a multiple of the world size (", world, ")");
  const std::unique_ptr<st::TokenSource> data =
      st::open_token_source(cfg.data.path, cfg.data.format, cfg.model.vocab_size, "data.path", cfg.data.loss_mask);
  st::SamplerOptions so;
  so.T = cfg.model.seq_len;
  so.micro_batch = cfg.train.micro_batch;
  so.rank = comm.rank();
  so.world = world;
  so.shuffle = false;
  const st::Sampler sampler(*data, so);
  const int64_t needed = batches * cfg.train.micro_batch;
  if (sampler.num_windows() < needed)
    ST_BAD_INPUT("data.path ", cfg.data.path, " holds ", sampler.num_windows(), " windows of ", cfg.model.seq_len + 1,
                 " tokens; ", batches, " batches of ", cfg.train.micro_batch, " rows need ", needed);

  st::StepEngine engine(cfg, comm);
  const st::CheckpointState cs = st::load_checkpoint(dir, cfg, engine.sharded(), comm, st::CheckpointLoad::kRead);
  const float loss = engine.evaluate(
      [&](int64_t i, int32_t* in, int32_t* tgt) { sampler.fill_eval(i, in, tgt); }, batches / world);
  if (comm.rank() == 0)
    std::printf("eval: %s (step %lld): loss %.6f over %lld batches of %lld x %d tokens of %s\n", dir.c_str(),
                static_cast<long long>(cs.step), loss, static_cast<long long>(batches),
                static_cast<long long>(cfg.train.micro_batch), cfg.model.seq_len, data->describe().c_str());
  return st::kExitOk;
}
