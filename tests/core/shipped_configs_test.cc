// The configs shipped in configs/: each loads with its model's shape, the llama family's agree with their Hugging Face
// config.json, and no two share a checkpoint directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

namespace fs = std::filesystem;
using testing::ConfigTest;
using testing::shipped;

TEST_F(ConfigTest, ShippedConfigsLoadWithTheirShapes) {
  struct Shape {
    const char* file;
    int n_layer, n_head, n_embd, vocab, seq;
    DataFormat format;
  };
  const Shape shapes[] = {
      {"tiny.ini", 4, 4, 128, 256, 128, DataFormat::kText},
      {"default.ini", 4, 4, 128, 256, 128, DataFormat::kText},
      {"gpt2-124m.ini", 12, 12, 768, 50257, 1024, DataFormat::kLlmc},
      {"gpt2-350m.ini", 24, 16, 1024, 50257, 1024, DataFormat::kLlmc},
      {"gpt2-774m.ini", 36, 20, 1280, 50257, 1024, DataFormat::kLlmc},
      {"gpt2-1.5b.ini", 48, 25, 1600, 50257, 1024, DataFormat::kLlmc},
  };
  for (const auto& s : shapes) {
    SCOPED_TRACE(s.file);
    const Config c = load_config(shipped(s.file), {});
    EXPECT_EQ(c.model.n_layer, s.n_layer);
    EXPECT_EQ(c.model.n_head, s.n_head);
    EXPECT_EQ(c.model.n_embd, s.n_embd);
    EXPECT_EQ(c.model.vocab_size, s.vocab);
    EXPECT_EQ(c.model.seq_len, s.seq);
    EXPECT_EQ(c.data.format, s.format);
    if (s.format == DataFormat::kLlmc) {
      EXPECT_EQ(c.model.padded_vocab(), 50304);
      EXPECT_EQ(c.data.path, "data/fineweb10B/fineweb_train_*.bin");
      EXPECT_EQ(c.data.val_path, "data/fineweb10B/fineweb_val_*.bin");
      EXPECT_EQ(c.train.global_batch, 512);
      EXPECT_EQ(c.train.micro_batch, 16);
      EXPECT_EQ(c.grad_accum_steps(8), 4);
      EXPECT_EQ(c.optim.lr, 6e-4f);
      EXPECT_EQ(c.optim.min_lr, 6e-5f);
      EXPECT_EQ(c.optim.warmup_steps, 700);
      EXPECT_EQ(c.optim.weight_decay, 0.1f);
      EXPECT_EQ(c.optim.beta2, 0.95f);
      EXPECT_EQ(c.optim.grad_clip, 1.0f);
    } else {
      EXPECT_EQ(c.data.path, "@fortunes");
    }
  }
  // The dual-4090 model: GPT-2-shaped 2.7B with the optimizer offloaded.
  const Config big = load_config(shipped("gpt2-2.7b.ini"), {});
  EXPECT_EQ(big.model.n_layer, 32);
  EXPECT_EQ(big.model.n_head, 20);
  EXPECT_EQ(big.model.n_embd, 2560);
  EXPECT_EQ(big.model.padded_vocab(), 50304);
  EXPECT_EQ(big.optim.offload, OffloadMode::kOptimizer);
  EXPECT_EQ(big.train.device, Device::kCuda);
  EXPECT_TRUE(big.train.recompute);
  EXPECT_EQ(big.grad_accum_steps(2), 8);
  // default.ini is the built-in defaults written out.
  EXPECT_EQ(to_ini(load_config(shipped("default.ini"), {})), to_ini(Config{}));
}

// The fine-tuning configs carry the real shapes: each loads on its own with that model's parameter count, and with
// init.from at a directory holding the model's published config.json (as on the Hugging Face hub) without a conflict.
TEST_F(ConfigTest, ShippedLlamaConfigsAgreeWithTheirHuggingFaceConfigs) {
  struct Model {
    const char* file;
    const char* config_json;
    int64_t params;
    int n_kv_head;
    bool qkv_bias;
  };
  const std::string llama32_1b =
      R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":128000,
           "eos_token_id":128001,"head_dim":64,"hidden_act":"silu","hidden_size":2048,"initializer_range":0.02,
           "intermediate_size":8192,"max_position_embeddings":131072,"mlp_bias":false,"model_type":"llama",
           "num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,"pretraining_tp":1,
           "rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
           "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,
           "tie_word_embeddings":true,"torch_dtype":"bfloat16","use_cache":true,"vocab_size":128256})";
  // Llama-3.2-3B's config.json is 1B's with four fields changed.
  std::string llama32_3b = llama32_1b;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("head_dim":64)", R"("head_dim":128)"},
           {R"("hidden_size":2048)", R"("hidden_size":3072)"},
           {R"("num_attention_heads":32)", R"("num_attention_heads":24)"},
           {R"("num_hidden_layers":16)", R"("num_hidden_layers":28)"}})
    llama32_3b.replace(llama32_3b.find(from), from.size(), to);
  const Model models[] = {
      {"llama3.2-1b.ini", llama32_1b.c_str(), 1235814400, 8, false},
      {"llama3.2-3b.ini", llama32_3b.c_str(), 3212749824, 8, false},
      {"qwen2.5-0.5b.ini",
       R"({"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151643,
           "hidden_act":"silu","hidden_size":896,"initializer_range":0.02,"intermediate_size":4864,
           "max_position_embeddings":32768,"max_window_layers":24,"model_type":"qwen2","num_attention_heads":14,
           "num_hidden_layers":24,"num_key_value_heads":2,"rms_norm_eps":1e-06,"rope_theta":1000000.0,
           "sliding_window":32768,"tie_word_embeddings":true,"torch_dtype":"bfloat16","use_cache":true,
           "use_sliding_window":false,"vocab_size":151936})",
       494032768, 2, true},
      {"smollm2-360m.ini",
       R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,"bos_token_id":0,
           "eos_token_id":0,"hidden_act":"silu","hidden_size":960,"initializer_range":0.02,"intermediate_size":2560,
           "is_llama_config":true,"max_position_embeddings":8192,"model_type":"llama","num_attention_heads":15,
           "num_hidden_layers":32,"num_key_value_heads":5,"pretraining_tp":1,"rms_norm_eps":1e-05,
           "rope_interleaved":false,"rope_scaling":null,"rope_theta":100000,"tie_word_embeddings":true,
           "torch_dtype":"bfloat16","use_cache":true,"vocab_size":49152})",
       361821120, 5, false},
  };
  for (const Model& m : models) {
    SCOPED_TRACE(m.file);
    const Config alone = load_config(shipped(m.file), {});
    EXPECT_EQ(alone.model.arch, ModelArch::kLlama);
    EXPECT_EQ(alone.model.seq_len, 2048);
    EXPECT_EQ(alone.model.n_kv_head, m.n_kv_head);
    EXPECT_EQ(alone.model.qkv_bias, m.qkv_bias);
    EXPECT_TRUE(alone.model.tie_embeddings);
    EXPECT_EQ(alone.train.device, Device::kCuda);
    EXPECT_EQ(alone.train.dtype, DType::kBF16);
    EXPECT_EQ(alone.data.format, DataFormat::kLlmc);
    EXPECT_EQ(alone.grad_accum_steps(8) * alone.train.micro_batch * 8, alone.train.global_batch);
    EXPECT_EQ(count_params(build_units(alone.model)), m.params);
    const fs::path hf = dir_ / (std::string(m.file) + ".hf");
    fs::create_directories(hf);
    std::ofstream((hf / "config.json").string()) << m.config_json;
    const Config with_hf = load_config(shipped(m.file), {"--init.from=" + hf.string()});
    Config same = alone;
    same.init.from = hf.string();
    EXPECT_EQ(to_ini(with_hf), to_ini(same)) << "config.json and the file disagree on a model key";
  }
}

// What is wrong with the checkpoint directories of the configs (*.ini) in `dir`, one line a problem. Each config
// names its ckpt.dir in a [ckpt] section: ckpt/<its file name without .ini>, so that no two configs' runs meet in
// one directory (a run of one model would find the other's checkpoints and be refused), or nothing with a comment
// that says the config saves no checkpoints.
std::vector<std::string> checkpoint_dir_problems(const fs::path& dir) {
  std::vector<std::string> problems;
  std::map<std::string, std::string> owner;  // ckpt.dir -> the config that names it
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".ini") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  const std::regex dir_key(R"(^\s*dir\s*=.*)");
  for (const fs::path& path : files) {
    const std::string file = path.filename().string();
    std::ifstream in(path);
    std::string line, section, dir_line;
    while (std::getline(in, line)) {
      if (line.rfind('[', 0) == 0) section = line;
      if (section == "[ckpt]" && std::regex_match(line, dir_key)) dir_line = line;
    }
    const std::string ckpt_dir = load_config(path.string(), {}).ckpt.dir;
    if (dir_line.empty()) {
      problems.push_back(file + ": no `dir =` line in a [ckpt] section");
    } else if (ckpt_dir.empty()) {
      if (dir_line.find("# empty: no checkpoints") == std::string::npos)
        problems.push_back(file + ": an empty ckpt.dir without the comment '# empty: no checkpoints': " + dir_line);
    } else {
      if (ckpt_dir != "ckpt/" + path.stem().string())
        problems.push_back(file + ": ckpt.dir is " + ckpt_dir + ", not ckpt/" + path.stem().string());
      const auto [named, first] = owner.emplace(ckpt_dir, file);
      if (!first) problems.push_back(file + " and " + named->second + " share ckpt.dir " + ckpt_dir);
    }
  }
  return problems;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

TEST_F(ConfigTest, EveryShippedConfigHasItsOwnCheckpointDirectory) {
  const fs::path configs = fs::path(SHARDTRAIN_SOURCE_DIR) / "configs";
  EXPECT_EQ(joined(checkpoint_dir_problems(configs)), "");
  // The test models save only when told where; the GPT-2 and llama-family configs each name a directory.
  for (const char* file : {"default.ini", "tiny.ini", "tiny-llama.ini"})
    EXPECT_EQ(load_config(shipped(file), {}).ckpt.dir, "") << file;
  for (const char* name : {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "gpt2-2.7b", "llama3.2-1b",
                           "llama3.2-3b", "qwen2.5-0.5b", "smollm2-360m"})
    EXPECT_EQ(load_config(shipped(std::string(name) + ".ini"), {}).ckpt.dir, "ckpt/" + std::string(name));

  // The check itself: two configs in one directory, one in another's, and ones that do not say.
  write("a.ini", "[ckpt]\ndir = ckpt/a\n");
  write("b.ini", "[ckpt]\ndir = ckpt/a\n");
  write("c.ini", "[model]\nn_layer = 2\n");
  write("d.ini", "[ckpt]\ndir =\n");
  write("e.ini", "[ckpt]\ndir =   # empty: no checkpoints\n");
  EXPECT_EQ(joined(checkpoint_dir_problems(dir_)),
            "b.ini: ckpt.dir is ckpt/a, not ckpt/b\n"
            "b.ini and a.ini share ckpt.dir ckpt/a\n"
            "c.ini: no `dir =` line in a [ckpt] section\n"
            "d.ini: an empty ckpt.dir without the comment '# empty: no checkpoints': dir =\n");
}

}  // namespace
}  // namespace st
