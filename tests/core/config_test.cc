#include "shardtrain/core/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using testing::ConfigTest;
using testing::shipped;

// Runs `f`, expects st::Error of kind kBadInput, and returns its message ("" and a failure otherwise).
std::string bad_input_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected st::Error(kBadInput), nothing was thrown";
  return "";
}

std::string load_error(const std::optional<std::string>& path, const std::vector<std::string>& overrides = {}) {
  return bad_input_message([&] { load_config(path, overrides); });
}

TEST_F(ConfigTest, DefaultsAreTheStructInitialisers) {
  const Config c = load_config(std::nullopt, {});
  EXPECT_EQ(c.source, "<defaults>");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.seq_len, 128);
  EXPECT_EQ(c.train.steps, 600);
  EXPECT_EQ(c.train.global_batch, 16);
  EXPECT_EQ(c.train.micro_batch, 16);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.train.eval_every, 100);
  EXPECT_EQ(c.train.eval_batches, 8);
  EXPECT_EQ(c.train.sample_tokens, 200);
  EXPECT_EQ(c.optim.lr, 3e-3f);
  EXPECT_EQ(c.optim.min_lr, 3e-4f);
  EXPECT_EQ(c.optim.warmup_steps, 30);
  EXPECT_EQ(c.optim.weight_decay, 0.1f);
  EXPECT_EQ(c.optim.beta1, 0.9f);
  EXPECT_EQ(c.optim.beta2, 0.95f);
  EXPECT_EQ(c.optim.eps, 1e-8f);
  EXPECT_EQ(c.optim.grad_clip, 1.0f);
  EXPECT_EQ(c.data.path, "@fortunes");
  EXPECT_EQ(c.data.format, DataFormat::kText);
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.data.val_holdout, 0.05);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.log.metrics, "");
  EXPECT_EQ(c.log.every, 1);
  EXPECT_EQ(c.ckpt.replicas, 0);
  EXPECT_EQ(to_ini(c), to_ini(Config{}));
}

TEST_F(ConfigTest, FileValuesAreReadAndOthersKeepDefaults) {
  const std::string path = write("a.ini",
                                 "# a comment\n"
                                 "[model]\n"
                                 "n_layer = 6   # trailing comment\n"
                                 "n_embd=96\n"
                                 "n_head = 3\n"
                                 "[train]\n"
                                 "steps = 42\n"
                                 "seed = 18446744073709551615\n"
                                 "[optim]\n"
                                 "lr = 3e-4\n"
                                 "[data]\n"
                                 "path = data/x_*.bin\n"
                                 "format = llmc\n"
                                 "val_holdout = 0.25\n"
                                 "shuffle = no\n"
                                 "[log]\n"
                                 "metrics = runs/m.jsonl\n"
                                 "[ckpt]\n"
                                 "[dist]\n");
  const Config c = load_config(path, {});
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.model.n_embd, 96);
  EXPECT_EQ(c.model.n_head, 3);
  EXPECT_EQ(c.model.seq_len, 128);  // default
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_EQ(c.train.global_batch, 16);  // default
  EXPECT_EQ(c.optim.lr, 3e-4f);
  EXPECT_EQ(c.optim.min_lr, 3e-4f);  // default
  EXPECT_EQ(c.data.path, "data/x_*.bin");
  EXPECT_EQ(c.data.format, DataFormat::kLlmc);
  EXPECT_EQ(c.data.val_holdout, 0.25);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.log.metrics, "runs/m.jsonl");
}

TEST_F(ConfigTest, CommandLineOverridesFile) {
  const std::string path = write("a.ini", "[train]\nsteps = 42\nmicro_batch = 8\n[data]\nshuffle = false\n");
  const Config c =
      load_config(path, {"--train.steps=7", "--data.shuffle", "yes", "--optim.lr", "0.5", "--model.n_layer=2"});
  EXPECT_EQ(c.train.steps, 7);        // override beats file
  EXPECT_EQ(c.train.micro_batch, 8);  // file beats default
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.optim.lr, 0.5f);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.source, path);
}

TEST_F(ConfigTest, OverridesWithoutFile) {
  const Config c = load_config(std::nullopt, {"--data.format=llmc", "--data.val_path=v.bin", "--log.metrics="});
  EXPECT_EQ(c.source, "<defaults>");
  EXPECT_EQ(c.data.format, DataFormat::kLlmc);
  EXPECT_EQ(c.data.val_path, "v.bin");
  EXPECT_EQ(c.log.metrics, "");
}

TEST_F(ConfigTest, BoolSpellings) {
  const std::pair<const char*, bool> cases[] = {{"true", true}, {"false", false}, {"1", true},
                                                {"0", false},   {"yes", true},    {"no", false}};
  for (const auto& [text, want] : cases) {
    const std::string path = write("b.ini", std::string("[data]\nshuffle = ") + text + "\n");
    EXPECT_EQ(load_config(path, {}).data.shuffle, want) << text;
  }
  const std::string msg = load_error(write("c.ini", "[data]\nshuffle = maybe\n"));
  EXPECT_NE(msg.find("data.shuffle"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'maybe'"), std::string::npos) << msg;
  // Boost reads an empty bool as true; we do not.
  const std::string empty = load_error(write("d.ini", "[data]\nshuffle =\n"));
  EXPECT_NE(empty.find("data.shuffle"), std::string::npos) << empty;
}

TEST_F(ConfigTest, UnknownKeyInFileNamesKeyFileAndLine) {
  const std::string path = write("k.ini", "[train]\nsteps = 5\nstepz = 5\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("train.stepz"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("steps, global_batch"), std::string::npos) << msg;  // lists the section's keys
}

TEST_F(ConfigTest, KeyBeforeAnySectionIsUnknown) {
  const std::string path = write("k.ini", "steps = 5\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("'steps'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path + ":1"), std::string::npos) << msg;
}

TEST_F(ConfigTest, UnknownKeyOnCommandLineNamesKey) {
  const std::string path = write("a.ini", "[train]\nsteps = 5\n");
  const std::string msg = load_error(path, {"--train.stepz=5"});
  EXPECT_NE(msg.find("train.stepz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("command line"), std::string::npos) << msg;
  // No prefix guessing: --train.step is not --train.steps.
  const std::string prefix = load_error(std::nullopt, {"--train.step=5"});
  EXPECT_NE(prefix.find("'train.step'"), std::string::npos) << prefix;
  const std::string section = load_error(std::nullopt, {"--foo.bar=1"});
  EXPECT_NE(section.find("foo.bar"), std::string::npos) << section;
  EXPECT_NE(section.find("no section [foo]"), std::string::npos) << section;
}

TEST_F(ConfigTest, UnknownKeyOfDistListsItsKeys) {
  const std::string path = write("c.ini", "[dist]\nworld = 100\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("dist.world"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("keys of [dist]: sharding, reshard_after_forward, max_gpu_mem_gib"), std::string::npos) << msg;
  const std::string cli = load_error(std::nullopt, {"--dist.world=2"});
  EXPECT_NE(cli.find("dist.world"), std::string::npos) << cli;
  EXPECT_NE(cli.find("command line"), std::string::npos) << cli;
}

TEST_F(ConfigTest, UnknownSectionNamesSectionAndFile) {
  const std::string path = write("s.ini", "[train]\nsteps = 5\n[trian]\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("[trian]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown section"), std::string::npos) << msg;
}

TEST_F(ConfigTest, WrongTypeNamesKeyAndValue) {
  const std::string path = write("t.ini", "[train]\nsteps = abc\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("train.steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'abc'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path + ":2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an integer"), std::string::npos) << msg;

  const std::string cli = load_error(std::nullopt, {"--optim.lr", "fast"});
  EXPECT_NE(cli.find("optim.lr"), std::string::npos) << cli;
  EXPECT_NE(cli.find("'fast'"), std::string::npos) << cli;
  EXPECT_NE(cli.find("command line"), std::string::npos) << cli;

  const std::string overflow = load_error(write("o.ini", "[model]\nn_layer = 99999999999\n"));
  EXPECT_NE(overflow.find("model.n_layer"), std::string::npos) << overflow;
  EXPECT_NE(overflow.find("'99999999999'"), std::string::npos) << overflow;

  // Boost would wrap -1 to 2^64-1 for an unsigned key.
  const std::string negative = load_error(std::nullopt, {"--train.seed=-1"});
  EXPECT_NE(negative.find("train.seed"), std::string::npos) << negative;
  EXPECT_NE(negative.find("'-1'"), std::string::npos) << negative;
}

TEST_F(ConfigTest, MissingFileNamesPath) {
  const std::string path = (dir_ / "nope.ini").string();
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST_F(ConfigTest, MalformedLineNamesFileAndLine) {
  const std::string path = write("m.ini", "[train]\nsteps = 5\nmicro_batch 4\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'micro_batch 4'"), std::string::npos) << msg;
}

TEST_F(ConfigTest, DuplicateKeyInFileNamesBothLines) {
  const std::string path = write("d.ini", "[train]\nsteps = 5\n[optim]\nlr = 1\n[train]\nsteps = 6\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("train.steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("lines 2, 6"), std::string::npos) << msg;

  const std::string cli = load_error(std::nullopt, {"--train.steps=5", "--train.steps=6"});
  EXPECT_NE(cli.find("train.steps"), std::string::npos) << cli;
  EXPECT_NE(cli.find("'5', '6'"), std::string::npos) << cli;
}

TEST_F(ConfigTest, BadEnumListsAllowedValues) {
  const std::string path = write("e.ini", "[data]\nformat = bin\n");
  const std::string msg = load_error(path);
  EXPECT_NE(msg.find("data.format"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'bin'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llmc, text"), std::string::npos) << msg;
  EXPECT_STREQ(to_string(DataFormat::kLlmc), "llmc");
  EXPECT_STREQ(to_string(DataFormat::kText), "text");
}

TEST_F(ConfigTest, StrayCommandLineWordsAreRejected) {
  const std::string msg = load_error(std::nullopt, {"--train.steps=5", "oops"});
  EXPECT_NE(msg.find("'oops'"), std::string::npos) << msg;
  const std::string missing = load_error(std::nullopt, {"--data.shuffle"});
  EXPECT_NE(missing.find("data.shuffle needs a value"), std::string::npos) << missing;
}

TEST_F(ConfigTest, ValidationNamesKeysAndValues) {
  const std::string heads = load_error(std::nullopt, {"--model.n_embd=100", "--model.n_head=3"});
  EXPECT_NE(heads.find("model.n_embd (100)"), std::string::npos) << heads;
  EXPECT_NE(heads.find("model.n_head (3)"), std::string::npos) << heads;

  struct Case {
    std::string override_arg;
    std::string expect;
  };
  const Case cases[] = {
      {"--model.n_layer=0", "model.n_layer must be > 0 (got 0)"},
      {"--model.n_head=-1", "model.n_head must be > 0 (got -1)"},
      {"--model.n_embd=0", "model.n_embd must be > 0 (got 0)"},
      {"--model.vocab_size=0", "model.vocab_size must be > 0 (got 0)"},
      {"--model.seq_len=0", "model.seq_len must be > 0 (got 0)"},
      {"--train.steps=0", "train.steps must be > 0 (got 0)"},
      {"--train.global_batch=0", "train.global_batch must be > 0 (got 0)"},
      {"--train.micro_batch=-2", "train.micro_batch must be > 0 (got -2)"},
      {"--train.eval_batches=0", "train.eval_batches must be >= 1 (got 0)"},
      {"--train.eval_every=-1", "train.eval_every must be >= 0 (got -1)"},
      {"--data.val_holdout=1", "data.val_holdout must be in [0, 1) (got 1)"},
      {"--data.val_holdout=-0.5", "data.val_holdout must be in [0, 1) (got -0.5)"},
      {"--optim.lr=0", "optim.lr must be finite and > 0 (got 0)"},
      {"--optim.min_lr=0.01", "optim.min_lr (0.01) must be in [0, optim.lr] = [0, 0.003]"},
      {"--optim.min_lr=-1", "optim.min_lr (-1) must be in [0, optim.lr] = [0, 0.003]"},
      {"--optim.beta1=1", "optim.beta1 must be in [0, 1) (got 1)"},
      {"--optim.beta2=-0.1", "optim.beta2 must be in [0, 1) (got -0.1)"},
      {"--optim.eps=0", "optim.eps must be > 0 (got 0)"},
      {"--optim.weight_decay=-0.1", "optim.weight_decay must be >= 0 (got -0.1)"},
      {"--optim.grad_clip=-1", "optim.grad_clip must be >= 0 (0: off) (got -1)"},
      {"--optim.warmup_steps=-1", "optim.warmup_steps must be >= 0 (got -1)"},
      {"--optim.decay_steps=-1", "optim.decay_steps must be >= 0 (got -1)"},
      {"--log.every=0", "log.every must be >= 1 (got 0)"},
      {"--data.path=", "data.path must not be empty"},
      {"--log.metrics=a#b", "log.metrics ('a#b') cannot be written to INI"},
      {"--ckpt.replicas=2", "ckpt.replicas (2) must be 0 (a shared ckpt.dir) or 1"},
      {"--ckpt.dir=ck/node{node}",
       "ckpt.dir ('ck/node{node}') contains {node}, which gives each node a directory "
       "of its own: that needs ckpt.replicas=1"},
      {"--ckpt.resume=ck/node{node}/step_00000004", "ckpt.resume ('ck/node{node}/step_00000004') contains {node}"},
  };
  for (const auto& c : cases) {
    const std::string msg = load_error(std::nullopt, {c.override_arg});
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.override_arg << " -> " << msg;
    EXPECT_NE(msg.find("<defaults> with command-line overrides"), std::string::npos) << msg;
  }
  // inf and nan are refused as they are read, for every floating-point key.
  const std::string nan = load_error(std::nullopt, {"--optim.lr=nan"});
  EXPECT_NE(nan.find("command line: bad value 'nan' for optim.lr (expected a finite number)"), std::string::npos)
      << nan;
  // Every problem is reported, not just the first.
  const std::string both = load_error(std::nullopt, {"--model.n_layer=0", "--log.every=0"});
  EXPECT_NE(both.find("model.n_layer"), std::string::npos) << both;
  EXPECT_NE(both.find("log.every"), std::string::npos) << both;
  // Boundaries that are allowed.
  const std::vector<std::string> edges = {"--train.eval_every=0",   "--data.val_holdout=0",   "--optim.min_lr=0",
                                          "--optim.beta1=0",        "--optim.weight_decay=0", "--optim.grad_clip=0",
                                          "--optim.warmup_steps=0", "--optim.decay_steps=0"};
  EXPECT_NO_THROW(load_config(std::nullopt, edges));
  // The decay fits in the steps after the warmup, the edge included.
  const std::string long_decay =
      load_error(std::nullopt, {"--train.steps=100", "--optim.warmup_steps=30", "--optim.decay_steps=71"});
  EXPECT_NE(long_decay.find("optim.decay_steps (71) must be at most train.steps - optim.warmup_steps = 100 - 30 = 70"),
            std::string::npos)
      << long_decay;
  const Config wsd = load_config(
      std::nullopt, {"--train.steps=100", "--optim.warmup_steps=30", "--optim.decay_steps=70", "--optim.decay=sqrt"});
  EXPECT_EQ(wsd.optim.decay_steps, 70);
  EXPECT_EQ(wsd.optim.decay, LrDecay::kSqrt);
  const std::string shape = load_error(std::nullopt, {"--optim.decay=step"});
  EXPECT_NE(shape.find("optim.decay"), std::string::npos) << shape;
  EXPECT_NE(shape.find("cosine, linear, sqrt"), std::string::npos) << shape;
  const Config node_local = load_config(std::nullopt, {"--ckpt.replicas=1", "--ckpt.dir=ck/node{node}"});
  EXPECT_EQ(node_local.ckpt.replicas, 1);
  EXPECT_EQ(node_local.ckpt.dir, "ck/node{node}");
}

TEST_F(ConfigTest, GradAccumSteps) {
  Config c;
  c.train.global_batch = 512;
  c.train.micro_batch = 16;
  EXPECT_EQ(c.grad_accum_steps(1), 32);
  EXPECT_EQ(c.grad_accum_steps(8), 4);
  EXPECT_EQ(c.grad_accum_steps(32), 1);

  c.train.global_batch = 24;
  const std::string msg = bad_input_message([&] { c.grad_accum_steps(1); });
  EXPECT_NE(msg.find("train.global_batch (24) must be a multiple of train.micro_batch (16) x world size (1) = 16"),
            std::string::npos)
      << msg;
  c.train.global_batch = 512;
  const std::string world = bad_input_message([&] { c.grad_accum_steps(3); });
  EXPECT_NE(world.find("(512)"), std::string::npos) << world;
  EXPECT_NE(world.find("(16)"), std::string::npos) << world;
  EXPECT_NE(world.find("world size (3) = 48"), std::string::npos) << world;
  // More ranks than the batch can feed: zero micro-steps is an error, not 0.
  const std::string too_many = bad_input_message([&] { c.grad_accum_steps(64); });
  EXPECT_NE(too_many.find("world size (64) = 1024"), std::string::npos) << too_many;
  const std::string zero = bad_input_message([&] { c.grad_accum_steps(0); });
  EXPECT_NE(zero.find("world size (0)"), std::string::npos) << zero;
}

TEST_F(ConfigTest, ToIniRoundTrips) {
  Config x;
  x.model.n_layer = 3;
  x.model.n_head = 6;
  x.model.n_embd = 192;
  x.model.vocab_size = 50257;
  x.train.steps = 123456789012;
  x.train.seed = 18446744073709551615ull;
  x.train.eval_every = 0;
  x.optim.lr = 0.1f + 0.2f;  // not the float nearest a short decimal
  x.optim.min_lr = 1.0f / 3.0f * 0.1f;
  x.optim.eps = 1.1754944e-38f;
  x.optim.beta2 = 0.999f;
  x.data.path = "data/train_*.bin";
  x.data.format = DataFormat::kLlmc;
  x.data.val_path = "data/val.bin";
  x.data.val_holdout = 0.1 + 0.2;
  x.data.shuffle = false;
  x.log.metrics = "runs/a b.jsonl";
  x.log.every = 7;

  const std::string ini = to_ini(x);
  const std::string path = write("round.ini", ini);
  const Config y = load_config(path, {});
  EXPECT_EQ(to_ini(y), ini);
  EXPECT_EQ(y.source, path);
  EXPECT_EQ(y.model.n_head, 6);
  EXPECT_EQ(y.train.steps, 123456789012);
  EXPECT_EQ(y.train.seed, 18446744073709551615ull);
  EXPECT_EQ(y.optim.lr, x.optim.lr);  // bit-exact
  EXPECT_EQ(y.optim.min_lr, x.optim.min_lr);
  EXPECT_EQ(y.optim.eps, x.optim.eps);
  EXPECT_EQ(y.data.val_holdout, x.data.val_holdout);
  EXPECT_EQ(y.data.format, DataFormat::kLlmc);
  EXPECT_FALSE(y.data.shuffle);
  EXPECT_EQ(y.log.metrics, "runs/a b.jsonl");

  // Defaults print short: 3e-3f is "0.003", not "0.00300000003".
  const std::string defaults = to_ini(Config{});
  EXPECT_NE(defaults.find("\nlr = 0.003\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nval_path =\n"), std::string::npos) << defaults;
  // Whole numbers print as integers: 600, not the shortest %g form 6e+02; small and fractional ones as before.
  EXPECT_NE(defaults.find("\ntimeout_s = 600\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nrendezvous_timeout_s = 300\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\ngrad_clip = 1\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nbucket_mb = -1\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\neps = 1e-08\n"), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("\nval_holdout = 0.05\n"), std::string::npos) << defaults;
  const Config big = load_config(std::nullopt, {"--dist.timeout_s=1e8", "--dist.max_gpu_mem_gib=80"});
  EXPECT_NE(to_ini(big).find("\ntimeout_s = 100000000\n"), std::string::npos) << to_ini(big);
  EXPECT_NE(to_ini(big).find("\nmax_gpu_mem_gib = 80\n"), std::string::npos) << to_ini(big);
  EXPECT_EQ(load_config(write("big.ini", to_ini(big)), {}).dist.timeout_s, 1e8);
  const Config z = load_config(write("defaults.ini", defaults), {});
  EXPECT_EQ(to_ini(z), defaults);
}

TEST_F(ConfigTest, HelpListsEveryKeyOfToIni) {
  const std::string help = config_help();
  std::istringstream ini(to_ini(Config{}));
  std::string line, section;
  int keys = 0;
  while (std::getline(ini, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      EXPECT_NE(help.find(line), std::string::npos) << line;
      continue;
    }
    const std::string name = section + "." + line.substr(0, line.find(" ="));
    EXPECT_NE(help.find("  " + name + " "), std::string::npos) << name;
    ++keys;
  }
  EXPECT_EQ(keys, 88);
  EXPECT_NE(help.find("(default: 0.003)"), std::string::npos) << help;
  EXPECT_NE(help.find("(default: @fortunes)"), std::string::npos) << help;
  EXPECT_NE(help.find("  dist.reshard_after_forward "), std::string::npos) << help;
}

// docs/config.md's text: a table row per key, in to_ini()'s order, with what the value must look like, the default
// and the description; each row has exactly the five '|' of its four cells.
TEST_F(ConfigTest, MarkdownHasOneRowPerKeyOfToIni) {
  const std::string md = config_markdown();
  std::vector<std::string> ini_names;
  std::istringstream ini(to_ini(Config{}));
  std::string line, section;
  while (std::getline(ini, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      EXPECT_NE(md.find("\n## [" + section + "]\n"), std::string::npos) << section;
      continue;
    }
    ini_names.push_back(section + "." + line.substr(0, line.find(" =")));
  }
  std::vector<std::string> row_names;
  std::istringstream rows(md);
  while (std::getline(rows, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    row_names.push_back(line.substr(3, line.find('`', 3) - 3));
    int cell_bars = 0;
    for (size_t i = 0; i < line.size(); ++i) cell_bars += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    EXPECT_EQ(cell_bars, 5) << line;
  }
  EXPECT_EQ(row_names, ini_names);
  EXPECT_EQ(row_names.size(), 88u);

  EXPECT_EQ(md.substr(0, md.find('\n')), "# Configuration keys");
  EXPECT_NE(md.find("\n    ./build/shardtrain --help-config=markdown > docs/config.md\n"), std::string::npos);
  EXPECT_NE(md.find("\n| `model.n_layer` | an integer | `4` | number of transformer blocks |\n"), std::string::npos);
  EXPECT_NE(md.find("\n| `train.seed` | a non-negative integer | `1337` | "), std::string::npos);
  EXPECT_NE(md.find("\n| `train.gemm_autotune` | an integer | `0` | cuda: "), std::string::npos);
  EXPECT_NE(md.find("\n| `train.device` | one of: cpu, cuda | `cpu` | "), std::string::npos);
  EXPECT_NE(md.find("\n| `optim.lr` | a finite number | `0.003` | "), std::string::npos);
  EXPECT_NE(md.find("\n| `data.shuffle` | true/false, 1/0 or yes/no | `true` | "), std::string::npos);
  EXPECT_NE(md.find("\n| `log.metrics` | a string | `\"\"` | "), std::string::npos);
}

TEST_F(ConfigTest, DeviceAndDtype) {
  const Config def = load_config(std::nullopt, {});
  EXPECT_EQ(def.train.device, Device::kCpu);
  EXPECT_EQ(def.compute_dtype(), DType::kF32);
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda"}).compute_dtype(), DType::kBF16);
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda", "--train.dtype=fp16"}).compute_dtype(), DType::kF16);
  const std::string bad = load_error(std::nullopt, {"--train.device=tpu"});
  EXPECT_NE(bad.find("train.device"), std::string::npos) << bad;
  EXPECT_NE(bad.find("cpu, cuda"), std::string::npos) << bad;
  const std::string cpu16 = load_error(std::nullopt, {"--train.dtype=bf16"});
  EXPECT_NE(cpu16.find("train.dtype (bf16) must be fp32 when train.device is cpu"), std::string::npos) << cpu16;
  const std::string cap = load_error(std::nullopt, {"--dist.max_gpu_mem_gib=-1"});
  EXPECT_NE(cap.find("dist.max_gpu_mem_gib must be in [0, 1048576] (0: no cap) (got -1)"), std::string::npos) << cap;
  const std::string host_cap = load_error(std::nullopt, {"--dist.max_host_mem_gib=-2"});
  EXPECT_NE(host_cap.find("dist.max_host_mem_gib must be in [0, 1048576] (0: no cap) (got -2)"), std::string::npos)
      << host_cap;
  EXPECT_EQ(load_config(std::nullopt, {"--dist.max_host_mem_gib=96.5"}).dist.max_host_mem_gib, 96.5);
  const Config round = load_config_text(
      to_ini(load_config(std::nullopt,
                         {"--train.device=cuda", "--dist.reshard_after_forward=false", "--train.attention=flash"})),
      "ini", {});
  EXPECT_EQ(round.train.device, Device::kCuda);
  EXPECT_FALSE(round.dist.reshard_after_forward);
  EXPECT_EQ(round.train.attention, AttentionImpl::kFlash);
}

TEST_F(ConfigTest, AttentionKernel) {
  EXPECT_EQ(load_config(std::nullopt, {}).train.attention, AttentionImpl::kAuto);
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda", "--train.attention=cudnn"}).train.attention,
            AttentionImpl::kCudnn);
  const std::string bad = load_error(std::nullopt, {"--train.device=cuda", "--train.attention=sdpa"});
  EXPECT_NE(bad.find("train.attention"), std::string::npos) << bad;
  EXPECT_NE(bad.find("auto, cudnn, flash"), std::string::npos) << bad;
  const std::string cpu = load_error(std::nullopt, {"--train.attention=flash"});
  EXPECT_NE(cpu.find("train.attention (flash) applies to train.device=cuda; cpu takes auto"), std::string::npos) << cpu;
  const std::string fp32 =
      load_error(std::nullopt, {"--train.device=cuda", "--train.dtype=fp32", "--train.attention=cudnn"});
  EXPECT_NE(fp32.find("train.attention (cudnn) needs train.dtype bf16 or fp16"), std::string::npos) << fp32;
}

TEST_F(ConfigTest, OptimizerOffload) {
  EXPECT_EQ(load_config(std::nullopt, {}).optim.offload, OffloadMode::kNone);
  const Config c = load_config(
      std::nullopt, {"--train.device=cuda", "--optim.offload=optimizer+params", "--optim.offload_threads=6"});
  EXPECT_EQ(c.optim.offload, OffloadMode::kOptimizerParams);
  EXPECT_EQ(c.optim.offload_threads, 6);
  EXPECT_EQ(load_config_text(to_ini(c), "ini", {}).optim.offload, OffloadMode::kOptimizerParams);  // round trip
  EXPECT_EQ(load_config(std::nullopt, {"--optim.offload=optimizer"}).optim.offload, OffloadMode::kOptimizer);
  const std::string bad = load_error(std::nullopt, {"--optim.offload=cpu"});
  EXPECT_NE(bad.find("optim.offload"), std::string::npos) << bad;
  EXPECT_NE(bad.find("none, optimizer, optimizer+params"), std::string::npos) << bad;
  const std::string cpu = load_error(std::nullopt, {"--optim.offload=optimizer+params"});
  EXPECT_NE(cpu.find("optim.offload (optimizer+params) applies to train.device=cuda"), std::string::npos) << cpu;
  const std::string threads = load_error(std::nullopt, {"--optim.offload_threads=-2"});
  EXPECT_NE(threads.find("optim.offload_threads"), std::string::npos) << threads;
  EXPECT_EQ(
      load_config(std::nullopt, {"--optim.offload=optimizer", "--optim.offload_fraction=0.25"}).optim.offload_fraction,
      0.25f);
  const std::string zero = load_error(std::nullopt, {"--optim.offload=optimizer", "--optim.offload_fraction=0"});
  EXPECT_NE(zero.find("optim.offload_fraction"), std::string::npos) << zero;
  const std::string unused = load_error(std::nullopt, {"--optim.offload_fraction=0.5"});
  EXPECT_NE(unused.find("optim.offload_fraction (0.5) needs optim.offload optimizer or optimizer+params"),
            std::string::npos)
      << unused;
  const std::string fp32 =
      load_error(std::nullopt, {"--train.device=cuda", "--train.dtype=fp32", "--optim.offload=optimizer"});
  EXPECT_NE(fp32.find("optim.offload (optimizer) needs train.dtype bf16 or fp16 on cuda"), std::string::npos) << fp32;
  // optim.offload_speculative: auto by default (valid anywhere: it resolves to off where it cannot apply), true
  // only with offload on cuda; the old true/false spellings still read.
  EXPECT_EQ(load_config(std::nullopt, {}).optim.offload_speculative, Speculation::kAuto);
  const Config spec = load_config(
      std::nullopt, {"--train.device=cuda", "--optim.offload=optimizer", "--optim.offload_speculative=true"});
  EXPECT_EQ(spec.optim.offload_speculative, Speculation::kOn);
  EXPECT_EQ(load_config_text(to_ini(spec), "ini", {}).optim.offload_speculative, Speculation::kOn);
  EXPECT_EQ(load_config(std::nullopt, {"--optim.offload_speculative=false"}).optim.offload_speculative,
            Speculation::kOff);
  const std::string on_cpu =
      load_error(std::nullopt, {"--optim.offload=optimizer", "--optim.offload_speculative=true"});
  EXPECT_NE(on_cpu.find("optim.offload_speculative (true) needs train.device=cuda"), std::string::npos) << on_cpu;
  const std::string word = load_error(std::nullopt, {"--optim.offload_speculative=yes"});
  EXPECT_NE(word.find("auto, true, false"), std::string::npos) << word;
}

TEST_F(ConfigTest, ShardingMode) {
  EXPECT_EQ(load_config(std::nullopt, {}).dist.sharding, ShardingMode::kFull);
  EXPECT_EQ(load_config(std::nullopt, {"--dist.sharding=hybrid"}).dist.sharding, ShardingMode::kHybrid);
  const Config a = load_config(std::nullopt, {"--dist.sharding=auto"});
  EXPECT_EQ(load_config_text(to_ini(a), "ini", {}).dist.sharding, ShardingMode::kAuto);
  const std::string bad = load_error(std::nullopt, {"--dist.sharding=hsdp"});
  EXPECT_NE(bad.find("full, hybrid, auto"), std::string::npos) << bad;
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda", "--dist.sharding=hybrid"}).dist.sharding,
            ShardingMode::kHybrid);
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda", "--dist.sharding=auto"}).dist.sharding,
            ShardingMode::kAuto);
}

TEST_F(ConfigTest, PrefetchDepthAndBucket) {
  const Config d = load_config(std::nullopt, {});
  EXPECT_EQ(d.dist.prefetch_depth, -1);
  EXPECT_EQ(d.dist.bucket_mb, -1.0);
  const Config c = load_config(std::nullopt, {"--train.device=cuda", "--dist.prefetch_depth=0",
                                              "--dist.sharding=hybrid", "--dist.bucket_mb=0.5"});
  EXPECT_EQ(c.dist.prefetch_depth, 0);
  EXPECT_EQ(c.dist.bucket_mb, 0.5);
  EXPECT_EQ(load_config_text(to_ini(c), "ini", {}).dist.bucket_mb, 0.5);
  std::string e = load_error(std::nullopt, {"--train.device=cuda", "--dist.prefetch_depth=9"});
  EXPECT_NE(e.find("dist.prefetch_depth (9) must be -1 (the link's default) or in [0, 8]"), std::string::npos) << e;
  e = load_error(std::nullopt, {"--dist.prefetch_depth=1"});
  EXPECT_NE(e.find("dist.prefetch_depth (1) applies to train.device=cuda"), std::string::npos) << e;
  e = load_error(std::nullopt, {"--dist.sharding=hybrid", "--dist.bucket_mb=-2"});
  EXPECT_NE(e.find("dist.bucket_mb"), std::string::npos) << e;
  EXPECT_NE(e.find("-2"), std::string::npos) << e;
  e = load_error(std::nullopt, {"--dist.bucket_mb=8"});
  EXPECT_NE(e.find("dist.bucket_mb (8) applies to dist.sharding hybrid or auto (it is full"), std::string::npos) << e;
  EXPECT_EQ(load_config(std::nullopt, {"--dist.sharding=auto", "--dist.bucket_mb=0"}).dist.bucket_mb, 0.0);
}

TEST_F(ConfigTest, ReduceScatterCtas) {
  EXPECT_EQ(load_config(std::nullopt, {}).dist.reduce_scatter_ctas, -1);
  const Config c = load_config(std::nullopt, {"--train.device=cuda", "--dist.reduce_scatter_ctas=8"});
  EXPECT_EQ(c.dist.reduce_scatter_ctas, 8);
  EXPECT_EQ(load_config_text(to_ini(c), "ini", {}).dist.reduce_scatter_ctas, 8);
  EXPECT_EQ(load_config(std::nullopt, {"--train.device=cuda", "--dist.reduce_scatter_ctas=0"}).dist.reduce_scatter_ctas,
            0);
  std::string e = load_error(std::nullopt, {"--train.device=cuda", "--dist.reduce_scatter_ctas=65"});
  EXPECT_NE(e.find("dist.reduce_scatter_ctas (65) must be -1 (the link's default), 0 (NCCL's own) or in [1, 64]"),
            std::string::npos)
      << e;
  e = load_error(std::nullopt, {"--train.device=cuda", "--dist.reduce_scatter_ctas=-2"});
  EXPECT_NE(e.find("dist.reduce_scatter_ctas (-2) must be"), std::string::npos) << e;
  e = load_error(std::nullopt, {"--dist.reduce_scatter_ctas=4"});
  EXPECT_NE(e.find("dist.reduce_scatter_ctas (4) applies to train.device=cuda (NCCL)"), std::string::npos) << e;
}

TEST_F(ConfigTest, Deterministic) {
  EXPECT_TRUE(load_config(std::nullopt, {}).train.deterministic);
  const Config c = load_config(std::nullopt, {"--train.device=cuda", "--train.deterministic=false"});
  EXPECT_FALSE(c.train.deterministic);
  EXPECT_FALSE(load_config_text(to_ini(c), "ini", {}).train.deterministic);
  const std::string e = load_error(std::nullopt, {"--train.deterministic=false"});
  EXPECT_NE(e.find("train.deterministic (false) applies to train.device=cuda"), std::string::npos) << e;
}

// dist.gather_engine and dist.reduce_engine: the same names, kept by a written config, refused when unknown (with
// the names) and on the cpu backend.
TEST_F(ConfigTest, CommEngine) {
  for (const auto& [key, field] :
       {std::pair<std::string, CommEngine DistConfig::*>{"gather_engine", &DistConfig::gather_engine},
        {"reduce_engine", &DistConfig::reduce_engine}}) {
    SCOPED_TRACE(key);
    EXPECT_EQ(load_config(std::nullopt, {}).dist.*field, CommEngine::kAuto);
    for (const auto& [name, want] : {std::pair<const char*, CommEngine>{"copy", CommEngine::kCopy},
                                     {"sm", CommEngine::kSm},
                                     {"auto", CommEngine::kAuto}}) {
      const Config c = load_config(std::nullopt, {"--train.device=cuda", "--dist." + key + "=" + name});
      EXPECT_EQ(c.dist.*field, want) << name;
      EXPECT_EQ(load_config_text(to_ini(c), "ini", {}).dist.*field, want) << name;
    }
    std::string e = load_error(std::nullopt, {"--train.device=cuda", "--dist." + key + "=dma"});
    EXPECT_NE(e.find("dist." + key), std::string::npos) << e;
    EXPECT_NE(e.find("auto, copy, sm"), std::string::npos) << e;
    e = load_error(std::nullopt, {"--dist." + key + "=copy"});
    EXPECT_NE(e.find("dist." + key + " (copy) applies to train.device=cuda (NCCL)"), std::string::npos) << e;
  }
}

TEST_F(ConfigTest, GemmAutotune) {
  EXPECT_EQ(load_config(std::nullopt, {}).train.gemm_autotune, 0);
  const Config c = load_config(std::nullopt, {"--train.device=cuda", "--train.gemm_autotune=8"});
  EXPECT_EQ(c.train.gemm_autotune, 8);
  EXPECT_EQ(load_config_text(to_ini(c), "ini", {}).train.gemm_autotune, 8);
  std::string e = load_error(std::nullopt, {"--train.device=cuda", "--train.gemm_autotune=65"});
  EXPECT_NE(e.find("train.gemm_autotune (65) must be in [0, 64]"), std::string::npos) << e;
  e = load_error(std::nullopt, {"--train.device=cuda", "--train.gemm_autotune=-1"});
  EXPECT_NE(e.find("train.gemm_autotune (-1) must be in [0, 64]"), std::string::npos) << e;
  // The cpu backend has no cuBLASLt: a value there would be ignored, so it is refused.
  e = load_error(std::nullopt, {"--train.gemm_autotune=4"});
  EXPECT_NE(e.find("train.gemm_autotune (4) applies to train.device=cuda"), std::string::npos) << e;
}

}  // namespace
}  // namespace st
