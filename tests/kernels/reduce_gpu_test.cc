// gpu::sum_of_squares, sum, convert, accumulate and accumulate_parts against double / host references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/kernels/reduce.h"

namespace st {
namespace {

using test::kTol;
using test::to_device;
using test::to_host;

// n elements starting `offset` into each buffer (offset 1: scalar path); 1 << 20 | 3 is more than one
// element per thread of the fixed reduction grid, with a tail.
struct Shape {
  int64_t n;
  int offset;
};
const Shape kShapes[] = {{1, 0}, {7, 0}, {1000, 0}, {1000, 1}, {(1 << 20) + 3, 0}};

// The sums accumulate into *out: it starts at this, on both sides.
constexpr double kStart = 2.5;

DeviceBuffer<double> device_double(double x) {
  DeviceBuffer<double> d(1);
  ST_CUDA_CHECK(cudaMemcpy(d.data(), &x, sizeof(x), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
  return d;
}
double host_double(const DeviceBuffer<double>& d) {
  double x = 0;
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  ST_CUDA_CHECK(cudaMemcpy(&x, d.data(), sizeof(x), cudaMemcpyDeviceToHost));
  return x;
}

template <typename T>
class ReduceGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(ReduceGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(ReduceGpuTest, SumOfSquaresAccumulatesAndIsDeterministic) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> x = test::random_input<T>(s.n, 1);
    double want = kStart;
    for (float v : x) want += static_cast<double>(v) * v;

    test::GpuEnv env(gpu::reduce_scratch_bytes());
    DeviceBuffer<T> d_x = test::upload<T>(x, s.offset);
    double first = 0;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer<double> out = device_double(kStart);
      gpu::sum_of_squares<T>(d_x.data() + s.offset, s.n, out.data(), env.ctx);
      const double got = host_double(out);
      // fp32 squares of the same operands summed in fp32/double: T does not loosen it.
      EXPECT_NEAR(got, want, kTol<float> * want);
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(std::memcmp(&got, &first, sizeof(got)), 0) << "not bit-identical: " << got << " vs " << first;
    }
  }
}

TEST(ReduceSumGpuTest, SumAccumulates) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    // Positive, like the per-token losses it sums.
    std::vector<float> x = test::random_input<float>(s.n, 1);
    for (float& v : x) v = 1.0f + std::fabs(v);
    double want = kStart;
    for (float v : x) want += v;

    test::GpuEnv env(gpu::reduce_scratch_bytes());
    DeviceBuffer<float> d_x = test::upload<float>(x, s.offset);
    DeviceBuffer<double> out = device_double(kStart);
    gpu::sum(d_x.data() + s.offset, s.n, out.data(), env.ctx);
    EXPECT_NEAR(host_double(out), want, kTol<float> * want);
  }
}

// The gradient norm's two ways: each unit's sum of squares into its own part, then sum_in_order, gives the bits of
// one total that sum_of_squares accumulated unit after unit.
TEST(ReduceSumGpuTest, SumInOrderOfPartsEqualsAccumulatingInTurn) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env(gpu::reduce_scratch_bytes());
  const int64_t sizes[] = {1000, 7, (1 << 20) + 3, 1, 4099, 65536};
  const int units = static_cast<int>(std::size(sizes));
  DeviceBuffer<double> parts(units), in_turn = device_double(0), in_order = device_double(-1);
  ST_CUDA_CHECK(cudaMemset(parts.data(), 0, parts.bytes()));
  std::vector<DeviceBuffer<float>> grads;
  for (int u = 0; u < units; ++u) {
    grads.push_back(to_device<float>(test::random_input<float>(sizes[u], 10 + u, 1e-3f * (u + 1))));
    gpu::sum_of_squares<float>(grads.back().data(), sizes[u], in_turn.data(), env.ctx);
    gpu::sum_of_squares<float>(grads.back().data(), sizes[u], parts.data() + u, env.ctx);
  }
  gpu::sum_in_order(parts.data(), units, in_order.data(), env.ctx);
  const double a = host_double(in_turn), b = host_double(in_order);
  EXPECT_GT(a, 0.0);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0) << a << " vs " << b;
  // And against a host loop in the same order, on parts whose sums round.
  std::vector<double> host_parts(1000);
  for (size_t i = 0; i < host_parts.size(); ++i) host_parts[i] = 1.0 / static_cast<double>(i + 3) * (i % 2 ? 1e10 : 1);
  DeviceBuffer<double> d_parts(static_cast<int64_t>(host_parts.size()));
  ST_CUDA_CHECK(cudaMemcpy(d_parts.data(), host_parts.data(), d_parts.bytes(), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
  double want = 0;
  for (double x : host_parts) want += x;
  gpu::sum_in_order(d_parts.data(), static_cast<int64_t>(host_parts.size()), in_order.data(), env.ctx);
  const double got = host_double(in_order);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof(got)), 0) << got << " vs " << want;
}

TYPED_TEST(ReduceGpuTest, SumRejectsTooLittleScratch) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  test::GpuEnv env(gpu::reduce_scratch_bytes() - 1);
  DeviceBuffer<T> x = to_device<T>(std::vector<float>(10, 1.0f));
  DeviceBuffer<double> out = device_double(0);
  EXPECT_THROW(gpu::sum_of_squares<T>(x.data(), 10, out.data(), env.ctx), Error);
}

// convert and accumulate do one fp32 operation and one rounding, as the host does: exact.
TYPED_TEST(ReduceGpuTest, ConvertRoundsToNearestEven) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> in = test::random_input<float>(s.n, 1);
    test::GpuEnv env;
    DeviceBuffer<float> d_in = test::upload<float>(in, s.offset);
    DeviceBuffer<T> out(s.offset + s.n);
    test::poison(out);
    gpu::convert<T>(out.data() + s.offset, d_in.data() + s.offset, s.n, env.ctx);
    EXPECT_TRUE(test::all_close(test::download(out, s.offset), test::round_through<T>(in), 0.0, 0.0));
  }
}

TYPED_TEST(ReduceGpuTest, AccumulateAdds) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    std::vector<float> acc = test::random_input<float>(s.n, 1);
    const std::vector<float> in = test::random_input<T>(s.n, 2);
    test::GpuEnv env;
    DeviceBuffer<float> d_acc = test::upload<float>(acc, s.offset);
    DeviceBuffer<T> d_in = test::upload<T>(in, s.offset);
    gpu::accumulate<T>(d_acc.data() + s.offset, d_in.data() + s.offset, s.n, env.ctx);
    for (int64_t i = 0; i < s.n; ++i) acc[i] += in[i];
    EXPECT_TRUE(test::all_close(test::download(d_acc, s.offset), acc, 0.0, 0.0));
  }
}

// The first micro-step's reduce-scatter writes the shard's gradient instead of adding to a zeroed one.
TYPED_TEST(ReduceGpuTest, AccumulateOverwriteWrites) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> in = test::random_input<T>(s.n, 2);
    test::GpuEnv env;
    DeviceBuffer<float> d_acc(s.offset + s.n + 1);
    test::poison(d_acc);
    DeviceBuffer<T> d_in = test::upload<T>(in, s.offset);
    gpu::accumulate<T>(d_acc.data() + s.offset, d_in.data() + s.offset, s.n, env.ctx, GradWrite::kOverwrite);
    std::vector<float> got = test::to_host(d_acc);
    EXPECT_TRUE(std::isnan(got.back())) << "wrote past n";
    got.pop_back();
    EXPECT_TRUE(test::all_close(std::vector<float>(got.begin() + s.offset, got.end()), in, 0.0, 0.0));
  }
}

// The owner's sum of the slices an all-to-all brought it, against st::accumulate_parts with the sum rounded to T:
// one, two and three parts, strides that keep the packed path and one that does not (odd), both write modes. Bit
// for bit: the same fp32 additions in the same order, one rounding.
TYPED_TEST(ReduceGpuTest, AccumulatePartsMatchesHost) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (int nparts : {1, 2, 3}) {
      for (int64_t stride : {s.n, (s.n + 7) / 4 * 4, s.n + 5}) {
        for (GradWrite write : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
          SCOPED_TRACE(::testing::Message()
                       << "n=" << s.n << " offset=" << s.offset << " parts=" << nparts << " stride=" << stride
                       << " overwrite=" << (write == GradWrite::kOverwrite));
          std::vector<float> acc = test::random_input<float>(s.n, 1);
          const std::vector<float> parts = test::random_input<T>(nparts * stride, 2);
          test::GpuEnv env;
          DeviceBuffer<float> d_acc = test::upload<float>(acc, s.offset);
          DeviceBuffer<T> d_parts = test::upload<T>(parts, s.offset);
          gpu::accumulate_parts<T>(d_acc.data() + s.offset, d_parts.data() + s.offset, nparts, stride, s.n, env.ctx,
                                   write);
          // The host reference's sum, rounded to T as the reduce-scatter it replaces would, then added.
          std::vector<float> sum(s.n);
          accumulate_parts(sum.data(), parts.data(), nparts, stride, s.n, GradWrite::kOverwrite);
          sum = test::round_through<T>(sum);
          for (int64_t i = 0; i < s.n; ++i) acc[i] = write == GradWrite::kOverwrite ? sum[i] : acc[i] + sum[i];
          EXPECT_TRUE(test::all_close(test::download(d_acc, s.offset), acc, 0.0, 0.0));
        }
      }
    }
  }
}

// With sum_sq, the accumulations also take the sum of squares of what they store, in the same pass: the stored values
// and the sum are bit for bit those of the accumulation without it followed by sum_of_squares<float>. Both write
// modes, one and two parts, and acc and the input aligned alike (the one pass) or not (acc aligned, the input not:
// two passes, as sum_of_squares alone would take acc's packs).
TYPED_TEST(ReduceGpuTest, AccumulateTakesTheSumOfSquaresOfWhatItStores) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  struct Offsets {
    int acc, in;
  };
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    for (const Offsets o : {Offsets{0, 0}, Offsets{1, 1}, Offsets{0, 1}}) {
      for (int nparts : {0, 1, 2}) {  // 0: accumulate, else accumulate_parts
        for (GradWrite write : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " offsets " << o.acc << "/" << o.in << " parts=" << nparts
                                            << " overwrite=" << (write == GradWrite::kOverwrite));
          const std::vector<float> acc = test::random_input<float>(n, 1);
          const int64_t stride = n + 4;
          const std::vector<float> in = test::random_input<T>(std::max(nparts, 1) * stride, 2);
          test::GpuEnv env(gpu::reduce_scratch_bytes());
          DeviceBuffer<T> d_in = test::upload<T>(in, o.in);
          std::vector<float> stored[2];
          double sums[2];
          for (int fused = 0; fused < 2; ++fused) {
            DeviceBuffer<float> d_acc = test::upload<float>(acc, o.acc);
            DeviceBuffer<double> sum = device_double(kStart);
            float* a = d_acc.data() + o.acc;
            double* sq = fused ? sum.data() : nullptr;
            if (nparts == 0)
              gpu::accumulate<T>(a, d_in.data() + o.in, n, env.ctx, write, sq);
            else
              gpu::accumulate_parts<T>(a, d_in.data() + o.in, nparts, stride, n, env.ctx, write, sq);
            if (!fused) gpu::sum_of_squares<float>(a, n, sum.data(), env.ctx);
            stored[fused] = test::download(d_acc, o.acc);
            sums[fused] = host_double(sum);
          }
          EXPECT_TRUE(test::all_close(stored[1], stored[0], 0.0, 0.0));
          EXPECT_EQ(std::memcmp(&sums[1], &sums[0], sizeof(double)), 0) << sums[1] << " vs " << sums[0];
          double want = kStart;
          for (float v : stored[0]) want += static_cast<double>(v) * v;
          EXPECT_NEAR(sums[1], want, kTol<float> * want);
        }
      }
    }
  }
}

TYPED_TEST(ReduceGpuTest, AccumulateSumOfSquaresNeedsScratch) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  test::GpuEnv env;  // no scratch
  DeviceBuffer<float> acc(64);
  DeviceBuffer<T> in(64);
  DeviceBuffer<double> sum(1);
  EXPECT_THROW(gpu::accumulate<T>(acc.data(), in.data(), 64, env.ctx, GradWrite::kOverwrite, sum.data()), Error);
  EXPECT_THROW(gpu::accumulate_parts<T>(acc.data(), in.data(), 1, 64, 64, env.ctx, GradWrite::kOverwrite, sum.data()),
               Error);
}

TYPED_TEST(ReduceGpuTest, AccumulatePartsRejectsOverlappingParts) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  test::GpuEnv env;
  DeviceBuffer<float> acc(8);
  DeviceBuffer<T> parts(16);
  EXPECT_THROW(gpu::accumulate_parts<T>(acc.data(), parts.data(), 2, 4, 8, env.ctx), Error);
  EXPECT_THROW(gpu::accumulate_parts<T>(acc.data(), parts.data(), 0, 8, 8, env.ctx), Error);
}

}  // namespace
}  // namespace st
