#pragma once
// Private helpers shared by the shape and data-movement kernels (kernels/shape/).
//
// These ops never look at values, only at bytes: they are written once per element *size*
// (1, 2, 4, 8, 16 bytes, or any size through memcpy), never per dtype.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::shape {

// --- byte movers --------------------------------------------------------------------------------

// Calls f(std::integral_constant<size_t, N>) with N = elem_size for the sizes a single load/store
// moves (1, 2, 4, 8, 16), or N = 0 meaning "runtime size, use memcpy".
template <typename F>
decltype(auto) dispatch_elem_size(size_t elem_size, F&& f) {
  switch (elem_size) {
    case 1: return f(std::integral_constant<size_t, 1>{});
    case 2: return f(std::integral_constant<size_t, 2>{});
    case 4: return f(std::integral_constant<size_t, 4>{});
    case 8: return f(std::integral_constant<size_t, 8>{});
    case 16: return f(std::integral_constant<size_t, 16>{});
    default: return f(std::integral_constant<size_t, 0>{});
  }
}

// Copies one element of N bytes (N > 0: a fixed-size memcpy the compiler turns into one move).
template <size_t N>
inline void copy_elem(std::byte* dst, const std::byte* src, [[maybe_unused]] size_t runtime_size) {
  if constexpr (N == 0) std::memcpy(dst, src, runtime_size);
  else std::memcpy(dst, src, N);
}

// Bytes moved per thread below which work stays on the calling thread (waking a team costs more
// than copying a few hundred KB).
constexpr int64_t kParallelBytes = 256 << 10;

// Calls fn(begin, end) over disjoint chunks of [0, n); in parallel when `bytes` (the memory the
// whole range moves) is large. Stays serial inside an enclosing parallel region.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t bytes, Fn&& fn) {
  int64_t nt = std::min<int64_t>(omp_get_max_threads(), n);
  nt = std::min<int64_t>(nt, bytes / kParallelBytes);
  if (nt <= 1 || omp_in_parallel()) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t b = n * t / T, e = n * (t + 1) / T;
    if (b < e) fn(b, e);
  }
}

// Writes `count` copies of the elem_size-byte pattern at `value` to dst.
void fill_elems(void* dst, const void* value, size_t elem_size, int64_t count);

// Copies `count` blocks of `block` bytes, block i from src + i * src_stride to dst + i * dst_stride
// (byte strides): the row copies of Concat/Split. Large copies are split across threads, by blocks
// or, when blocks are few and big, by pieces of blocks.
void copy_blocks(void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t count, size_t block);

// dst (contiguous, row-major with `shape`) = the strided view of src where the element at
// multi-index i is src + sum_d i[d] * src_strides[d] elements (strides may be 0 or negative).
// Size-1 dims are dropped and dims that are contiguous in src are merged first, so a view that is
// contiguous in its last k dims moves whole runs with memcpy; when the innermost output dim is
// strided but another dim is contiguous in src (transposes), it copies in cache-sized 2-D tiles.
// This one routine carries Transpose, Slice, Expand, Tile, DepthToSpace and SpaceToDepth.
void strided_copy(void* dst, const void* src, const Shape& shape, const std::vector<int64_t>& src_strides,
                  size_t elem_size);

// dst = src transposed: dst.shape[d] = in_shape[perm[d]].
void transpose_bytes(void* dst, const void* src, const Shape& in_shape, const std::vector<int64_t>& perm,
                     size_t elem_size);

// --- argument reading ---------------------------------------------------------------------------

// Output i is present and named (optional outputs may be absent or "").
bool output_requested(const KernelContext& ctx, size_t i);

// Values of an integer tensor (int8..uint64); throws kInvalidModel naming the node and `what`
// for other dtypes.
std::vector<int64_t> read_ints(const Tensor& t, const ir::Node& node, const std::string& what);

// Number of elements the shape has, checking that every dim is >= 0.
int64_t checked_numel(const Shape& s, const ir::Node& node, const std::string& what);

// An integer list argument that, depending on the opset, is an attribute or an input. Constant
// inputs (initializers) are read once when the kernel is created, not on every run.
class IntListArg {
 public:
  IntListArg() = default;
  static IntListArg from_attr(const ir::Node& node, const std::string& attr);
  static IntListArg from_input(const KernelInit& init, size_t input, std::string what);

  // Whether the list was given (attribute set, or input connected).
  bool present(const KernelContext& ctx) const {
    return cached_.has_value() || (input_ >= 0 && ctx.has_input(static_cast<size_t>(input_)));
  }
  // The values; empty when absent.
  std::vector<int64_t> get(const KernelContext& ctx) const;

 private:
  std::optional<std::vector<int64_t>> cached_;
  int input_ = -1;
  std::string what_;
};

// Shape kernel factories, one per op; shape_register.cpp maps op types to them.
using Factory = std::unique_ptr<Kernel> (*)(const KernelInit&);
std::unique_ptr<Kernel> make_reshape(const KernelInit& init);
std::unique_ptr<Kernel> make_flatten(const KernelInit& init);
std::unique_ptr<Kernel> make_squeeze(const KernelInit& init);
std::unique_ptr<Kernel> make_unsqueeze(const KernelInit& init);
std::unique_ptr<Kernel> make_identity(const KernelInit& init);
std::unique_ptr<Kernel> make_dropout(const KernelInit& init);
std::unique_ptr<Kernel> make_shape(const KernelInit& init);
std::unique_ptr<Kernel> make_size(const KernelInit& init);
std::unique_ptr<Kernel> make_transpose(const KernelInit& init);
std::unique_ptr<Kernel> make_depth_to_space(const KernelInit& init);
std::unique_ptr<Kernel> make_space_to_depth(const KernelInit& init);
std::unique_ptr<Kernel> make_concat(const KernelInit& init);
std::unique_ptr<Kernel> make_split(const KernelInit& init);
std::unique_ptr<Kernel> make_slice(const KernelInit& init);
std::unique_ptr<Kernel> make_gather(const KernelInit& init);
std::unique_ptr<Kernel> make_gather_elements(const KernelInit& init);
std::unique_ptr<Kernel> make_pad(const KernelInit& init);
std::unique_ptr<Kernel> make_expand(const KernelInit& init);
std::unique_ptr<Kernel> make_tile(const KernelInit& init);
std::unique_ptr<Kernel> make_trilu(const KernelInit& init);
std::unique_ptr<Kernel> make_resize(const KernelInit& init);
std::unique_ptr<Kernel> make_upsample(const KernelInit& init);
std::unique_ptr<Kernel> make_constant(const KernelInit& init);
std::unique_ptr<Kernel> make_constant_of_shape(const KernelInit& init);
std::unique_ptr<Kernel> make_range(const KernelInit& init);
std::unique_ptr<Kernel> make_one_hot(const KernelInit& init);

}  // namespace slimquant::runtime::shape
