// Large tensor buffers: mapped directly and kept for reuse after release.
//
// A run on large feature maps (a 1024x1024 segmentation network) allocates and frees buffers of
// tens to hundreds of MB: kernel temporaries, layout conversions, values handed to the caller.
// glibc maps each one afresh (its mmap threshold stops growing at 32 MB) and unmaps it on free, so
// every run faults every page in again: 70 million minor faults and 223 of 528 s in the kernel for
// a PTQ analysis of a 119-convolution U-Net at 1024x1024 (one image; AMD EPYC VM, ~3 us a fault).
// Here a buffer of kMinCachedBytes or more is its own mapping, zero-filled by the kernel (no
// memset of fresh pages), with transparent huge pages advised (one fault per 2 MiB where the
// system allows them), and on release it goes into a bounded cache that later requests of about
// the same size take (zeroed again) before mapping new memory. The cache holds at most SLIMQUANT_BUFFER_CACHE_MB (default: 1/8 of physical memory,
// at most 2048 MB; 0 turns all of this off: the plain allocator, as before, serves every size);
// release_cached_buffers() gives it all back.
// Measured without the huge-page advice: that analysis took 570 s, no better than before (the
// sizes vary, so misses map fresh memory); with it 388 s. A FP32 run at 1024x1024 spends more
// time in the kernel with it (5.4-6.4 s against 3.2-3.5 s, compaction) at the same wall time.
// Under AddressSanitizer the plain allocator serves everything, so overflows stay detected.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <string>

#include "slimquant/core/error.h"
#include "slimquant/core/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

// Defined by the AddressSanitizer runtime when it is linked in (the sanitized test binaries, whose
// instrumented kernels are checked against the plain allocator's red zones).
extern "C" void __asan_init() __attribute__((weak));

namespace slimquant {

namespace {

constexpr size_t kAlign = 64;

std::shared_ptr<std::byte[]> plain_allocation(size_t bytes) {
  const size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) fail(ErrorKind::kInternal, "out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

constexpr size_t kMinCachedBytes = size_t{1} << 20;  // below this glibc keeps freed memory itself
constexpr size_t kMappingGranule = size_t{64} << 10;
constexpr size_t kHugePage = size_t{2} << 20;

size_t cache_limit_from_environment() {
  // A value that is not a count of megabytes is refused, as SLIMQUANT_MAX_TENSOR_BYTES is.
  if (const char* v = std::getenv("SLIMQUANT_BUFFER_CACHE_MB"); v && *v) {
    const std::string value(v);
    unsigned long long mb = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mb);
    if (ec != std::errc() || end != value.data() + value.size() || mb > (~0ull >> 20))
      fail(ErrorKind::kInvalidArgument,
           "SLIMQUANT_BUFFER_CACHE_MB='" + value + "' is not a number of megabytes (such as 512, or 0 for none)");
    return static_cast<size_t>(mb) << 20;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t physical = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  return std::min<size_t>(physical / 8, size_t{2048} << 20);
}

class LargeBufferCache {
 public:
  struct Block {
    std::byte* data = nullptr;
    size_t size = 0;
  };

  std::shared_ptr<std::byte[]> allocate(size_t bytes) {
    Block block = take(bytes);
    if (block.data) {
      std::memset(block.data, 0, bytes);
    } else {
      block.size = (bytes + kMappingGranule - 1) / kMappingGranule * kMappingGranule;
      unmap_oldest(block.size);
      block.data = map(block.size);
    }
    return std::shared_ptr<std::byte[]>(block.data, [this, block](std::byte*) { give_back(block); });
  }

  bool enabled() const { return limit_ > 0 && &__asan_init == nullptr; }

  void release_all() {
    std::list<Block> all;
    {
      std::lock_guard lock(mutex_);
      all.swap(free_);
      cached_ = 0;
    }
    for (const Block& b : all) munmap(b.data, b.size);
  }

  size_t cached_bytes() {
    std::lock_guard lock(mutex_);
    return cached_;
  }

 private:
  // The smallest cached block that holds `bytes` without wasting more than a quarter of it (kept
  // whole, so that its deleter gives back the whole mapping).
  Block take(size_t bytes) {
    std::lock_guard lock(mutex_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->size >= bytes && it->size - bytes <= bytes / 4 && (best == free_.end() || it->size < best->size)) best = it;
    if (best == free_.end()) return {};
    const Block block = *best;
    free_.erase(best);
    cached_ -= block.size;
    return block;
  }

  static std::byte* map(size_t size) {
    // Over-map by one huge page to start on a huge-page boundary (transparent huge pages need it).
    const size_t span = size + kHugePage;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) fail(ErrorKind::kInternal, "out of memory allocating " + std::to_string(size) + " bytes");
    const auto start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + span, used_end = aligned + size;
    if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
    auto* p = reinterpret_cast<std::byte*>(aligned);
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);  // advice only: ignored where huge pages are off
#endif
    return p;
  }

  // A miss: cached blocks of other sizes make room first, so the memory mapped (in use plus
  // cached) grows only when the cache has no room to give: peak memory stays what it was without
  // the cache (measured: 4.84 GB for a quantize at 1024x1024 that peaked at 5.93 GB without this).
  void unmap_oldest(size_t bytes) {
    std::list<Block> evicted;
    {
      std::lock_guard lock(mutex_);
      size_t freed = 0;
      while (freed < bytes && !free_.empty()) {
        freed += free_.front().size;
        cached_ -= free_.front().size;
        evicted.splice(evicted.end(), free_, free_.begin());
      }
    }
    for (const Block& b : evicted) munmap(b.data, b.size);
  }

  void give_back(const Block& block) {
    if (block.size <= limit_) {
      std::lock_guard lock(mutex_);
      while (cached_ + block.size > limit_ && !free_.empty()) {  // the oldest go first
        munmap(free_.front().data, free_.front().size);
        cached_ -= free_.front().size;
        free_.pop_front();
      }
      free_.push_back(block);
      cached_ += block.size;
      return;
    }
    munmap(block.data, block.size);
  }

  const size_t limit_ = cache_limit_from_environment();
  std::mutex mutex_;
  std::list<Block> free_;  // oldest first
  size_t cached_ = 0;
};

// Never destroyed: tensors released during static destruction still find it.
LargeBufferCache& cache() {
  static auto* instance = new LargeBufferCache();
  return *instance;
}

}  // namespace

std::shared_ptr<std::byte[]> allocate_storage(size_t bytes) {
  if (bytes > max_tensor_bytes())
    fail(ErrorKind::kInvalidArgument, "refusing to allocate " + std::to_string(bytes) + " bytes, more than the limit of " +
                                          std::to_string(max_tensor_bytes()) + " bytes for one buffer (SLIMQUANT_MAX_TENSOR_BYTES)");
  if (bytes >= kMinCachedBytes && cache().enabled()) return cache().allocate(bytes);
  return plain_allocation(bytes);
}

bool large_buffers_reused() { return cache().enabled(); }

size_t cached_buffer_bytes() { return cache().cached_bytes(); }

void release_cached_buffers() { cache().release_all(); }

}  // namespace slimquant
