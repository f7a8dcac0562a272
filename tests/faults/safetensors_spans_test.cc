// Safetensors headers whose offsets break the format (overlapping, holes, trailing bytes, short spans, spans past the
// end, unknown dtypes, non-string metadata, an oversized header), an index whose shards hold tensors it does not list,
// and HDF5 rank files whose datasets share bytes. Every reader of such a file refuses it (kBadInput, exit 2) naming
// the file, the tensor(s) and the offsets, expected against actual, as the safetensors library itself does.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "../ckpt/hf_dir_test_util.h"
#include "shardtrain/ckpt/hf_dir.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/shard_file.h"

namespace st {
namespace {

using st::testing::bad_input_message;
using st::testing::contains;
using st::testing::TempDir;
using st::testing::write_bytes;

// A well-formed length, then `header` and `data_bytes` zero bytes of data.
std::string st_file(const std::string& header, size_t data_bytes) {
  return testing::safetensors_file(header.size(), header, std::string(data_bytes, '\0'));
}

struct Case {
  const char* name;
  std::string header;
  size_t data_bytes;
  std::string expected;  // after "<path>"
};

// Every rule of the format's reader (the safetensors library's Metadata::validate and read_metadata), each broken once.
TEST(SafetensorsSpans, SafetensorsOffsetsMustTileTheDataSection) {
  const Case cases[] = {
      // The issue's case in small: b's bytes are the first 8 of a's.
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       16,
       ": tensor a has data_offsets [0, 16], which overlap tensor b's [0, 8]: every tensor's bytes must be its own "
       "(expected it to begin at 8, where b ends; it begins at 0)"},
      {"overlap_inside",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
       R"("c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
       20, ": tensor b has data_offsets [4, 8], which overlap tensor a's [0, 16]"},
      {"hole",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       16,
       ": bytes [8, 12) of the data section belong to no tensor (a hole between tensor a, which ends at 8, and tensor "
       "b, whose data_offsets are [12, 16])"},
      {"hole_at_start", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16,
       ": bytes [0, 8) of the data section belong to no tensor (a hole before tensor a"},
      {"trailing_bytes", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 20,
       ": bytes [16, 20) of the 20-byte data section belong to no tensor (the last tensor, a, ends at 16"},
      {"no_tensor_but_data", R"({"__metadata__":{"format":"pt"}})", 4,
       ": bytes [0, 4) of the 4-byte data section belong to no tensor (the header declares no tensor"},
      {"short_span", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})", 8,
       ": tensor a of shape [4] and dtype F32 needs 16 bytes (4 elements of 32 bits), its data_offsets [0, 8] hold 8"},
      {"long_span", R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}})", 16,
       ": tensor a of shape [2, 2] and dtype BF16 needs 8 bytes (4 elements of 16 bits), its data_offsets [0, 16] "
       "hold 16"},
      {"past_the_end", R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", 16,
       ": tensor a: data_offsets [0, 32] do not lie within the 16-byte data section"},
      {"begin_after_end", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", 16,
       ": tensor a: data_offsets [16, 0] do not lie within the 16-byte data section"},
      {"unknown_dtype", R"({"a":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", 16,
       ": tensor a has dtype F33, which the safetensors format does not define"},
      {"lower_case_dtype", R"({"a":{"dtype":"float32","shape":[4],"data_offsets":[0,16]}})", 16,
       ": tensor a has dtype float32, which the safetensors format does not define"},
      {"half_a_byte", R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2,
       ": tensor a of shape [3] and dtype F4 holds 3 elements of 4 bits, which is not a whole number of bytes"},
      {"no_dtype", R"({"a":{"shape":[4],"data_offsets":[0,16]}})", 16, ": tensor a has no dtype"},
      {"three_offsets", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}})", 16,
       ": tensor a: data_offsets must hold 2 numbers, it holds 3"},
      {"tensor_not_object", R"({"a":[1,2]})", 0, ": tensor a is [1,2], expected an object"},
      {"metadata_number", R"({"__metadata__":{"format":"pt","step":3}})", 0,
       ": __metadata__[\"step\"] is 3, expected a string"},
      {"metadata_list", R"({"__metadata__":["pt"]})", 0, ": __metadata__ is [\"pt\"], expected an object of strings"},
      {"not_json", R"({"a":{"dtype":"F32",)", 0, ": the safetensors header is not valid JSON"},
      {"not_utf8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
       ": the safetensors header is not valid JSON"},
      {"not_an_object", "[]", 0, ": the safetensors header is not a JSON object"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_bytes(path, st_file(c.header, c.data_bytes));
    const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
    EXPECT_TRUE(contains(msg, path + c.expected)) << c.name << ": " << msg;
  }
}

// What the format allows stays allowed: any order of declaration, empty tensors sharing an offset, every dtype the
// format defines (sub-byte ones in whole bytes), string metadata, padding spaces after the JSON.
TEST(SafetensorsSpans, SafetensorsFilesThatTileTheirDataAreAccepted) {
  TempDir dir;
  const std::string header =
      R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[6,14]},"e1":{"dtype":"F32","shape":[0,3],"data_offsets":[6,6]},)"
      R"("e2":{"dtype":"I64","shape":[0],"data_offsets":[6,6]},"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]},)"
      R"("b":{"dtype":"BOOL","shape":[4],"data_offsets":[2,6]},"__metadata__":{"format":"pt"}}    )";
  const std::string path = dir.file("ok.safetensors");
  write_bytes(path, st_file(header, 14));
  const SafetensorsReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"b", "e1", "e2", "q", "z"}));
  std::vector<float> z(2, 1.0f);
  r.read("z", {2}, z.data());
  EXPECT_EQ(z, (std::vector<float>{0.0f, 0.0f}));
  // An empty file of no tensors is a valid file too.
  write_bytes(dir.file("empty.safetensors"), st_file("{}", 0));
  EXPECT_TRUE(SafetensorsReader(dir.file("empty.safetensors")).names().empty());
}

// A header length past the library's 100,000,000-byte limit is refused before it is read (a sparse file: no disk).
TEST(SafetensorsSpans, SafetensorsHeaderLongerThanTheFormatAllowsIsRefusedUnread) {
  TempDir dir;
  const std::string path = dir.file("huge_header.safetensors");
  const uint64_t n = 100'000'001;
  write_bytes(path, testing::safetensors_file(n, ""));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + n + 16)), 0);
  const std::string msg = bad_input_message([&] { SafetensorsReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": header length 100000001 exceeds the safetensors format's limit of 100000000 bytes"))
      << msg;
}

// A shard of an index holding a tensor the index does not list: it would be loaded by nobody.
TEST(SafetensorsSpans, AShardHoldingATensorItsIndexDoesNotListIsRefused) {
  TempDir tmp;
  testing::Variant v;
  v.files = 2;
  const std::vector<testing::Tensor> ts = testing::write_hf_dir(tmp.file("hf"), v);
  const std::string shard = tmp.file("hf") + "/model-00002-of-00002.safetensors";
  std::vector<const testing::Tensor*> second;
  for (size_t i = 1; i < ts.size(); i += 2) second.push_back(&ts[i]);  // write_hf_dir's round-robin
  const testing::Tensor extra = testing::make_tensor("model.layers.0.self_attn.q_norm.weight", {4}, "F32", 77);
  second.push_back(&extra);
  testing::write_safetensors(shard, second, "F32");
  const std::string msg = bad_input_message([&] { HfDirWeights w(tmp.file("hf")); });
  EXPECT_TRUE(contains(msg, shard + ": holds tensor model.layers.0.self_attn.q_norm.weight, which " + tmp.file("hf") +
                                "/model.safetensors.index.json does not list"))
      << msg;
}

// A rank file whose exp_avg dataset is param's bytes under a second name: resume would read the moments from the weights.
TEST(SafetensorsSpans, ARankFileWhoseDatasetsShareBytesIsRefused) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const std::vector<float> p(8, 1.0f), m(8, 2.0f), v(8, 3.0f);
  write_shard_file(path, 0, 1, 0, {UnitSlice{"head", ShardSpan{0, 8}, p.data(), m.data(), v.data()}});
  EXPECT_NO_THROW(ShardFileReader{path});
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/units/head/exp_avg", H5P_DEFAULT), 0);
  ASSERT_GE(H5Lcreate_hard(f, "/units/head/param", f, "/units/head/exp_avg", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::string msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": datasets /units/head/exp_avg (bytes [") &&
              contains(msg, ")) and /units/head/param (bytes [") && contains(msg, ")) overlap"))
      << msg;
}

}  // namespace
}  // namespace st
