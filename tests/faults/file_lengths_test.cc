// Lengths and offsets read from files, set past what any file can hold: a safetensors header length of 2^63
// and more, shapes whose product wraps or whose dimensions are negative, and a rank file's span whose end
// wraps. Each is bad input (kBadInput, exit 2) naming the file and the number, found before it sizes an
// allocation or a read.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "../ckpt/ckpt_test_util.h"
#include "../common/run_shardtrain.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/shard_file.h"

namespace st {
namespace {

using st::testing::bad_input_message;
using st::testing::contains;
using st::testing::TempDir;
using st::testing::write_bytes;

// The 8-byte little-endian length, then `header` and `data`.
std::string safetensors_bytes(uint64_t length, const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return out + header + data;
}

// A well-formed length around one tensor's JSON declaration and 16 data bytes.
std::string one_tensor_file(const std::string& declaration) {
  const std::string header = "{\"t\":" + declaration + "}";
  return safetensors_bytes(header.size(), header, std::string(16, '\0'));
}

TEST(FileLengths, SafetensorsHeaderLengthOf2To63IsBadInputThroughTheCli) {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  const std::string file = safetensors_bytes(uint64_t{1} << 63, "{}");
  write_bytes(path, file);
  const st::testing::CliResult r = st::testing::run_shardtrain(
      "train --config " SHARDTRAIN_SOURCE_DIR
      "/configs/tiny.ini --model.n_layer=1 --model.n_embd=32 "
      "--model.n_head=2 --model.seq_len=16 --train.micro_batch=1 --train.global_batch=1 --train.steps=1 "
      "--init.from=" +
      path);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, path + ": header length 9223372036854775808 runs past the end of the 10-byte file"))
      << r.output;
}

TEST(FileLengths, SafetensorsHeaderLengthOf2To64Minus1IsBadInput) {
  TempDir dir;
  const std::string path = dir.file("max.safetensors");
  write_bytes(path, safetensors_bytes(std::numeric_limits<uint64_t>::max(), "{}"));
  const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": header length 18446744073709551615 runs past the end of the 10-byte file (at "
                                   "most 2 bytes follow the length)"))
      << msg;
}

TEST(FileLengths, SafetensorsShapeWhoseProductWrapsIsBadInput) {
  TempDir dir;
  const std::string path = dir.file("wrap.safetensors");
  // 2^62 x 4 elements: the product is 2^64, 0 once it wraps, which [0, 0] would match.
  write_bytes(path, one_tensor_file(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]})"));
  const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": tensor t: shape [4611686018427387904,4] holds more elements than the ")) << msg;
}

TEST(FileLengths, SafetensorsNegativeDimensionIsBadInput) {
  TempDir dir;
  const std::string path = dir.file("negative.safetensors");
  // -1 x -4 = 4 elements, 16 bytes: the product alone cannot tell.
  write_bytes(path, one_tensor_file(R"({"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]})"));
  const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": tensor t: shape holds -1, expected integers >= 0")) << msg;
}

TEST(FileLengths, SafetensorsDataOffsetsPastTheFileAreBadInput) {
  TempDir dir;
  const std::string path = dir.file("offsets.safetensors");
  // 2^63 + 16 - 2^63 = 16 bytes for 4 floats, but the data section has 16 bytes from 0, not from 2^63.
  write_bytes(
      path, one_tensor_file(R"({"dtype":"F32","shape":[4],"data_offsets":[9223372036854775808,9223372036854775824]})"));
  const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": tensor t: data_offsets [9223372036854775808, 9223372036854775824] do not lie "
                                   "within the 16-byte data section"))
      << msg;
  const std::string negative = dir.file("negative_offsets.safetensors");
  write_bytes(negative, one_tensor_file(R"({"dtype":"F32","shape":[4],"data_offsets":[-16,0]})"));
  const std::string neg_msg = bad_input_message([&] { SafetensorsReader r(negative); });
  EXPECT_TRUE(contains(neg_msg, negative + ": tensor t: data_offsets holds -16, expected integers >= 0")) << neg_msg;
}

// A rank file whose unit group says offset 2^63 - 1 and count 2: offset + count wraps, and a read would
// compare against a negative end.
TEST(FileLengths, ShardFileSpanWhoseEndWrapsIsBadInput) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  {
    H5File f = H5File::create(path);
    h5_write_attr_i64(f, f.id(), "/", "format_version", kCheckpointFormatVersion);
    h5_write_attr_i64(f, f.id(), "/", "rank", 0);
    h5_write_attr_i64(f, f.id(), "/", "world_size", 1);
    h5_write_attr_i64(f, f.id(), "/", "step", 0);
    h5_create_group(f, "/units");
    H5Handle g = h5_create_group(f, "/units/head");
    h5_write_attr_i64(f, g.get(), "/units/head", "offset", std::numeric_limits<int64_t>::max());
    h5_write_attr_i64(f, g.get(), "/units/head", "count", 2);
    const float data[2] = {1.0f, 2.0f};
    for (const char* state : {"param", "exp_avg", "exp_avg_sq"})
      h5_write_f32(f, std::string("/units/head/") + state, {2}, data);
    f.close();
  }
  const std::string msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": group /units/head has offset 9223372036854775807 and count 2, expected both >= 0 "
                                   "and offset + count <= 9223372036854775807"))
      << msg;
}

}  // namespace
}  // namespace st
