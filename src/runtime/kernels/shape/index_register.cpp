// Index and selection kernels (select_topk_nonzero.cpp, scatter_gather_nd.cpp,
// reverse_sequence_eye_like.cpp): one line per op, plus the helpers they share.
#include "runtime/kernels/shape/index_common.h"
#include "runtime/kernels/register_all.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime {

void register_index_kernels(KernelRegistry& r) {
  using namespace indexing;
  r.add("TopK", make_top_k);
  r.add("NonZero", make_non_zero);
  r.add("Compress", make_compress);
  r.add("GatherND", make_gather_nd);
  r.add("ScatterND", make_scatter_nd);
  r.add("ScatterElements", make_scatter_elements);
  r.add("Scatter", make_scatter_elements);  // opset 9-10 name of ScatterElements (no reduction)
  r.add("ReverseSequence", make_reverse_sequence);
  r.add("EyeLike", make_eye_like);
}

namespace indexing {

std::vector<int64_t> read_indices(const Tensor& t, const ir::Node& node, const std::string& what) {
  if (t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32)
    fail(ErrorKind::kInvalidModel,
         node.describe() + ": " + what + " must be int32 or int64, got " + dtype_name(t.dtype()));
  return t.to_int64_vector();
}

void fail_index_out_of_range(int64_t index, int64_t dim, const ir::Node& node, const char* what) {
  fail(ErrorKind::kInvalidArgument, node.describe() + ": " + what + " " + std::to_string(index) +
                                        " out of range for an axis of size " + std::to_string(dim));
}

void gather_blocks(void* dst, const void* src, std::span<const int64_t> src_blocks, size_t block_bytes) {
  const int64_t n = static_cast<int64_t>(src_blocks.size());
  if (block_bytes == 0 || n == 0) return;
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  shape::dispatch_elem_size(block_bytes, [&](auto sz) {
    constexpr size_t N = decltype(sz)::value;
    shape::parallel_chunks(n, n * static_cast<int64_t>(block_bytes) * 2, [&](int64_t u0, int64_t u1) {
      // Locals, not captures: byte stores may alias anything whose address escaped.
      const int64_t bs = static_cast<int64_t>(block_bytes);
      const size_t size = block_bytes;
      const int64_t* sb = src_blocks.data();
      const std::byte* from = in;
      std::byte* to = out;
      for (int64_t u = u0; u < u1; ++u) shape::copy_elem<N>(to + u * bs, from + sb[u] * bs, size);
    });
  });
}

}  // namespace indexing
}  // namespace slimquant::runtime
