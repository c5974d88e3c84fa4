// allocate_storage's large buffers (src/core/large_buffers.cpp): zeroed, aligned, and reused after
// release instead of mapped afresh.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "slimquant/core/tensor.h"

namespace slimquant {
namespace {

bool large_buffer_zeroed(const std::byte* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

TEST(LargeBuffers, AReleasedBufferIsReusedZeroedForARequestOfAboutItsSize) {
  // The sanitized binaries (and SLIMQUANT_BUFFER_CACHE_MB=0) allocate every size plainly.
  if (!large_buffers_reused()) GTEST_SKIP() << "large buffers are not reused in this process";
  release_cached_buffers();
  constexpr size_t kBytes = size_t{6} << 20;
  const std::byte* first_address = nullptr;
  {
    auto a = allocate_storage(kBytes);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(a.get()) % 64, 0u);
    EXPECT_TRUE(large_buffer_zeroed(a.get(), kBytes));
    std::memset(a.get(), 0xAB, kBytes);  // dirty every byte before it goes back
    first_address = a.get();
  }
  const size_t cached = cached_buffer_bytes();
  EXPECT_GE(cached, kBytes);
  // A slightly smaller request takes the released block, zeroed again.
  auto b = allocate_storage(kBytes - 4096);
  EXPECT_EQ(b.get(), first_address);
  EXPECT_TRUE(large_buffer_zeroed(b.get(), kBytes - 4096));
  EXPECT_EQ(cached_buffer_bytes(), cached - kBytes);  // taken out of the cache
  // A request far smaller than any cached block maps its own memory instead of pinning a big one,
  // and the cached block makes room for it first (mapped memory never grows past what it was).
  b.reset();
  EXPECT_EQ(cached_buffer_bytes(), cached);
  auto small = allocate_storage(size_t{1} << 20);
  EXPECT_TRUE(large_buffer_zeroed(small.get(), size_t{1} << 20));
  EXPECT_EQ(cached_buffer_bytes(), 0u);
  small.reset();
  EXPECT_EQ(cached_buffer_bytes(), size_t{1} << 20);
  release_cached_buffers();
  EXPECT_EQ(cached_buffer_bytes(), 0u);
}

TEST(LargeBuffers, SmallBuffersAreZeroedAndAligned) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096}, (size_t{1} << 20) - 1}) {
    auto p = allocate_storage(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << bytes;
    EXPECT_TRUE(large_buffer_zeroed(p.get(), bytes)) << bytes;
  }
}

TEST(LargeBuffers, TensorsOfLargeShapesAreZeroedWhateverMemoryTheyReuse) {
  const void* first = nullptr;
  {
    Tensor t(DType::kFloat32, {4, 512, 1024});  // 8 MiB
    t.data<float>()[t.numel() - 1] = 1.f;
    t.data<float>()[0] = 2.f;
    first = t.raw();
  }
  Tensor u(DType::kFloat32, {4, 512, 1024});
  EXPECT_EQ(u.data<float>()[0], 0.f);
  EXPECT_EQ(u.data<float>()[u.numel() - 1], 0.f);
  if (large_buffers_reused()) {
    EXPECT_EQ(u.raw(), first);
  }
  release_cached_buffers();
}

}  // namespace
}  // namespace slimquant
