// CudaBuffer's ownership (core/cuda.h): an owning buffer frees what it allocated exactly once, through moves; a
// borrowed one never frees. Counting allocator functions stand in for cudaMalloc/cudaFree: no device needed.
#include <gtest/gtest.h>

#include <utility>

#include "shardtrain/core/cuda.h"

namespace st {
namespace {

float g_storage[16];
int g_allocs = 0, g_frees = 0;
void* g_last_freed = nullptr;

cudaError_t counting_alloc(void** p, size_t) {
  ++g_allocs;
  *p = g_storage;
  return cudaSuccess;
}
cudaError_t counting_free(void* p) {
  ++g_frees;
  g_last_freed = p;
  return cudaSuccess;
}
using CountingBuffer = CudaBuffer<float, counting_alloc, counting_free>;

class CudaBufferTest : public ::testing::Test {
 protected:
  void SetUp() override { g_allocs = g_frees = 0, g_last_freed = nullptr; }
};

TEST_F(CudaBufferTest, OwnedIsFreedOnceThroughMoves) {
  {
    CountingBuffer a(16);
    CountingBuffer b(std::move(a));
    CountingBuffer c;
    c = std::move(b);
    EXPECT_EQ(c.data(), g_storage);
    EXPECT_EQ(c.size(), 16);
    EXPECT_EQ(g_frees, 0);
  }
  EXPECT_EQ(g_allocs, 1);
  EXPECT_EQ(g_frees, 1);
  EXPECT_EQ(g_last_freed, g_storage);
}

TEST_F(CudaBufferTest, BorrowedIsNeverFreed) {
  float other[4] = {};
  {
    CountingBuffer b = CountingBuffer::borrow(other, 4);
    EXPECT_EQ(b.data(), other);
    EXPECT_EQ(b.bytes(), 4 * sizeof(float));
    CountingBuffer moved(std::move(b));
    CountingBuffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.data(), other);
  }
  EXPECT_EQ(g_allocs, 0);
  EXPECT_EQ(g_frees, 0);
}

// An owning buffer assigned over a borrowed one: the owned memory is freed once, the borrowed never.
TEST_F(CudaBufferTest, AssigningSwapsOwnership) {
  float other[4] = {};
  {
    CountingBuffer b = CountingBuffer::borrow(other, 4);
    b = CountingBuffer(16);  // the temporary leaves with the borrowed view and frees nothing
    EXPECT_EQ(g_frees, 0);
    EXPECT_EQ(b.data(), g_storage);
  }
  EXPECT_EQ(g_allocs, 1);
  EXPECT_EQ(g_frees, 1);
  EXPECT_EQ(g_last_freed, g_storage);
}

}  // namespace
}  // namespace st
