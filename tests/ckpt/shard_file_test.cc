#include "shardtrain/ckpt/shard_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/file_write.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/manifest.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::bits;
using testing::contains;
using testing::expect_fault_past_file_size_limit;
using testing::fault_message;
using testing::on_tmpfs;
using testing::pattern;
using testing::TempDir;
using testing::write_bytes;

// One unit's slice with owned buffers for the three states.
struct OwnedSlice {
  std::string unit;
  ShardSpan span;
  std::vector<float> state[3];

  OwnedSlice(std::string name, ShardSpan s, uint32_t salt) : unit(std::move(name)), span(s) {
    for (int k = 0; k < 3; ++k) state[k] = pattern(static_cast<size_t>(s.count), salt * 3 + k);
  }
  UnitSlice view() const { return {unit, span, state[0].data(), state[1].data(), state[2].data()}; }
};

std::vector<UnitSlice> views(const std::vector<OwnedSlice>& s) {
  std::vector<UnitSlice> out;
  for (const OwnedSlice& o : s) out.push_back(o.view());
  return out;
}

constexpr ShardState kStates[] = {ShardState::kParam, ShardState::kExpAvg, ShardState::kExpAvgSq};

// Units in a non-alphabetical order, with uneven spans, an empty one, a single element and one large
// enough to span several HDF5 I/O buffers.
std::vector<OwnedSlice> sample_slices() {
  std::vector<OwnedSlice> s;
  s.emplace_back("head", ShardSpan{7, 13}, 1);
  s.emplace_back("block.0", ShardSpan{0, 0}, 2);
  s.emplace_back("block.1", ShardSpan{262144, 1}, 3);
  s.emplace_back("embedding", ShardSpan{1000, 300007}, 4);
  s.emplace_back("block.10", ShardSpan{5, 0}, 5);
  return s;
}

TEST(ShardFile, DatasetNames) {
  EXPECT_STREQ(dataset_name(ShardState::kParam), "param");
  EXPECT_STREQ(dataset_name(ShardState::kExpAvg), "exp_avg");
  EXPECT_STREQ(dataset_name(ShardState::kExpAvgSq), "exp_avg_sq");
}

TEST(ShardFile, RoundTripIsBitExactForEveryUnitAndState) {
  TempDir dir;
  const std::string path = dir.file("rank_00002.h5");
  const std::vector<OwnedSlice> slices = sample_slices();
  write_shard_file(path, 2, 5, 1234567890123LL, views(slices));

  const ShardFileReader r(path);
  EXPECT_EQ(r.rank(), 2);
  EXPECT_EQ(r.world_size(), 5);
  EXPECT_EQ(r.step(), 1234567890123LL);
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.unit_names(), (std::vector<std::string>{"head", "block.0", "block.1", "embedding", "block.10"}));
  for (const OwnedSlice& s : slices) {
    SCOPED_TRACE(s.unit);
    EXPECT_TRUE(r.has_unit(s.unit));
    EXPECT_EQ(r.span(s.unit), s.span);
    for (int k = 0; k < 3; ++k) {
      std::vector<float> out(s.state[k].size());
      r.read(s.unit, kStates[k], s.span, out.data());
      EXPECT_EQ(bits(out), bits(s.state[k])) << dataset_name(kStates[k]);
    }
  }
  EXPECT_FALSE(r.has_unit("block.2"));
}

TEST(ShardFile, LayoutIsWhatTheDocsSay) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const std::vector<OwnedSlice> slices = sample_slices();
  write_shard_file(path, 0, 1, 9, views(slices));
  const H5File f = H5File::open_read(path);
  EXPECT_EQ(h5_read_attr_i64(f, f.id(), "/", "format_version"), kCheckpointFormatVersion);
  EXPECT_EQ(h5_read_attr_i64(f, f.id(), "/", "rank"), 0);
  EXPECT_EQ(h5_read_attr_i64(f, f.id(), "/", "world_size"), 1);
  EXPECT_EQ(h5_read_attr_i64(f, f.id(), "/", "step"), 9);
  H5Handle g = h5_open_group(f, "/units/head");
  EXPECT_EQ(h5_read_attr_i64(f, g.get(), "/units/head", "offset"), 7);
  EXPECT_EQ(h5_read_attr_i64(f, g.get(), "/units/head", "count"), 13);
  for (const char* name : {"param", "exp_avg", "exp_avg_sq"}) {
    H5Handle ds = h5_open_dataset(f, std::string("/units/embedding/") + name);
    EXPECT_EQ(h5_dataset_shape(f, ds.get(), name), std::vector<int64_t>{300007});
    H5Handle type(H5Dget_type(ds.get()), H5Tclose);
    EXPECT_GT(H5Tequal(type.get(), H5T_IEEE_F32LE), 0) << name;
    H5Handle empty = h5_open_dataset(f, std::string("/units/block.0/") + name);
    EXPECT_EQ(h5_dataset_shape(f, empty.get(), name), std::vector<int64_t>{0});
  }
}

TEST(ShardFile, PartialReadsReturnExactlyTheWantedElements) {
  TempDir dir;
  const std::string path = dir.file("rank_00001.h5");
  const std::vector<OwnedSlice> slices = sample_slices();
  write_shard_file(path, 1, 2, 3, views(slices));
  const ShardFileReader r(path);
  const OwnedSlice& big = slices[3];  // embedding, [1000, 301007)
  const int64_t o = big.span.offset, n = big.span.count;
  const std::vector<ShardSpan> wants = {{o, 1},         {o + n - 1, 1},  {o + 12345, 100000}, {o + 1, n - 2},
                                        {o + n - 7, 7}, {o + 131071, 2}, {o + 500, 0},        {o + n, 0}};
  for (const ShardSpan& w : wants) {
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(::testing::Message() << "[" << w.offset << ", " << w.end() << ") " << dataset_name(kStates[k]));
      // Guard elements on both sides must stay untouched.
      const float sentinel = -12345.0f;
      std::vector<float> out(static_cast<size_t>(w.count) + 2, sentinel);
      r.read(big.unit, kStates[k], w, out.data() + 1);
      const float* src = big.state[k].data() + (w.offset - o);
      EXPECT_EQ(bits(out.data() + 1, w.count), bits(src, w.count));
      EXPECT_EQ(out.front(), sentinel);
      EXPECT_EQ(out.back(), sentinel);
    }
  }
  // The small unit, element by element.
  const OwnedSlice& head = slices[0];
  for (int64_t i = head.span.offset; i < head.span.end(); ++i) {
    float v = 0;
    r.read("head", ShardState::kExpAvgSq, {i, 1}, &v);
    EXPECT_EQ(bits(&v, 1), bits(&head.state[2][i - head.span.offset], 1)) << i;
  }
}

// Bytes this process has read through read(2)/pread(2) so far (Linux /proc/self/io "rchar").
int64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = -1;
  while (io >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

TEST(ShardFile, APartialReadReadsOnlyAroundTheWantedElements) {
  if (bytes_read_so_far() < 0) GTEST_SKIP() << "/proc/self/io is not available";
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const std::vector<OwnedSlice> slices = sample_slices();
  write_shard_file(path, 0, 1, 0, views(slices));
  const ShardFileReader r(path);
  const OwnedSlice& big = slices[3];  // 300007 floats: 1.2 MB per dataset
  std::vector<float> out(big.state[0].size());
  int64_t before = bytes_read_so_far();
  r.read(big.unit, ShardState::kExpAvg, {big.span.offset + 150000, 16}, out.data());
  const int64_t partial = bytes_read_so_far() - before;
  before = bytes_read_so_far();
  r.read(big.unit, ShardState::kExpAvg, big.span, out.data());
  const int64_t whole = bytes_read_so_far() - before;
  EXPECT_GE(whole, big.span.count * 4);
  // HDF5's sieve buffer may read up to 64 KiB around the wanted bytes, never the whole dataset.
  EXPECT_LE(partial, 128 * 1024) << "whole dataset read took " << whole << " bytes";
}

TEST(ShardFile, ReadOutsideTheSpanNamesThePathUnitAndBothRanges) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_shard_file(path, 0, 1, 0, views(sample_slices()));
  const ShardFileReader r(path);
  float out[32];
  std::string msg = bad_input_message([&] { r.read("head", ShardState::kParam, {6, 2}, out); });
  EXPECT_TRUE(contains(msg, path + ": unit head holds elements [7, 20), cannot read [6, 8)")) << msg;
  msg = bad_input_message([&] { r.read("head", ShardState::kParam, {19, 2}, out); });
  EXPECT_TRUE(contains(msg, "cannot read [19, 21)")) << msg;
  msg = bad_input_message([&] { r.read("block.0", ShardState::kParam, {0, 1}, out); });
  EXPECT_TRUE(contains(msg, path + ": unit block.0 holds elements [0, 0), cannot read [0, 1)")) << msg;
}

TEST(ShardFile, AbsentUnitIsBadInputNamingIt) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_shard_file(path, 0, 1, 0, views(sample_slices()));
  const ShardFileReader r(path);
  std::string msg = bad_input_message([&] { r.span("block.7"); });
  EXPECT_TRUE(contains(msg, path + ": unit block.7 is not in this file")) << msg;
  float v;
  msg = bad_input_message([&] { r.read("lm_head", ShardState::kParam, {0, 1}, &v); });
  EXPECT_TRUE(contains(msg, path + ": unit lm_head is not in this file")) << msg;
}

TEST(ShardFile, NoUnitsIsAValidFile) {
  TempDir dir;
  const std::string path = dir.file("rank_00003.h5");
  write_shard_file(path, 3, 4, 0, {});
  const ShardFileReader r(path);
  EXPECT_TRUE(r.unit_names().empty());
  EXPECT_EQ(r.rank(), 3);
}

TEST(ShardFile, WriteTruncatesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_shard_file(path, 0, 1, 1, views(sample_slices()));
  const OwnedSlice only("head", {0, 4}, 9);
  write_shard_file(path, 0, 1, 2, {only.view()});
  const ShardFileReader r(path);
  EXPECT_EQ(r.step(), 2);
  EXPECT_EQ(r.unit_names(), std::vector<std::string>{"head"});
  EXPECT_LT(std::filesystem::file_size(path), 100000u);
}

TEST(ShardFile, TruncatedFileIsBadInputNamingThePath) {
  TempDir dir;
  const std::string good = dir.file("good.h5");
  write_shard_file(good, 0, 1, 0, views(sample_slices()));
  const uintmax_t size = std::filesystem::file_size(good);
  for (uintmax_t keep : {size - 1, size / 2, uintmax_t{2048}, uintmax_t{100}, uintmax_t{0}}) {
    SCOPED_TRACE(keep);
    const std::string path = dir.file("cut_" + std::to_string(keep) + ".h5");
    std::filesystem::copy_file(good, path);
    std::filesystem::resize_file(path, keep);
    const std::string msg = bad_input_message([&] { ShardFileReader r(path); });
    EXPECT_TRUE(contains(msg, path)) << msg;
  }
}

TEST(ShardFile, GarbageOrMissingFileIsBadInputNamingThePath) {
  TempDir dir;
  std::string garbage(64 * 1024, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 7919) >> 3);
  write_bytes(dir.file("garbage.h5"), garbage);
  std::string msg = bad_input_message([&] { ShardFileReader r(dir.file("garbage.h5")); });
  EXPECT_TRUE(contains(msg, "cannot open HDF5 file " + dir.file("garbage.h5"))) << msg;
  msg = bad_input_message([&] { ShardFileReader r(dir.file("missing.h5")); });
  EXPECT_TRUE(contains(msg, "cannot open HDF5 file " + dir.file("missing.h5"))) << msg;
}

TEST(ShardFile, UnknownFormatVersionIsBadInput) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  write_shard_file(path, 0, 1, 0, views(sample_slices()));
  {
    H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(f.get(), 0);
    H5Handle a(H5Aopen(f.get(), "format_version", H5P_DEFAULT), H5Aclose);
    const int64_t v = 7;
    ASSERT_GE(H5Awrite(a.get(), H5T_NATIVE_INT64, &v), 0);
  }
  const std::string msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": unknown checkpoint format version 7 (this build reads versions 1 to 2)")) << msg;
}

// A rank file built by hand: the root attributes of rank 0 of 1 at step 0 and the group /units/head with its offset
// attribute (and count, unless count < 0); the caller adds the datasets.
H5File hand_built_file(const std::string& path, int64_t offset, int64_t count) {
  H5File f = H5File::create(path);
  h5_write_attr_i64(f, f.id(), "/", "format_version", kCheckpointFormatVersion);
  h5_write_attr_i64(f, f.id(), "/", "rank", 0);
  h5_write_attr_i64(f, f.id(), "/", "world_size", 1);
  h5_write_attr_i64(f, f.id(), "/", "step", 0);
  h5_create_group(f, "/units");
  H5Handle g = h5_create_group(f, "/units/head");
  h5_write_attr_i64(f, g.get(), "/units/head", "offset", offset);
  if (count >= 0) h5_write_attr_i64(f, g.get(), "/units/head", "count", count);
  return f;
}

// Files built by hand with one thing wrong: each error names the file and the object.
TEST(ShardFile, MalformedFilesNameTheObject) {
  TempDir dir;
  auto build = [&](const std::string& name, bool with_count, int64_t param_len, bool with_exp_avg_sq) {
    const std::string path = dir.file(name);
    H5File f = hand_built_file(path, 0, with_count ? 4 : -1);
    const std::vector<float> data(8, 1.0f);
    h5_write_f32(f, "/units/head/param", {param_len}, data.data());
    h5_write_f32(f, "/units/head/exp_avg", {4}, data.data());
    if (with_exp_avg_sq) h5_write_f32(f, "/units/head/exp_avg_sq", {4}, data.data());
    f.close();
    return path;
  };
  std::string path = build("no_count.h5", false, 4, true);
  std::string msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": attribute count of /units/head is missing")) << msg;
  path = build("short_param.h5", true, 3, true);
  msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": dataset /units/head/param has shape [3], expected [4]")) << msg;
  path = build("no_v.h5", true, 4, false);
  msg = bad_input_message([&] { ShardFileReader r(path); });
  EXPECT_TRUE(contains(msg, path + ": dataset /units/head/exp_avg_sq is missing")) << msg;
  path = build("fine.h5", true, 4, true);
  EXPECT_EQ(ShardFileReader(path).span("head"), (ShardSpan{0, 4}));
}

// Datasets whose file bytes are not this machine's fp32 in one run (float64; chunked fp32) are read through HDF5,
// which converts and gathers them; the others are read as plain bytes. Both give the wanted elements.
TEST(ShardFile, DatasetsStoredOtherwiseAreReadThroughHdf5) {
  TempDir dir;
  const std::string path = dir.file("by_hand.h5");
  {
    H5File f = hand_built_file(path, 5, 10);
    const hsize_t n = 10, chunk = 3;
    H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    const std::vector<double> f64 = {0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5};
    H5Handle p(
        H5Dcreate2(f.id(), "/units/head/param", H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        H5Dclose);
    ASSERT_GE(H5Dwrite(p.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, f64.data()), 0);
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    ASSERT_GE(H5Pset_chunk(dcpl.get(), 1, &chunk), 0);
    const std::vector<float> f32 = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    H5Handle m(
        H5Dcreate2(f.id(), "/units/head/exp_avg", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        H5Dclose);
    ASSERT_GE(H5Dwrite(m.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f32.data()), 0);
    h5_write_f32(f, "/units/head/exp_avg_sq", {10}, f32.data());
  }
  const ShardFileReader r(path);
  std::vector<float> out(5);
  r.read("head", ShardState::kParam, {7, 5}, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.5f, 3.5f, 4.5f, 5.5f, 6.5f}));
  r.read("head", ShardState::kExpAvg, {7, 5}, out.data());
  EXPECT_EQ(out, (std::vector<float>{12, 13, 14, 15, 16}));
  r.read("head", ShardState::kExpAvgSq, {10, 5}, out.data());
  EXPECT_EQ(out, (std::vector<float>{15, 16, 17, 18, 19}));

  // A load's one pass reads only the plain dataset, and returns the file's digest.
  EXPECT_FALSE(r.stored_plain("head", ShardState::kParam));
  EXPECT_FALSE(r.stored_plain("head", ShardState::kExpAvg));
  EXPECT_TRUE(r.stored_plain("head", ShardState::kExpAvgSq));
  std::vector<float> param(5, -1), m(5, -1), v(5, -1);
  const std::vector<SliceRead> reads = {{"head", ShardState::kParam, {7, 5}, param.data()},
                                        {"head", ShardState::kExpAvg, {7, 5}, m.data()},
                                        {"head", ShardState::kExpAvgSq, {11, 3}, v.data() + 1}};
  EXPECT_EQ(r.read_plain_and_digest(reads, 4096), file_digest(path, 4096));
  EXPECT_EQ(param, std::vector<float>(5, -1));
  EXPECT_EQ(m, std::vector<float>(5, -1));
  EXPECT_EQ(v, (std::vector<float>{-1, 16, 17, 18, -1}));
}

// The one pass checks every wanted span as read() does, before it reads anything.
TEST(ShardFile, OnePassRefusesASpanOutsideTheUnitAndReadsNothing) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const std::vector<OwnedSlice> slices = {OwnedSlice("head", {4, 6}, 1), OwnedSlice("tail", {0, 3}, 2)};
  write_shard_file(path, 0, 1, 3, views(slices));
  const ShardFileReader r(path);
  std::vector<float> a(6, -1), b(6, -1);
  const std::string msg = bad_input_message([&] {
    r.read_plain_and_digest(
        {{"head", ShardState::kParam, {4, 6}, a.data()}, {"tail", ShardState::kExpAvg, {1, 3}, b.data()}},
        kDigestPieceBytes);
  });
  EXPECT_TRUE(contains(msg, path + ": unit tail holds elements [0, 3), cannot read [1, 4)")) << msg;
  EXPECT_EQ(a, std::vector<float>(6, -1));
  std::vector<float> param(6), m(6), v(6);
  EXPECT_EQ(r.read_plain_and_digest({{"head", ShardState::kParam, {4, 6}, param.data()},
                                     {"head", ShardState::kExpAvg, {4, 6}, m.data()},
                                     {"head", ShardState::kExpAvgSq, {4, 6}, v.data()}},
                                    kDigestPieceBytes),
            file_digest(path, kDigestPieceBytes));
  EXPECT_EQ(bits(param), bits(slices[0].state[0]));
  EXPECT_EQ(bits(m), bits(slices[0].state[1]));
  EXPECT_EQ(bits(v), bits(slices[0].state[2]));
}

// Writes `slices`, then checks what write_shard_file returned against the file (length and digest) and reads
// every unit back bit-exactly.
void expect_written_and_read_back(const std::string& path, const std::vector<OwnedSlice>& slices) {
  SCOPED_TRACE(path);
  const WrittenFile w = write_shard_file(path, 0, 1, 77, views(slices));
  EXPECT_EQ(w.bytes, file_size(path));
  EXPECT_EQ(w.digest, file_digest(path, kDigestPieceBytes));
  const ShardFileReader r(path);
  EXPECT_EQ(r.step(), 77);
  ASSERT_EQ(r.unit_names().size(), slices.size());
  for (const OwnedSlice& s : slices) {
    EXPECT_EQ(r.span(s.unit), s.span) << s.unit;
    for (int k = 0; k < 3; ++k) {
      std::vector<float> out(s.state[k].size());
      r.read(s.unit, kStates[k], s.span, out.data());
      EXPECT_TRUE(bits(out) == bits(s.state[k])) << s.unit << " " << dataset_name(kStates[k]);
    }
  }
}

// The digest is taken from memory while the bytes are written: it must be the file's. Unit sets: the sample
// (empty units among others), none, only empty ones, and one unit whose datasets (18 MB each) cross the 16 MiB
// write size.
TEST(ShardFile, WriteReturnsTheFilesLengthAndDigest) {
  TempDir dir;
  expect_written_and_read_back(dir.file("sample.h5"), sample_slices());
  expect_written_and_read_back(dir.file("none.h5"), {});
  std::vector<OwnedSlice> empty;
  empty.emplace_back("block.0", ShardSpan{0, 0}, 6);
  empty.emplace_back("block.1", ShardSpan{12, 0}, 7);
  expect_written_and_read_back(dir.file("empty.h5"), empty);
  std::vector<OwnedSlice> large;
  large.emplace_back("embedding", ShardSpan{3, 4500001}, 8);
  large.emplace_back("head", ShardSpan{0, 5}, 9);
  expect_written_and_read_back(dir.file("large.h5"), large);
}

// The same on a tmpfs, where the writes go through the page cache or, on Linux >= 6.6, direct.
TEST(ShardFile, WriteOnTmpfsReturnsTheFilesLengthAndDigest) {
  if (!on_tmpfs("/dev/shm")) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  TempDir dir("/dev/shm");
  expect_written_and_read_back(dir.file("sample.h5"), sample_slices());
}

// Past RLIMIT_FSIZE the write fails with EFBIG: a fault naming the path and the OS's text, and the process then
// exits normally (HDF5 keeps no exit handler that could crash on the file it failed to close).
TEST(ShardFile, AWritePastTheFileSizeLimitIsAFaultNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  std::vector<OwnedSlice> slices;
  slices.emplace_back("embedding", ShardSpan{0, 300000}, 10);  // 3.6 MB of floats
  expect_fault_past_file_size_limit(256 * 1024, path + ": File too large",
                                    [&] { write_shard_file(path, 0, 1, 1, views(slices)); });
}

TEST(ShardFile, WriteIntoAMissingDirectoryIsAFaultNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("step_00000001.tmp-1/rank_00000.h5");
  const std::string msg = fault_message([&] { write_shard_file(path, 0, 1, 1, views(sample_slices())); });
  EXPECT_TRUE(contains(msg, path)) << msg;
}

TEST(ShardFile, ReaderMoves) {
  TempDir dir;
  const std::string path = dir.file("rank_00000.h5");
  const std::vector<OwnedSlice> slices = sample_slices();
  write_shard_file(path, 0, 1, 5, views(slices));
  ShardFileReader a(path);
  ShardFileReader b(std::move(a));
  EXPECT_EQ(b.step(), 5);
  ShardFileReader c(path);
  c = std::move(b);
  float v;
  c.read("head", ShardState::kParam, {7, 1}, &v);
  EXPECT_EQ(bits(&v, 1), bits(slices[0].state[0].data(), 1));
}

// What the resume code does (docs/checkpoint-format.md): a run at world M reads its shard_span of each unit
// by intersecting it with the spans the N old files hold. Every (N, M) pair gives back the full buffer.
TEST(ShardFile, AnyWorldSizeReassemblesTheUnitByIntersectingSpans) {
  TempDir dir;
  const std::vector<std::pair<std::string, int64_t>> units = {{"embedding", 1001}, {"block.0", 2}, {"head", 0}};
  std::vector<std::vector<float>> full[3];  // [state][unit]
  for (int k = 0; k < 3; ++k)
    for (size_t u = 0; u < units.size(); ++u) full[k].push_back(pattern(units[u].second, 100 * k + u));
  for (int n : {1, 3, 4}) {
    std::vector<std::string> paths;
    for (int r = 0; r < n; ++r) {
      std::vector<UnitSlice> slices;
      for (size_t u = 0; u < units.size(); ++u) {
        const ShardSpan s = shard_span(units[u].second, r, n);
        slices.push_back({units[u].first, s, full[0][u].data() + s.offset, full[1][u].data() + s.offset,
                          full[2][u].data() + s.offset});
      }
      paths.push_back(dir.file("n" + std::to_string(n) + "_rank_" + std::to_string(r) + ".h5"));
      write_shard_file(paths.back(), r, n, 10, slices);
    }
    std::vector<ShardFileReader> readers;
    for (const std::string& p : paths) readers.emplace_back(p);
    for (int m : {1, 2, 3, 5, 7}) {
      for (size_t u = 0; u < units.size(); ++u) {
        for (int k = 0; k < 3; ++k) {
          std::vector<float> assembled(units[u].second, 0.0f);
          for (int r = 0; r < m; ++r) {
            const ShardSpan mine = shard_span(units[u].second, r, m);
            for (const ShardFileReader& old : readers) {
              const ShardSpan part = intersect(mine, old.span(units[u].first));
              if (part.count > 0) old.read(units[u].first, kStates[k], part, assembled.data() + part.offset);
            }
          }
          EXPECT_EQ(bits(assembled), bits(full[k][u])) << "N=" << n << " M=" << m << " " << units[u].first;
        }
      }
    }
  }
}

}  // namespace
}  // namespace st
