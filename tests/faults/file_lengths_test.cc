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
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/shard_file.h"

namespace st {
namespace {

using st::testing::bad_input_message;
using st::testing::contains;
using st::testing::safetensors_file;
using st::testing::TempDir;
using st::testing::write_bytes;

// A well-formed length around one tensor's JSON declaration and 16 data bytes.
std::string one_tensor_file(const std::string& declaration) {
  const std::string header = "{\"t\":" + declaration + "}";
  return safetensors_file(header.size(), header, std::string(16, '\0'));
}

TEST(FileLengths, SafetensorsHeaderLengthOf2To63IsBadInputThroughTheCli) {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  const std::string file = safetensors_file(uint64_t{1} << 63, "{}");
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

// Each file opened by SafetensorsReader: the message of its kBadInput must hold the file's path, then `expected`.
struct BadSafetensors {
  const char* name;
  std::string bytes;
  std::string expected;
};

TEST(FileLengths, SafetensorsLengthsShapesAndOffsetsAreBoundedByTheFile) {
  const BadSafetensors cases[] = {
      {"max_length", safetensors_file(std::numeric_limits<uint64_t>::max(), "{}"),
       ": header length 18446744073709551615 runs past the end of the 10-byte file (at most 2 bytes follow the "
       "length)"},
      // 2^62 x 4 elements: the product is 2^64, 0 once it wraps, which [0, 0] would match.
      {"product_wraps", one_tensor_file(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]})"),
       ": tensor t: shape [4611686018427387904,4] holds more elements than the 98-byte file has bytes"},
      // -1 x -4 = 4 elements, 16 bytes: the product alone cannot tell.
      {"negative_dim", one_tensor_file(R"({"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]})"),
       ": tensor t: shape holds -1, expected integers >= 0"},
      // 16 bytes for 4 floats, but the data section has its 16 bytes from 0, not from 2^63.
      {"offsets_past_end",
       one_tensor_file(R"({"dtype":"F32","shape":[4],"data_offsets":[9223372036854775808,9223372036854775824]})"),
       ": tensor t: data_offsets [9223372036854775808, 9223372036854775824] do not lie within the 16-byte data "
       "section"},
      {"negative_offset", one_tensor_file(R"({"dtype":"F32","shape":[4],"data_offsets":[-16,0]})"),
       ": tensor t: data_offsets holds -16, expected integers >= 0"},
  };
  TempDir dir;
  for (const BadSafetensors& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
    EXPECT_TRUE(contains(msg, path + c.expected)) << c.name << ": " << msg;
  }
}

// A rank file whose unit says offset 2^63 - 1 and count 2: offset + count wraps, and a read would compare
// against a negative end. (The writer takes the span as given; the reader must not.)
TEST(FileLengths, ShardFileSpanWhoseEndWrapsIsBadInput) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const float data[2] = {1.0f, 2.0f};
  write_shard_file(path, 0, 1, 0,
                   {UnitSlice{"head", ShardSpan{std::numeric_limits<int64_t>::max(), 2}, data, data, data}});
  const std::string msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": group /units/head has offset 9223372036854775807 and count 2, expected both >= 0 "
                                   "and offset + count <= 9223372036854775807"))
      << msg;
}

}  // namespace
}  // namespace st
