// Transpose, DepthToSpace, SpaceToDepth: all permutations of a (reshaped) view, moved by
// transpose_bytes (dims merged, tiled 2-D copies for NCHW<->NHWC and matrix transposes).
#include <algorithm>
#include <numeric>

#include "runtime/kernels/shape_common.h"

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
    const Tensor& x = ctx.input(0);
    check_rank4(x, ctx.node());
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3), b = a_.blocksize;
    if (c % (b * b) != 0)
      fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": channels " + std::to_string(c) +
                                            " not divisible by blocksize^2 = " + std::to_string(b * b));
    const int64_t oc = c / (b * b);
    Tensor& y = ctx.allocate_output(0, x.dtype(), {n, oc, h * b, w * b});
    if (a_.crd)  // [n, oc, b, b, h, w] -> [n, oc, h, b, w, b]
      transpose_bytes(y.raw(), x.raw(), {n, oc, b, b, h, w}, {0, 1, 4, 2, 5, 3}, dtype_size(x.dtype()));
    else  // [n, b, b, oc, h, w] -> [n, oc, h, b, w, b]
      transpose_bytes(y.raw(), x.raw(), {n, b, b, oc, h, w}, {0, 3, 4, 1, 5, 2}, dtype_size(x.dtype()));
  }

 private:
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
