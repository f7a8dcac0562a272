// The offline checkpoint tools (ckpt/tools.h) on checkpoints written by the real save path: verify and
// its failures, export to safetensors and HDF5 against the gathered parameters, and the CLI around them.
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/tools.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/run_shardtrain.h"
#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

// Whether a temporary of the writer of `path` (PATH.tmp-PID) is left beside it.
bool temporary_left(const std::string& path) {
  const std::string prefix = fs::path(path).filename().string() + ".tmp";
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

using st::testing::bad_input_message;
using st::testing::bits;
using st::testing::contains;
using st::testing::hf_tensor_values;
using st::testing::numel_of;
using st::testing::read_bytes;
using st::testing::safetensors_header_len;
using st::testing::TempDir;
using st::testing::write_bytes;

constexpr uint64_t kSeed = 7;  // the corpus of testing::corpus_batches

// A checkpoint written by the real save path, and the full parameters it holds (gathered on rank 0).
struct Saved {
  std::string step_dir;
  std::vector<std::vector<float>> params;  // full flat buffer per unit
};

// Trains `steps` steps on `world` fake ranks and saves into cfg.ckpt.dir.
Saved train_and_save(const Config& cfg, int world, int64_t steps) {
  Saved out;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(cfg, comm);
    testing::Trace trace;
    testing::train_steps(e, cfg, comm, kSeed, 0, steps, &trace);
    CheckpointState cs;
    cs.step = steps;
    cs.optimizer_updates = e.updates();
    const std::string where = save_checkpoint(cfg, e.sharded(), cs, comm);
    std::vector<std::vector<float>> full = e.gather_params();  // collective
    if (comm.rank() == 0) {
      out.step_dir = where;
      out.params = std::move(full);
    }
  });
  return out;
}

// A safetensors file parsed by hand: the header JSON and the data section.
struct Safetensors {
  uint64_t header_len = 0;
  nlohmann::ordered_json header;
  std::string data;
};

Safetensors parse_safetensors(const std::string& path) {
  const std::string blob = read_bytes(path);
  Safetensors s;
  EXPECT_GE(blob.size(), 8u) << path;
  if (blob.size() < 8) return s;
  s.header_len = safetensors_header_len(blob);
  EXPECT_LE(8 + s.header_len, blob.size()) << path;
  s.header = nlohmann::ordered_json::parse(blob.substr(8, s.header_len));
  s.data = blob.substr(8 + s.header_len);
  return s;
}

using st::testing::CliResult;
using st::testing::run_shardtrain;

class CkptToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    cfg_ = testing::tiny_config();  // vocabulary 50, padded to 128 in memory: the export must keep 50 rows
    cfg_.train.global_batch = 6;
    cfg_.optim.warmup_steps = 1;
    cfg_.ckpt.dir = tmp_.file("ckpt");
    cfg_.ckpt.keep = 0;
  }
  // A 3-rank checkpoint after 2 steps.
  const Saved& saved() {
    if (saved_.step_dir.empty()) saved_ = train_and_save(cfg_, 3, 2);
    return saved_;
  }
  std::string rank_file(int r) const {
    char name[32];
    std::snprintf(name, sizeof(name), "rank_%05d.h5", r);
    return (fs::path(saved_.step_dir) / name).string();
  }
  std::string verify_error() {
    return bad_input_message([&] { verify_checkpoint(saved_.step_dir); });
  }

  TempDir tmp_;
  Config cfg_;
  Saved saved_;
};

TEST_F(CkptToolsTest, VerifyPassesOnAFreshCheckpoint) {
  saved();
  const VerifyReport r = verify_checkpoint(saved_.step_dir);
  EXPECT_EQ(r.files, 3);
  int64_t bytes = 0;
  for (int i = 0; i < 3; ++i) bytes += file_size(rank_file(i));
  EXPECT_EQ(r.bytes, bytes);
}

TEST_F(CkptToolsTest, VerifyNamesAFileWithAFlippedByte) {
  saved();
  std::string b = read_bytes(rank_file(1));
  b[b.size() / 2] ^= 0x01;
  write_bytes(rank_file(1), b);
  const Manifest m = read_manifest((fs::path(saved_.step_dir) / "manifest.json").string());
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(1))) << msg;
  EXPECT_TRUE(contains(msg, "SHA-256 mismatch")) << msg;
  EXPECT_TRUE(contains(msg, "expected " + m.files[1].digest)) << msg;
  EXPECT_TRUE(contains(msg, "actual " + file_digest(rank_file(1), m.digest_piece_bytes))) << msg;
}

// A checkpoint of format version 1 (each file's digest the SHA-256 of the whole file, files[i].sha256) verifies and
// exports as its version-2 original did, and a flipped byte is named with both whole-file hashes.
TEST_F(CkptToolsTest, AFormatVersion1CheckpointVerifiesExportsAndNamesAFlippedByte) {
  saved();
  // Two directories: each export writes a new config.json beside its weights.
  fs::create_directories(tmp_.file("v2"));
  fs::create_directories(tmp_.file("v1"));
  const std::string v2_export = tmp_.file("v2/model.safetensors"), v1_export = tmp_.file("v1/model.safetensors");
  export_checkpoint(saved_.step_dir, v2_export);
  const fs::path manifest = fs::path(saved_.step_dir) / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(read_bytes(manifest));
  j["format_version"] = 1;
  j.erase("digest_piece_bytes");
  for (int r = 0; r < 3; ++r) {
    const hid_t f = H5Fopen(rank_file(r).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0) << rank_file(r);
    const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    const int64_t one = 1;
    EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &one), 0);
    H5Aclose(a);
    H5Fclose(f);
    nlohmann::json& file = j["files"][static_cast<size_t>(r)];
    file.erase("piece_sha256");
    file["bytes"] = file_size(rank_file(r));
    file["sha256"] = sha256_file(rank_file(r));
  }
  write_bytes(manifest, j.dump(2));
  EXPECT_EQ(verify_checkpoint(saved_.step_dir).files, 3);
  export_checkpoint(saved_.step_dir, v1_export);
  EXPECT_TRUE(read_bytes(v1_export) == read_bytes(v2_export));

  const std::string before = sha256_file(rank_file(1));
  std::string b = read_bytes(rank_file(1));
  b[b.size() / 2] ^= 0x01;
  write_bytes(rank_file(1), b);
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(1) + ": SHA-256 mismatch: expected " + before + " (manifest), actual " +
                                sha256_file(rank_file(1))))
      << msg;
}

TEST_F(CkptToolsTest, VerifyNamesATruncatedFile) {
  saved();
  const std::string b = read_bytes(rank_file(1));
  write_bytes(rank_file(1), b.substr(0, b.size() - 100));
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(1))) << msg;
  EXPECT_TRUE(contains(msg, "expected " + std::to_string(b.size()) + " bytes")) << msg;
  EXPECT_TRUE(contains(msg, "actual " + std::to_string(b.size() - 100))) << msg;
}

TEST_F(CkptToolsTest, VerifyNamesAMissingFile) {
  saved();
  fs::remove(rank_file(2));
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(2))) << msg;
  EXPECT_TRUE(contains(msg, "missing")) << msg;
}

TEST_F(CkptToolsTest, VerifyNamesTheFileWhoseManifestHashWasEdited) {
  saved();
  const fs::path manifest = fs::path(saved_.step_dir) / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(read_bytes(manifest));
  const std::string fake(64, 'a');
  j["files"][0]["piece_sha256"] = fake;
  write_bytes(manifest, j.dump(2));
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(0))) << msg;
  EXPECT_TRUE(contains(msg, "expected " + fake)) << msg;
  EXPECT_TRUE(contains(msg, "actual " + file_digest(rank_file(0), kDigestPieceBytes))) << msg;
}

// The manifest still covers every unit exactly once, and every file's bytes match, but the boundary
// between files 0 and 1 of block.0 moved: only the span check can catch it.
TEST_F(CkptToolsTest, VerifyNamesAFileWhoseSpanDisagreesWithTheManifest) {
  saved();
  const fs::path manifest = fs::path(saved_.step_dir) / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(read_bytes(manifest));
  auto& s0 = j["files"][0]["spans"][1];
  auto& s1 = j["files"][1]["spans"][1];
  const int64_t count0 = s0["count"].get<int64_t>();
  const int64_t off1 = s1["offset"].get<int64_t>(), count1 = s1["count"].get<int64_t>();
  ASSERT_GT(count0, 1);
  s0["count"] = count0 - 1;
  s1["offset"] = off1 - 1;
  s1["count"] = count1 + 1;
  write_bytes(manifest, j.dump(2));
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, rank_file(0))) << msg;
  EXPECT_TRUE(contains(msg, "unit block.0 span mismatch")) << msg;
  EXPECT_TRUE(contains(msg, "expected [0, " + std::to_string(count0 - 1) + ")")) << msg;
  EXPECT_TRUE(contains(msg, "actual [0, " + std::to_string(count0) + ")")) << msg;
}

// The manifest's step edited: the directory's name disagrees before any rank file is read.
TEST_F(CkptToolsTest, VerifyNamesAManifestWhoseStepDisagreesWithTheDirectoryName) {
  saved();
  const fs::path manifest = fs::path(saved_.step_dir) / "manifest.json";
  nlohmann::json j = nlohmann::json::parse(read_bytes(manifest));
  j["step"] = 3;
  write_bytes(manifest, j.dump(2));
  const std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, manifest.string() + ": step mismatch: expected 2 (the directory name step_00000002), "
                                                "actual 3 (manifest step)"))
      << msg;
}

// lr_step and data_cursor follow from the step; an edit of either alone is refused naming both values.
TEST_F(CkptToolsTest, VerifyNamesAStepDerivedFieldThatDisagreesWithTheStep) {
  saved();
  const fs::path manifest = fs::path(saved_.step_dir) / "manifest.json";
  const std::string pristine = read_bytes(manifest);
  nlohmann::json j = nlohmann::json::parse(pristine);
  j["data_cursor"] = 13;
  write_bytes(manifest, j.dump(2));
  std::string msg = verify_error();
  EXPECT_TRUE(contains(msg, manifest.string() + ": data_cursor mismatch: expected 12 (step 2 x global_batch 6), "
                                                "actual 13"))
      << msg;
  j = nlohmann::json::parse(pristine);
  j["lr_step"] = 3;
  write_bytes(manifest, j.dump(2));
  msg = verify_error();
  EXPECT_TRUE(contains(msg, manifest.string() + ": lr_step mismatch: expected 2 (manifest step), actual 3")) << msg;
}

TEST_F(CkptToolsTest, RefusesADirectoryThatIsNotACommittedCheckpoint) {
  const std::string missing = tmp_.file("nope");
  std::string msg = bad_input_message([&] { verify_checkpoint(missing); });
  EXPECT_TRUE(contains(msg, missing + " is not a committed checkpoint")) << msg;
  const std::string empty = tmp_.file("step_00000001");
  fs::create_directories(empty);
  msg = bad_input_message([&] { inspect_checkpoint(empty); });
  EXPECT_TRUE(contains(msg, empty + " is not a committed checkpoint")) << msg;
  EXPECT_TRUE(contains(msg, "manifest.json")) << msg;
  msg = bad_input_message([&] { export_checkpoint(empty, tmp_.file("x.safetensors")); });
  EXPECT_TRUE(contains(msg, empty + " is not a committed checkpoint")) << msg;
}

TEST_F(CkptToolsTest, InspectPrintsStateUnitsAndFiles) {
  saved();
  const std::string text = inspect_checkpoint(saved_.step_dir);
  const Manifest m = read_manifest((fs::path(saved_.step_dir) / "manifest.json").string());
  for (const std::string& line :
       {std::string("step 2\n"), std::string("world_size 3\n"), std::string("format_version 2\n"),
        "optimizer_updates " + std::to_string(m.optimizer_updates) + "\n", std::string("data_cursor 12\n"),
        std::string("model arch=gpt2 n_layer=2 n_head=2 n_embd=16 vocab_size=50 seq_len=8\n"),
        std::string("units 4\n"),
        std::string("  embedding numel=2176\n"), std::string("    wte [128, 16]\n"),
        std::string("    attn.qkv.weight [48, 16]\n"), std::string("  head numel=32\n"),
        "  rank_00002.h5 bytes=" + std::to_string(m.files[2].bytes) + " piece_sha256=" + m.files[2].digest + "\n"})
    EXPECT_TRUE(contains(text, line)) << "missing: " << line << "in:\n" << text;
}

// A LoRA checkpoint lists its adapters, their settings and the base they apply to (here the seed's: no files).
TEST_F(CkptToolsTest, InspectPrintsTheLoraSettingsAndTheBase) {
  Config c = cfg_;
  c.model.arch = ModelArch::kLlama;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_dim = 40;
  c.model.lora.rank = 3;
  c.model.lora.alpha = 6;
  c.model.lora.targets = "q,down";
  c.model.lora.base_dtype = LoraBase::kNf4;
  c.ckpt.dir = tmp_.file("lora");
  const std::string text = inspect_checkpoint(train_and_save(c, 2, 1).step_dir);
  for (const std::string& line :
       {std::string("model arch=llama n_layer=2 n_head=4 n_embd=16 vocab_size=50 seq_len=8 n_kv_head=2 ffn_dim=40\n"),
        std::string("lora rank=3 alpha=6 targets=q,down rslora=false dropout=0 base_dtype=nf4\n"),
        "lora base: drawn from train.seed " + std::to_string(c.train.seed) + "\n"})
    EXPECT_TRUE(contains(text, line)) << "missing: " << line << "in:\n" << text;
  EXPECT_TRUE(contains(text, "    lora.down.A [3, 40]\n")) << text;
  EXPECT_FALSE(contains(text, "mlp.down.weight")) << "the frozen base is not in the files:\n" << text;
}

TEST_F(CkptToolsTest, ExportSafetensorsEqualsTheGatheredParameters) {
  saved();
  const std::string out = tmp_.file("model.safetensors");
  const ExportReport r = export_checkpoint(saved_.step_dir, out);
  const std::vector<UnitLayout> units = build_units(cfg_.model);
  const std::vector<HfTensorMap> map = hf_gpt2_tensor_map(cfg_.model, units);
  EXPECT_EQ(r.tensors, static_cast<int>(map.size()));
  EXPECT_EQ(r.bytes, file_size(out));
  EXPECT_FALSE(temporary_left(out));

  const Safetensors s = parse_safetensors(out);
  EXPECT_EQ((8 + s.header_len) % 8, 0u) << "data section not 8-byte aligned";
  ASSERT_EQ(s.header.size(), map.size() + 1);  // + __metadata__
  EXPECT_EQ(s.header["__metadata__"], nlohmann::ordered_json({{"format", "pt"}}));
  int64_t end = 0;
  size_t k = 0;
  for (auto it = s.header.begin(); it != s.header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    ASSERT_LT(k, map.size());
    const HfTensorMap& t = map[k++];
    EXPECT_EQ(it.key(), t.hf_name) << "order differs from write_hf_gpt2";
    const auto& e = it.value();
    EXPECT_EQ(e["dtype"], "F32") << t.hf_name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), t.hf_shape) << t.hf_name;
    const int64_t begin = e["data_offsets"][0].get<int64_t>(), stop = e["data_offsets"][1].get<int64_t>();
    EXPECT_EQ(begin, end) << t.hf_name << ": not back to back";
    ASSERT_EQ(stop - begin, numel_of(t.hf_shape) * 4) << t.hf_name;
    ASSERT_LE(static_cast<size_t>(stop), s.data.size());
    const std::vector<float> want = hf_tensor_values(t, saved_.params);
    EXPECT_EQ(bits(reinterpret_cast<const float*>(s.data.data() + begin), want.size()), bits(want)) << t.hf_name;
    end = stop;
  }
  EXPECT_EQ(static_cast<size_t>(end), s.data.size());
  EXPECT_EQ(s.header["transformer.wte.weight"]["shape"], nlohmann::ordered_json({50, 16}));  // unpadded
  EXPECT_EQ(s.header["transformer.h.1.mlp.c_fc.weight"]["shape"], nlohmann::ordered_json({16, 64}));  // Conv1D
}

TEST_F(CkptToolsTest, ExportHdf5EqualsTheGatheredParameters) {
  saved();
  const std::string out = tmp_.file("model.h5");
  export_checkpoint(saved_.step_dir, out);
  const std::vector<UnitLayout> units = build_units(cfg_.model);
  {
    const H5File f = H5File::open_read(out);
    for (const HfTensorMap& t : hf_gpt2_tensor_map(cfg_.model, units)) {
      std::vector<float> got(static_cast<size_t>(numel_of(t.hf_shape)));
      h5_read_f32(f, t.hf_name, t.hf_shape, got.data());
      EXPECT_EQ(bits(got), bits(hf_tensor_values(t, saved_.params))) << t.hf_name;
    }
  }
  // read_hf_gpt2 takes it as ckpt.export's own file: the units come back whole (wte padding rows zero,
  // as they are in the trained model).
  std::vector<std::vector<float>> back(units.size());
  std::vector<float*> ptrs;
  for (const UnitLayout& u : units) {
    back[static_cast<size_t>(u.index)].assign(static_cast<size_t>(u.numel), -1.0f);
    ptrs.push_back(back[static_cast<size_t>(u.index)].data());
  }
  read_hf_gpt2(out, cfg_.model, units, ptrs);
  for (const UnitLayout& u : units)
    EXPECT_EQ(bits(back[static_cast<size_t>(u.index)]), bits(saved_.params[static_cast<size_t>(u.index)])) << u.name;
}

TEST_F(CkptToolsTest, ExportWritesConfigJsonBesideTheWeights) {
  saved();
  fs::create_directories(tmp_.file("hf"));
  const ExportReport r = export_checkpoint(saved_.step_dir, tmp_.file("hf/model.safetensors"));
  EXPECT_EQ(r.config_path, tmp_.file("hf/config.json"));
  const nlohmann::json c = nlohmann::json::parse(read_bytes(r.config_path));
  EXPECT_EQ(c["architectures"], nlohmann::json({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["vocab_size"], 50);
  EXPECT_EQ(c["n_positions"], 8);
  EXPECT_EQ(c["n_ctx"], 8);
  EXPECT_EQ(c["n_embd"], 16);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_TRUE(c["n_inner"].is_null());
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_DOUBLE_EQ(c["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(c["resid_pdrop"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(c["embd_pdrop"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(c["attn_pdrop"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(c["initializer_range"].get<double>(), 0.02);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(c.size(), 17u);
}

TEST_F(CkptToolsTest, ExportRefusesABadSuffix) {
  saved();
  for (const char* name : {"model.bin", "model.pt", "model", "model.safetensors.bak", "model.h5x"}) {
    const std::string out = tmp_.file(name);
    const std::string msg = bad_input_message([&] { export_checkpoint(saved_.step_dir, out); });
    EXPECT_TRUE(contains(msg, out)) << msg;
    EXPECT_TRUE(contains(msg, ".safetensors or .h5")) << msg;
    EXPECT_FALSE(fs::exists(out)) << out;
  }
  const CliResult r = run_shardtrain("ckpt export " + saved_.step_dir + " --out " + tmp_.file("model.bin"));
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, "--out " + tmp_.file("model.bin"))) << r.output;
  EXPECT_TRUE(contains(r.output, "allowed: .safetensors, .h5")) << r.output;
}

TEST_F(CkptToolsTest, ExportVerifiesEachRankFileBeforeReadingIt) {
  saved();
  std::string b = read_bytes(rank_file(2));
  b[b.size() / 3] ^= 0x40;
  write_bytes(rank_file(2), b);
  const std::string out = tmp_.file("model.safetensors");
  const std::string msg = bad_input_message([&] { export_checkpoint(saved_.step_dir, out); });
  EXPECT_TRUE(contains(msg, rank_file(2))) << msg;
  EXPECT_TRUE(contains(msg, "SHA-256 mismatch")) << msg;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(temporary_left(out));
}

// The same weights saved by 3 ranks and, after resharding on load, by 1 rank: the exports are identical.
TEST_F(CkptToolsTest, ExportIsByteIdenticalWhateverTheWorldSizeThatWrote) {
  saved();
  Config one = cfg_;
  one.ckpt.dir = tmp_.file("ckpt1");
  std::string where1;
  fake::spawn(1, [&](Communicator& comm) {
    StepEngine e(one, comm);
    const CheckpointState cs = load_checkpoint(saved_.step_dir, one, e.sharded(), comm);
    where1 = save_checkpoint(one, e.sharded(), cs, comm);
  });
  EXPECT_EQ(read_manifest((fs::path(saved_.step_dir) / "manifest.json").string()).world_size, 3);
  EXPECT_EQ(read_manifest((fs::path(where1) / "manifest.json").string()).world_size, 1);
  fs::create_directories(tmp_.file("from3"));
  fs::create_directories(tmp_.file("from1"));
  export_checkpoint(saved_.step_dir, tmp_.file("from3/model.safetensors"));
  export_checkpoint(where1, tmp_.file("from1/model.safetensors"));
  const std::string a = read_bytes(tmp_.file("from3/model.safetensors"));
  const std::string b = read_bytes(tmp_.file("from1/model.safetensors"));
  EXPECT_GT(a.size(), 2176u * 4);
  EXPECT_TRUE(a == b) << "exports differ (" << a.size() << " vs " << b.size() << " bytes)";
  EXPECT_EQ(read_bytes(tmp_.file("from3/config.json")), read_bytes(tmp_.file("from1/config.json")));
}

TEST_F(CkptToolsTest, CliVerifyExitCodes) {
  saved();
  CliResult r = run_shardtrain("ckpt verify " + saved_.step_dir);
  EXPECT_EQ(r.code, 0) << r.output;
  int64_t bytes = 0;
  for (int i = 0; i < 3; ++i) bytes += file_size(rank_file(i));
  EXPECT_EQ(r.output, "OK: " + saved_.step_dir + ": 3 files, " + std::to_string(bytes) + " bytes verified\n");
  r = run_shardtrain("ckpt inspect " + saved_.step_dir);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\nstep 2\n")) << r.output;
  fs::remove(rank_file(1));
  r = run_shardtrain("ckpt verify " + saved_.step_dir);
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, rank_file(1))) << r.output;
}

}  // namespace
}  // namespace st
