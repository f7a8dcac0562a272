// The safetensors writer's contract (ckpt/safetensors.h): the layout, alignment, order and misuse.
#include "shardtrain/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {
namespace {

using st::testing::bits;
using st::testing::contains;
using st::testing::pattern;
using st::testing::read_bytes;
using st::testing::safetensors_header_len;
using st::testing::TempDir;

std::string internal_error(const std::function<void()>& fn) {
  return st::testing::error_message(ErrorKind::kInternal, fn);
}

TEST(Safetensors, LayoutIsHeaderThenAlignedBackToBackData) {
  TempDir tmp;
  const std::string path = tmp.file("t.safetensors");
  const std::vector<float> a = pattern(6, 1), b = pattern(5, 2), c = pattern(1, 3);
  SafetensorsWriter w(path, {{"z.first", {2, 3}}, {"a.second", {5}}, {"empty", {0, 4}}, {"scalar", {}}});
  w.write("z.first", a.data(), 6);
  w.write("a.second", b.data(), 5);
  w.write("empty", nullptr, 0);
  w.write("scalar", c.data(), 1);
  w.finish();

  const std::string blob = read_bytes(path);
  ASSERT_EQ(static_cast<int64_t>(blob.size()), w.file_bytes());
  const uint64_t n = safetensors_header_len(blob);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = blob.substr(8, n);
  EXPECT_EQ(header, safetensors_header({{"z.first", {2, 3}}, {"a.second", {5}}, {"empty", {0, 4}}, {"scalar", {}}}));
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only
  const auto j = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"z.first", "a.second", "empty", "scalar", "__metadata__"}));  // as declared
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["z.first"]["dtype"], "F32");
  EXPECT_EQ(j["z.first"]["shape"], nlohmann::ordered_json({2, 3}));
  EXPECT_EQ(j["z.first"]["data_offsets"], nlohmann::ordered_json({0, 24}));
  EXPECT_EQ(j["a.second"]["data_offsets"], nlohmann::ordered_json({24, 44}));
  EXPECT_EQ(j["empty"]["data_offsets"], nlohmann::ordered_json({44, 44}));
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::ordered_json::array());
  EXPECT_EQ(j["scalar"]["data_offsets"], nlohmann::ordered_json({44, 48}));
  const std::string data = blob.substr(8 + n);
  ASSERT_EQ(data.size(), 48u);
  // Bit for bit, NaN payloads and denormals included.
  EXPECT_EQ(bits(reinterpret_cast<const float*>(data.data()), 6), bits(a));
  EXPECT_EQ(bits(reinterpret_cast<const float*>(data.data() + 24), 5), bits(b));
  EXPECT_EQ(bits(reinterpret_cast<const float*>(data.data() + 44), 1), bits(c));
}

TEST(Safetensors, HeaderPaddingAlignsEveryLength) {
  // Names of every length mod 8 give every header length mod 8.
  for (int len = 1; len <= 16; ++len) {
    const std::string h = safetensors_header({{std::string(static_cast<size_t>(len), 'x'), {3}}});
    EXPECT_EQ((8 + h.size()) % 8, 0u) << len;
    EXPECT_TRUE(nlohmann::json::accept(h)) << len;
  }
}

// The reader hands back any range of a tensor as written, a BF16 tensor read and widened in chunks of 2^20 elements
// on several threads: ranges that start and end inside chunks, span several, or hold one element.
TEST(Safetensors, ReaderReadsAnyRangeOfALargeTensor) {
  TempDir tmp;
  const std::string path = tmp.file("big.safetensors");
  const int64_t n = (int64_t{5} << 20) + 17;
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 1000003) * 0.37f - 9.0f;
  SafetensorsWriter w(path, {{"f", {n}, SafetensorsDtype::kF32}, {"h", {n}, SafetensorsDtype::kBF16}});
  w.write("f", values.data(), n);
  w.write("h", values.data(), n);
  w.finish();
  const SafetensorsReader r(path);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, n}, {12345, (int64_t{3} << 20) + 5}, {(int64_t{1} << 20) - 1, 2}, {n - 1, 1}, {7, 0}};
  for (const auto& [begin, count] : ranges) {
    std::vector<float> f(static_cast<size_t>(count) + 1, -1.0f), h(f);
    r.read_range("f", begin, count, f.data());
    r.read_range("h", begin, count, h.data());
    std::vector<float> want_f(values.begin() + begin, values.begin() + begin + count), want_h(want_f);
    for (float& x : want_h) x = bf16_to_float(round_to_bf16(x));
    EXPECT_TRUE(bits(f.data(), static_cast<size_t>(count)) == bits(want_f)) << "f [" << begin << ", +" << count << ")";
    EXPECT_TRUE(bits(h.data(), static_cast<size_t>(count)) == bits(want_h)) << "h [" << begin << ", +" << count << ")";
    EXPECT_EQ(f.back(), -1.0f) << "read past the range";
    EXPECT_EQ(h.back(), -1.0f) << "read past the range";
  }
}

TEST(Safetensors, MisuseIsAnInternalErrorNamingTheTensor) {
  TempDir tmp;
  const std::vector<float> x(6, 1.0f);
  EXPECT_TRUE(contains(internal_error([&] {
                         SafetensorsWriter(tmp.file("a"), {{"t", {1}}, {"t", {2}}});
                       }),
                       "t is declared twice"));
  EXPECT_TRUE(contains(internal_error([&] {
                         SafetensorsWriter(tmp.file("b"), {{"__metadata__", {1}}});
                       }),
                       "__metadata__"));
  EXPECT_TRUE(contains(internal_error([&] { SafetensorsWriter(tmp.file("c"), {{"neg", {2, -1}}}); }), "neg"));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("a")));  // refused before the file is created

  SafetensorsWriter w(tmp.file("d"), {{"first", {2, 3}}, {"second", {4}}});
  EXPECT_TRUE(contains(internal_error([&] { w.write("second", x.data(), 4); }), "the next declared tensor is first"));
  EXPECT_TRUE(contains(internal_error([&] { w.write("first", x.data(), 5); }), "the shape holds 6"));
  w.write("first", x.data(), 6);
  EXPECT_TRUE(contains(internal_error([&] { w.finish(); }), "the next is second"));
}

TEST(Safetensors, AnUnwritablePathIsAFaultNamingIt) {
  TempDir tmp;
  const std::string path = tmp.file("no/such/dir/t.safetensors");
  const std::string msg = st::testing::fault_message([&] { SafetensorsWriter(path, {{"t", {1}}}); });
  EXPECT_TRUE(contains(msg, path)) << msg;
}

}  // namespace
}  // namespace st
