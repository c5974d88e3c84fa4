#pragma once
// Private helpers shared by the index and selection kernels (TopK, NonZero, Compress, GatherND,
// ScatterND, ScatterElements, Scatter, ReverseSequence, EyeLike).
//
// The index-driven ops validate and wrap every index first (one pass, before any output byte is
// written), turning the index tensor into a list of element or block offsets; the copy or update
// loops that follow then run without checks. An index out of range is a kInvalidArgument naming the
// node, never an out-of-bounds access.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::indexing {

// Values of an index tensor (int32 or int64) widened to int64; kInvalidModel naming the node and
// `what` for other dtypes (the ONNX schemas allow only these two).
std::vector<int64_t> read_indices(const Tensor& t, const ir::Node& node, const std::string& what);

[[noreturn]] void fail_index_out_of_range(int64_t index, int64_t dim, const ir::Node& node, const char* what);

// Maps an index in [-dim, dim) to [0, dim) (negative ones count from the end).
inline int64_t wrap_index(int64_t index, int64_t dim, const ir::Node& node, const char* what) {
  if (index < -dim || index >= dim) [[unlikely]]
    fail_index_out_of_range(index, dim, node, what);
  return index < 0 ? index + dim : index;
}

// dst block u = src block src_blocks[u], blocks of `block_bytes` bytes: the copy behind Compress,
// GatherND and ReverseSequence (one load/store per block for element-sized blocks, memcpy for rows).
void gather_blocks(void* dst, const void* src, std::span<const int64_t> src_blocks, size_t block_bytes);

// Kernel factories, one per op; index_register.cpp maps op types to them.
std::unique_ptr<Kernel> make_top_k(const KernelInit& init);
std::unique_ptr<Kernel> make_non_zero(const KernelInit& init);
std::unique_ptr<Kernel> make_compress(const KernelInit& init);
std::unique_ptr<Kernel> make_gather_nd(const KernelInit& init);
std::unique_ptr<Kernel> make_scatter_nd(const KernelInit& init);
std::unique_ptr<Kernel> make_scatter_elements(const KernelInit& init);
std::unique_ptr<Kernel> make_reverse_sequence(const KernelInit& init);
std::unique_ptr<Kernel> make_eye_like(const KernelInit& init);

}  // namespace slimquant::runtime::indexing
