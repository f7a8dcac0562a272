#include "shardtrain/ckpt/manifest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

using nlohmann::json;
using testing::bad_input_message;
using testing::contains;
using testing::TempDir;

const std::string kPath = "/ckpt/step_00000100/manifest.json";

ModelConfig small_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 16;
  m.vocab_size = 100;
  m.seq_len = 32;
  return m;
}

// A small llama with every family key away from its default.
ModelConfig small_llama() {
  ModelConfig m = small_model();
  m.arch = ModelArch::kLlama;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn_dim = 40;
  m.rope_theta = 500000.0f;
  m.rope_scaling = RopeScaling::kLlama3;
  m.rope_scaling_factor = 32.0f;
  m.rope_scaling_low_freq_factor = 1.5f;
  m.rope_scaling_high_freq_factor = 4.25f;
  m.rope_scaling_original_max_position = 64;
  m.rms_norm_eps = 1e-6f;  // not exactly representable: must round-trip bit for bit
  m.tie_embeddings = false;
  m.qkv_bias = true;
  return m;
}

// A manifest as the commit code would write it: units from the model layout, spans from shard_span.
Manifest make_manifest(int world, const ModelConfig& model = small_model()) {
  Config cfg;
  cfg.model = model;
  Manifest m;
  m.step = 100;
  m.world_size = world;
  m.config_ini = to_ini(cfg) + "# a \"quoted\" line\\n with a backslash\n";
  m.model = cfg.model;
  for (const UnitLayout& u : build_units(cfg.model)) {
    ManifestUnit mu{u.name, u.numel, {}};
    for (const TensorSpec& t : u.tensors) mu.tensors.push_back({t.name, t.shape, t.offset});
    m.units.push_back(std::move(mu));
  }
  for (int r = 0; r < world; ++r) {
    ManifestFile f;
    f.name = "rank_0000" + std::to_string(r) + ".h5";
    f.rank = r;
    f.bytes = 123456789012LL + r;
    f.digest = sha256_hex(f.name.data(), f.name.size());
    for (const ManifestUnit& u : m.units) f.spans.push_back(shard_span(u.numel, r, world));
    m.files.push_back(std::move(f));
    m.rng_counters.push_back(r == 0 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << 63) + r);
  }
  m.optimizer_updates = 97;
  m.lr_step = 100;
  m.data_cursor = 100 * 48;
  m.global_batch = 48;
  m.seed = std::numeric_limits<uint64_t>::max();
  m.shuffle = false;
  m.train_windows = 76495;
  m.loss_scale = 0.1;  // not exactly representable: must still round-trip bit for bit
  m.skipped_steps = 3;
  m.loss_scale_good_steps = 1999;
  m.gemm_algorithms = {"NVIDIA H200", 130100, "gemm 1 2 3\ngemm 4 5 6\n"};
  // Two sites' x, W and dy over two steps, newest first; a denormal and 0 among them must round-trip bit for bit.
  m.fp8_amax_history = {{0.0f, 1e-40f, 3.5f, 448.0f, 57344.0f, 0.1f}, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}};
  return m;
}

void expect_equal(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.config_ini, b.config_ini);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.seq_len, b.model.seq_len);
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.n_kv_head, b.model.n_kv_head);
  EXPECT_EQ(a.model.ffn_dim, b.model.ffn_dim);
  EXPECT_EQ(a.model.rope_theta, b.model.rope_theta);
  EXPECT_EQ(a.model.rope_scaling, b.model.rope_scaling);
  EXPECT_EQ(a.model.rope_scaling_factor, b.model.rope_scaling_factor);
  EXPECT_EQ(a.model.rope_scaling_low_freq_factor, b.model.rope_scaling_low_freq_factor);
  EXPECT_EQ(a.model.rope_scaling_high_freq_factor, b.model.rope_scaling_high_freq_factor);
  EXPECT_EQ(a.model.rope_scaling_original_max_position, b.model.rope_scaling_original_max_position);
  EXPECT_EQ(a.model.rms_norm_eps, b.model.rms_norm_eps);
  EXPECT_EQ(a.model.tie_embeddings, b.model.tie_embeddings);
  EXPECT_EQ(a.model.qkv_bias, b.model.qkv_bias);
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u) {
    EXPECT_EQ(a.units[u].name, b.units[u].name);
    EXPECT_EQ(a.units[u].numel, b.units[u].numel);
    ASSERT_EQ(a.units[u].tensors.size(), b.units[u].tensors.size());
    for (size_t t = 0; t < a.units[u].tensors.size(); ++t) {
      EXPECT_EQ(a.units[u].tensors[t].name, b.units[u].tensors[t].name);
      EXPECT_EQ(a.units[u].tensors[t].shape, b.units[u].tensors[t].shape);
      EXPECT_EQ(a.units[u].tensors[t].offset, b.units[u].tensors[t].offset);
    }
  }
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t f = 0; f < a.files.size(); ++f) {
    EXPECT_EQ(a.files[f].name, b.files[f].name);
    EXPECT_EQ(a.files[f].rank, b.files[f].rank);
    EXPECT_EQ(a.files[f].bytes, b.files[f].bytes);
    EXPECT_EQ(a.files[f].digest, b.files[f].digest);
    EXPECT_EQ(a.files[f].spans, b.files[f].spans);
  }
  EXPECT_EQ(a.optimizer_updates, b.optimizer_updates);
  EXPECT_EQ(a.lr_step, b.lr_step);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.shuffle, b.shuffle);
  EXPECT_EQ(a.train_windows, b.train_windows);
  EXPECT_EQ(a.digest_piece_bytes, b.digest_piece_bytes);
  EXPECT_EQ(a.rng_counters, b.rng_counters);
  EXPECT_EQ(a.loss_scale, b.loss_scale);  // exact, not approximate
  EXPECT_EQ(a.skipped_steps, b.skipped_steps);
  EXPECT_EQ(a.loss_scale_good_steps, b.loss_scale_good_steps);
  EXPECT_EQ(a.gemm_algorithms.device, b.gemm_algorithms.device);
  EXPECT_EQ(a.gemm_algorithms.library, b.gemm_algorithms.library);
  EXPECT_EQ(a.gemm_algorithms.plans, b.gemm_algorithms.plans);
  EXPECT_EQ(a.fp8_amax_history, b.fp8_amax_history);
}

TEST(Manifest, RoundTripKeepsEveryFieldExactly) {
  for (int world : {1, 3, 7}) {
    SCOPED_TRACE(world);
    const Manifest m = make_manifest(world);
    const std::string text = manifest_to_json(m);
    expect_equal(manifest_from_json(text, kPath), m);
    EXPECT_EQ(manifest_to_json(manifest_from_json(text, kPath)), text);  // a fixed point
  }
}

TEST(Manifest, JsonIsPrettyPrintedWithIndentTwoAndExactIntegers) {
  const std::string text = manifest_to_json(make_manifest(2));
  EXPECT_EQ(text.rfind("{\n  \"format_version\": 2,\n  \"step\": 100,\n", 0), 0u) << text.substr(0, 80);
  EXPECT_TRUE(contains(text, "\n  \"seed\": 18446744073709551615,\n")) << text;
  EXPECT_TRUE(contains(text, "\n  \"model\": {\n    \"arch\": \"gpt2\",\n    \"n_layer\": 2,\n")) << text;
  EXPECT_TRUE(contains(text, "\"spans\": [\n        {\n          \"offset\": 0,\n          \"count\": ")) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(Manifest, ReadManifestReadsTheFileAndNamesAMissingOne) {
  TempDir dir;
  const Manifest m = make_manifest(2);
  write_file_atomic(dir.file("manifest.json"), manifest_to_json(m));
  expect_equal(read_manifest(dir.file("manifest.json")), m);
  const std::string msg = bad_input_message([&] { read_manifest(dir.file("nope.json")); });
  EXPECT_TRUE(contains(msg, dir.file("nope.json"))) << msg;
}

TEST(Manifest, SyntaxErrorNamesThePathAndBytePosition) {
  std::string text = manifest_to_json(make_manifest(1));
  const size_t at = text.find("\"step\": 100,") + 8;  // "step": 10x0,  — a stray letter inside the number
  text.insert(at + 2, "x");
  const std::string msg = bad_input_message([&] { manifest_from_json(text, kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": not valid JSON at byte " + std::to_string(at + 3))) << msg;
  const std::string empty = bad_input_message([&] { manifest_from_json("", kPath); });
  EXPECT_TRUE(contains(empty, kPath + ": not valid JSON at byte 1")) << empty;
}

// A mutation of valid manifest JSON, and the substrings its error must contain (besides the path).
struct JsonCase {
  const char* what;
  std::function<void(json&)> mutate;
  std::vector<std::string> expect;
};

TEST(Manifest, EachValidationErrorNamesThePathAndTheField) {
  const std::vector<JsonCase> cases = {
      {"top level not an object", [](json& j) { j = json::array(); }, {"the top level must be an object, got array"}},
      {"future version",
       [](json& j) { j["format_version"] = 7; },
       {"unknown checkpoint format version 7 (this build reads versions 1 to 2)"}},
      {"version 0", [](json& j) { j["format_version"] = 0; }, {"unknown checkpoint format version 0"}},
      {"future version without the rest",
       [](json& j) {
         j = json{{"format_version", 3}};
       },
       {"unknown checkpoint format version 3 (this build reads versions 1 to 2)"}},
      {"missing digest_piece_bytes",
       [](json& j) { j.erase("digest_piece_bytes"); },
       {"required field digest_piece_bytes is missing"}},
      {"missing digest",
       [](json& j) { j["files"][1].erase("piece_sha256"); },
       {"required field files[1].piece_sha256 is missing"}},
      {"digest wrong type",
       [](json& j) { j["files"][1]["piece_sha256"] = 5; },
       {"files[1].piece_sha256 must be a string, got number 5"}},
      {"digest not hex",
       [](json& j) { j["files"][1]["piece_sha256"] = "ABC"; },
       {"files[1].piece_sha256 is \"ABC\", expected 64 lowercase hex digits"}},
      {"version 1 (whole-file digests)",
       [](json& j) {
         j["format_version"] = 1;
         j.erase("digest_piece_bytes");
         for (json& f : j["files"]) f["sha256"] = f["piece_sha256"];
         j["files"][2]["sha256"] = "ABC";
       },
       {"files[2].sha256 is \"ABC\", expected 64 lowercase hex digits"}},
      {"digest_piece_bytes wrong type",
       [](json& j) { j["digest_piece_bytes"] = "16M"; },
       {"digest_piece_bytes must be an integer, got string \"16M\""}},
      {"digest pieces too small",
       [](json& j) { j["digest_piece_bytes"] = 512; },
       {"digest_piece_bytes is 512, expected 4096 to 1073741824"}},
      {"digest pieces too large",
       [](json& j) { j["digest_piece_bytes"] = int64_t{1} << 31; },
       {"digest_piece_bytes is 2147483648, expected 4096 to 1073741824"}},
      {"missing model field",
       [](json& j) { j["model"].erase("seq_len"); },
       {"required field model.seq_len is missing"}},
      {"model not an object", [](json& j) { j["model"] = "gpt2"; }, {"model must be an object, got string \"gpt2\""}},
      {"fractional step", [](json& j) { j["step"] = 1.5; }, {"step must be an integer, got number 1.5"}},
      {"negative step", [](json& j) { j["step"] = -1; }, {"step is -1, expected >= 0"}},
      {"negative seed", [](json& j) { j["seed"] = -1; }, {"seed must be a non-negative integer, got number -1"}},
      {"rng counter string",
       [](json& j) { j["rng_counters"][1] = "7"; },
       {"rng_counters[1] must be a non-negative integer, got string \"7\""}},
      {"shuffle not bool", [](json& j) { j["shuffle"] = 1; }, {"shuffle must be true or false, got number 1"}},
      {"world_size too large for int",
       [](json& j) { j["world_size"] = int64_t{1} << 40; },
       {"world_size is 1099511627776, expected a 32-bit integer"}},
      {"bytes above int64",
       [](json& j) { j["files"][0]["bytes"] = std::numeric_limits<uint64_t>::max(); },
       {"files[0].bytes is 18446744073709551615, expected at most 9223372036854775807"}},
      {"missing span count",
       [](json& j) { j["files"][2]["spans"][3].erase("count"); },
       {"required field files[2].spans[3].count is missing"}},
      {"tensor shape element",
       [](json& j) { j["units"][1]["tensors"][2]["shape"][0] = "48"; },
       {"units[1].tensors[2].shape[0] must be an integer, got string \"48\""}},
      {"zero loss scale", [](json& j) { j["loss_scale"] = 0; }, {"loss_scale is 0, expected a finite number > 0"}},
      {"zero global batch", [](json& j) { j["global_batch"] = 0; }, {"global_batch is 0, expected >= 1"}},
      {"negative loss-scale count",
       [](json& j) { j["loss_scale_good_steps"] = -1; },
       {"loss_scale_good_steps is -1, expected >= 0"}},
      {"gemm library not an integer",
       [](json& j) { j["gemm_algorithms"]["library"] = "13.1"; },
       {"gemm_algorithms.library must be an integer, got string \"13.1\""}},
      {"gemm plans missing",
       [](json& j) { j["gemm_algorithms"].erase("plans"); },
       {"required field gemm_algorithms.plans is missing"}},
      {"fp8 history entry of another size",
       [](json& j) { j["fp8_amax_history"]["entries"][1].erase(0); },
       {"fp8_amax_history.entries[1] holds 5 maxima, expected maxima_per_entry = 6"}},
      {"fp8 history NaN",
       [](json& j) { j["fp8_amax_history"]["entries"][0][2] = 0x7fc00000u; },
       {"fp8_amax_history.entries[0][2] is nan, expected a finite maximum >= 0"}},
      {"fp8 history negative",
       [](json& j) { j["fp8_amax_history"]["entries"][1][4] = 0xbf800000u; },
       {"fp8_amax_history.entries[1][4] is -1, expected a finite maximum >= 0"}},
      {"fp8 history negative zero",
       [](json& j) { j["fp8_amax_history"]["entries"][0][1] = 0x80000000u; },
       {"fp8_amax_history.entries[0][1] is -0, expected a finite maximum >= 0"}},
      {"fp8 history past 32 bits",
       [](json& j) { j["fp8_amax_history"]["entries"][0][0] = uint64_t{1} << 32; },
       {"fp8_amax_history.entries[0][0] is 4294967296, expected a float's 32 bits"}},
      {"fp8 history of no whole site",
       [](json& j) {
         j["fp8_amax_history"]["maxima_per_entry"] = 5;
         for (json& e : j["fp8_amax_history"]["entries"]) e.erase(0);
       },
       {"fp8_amax_history.maxima_per_entry is 5, expected a positive multiple of 3 (x, W, dy a site)"}},
      {"one file too few",
       [](json& j) { j["files"].erase(2); },
       {"files has 2 entries, expected world_size = 3 (one per rank)"}},
      {"rng counters too few",
       [](json& j) { j["rng_counters"].erase(0); },
       {"rng_counters has 2 entries, expected world_size = 3 (one per rank)"}},
      {"wrong rank", [](json& j) { j["files"][1]["rank"] = 2; }, {"files[1].rank is 2, expected 1"}},
      {"duplicate file name",
       [](json& j) { j["files"][2]["name"] = j["files"][0]["name"]; },
       {"files[2].name \"rank_00000.h5\" is used by an earlier file too"}},
      {"file name with a path",
       [](json& j) { j["files"][0]["name"] = "../rank_00000.h5"; },
       {"files[0].name is \"../rank_00000.h5\", expected a file name inside the step directory"}},
      {"spans per unit",
       [](json& j) { j["files"][1]["spans"].erase(0); },
       {"files[1].spans has 3 entries, expected 4 (one per unit)"}},
      {"unit numel vs tensors",
       [](json& j) { j["units"][3]["numel"] = 33; },
       {"units[3].numel is 33, but its tensors hold 32 elements"}},
      {"tensor offset",
       [](json& j) { j["units"][0]["tensors"][1]["offset"] = 1; },
       {"units[0].tensors[1].offset is 1, expected 2048 (the end of the previous tensor)"}},
      {"negative dimension",
       [](json& j) { j["units"][3]["tensors"][0]["shape"][0] = -16; },
       {"units[3].tensors[0].shape has a negative or too large dimension"}},
      {"duplicate unit",
       [](json& j) { j["units"][2]["name"] = "block.0"; },
       {"units[2].name \"block.0\" is used by an earlier unit too"}},
      // Unit "head" (units[3]) has 32 elements; with 3 ranks the spans are [0, 11), [11, 22), [22, 32).
      {"overlap",
       [](json& j) {
         j["files"][1]["spans"][3] = {{"offset", 10}, {"count", 12}};
       },
       {"unit head (units[3], numel 32): files[0].spans[3] = [0, 11) and files[1].spans[3] = [10, 22) overlap"}},
      {"gap",
       [](json& j) {
         j["files"][1]["spans"][3] = {{"offset", 12}, {"count", 10}};
       },
       {"unit head (units[3], numel 32): elements [11, 12) are in no file's span"}},
      {"missing tail",
       [](json& j) {
         j["files"][2]["spans"][3] = {{"offset", 22}, {"count", 9}};
       },
       {"unit head (units[3], numel 32): elements [31, 32) are in no file's span"}},
      {"past the end",
       [](json& j) {
         j["files"][2]["spans"][3] = {{"offset", 22}, {"count", 11}};
       },
       {"files[2].spans[3] = [22, 33) runs past the end of unit head (units[3], numel 32)"}},
      {"negative count",
       [](json& j) {
         j["files"][2]["spans"][3] = {{"offset", 22}, {"count", -1}};
       },
       {"files[2].spans[3].count is -1, expected >= 0"}},
  };
  const std::string good = manifest_to_json(make_manifest(3));
  for (const JsonCase& c : cases) {
    SCOPED_TRACE(c.what);
    json j = json::parse(good);
    c.mutate(j);
    const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
    EXPECT_TRUE(contains(msg, kPath + ": ")) << msg;
    for (const std::string& e : c.expect) EXPECT_TRUE(contains(msg, e)) << "expected \"" << e << "\" in: " << msg;
  }
}

// Format version 2 gives digest_piece_bytes and files[i].piece_sha256. Version 1 gives each whole file's SHA-256 in
// files[i].sha256: it reads with digest_piece_bytes 0 and writes back the same way.
TEST(Manifest, DigestsOfWholeFilesOrOfPieces) {
  json j = json::parse(manifest_to_json(make_manifest(3)));
  EXPECT_EQ(j["digest_piece_bytes"], kDigestPieceBytes);
  EXPECT_TRUE(j["files"][0].contains("piece_sha256"));
  EXPECT_FALSE(j["files"][0].contains("sha256"));
  const std::string digest = j["files"][1]["piece_sha256"];
  j["format_version"] = 1;
  j.erase("digest_piece_bytes");
  for (json& f : j["files"]) {
    f["sha256"] = f["piece_sha256"];
    f.erase("piece_sha256");
  }
  const Manifest m = manifest_from_json(j.dump(), kPath);
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.digest_piece_bytes, 0);
  EXPECT_EQ(m.files[1].digest, digest);
  const json back = json::parse(manifest_to_json(m));
  EXPECT_EQ(back["format_version"], 1);
  EXPECT_FALSE(back.contains("digest_piece_bytes"));
  EXPECT_EQ(back["files"][1]["sha256"], digest);
  EXPECT_FALSE(back["files"][1].contains("piece_sha256"));
  // Version 2 does not read a whole-file digest field as its digest.
  j["format_version"] = 2;
  j["digest_piece_bytes"] = 4096;
  const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": required field files[0].piece_sha256 is missing")) << msg;
}

// Manifests written before fp16 training carry no loss_scale_good_steps: they read as 0.
TEST(Manifest, LossScaleCountIsOptionalOnRead) {
  json j = json::parse(manifest_to_json(make_manifest(3)));
  j.erase("loss_scale_good_steps");
  EXPECT_EQ(manifest_from_json(j.dump(), kPath).loss_scale_good_steps, 0);
}

// A manifest without train_windows reads as 0 (not recorded), and a writer that has no count leaves the field out;
// a recorded count must be at least 1.
TEST(Manifest, TrainWindowsAreOptional) {
  json j = json::parse(manifest_to_json(make_manifest(2)));
  EXPECT_EQ(j["train_windows"], 76495);
  j.erase("train_windows");
  EXPECT_EQ(manifest_from_json(j.dump(), kPath).train_windows, 0);
  Manifest m = make_manifest(2);
  m.train_windows = 0;
  EXPECT_FALSE(json::parse(manifest_to_json(m)).contains("train_windows"));
  j["train_windows"] = 0;
  const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": train_windows is 0, expected >= 1")) << msg;
}

// The cpu backend records no GEMM algorithms: the field is left out, and a manifest without it (also those written
// before GEMM tuning) reads as none.
TEST(Manifest, GemmAlgorithmsAreOptional) {
  Manifest m = make_manifest(2);
  m.gemm_algorithms = {};
  const json j = json::parse(manifest_to_json(m));
  EXPECT_FALSE(j.contains("gemm_algorithms"));
  const Manifest back = manifest_from_json(j.dump(), kPath);
  EXPECT_TRUE(back.gemm_algorithms.empty());
  EXPECT_EQ(back.gemm_algorithms.library, 0);
}

// Only train.fp8=delayed runs keep an amax history: otherwise the field is left out, and a manifest without it reads
// as none.
TEST(Manifest, Fp8AmaxHistoryIsOptional) {
  Manifest m = make_manifest(2);
  m.fp8_amax_history.clear();
  const json j = json::parse(manifest_to_json(m));
  EXPECT_FALSE(j.contains("fp8_amax_history"));
  EXPECT_TRUE(manifest_from_json(j.dump(), kPath).fp8_amax_history.empty());
}

// A node-local copy (ckpt.replicas = 1) names its node and which files it holds; the field is optional, and a
// manifest without it holds every file.
TEST(Manifest, NodeLocalRoundTripsAndNamesWhatTheDirectoryHolds) {
  Manifest m = make_manifest(3);
  EXPECT_EQ(files_held(m), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(json::parse(manifest_to_json(m)).contains("node_local"));
  m.node_local = ManifestNodeLocal{2, 3, {2}, {0}};
  const std::string text = manifest_to_json(m);
  EXPECT_EQ(json::parse(text)["node_local"].dump(), R"({"node":2,"nodes":3,"primaries":[2],"replicas":[0]})");
  const Manifest back = manifest_from_json(text, kPath);
  ASSERT_TRUE(back.node_local.has_value());
  EXPECT_EQ(back.node_local->node, 2);
  EXPECT_EQ(back.node_local->nodes, 3);
  EXPECT_EQ(back.node_local->primaries, std::vector<int>{2});
  EXPECT_EQ(back.node_local->replicas, std::vector<int>{0});
  EXPECT_EQ(files_held(back), (std::vector<int>{0, 2}));
  EXPECT_EQ(manifest_to_json(back), text);

  const std::vector<JsonCase> cases = {
      {"one node", [](json& j) { j["node_local"]["nodes"] = 1; }, {"node_local.nodes is 1, expected >= 2"}},
      {"node out of range",
       [](json& j) { j["node_local"]["node"] = 3; },
       {"node_local.node is 3, expected in [0, node_local.nodes = 3)"}},
      {"file out of range",
       [](json& j) { j["node_local"]["replicas"][0] = 3; },
       {"node_local.replicas[0] is 3, expected a file index in [0, world_size = 3)"}},
      {"not ascending",
       [](json& j) {
         j["node_local"]["primaries"] = {1, 0};
       },
       {"node_local.primaries[1] is 0, expected ascending indices"}},
      {"in both lists",
       [](json& j) { j["node_local"]["replicas"] = {2}; },
       {"node_local.replicas[0] is 2, which node_local.primaries lists too"}},
      {"primaries not an array",
       [](json& j) { j["node_local"]["primaries"] = 2; },
       {"node_local.primaries must be an array, got number 2"}},
  };
  for (const JsonCase& c : cases) {
    SCOPED_TRACE(c.what);
    json j = json::parse(text);
    c.mutate(j);
    const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
    for (const std::string& e : c.expect) EXPECT_TRUE(contains(msg, e)) << "expected \"" << e << "\" in: " << msg;
  }
}

TEST(Manifest, EmptySpansAnywhereAreValid) {
  // More ranks than elements in the head: trailing ranks own nothing there.
  Manifest m = make_manifest(7);
  EXPECT_EQ(m.files[6].spans[3], (ShardSpan{30, 2}));
  // Any disjoint cover is accepted, not only shard_span's: give rank 0 the whole head.
  for (size_t r = 0; r < m.files.size(); ++r) m.files[r].spans[3] = r == 0 ? ShardSpan{0, 32} : ShardSpan{32, 0};
  EXPECT_NO_THROW(validate_manifest(m, kPath));
  expect_equal(manifest_from_json(manifest_to_json(m), kPath), m);
}

TEST(Manifest, NonFiniteLossScaleIsRefusedWhenWriting) {
  Manifest m = make_manifest(1);
  m.loss_scale = std::numeric_limits<double>::infinity();
  try {
    manifest_to_json(m);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kInternal));
    EXPECT_TRUE(contains(e.what(), "loss_scale")) << e.what();
  }
}

TEST(Manifest, CheckModelMatchesNamesEachDifferingField) {
  const Manifest m = make_manifest(2);
  EXPECT_NO_THROW(check_model_matches(m, small_model(), kPath));
  ModelConfig other = small_model();
  other.n_embd = 512;
  std::string msg = bad_input_message([&] { check_model_matches(m, other, kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": model.n_embd is 16 in the checkpoint, 512 in the config")) << msg;
  EXPECT_FALSE(contains(msg, "n_layer")) << msg;
  other.n_layer = 12;
  other.vocab_size = 50257;
  msg = bad_input_message([&] { check_model_matches(m, other, kPath); });
  EXPECT_TRUE(contains(msg,
                       "model.n_layer is 2 in the checkpoint, 12 in the config; "
                       "model.n_embd is 16 in the checkpoint, 512 in the config; "
                       "model.vocab_size is 100 in the checkpoint, 50257 in the config"))
      << msg;
  for (auto field : {&ModelConfig::n_head, &ModelConfig::seq_len}) {
    ModelConfig one = small_model();
    one.*field += 1;
    msg = bad_input_message([&] { check_model_matches(m, one, kPath); });
    EXPECT_TRUE(contains(msg, field == &ModelConfig::n_head
                                  ? "model.n_head is 2 in the checkpoint, 3 in the config"
                                  : "model.seq_len is 32 in the checkpoint, 33 in the config"))
        << msg;
  }
}

TEST(Manifest, LlamaModelKeysRoundTripExactly) {
  const Manifest m = make_manifest(3, small_llama());
  const std::string text = manifest_to_json(m);
  EXPECT_TRUE(contains(text, "\"arch\": \"llama\"")) << text;
  expect_equal(manifest_from_json(text, kPath), m);
  EXPECT_EQ(manifest_to_json(manifest_from_json(text, kPath)), text);
  EXPECT_NO_THROW(check_model_matches(m, small_llama(), kPath));
}

// Manifests written before the llama family have no model.arch: they are gpt2, and carry no llama keys.
TEST(Manifest, ModelWithoutArchIsGpt2) {
  json j = json::parse(manifest_to_json(make_manifest(2)));
  EXPECT_FALSE(j["model"].contains("n_kv_head"));
  j["model"].erase("arch");
  EXPECT_EQ(manifest_from_json(j.dump(), kPath).model.arch, ModelArch::kGpt2);
  j["model"]["arch"] = "mamba";
  const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": model.arch is \"mamba\", expected gpt2 or llama")) << msg;
}

TEST(Manifest, LlamaManifestNamesAMissingFamilyKey) {
  json j = json::parse(manifest_to_json(make_manifest(2, small_llama())));
  j["model"].erase("rope_theta");
  const std::string msg = bad_input_message([&] { manifest_from_json(j.dump(), kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": required field model.rope_theta is missing")) << msg;
}

TEST(Manifest, CheckModelMatchesNamesBothFamilies) {
  const Manifest gpt2 = make_manifest(2);
  ModelConfig llama = small_llama();
  std::string msg = bad_input_message([&] { check_model_matches(gpt2, llama, kPath); });
  EXPECT_TRUE(contains(msg, kPath + ": the checkpoint holds a gpt2 model (model.arch=gpt2), the config asks for "
                                    "model.arch=llama"))
      << msg;
  const Manifest m = make_manifest(2, small_llama());
  msg = bad_input_message([&] { check_model_matches(m, small_model(), kPath); });
  EXPECT_TRUE(contains(msg, "holds a llama model (model.arch=llama), the config asks for model.arch=gpt2")) << msg;
  llama.n_kv_head = 4;
  llama.rms_norm_eps = 1e-5f;
  llama.tie_embeddings = true;
  llama.rope_scaling_factor = 8.0f;
  msg = bad_input_message([&] { check_model_matches(m, llama, kPath); });
  EXPECT_TRUE(contains(msg,
                       "model.n_kv_head is 2 in the checkpoint, 4 in the config; model.rope_scaling_factor is "
                       "32 in the checkpoint, 8 in the config; model.rms_norm_eps is 9.99999997e-07 in the "
                       "checkpoint, 9.99999975e-06 in the config; model.tie_embeddings is false in the "
                       "checkpoint, true in the config"))
      << msg;
}

}  // namespace
}  // namespace st
