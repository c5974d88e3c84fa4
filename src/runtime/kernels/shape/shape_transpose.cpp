// Transpose, DepthToSpace, SpaceToDepth: all permutations of a (reshaped) view, moved by
// transpose_bytes (dims merged, tiled 2-D copies for NCHW<->NHWC and matrix transposes).
#include <algorithm>
#include <numeric>

#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

class TransposeKernel : public Kernel {
 public:
  explicit TransposeKernel(const KernelInit& init) {
    if (init.node.has_attr("perm")) perm_ = init.node.attr_ints("perm");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const size_t r = x.rank();
    std::vector<int64_t> perm = perm_;
    if (perm.empty()) {  // default: reverse the dims
      perm.resize(r);
      std::iota(perm.rbegin(), perm.rend(), int64_t{0});
    }
    check_perm(perm, r, ctx.node());
    Shape out_shape(r);
    for (size_t d = 0; d < r; ++d) out_shape[d] = x.dim(static_cast<size_t>(perm[d]));
    // The identity permutation is a view.
    bool identity = true;
    for (size_t d = 0; d < r; ++d) identity = identity && perm[d] == static_cast<int64_t>(d);
    if (identity) {
      ctx.set_output(0, x);
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    transpose_bytes(y.raw(), x.raw(), x.shape(), perm, dtype_size(x.dtype()));
  }

 private:
  static void check_perm(std::vector<int64_t>& perm, size_t r, const ir::Node& node) {
    std::vector<bool> seen(r, false);
    bool ok = perm.size() == r;
    for (size_t d = 0; ok && d < r; ++d) {
      if (perm[d] < 0) perm[d] += static_cast<int64_t>(r);
      ok = perm[d] >= 0 && perm[d] < static_cast<int64_t>(r) && !seen[static_cast<size_t>(perm[d])];
      if (ok) seen[static_cast<size_t>(perm[d])] = true;
    }
    if (!ok) {
      std::string p;
      for (int64_t v : perm) {
        if (!p.empty()) p += ',';
        p += std::to_string(v);
      }
      fail(ErrorKind::kInvalidModel,
           node.describe() + ": perm [" + p + "] is not a permutation of " + std::to_string(r) + " axes");
    }
  }

  std::vector<int64_t> perm_;
};

// DepthToSpace / SpaceToDepth: 4-D NCHW rearrangements defined by the spec as
// reshape -> transpose -> reshape; the first reshape is free, the transpose is one strided copy.
struct BlockAttrs {
  int64_t blocksize;
  bool crd;  // DepthToSpace mode: CRD (channel, row, col) vs DCR (depth, row, col; default)
};

BlockAttrs parse_block_attrs(const KernelInit& init, bool has_mode) {
  const ir::Node& node = init.node;
  BlockAttrs a{node.attr_int("blocksize", 0), false};
  if (a.blocksize <= 0)
    fail(ErrorKind::kInvalidModel, node.describe() + ": blocksize must be a positive integer, got " +
                                       std::to_string(a.blocksize));
  if (has_mode && init.opset >= 11) {
    const std::string mode = node.attr_string("mode", "DCR");
    if (mode != "DCR" && mode != "CRD")
      fail(ErrorKind::kInvalidModel, node.describe() + ": mode '" + mode + "' is neither DCR nor CRD");
    a.crd = mode == "CRD";
  }
  return a;
}

void check_rank4(const Tensor& x, const ir::Node& node) {
  if (x.rank() != 4)
    fail(ErrorKind::kInvalidArgument, node.describe() + ": input must be 4-D NCHW, got " + shape_str(x.shape()));
}

class DepthToSpaceKernel : public Kernel {
 public:
  explicit DepthToSpaceKernel(const KernelInit& init) : a_(parse_block_attrs(init, true)) {}

  void run(KernelContext& ctx) override {
    Tensor x = ctx.input(0);
    check_rank4(x, ctx.node());
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = a_.blocksize;
    if (c % (b * b) != 0)
      fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": channels " + std::to_string(c) +
                                            " not divisible by blocksize^2 = " + std::to_string(b * b));
    const int64_t oc = c / (b * b);
    const Shape out_shape{n, oc, h * b, w * b};
    if (ctx.input_layout(0)) {
      if (run_blocked(ctx, x, out_shape)) return;
      x = channel_blocked::plain_input(ctx, 0);
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (a_.crd)  // [n, oc, b, b, h, w] -> [n, oc, h, b, w, b]
      transpose_bytes(y.raw(), x.raw(), {n, oc, b, b, h, w}, {0, 1, 4, 2, 5, 3}, dtype_size(x.dtype()));
    else  // [n, b, b, oc, h, w] -> [n, oc, h, b, w, b]
      transpose_bytes(y.raw(), x.raw(), {n, b, b, oc, h, w}, {0, 3, 4, 1, 5, 2}, dtype_size(x.dtype()));
  }

 private:
  // A channel-blocked x (kernels/elementwise/channel_blocked.h: what the convolutions write; a lowered
  // kernel-sized ConvTranspose's 1x1 QConv feeds this op) in DCR mode, where input channel
  // (i*b + j)*oc + m is output channel m at offset (i, j). y keeps x's blocking for the next
  // convolution; with one output channel, channels-last y is plain y whatever its readers take.
  bool run_blocked(KernelContext& ctx, const Tensor& x, const Shape& out_shape) const {
    const std::optional<channel_blocked::Blocking> blocking = channel_blocked::blocking_of(*ctx.input_layout(0));
    if (a_.crd || !blocking) return false;
    const int64_t oc = out_shape[1];
    if (!blocking->channels_last && oc % blocking->block != 0) return false;  // blocks would straddle offsets
    const bool plain_too = blocking->channels_last && oc == 1;
    LayoutPtr out_layout = channel_blocked::blocked_layout(*blocking, out_shape, x.dtype());
    if (!plain_too && (!out_layout || !ctx.output_layout_allowed(0))) return false;
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (blocking->channels_last) copy_channels_last(x, y);
    else copy_channel_blocks(x, y, *blocking);
    if (out_layout && ctx.output_layout_allowed(0)) ctx.set_output_layout(0, std::move(out_layout));
    return true;
  }

  // Channels-last: input pixel (h, w) holds channels (i, j, m), so its b*oc channels of kernel row
  // i are output row h*b+i's pixels w*b .. w*b+b-1, contiguous in y: one copy per (pixel, i).
  void copy_channels_last(const Tensor& x, Tensor& y) const {
    const int64_t c = x.dim(1), b = a_.blocksize;
    const int64_t run = c / b * static_cast<int64_t>(dtype_size(x.dtype()));  // bytes of b*oc channels
    // Short runs (DBNet's head: one float32 channel, b = 2, 8 bytes) as fixed-size copies the
    // compiler turns into moves; a memcpy call per 8 bytes took 0.75 ms at 1x4x320x320.
    switch (run) {
      case 4: return copy_runs<4>(x, y);
      case 8: return copy_runs<8>(x, y);
      case 16: return copy_runs<16>(x, y);
      default: return copy_runs<0>(x, y);
    }
  }

  // copy_channels_last with runs of Run bytes (0: the run length known at run time only).
  template <int64_t Run>
  void copy_runs(const Tensor& x, Tensor& y) const {
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = a_.blocksize;
    const int64_t run = Run ? Run : c / b * static_cast<int64_t>(dtype_size(x.dtype()));
    const auto* src = static_cast<const unsigned char*>(x.raw());
    auto* dst = static_cast<unsigned char*>(y.raw());
    for (int64_t p = 0; p < n * h; ++p)  // input rows
      for (int64_t i = 0; i < b; ++i) {
        unsigned char* out_row = dst + (p * b + i) * w * run;
        const unsigned char* in_row = src + (p * w * b + i) * run;
        for (int64_t q = 0; q < w; ++q)
          std::memcpy(out_row + q * run, in_row + q * b * run, static_cast<size_t>(Run ? Run : run));
      }
  }

  // B channels per block, oc % B == 0: output block mb at offset (i, j) is input block
  // (i*b + j)*oc/B + mb; one copy of B lanes per input pixel.
  void copy_channel_blocks(const Tensor& x, Tensor& y, const channel_blocked::Blocking& blocking) const {
    const channel_blocked::View in(x.shape(), blocking), out(y.shape(), blocking);
    const int64_t b = a_.blocksize, out_blocks = out.blocks();
    const size_t esize = dtype_size(x.dtype()), lanes = static_cast<size_t>(in.block) * esize;
    const auto* src = static_cast<const unsigned char*>(x.raw());
    auto* dst = static_cast<unsigned char*>(y.raw());
    for (int64_t n = 0; n < in.n; ++n)
      for (int64_t k = 0; k < b * b; ++k)
        for (int64_t mb = 0; mb < out_blocks; ++mb) {
          const unsigned char* from = src + static_cast<size_t>(in.plane(n, k * out_blocks + mb)) * esize;
          unsigned char* to = dst + static_cast<size_t>(out.plane(n, mb) + ((k / b) * out.width + k % b) * out.block) * esize;
          for (int64_t h = 0; h < in.height; ++h)
            for (int64_t w = 0; w < in.width; ++w)
              std::memcpy(to + static_cast<size_t>((h * b * out.width + w * b) * out.block) * esize,
                          from + static_cast<size_t>((h * in.width + w) * in.block) * esize, lanes);
        }
  }

  BlockAttrs a_;
};

class SpaceToDepthKernel : public Kernel {
 public:
  explicit SpaceToDepthKernel(const KernelInit& init) : a_(parse_block_attrs(init, false)) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    check_rank4(x, ctx.node());
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = a_.blocksize;
    if (h % b != 0 || w % b != 0)
      fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": spatial size " + std::to_string(h) + "x" +
                                            std::to_string(w) + " not divisible by blocksize " + std::to_string(b));
    Tensor& y = ctx.allocate_output(0, x.dtype(), {n, c * b * b, h / b, w / b});
    // [n, c, h/b, b, w/b, b] -> [n, b, b, c, h/b, w/b]
    transpose_bytes(y.raw(), x.raw(), {n, c, h / b, b, w / b, b}, {0, 3, 5, 1, 2, 4}, dtype_size(x.dtype()));
  }

 private:
  BlockAttrs a_;
};

}  // namespace

std::unique_ptr<Kernel> make_transpose(const KernelInit& init) { return std::make_unique<TransposeKernel>(init); }
std::unique_ptr<Kernel> make_depth_to_space(const KernelInit& init) {
  return std::make_unique<DepthToSpaceKernel>(init);
}
std::unique_ptr<Kernel> make_space_to_depth(const KernelInit& init) {
  return std::make_unique<SpaceToDepthKernel>(init);
}

}  // namespace slimquant::runtime::shape
