#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/elementwise/float16_storage.h"

#include <numeric>
#include <vector>

namespace slimquant::runtime::channel_blocked {

std::optional<Blocking> blocking_of(const Layout& layout) {
  const dnnl_memory_desc_t& d = layout.desc.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 4 || d.offset0 != 0) return std::nullopt;
  for (int i = 0; i < 4; ++i)
    if (d.padded_dims[i] != d.dims[i] || d.padded_offsets[i] != 0) return std::nullopt;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const int64_t c = d.dims[1], h = d.dims[2], w = d.dims[3];
  int64_t block = c;
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1 && b.inner_blks[0] > 0 && c % b.inner_blks[0] == 0)
    block = b.inner_blks[0];
  else if (b.inner_nblks != 0)
    return std::nullopt;
  // Outer strides (in elements) of the dense [N][C/B][H][W][B] order; channels-last (no inner
  // block) has C innermost, so its channel stride is 1.
  const bool inner = b.inner_nblks == 1;
  const int64_t want[4] = {c * h * w, inner ? h * w * block : 1, w * block, block};
  for (int i = 0; i < 4; ++i)
    if (d.dims[i] > 1 && b.strides[i] != want[i]) return std::nullopt;
  if (block == c) return Blocking{true, 0};
  return Blocking{false, block};
}

LayoutPtr blocked_layout(const Blocking& blocking, const Shape& shape, DType dtype) {
  using tag = dnnl::memory::format_tag;
  if (shape.size() != 4) return nullptr;
  const int64_t block = blocking.block_for(shape[1]);
  if (block <= 0 || shape[1] % block != 0) return nullptr;
  tag t = tag::acdb;
  if (block != shape[1]) {
    switch (block) {
      case 4: t = tag::aBcd4b; break;
      case 8: t = tag::aBcd8b; break;
      case 16: t = tag::aBcd16b; break;
      case 32: t = tag::aBcd32b; break;
      default: return nullptr;
    }
  }
  const dnnl::memory::dims dims(shape.begin(), shape.end());
  return std::make_shared<const Layout>(Layout{dnnl::memory::desc(dims, to_dnnl_type(dtype), t)});
}

namespace {
// The blocking every blocked input at `positions` shares (plain inputs aside), or nullopt.
template <class Positions>
std::optional<Blocking> shared_blocking(const KernelContext& ctx, const Positions& positions) {
  std::optional<Blocking> common;
  for (size_t i : positions) {
    const Layout* layout = ctx.has_input(i) ? ctx.input_layout(i) : nullptr;
    if (!layout) continue;
    const std::optional<Blocking> b = blocking_of(*layout);
    if (!b || (common && !(*common == *b))) return std::nullopt;
    common = b;
  }
  return common;
}
}  // namespace

std::optional<Blocking> common_blocking(const KernelContext& ctx, std::initializer_list<size_t> positions) {
  return shared_blocking(ctx, positions);
}

std::optional<Blocking> common_blocking(const KernelContext& ctx) {
  std::vector<size_t> every_input(ctx.num_inputs());
  std::iota(every_input.begin(), every_input.end(), size_t{0});
  return shared_blocking(ctx, every_input);
}

Tensor plain_input(const KernelContext& ctx, size_t i) {
  const Layout* layout = ctx.input_layout(i);
  if (ctx.input(i).dtype() == DType::kFloat16) {  // float16 storage: plain float32
    const Tensor wide = as_float32(ctx.input(i));
    return layout ? dnnl_kernels::to_plain(wide, *dnnl_kernels::retyped_layout(*layout, DType::kFloat32)) : wide;
  }
  return layout ? dnnl_kernels::to_plain(ctx.input(i), *layout) : ctx.input(i);
}

}  // namespace slimquant::runtime::channel_blocked
