// The buffer pool a session's plans allocate every intermediate value from.
#include "runtime/session_internal.h"

#include <algorithm>

namespace slimquant::runtime {

Tensor BufferPool::allocate(DType dtype, const Shape& shape) {
  const size_t bytes = checked_tensor_bytes(dtype, shape, "a value");
  Entry* best = nullptr;
  for (auto& e : entries_)
    if (e.storage.use_count() == 1 && e.capacity >= bytes && (!best || e.capacity < best->capacity)) best = &e;
  // Don't hand a huge buffer to a tiny tensor: it would pin memory a later large value needs.
  if (best && best->capacity > 4 * bytes + 4096) best = nullptr;
  if (!best) {
    entries_.push_back({allocate_storage(bytes), bytes});
    best = &entries_.back();
  }
  Tensor t(dtype, shape, best->storage, best->capacity);
  if (tracking_) {
    size_t live = 0;
    for (const auto& e : entries_) live += e.storage.use_count() > 1 ? e.capacity : 0;
    peak_ = std::max(peak_, live);
  }
  return t;
}

void BufferPool::release_idle() {
  std::erase_if(entries_, [](const Entry& e) { return e.storage.use_count() == 1; });
}

std::shared_ptr<BufferPool> make_shared_buffer_pool() { return std::make_shared<BufferPool>(); }

void release_idle_buffers(BufferPool& pool) { pool.release_idle(); }

}  // namespace slimquant::runtime
