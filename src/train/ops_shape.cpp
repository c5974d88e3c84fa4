// Backward of data-movement ops: views (Reshape/Flatten/Squeeze/Unsqueeze), Transpose, Concat,
// Split, Slice, Gather, Expand, Pad, Resize (nearest). Index/shape inputs get no gradient.
#include <cstring>
#include <numeric>

#include "train/op_base.h"
#include "train/tensor_ops.h"

namespace slimquant::train::detail {

namespace {

// Reshape, Flatten, Squeeze, Unsqueeze: the gradient is the output gradient viewed in x's shape.
class ViewOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (needed(0)) r[0] = gy[0].reshaped(in_[0].shape());
    return r;
  }
};

class TransposeOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const size_t rank = in_[0].rank();
    std::vector<int64_t> perm = node_.attr_ints("perm");
    if (perm.empty())
      for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(rank - 1 - i));
    std::vector<int64_t> inv(rank);
    for (size_t i = 0; i < rank; ++i) inv[perm[i]] = static_cast<int64_t>(i);
    r[0] = transpose(gy[0], inv);
    return r;
  }
};

// Copies slabs between a tensor and its pieces along `axis`: to_pieces splits whole into pieces
// (whose axis sizes must add up), otherwise concatenates pieces into whole.
void move_along_axis(Tensor& whole, std::vector<Tensor*>& pieces, int64_t axis, bool to_pieces) {
  const Shape& s = whole.shape();
  const int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t{1}, std::multiplies<>());
  const int64_t inner = std::accumulate(s.begin() + axis + 1, s.end(), int64_t{1}, std::multiplies<>());
  float* pw = whole.data<float>();
  int64_t offset = 0;  // along axis
  for (Tensor* p : pieces) {
    const int64_t len = p->dim(static_cast<size_t>(axis));
    float* pp = p->data<float>();
    for (int64_t o = 0; o < outer; ++o) {
      float* w = pw + (o * s[axis] + offset) * inner;
      float* q = pp + o * len * inner;
      const size_t bytes = static_cast<size_t>(len * inner) * sizeof(float);
      if (to_pieces) std::memcpy(q, w, bytes);
      else std::memcpy(w, q, bytes);
    }
    offset += len;
  }
}

class ConcatOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    Tensor g = gy[0];
    const int64_t axis = normalize_axis(node_.attr_int("axis", 0), static_cast<int64_t>(g.rank()), node_.describe() + " axis");
    std::vector<Tensor*> pieces;
    for (size_t i = 0; i < in_.size(); ++i) {
      r[i] = Tensor(DType::kFloat32, in_[i].shape());
      pieces.push_back(&r[i]);
    }
    move_along_axis(g, pieces, axis, true);
    for (size_t i = 0; i < in_.size(); ++i)
      if (!needed(i)) r[i] = Tensor();
    return r;
  }
};

class SplitOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const int64_t axis =
        normalize_axis(node_.attr_int("axis", 0), static_cast<int64_t>(in_[0].rank()), node_.describe() + " axis");
    Tensor dx(DType::kFloat32, in_[0].shape());
    std::vector<Tensor> gs = gy;  // zeros already filled in for outputs without a gradient
    std::vector<Tensor*> pieces;
    for (Tensor& t : gs) pieces.push_back(&t);
    move_along_axis(dx, pieces, axis, false);
    r[0] = dx;
    return r;
  }
};

std::vector<int64_t> int_input_or_attr(const std::vector<Tensor>& in, size_t i, const ir::Node& n, const char* attr,
                                       bool from_attr) {
  if (from_attr) return n.attr_ints(attr);
  if (i < in.size() && in[i].defined()) return in[i].to_int64_vector();
  return {};
}

// Slice: the gradient scatters back to the sliced positions, zeros elsewhere.
class SliceOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Shape& xs = in_[0].shape();
    const bool attrs = opset_ < 10;
    const auto starts = int_input_or_attr(in_, 1, node_, "starts", attrs);
    auto axes = int_input_or_attr(in_, 3, node_, "axes", attrs);
    auto steps = attrs ? std::vector<int64_t>{} : int_input_or_attr(in_, 4, node_, "steps", false);
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    const auto cs = contiguous_strides(xs);
    std::vector<int64_t> st = cs;
    int64_t base = 0;
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t a = normalize_axis(axes[i], static_cast<int64_t>(xs.size()), node_.describe() + " axes");
      const int64_t dim = xs[a], step = steps[i];
      int64_t b = starts[i] < 0 ? starts[i] + dim : starts[i];
      b = step > 0 ? std::clamp<int64_t>(b, 0, dim) : std::clamp<int64_t>(b, 0, dim - 1);
      base += b * cs[a];
      st[a] = step * cs[a];
    }
    Tensor dx(DType::kFloat32, xs);
    const float* pg = gy[0].data<float>();
    float* pd = dx.data<float>();
    walk_rows(gy[0].shape(), st, base, [&](int64_t o, int64_t i, int64_t n, int64_t s) {
      for (int64_t k = 0; k < n; ++k) pd[i + k * s] += pg[o + k];
    });
    r[0] = dx;
    return r;
  }
};

// Gather along axis: the gradient is scattered (added: indices may repeat) into zeros of x's shape.
class GatherOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Shape& xs = in_[0].shape();
    const int64_t axis = normalize_axis(node_.attr_int("axis", 0), static_cast<int64_t>(xs.size()), node_.describe() + " axis");
    const std::vector<int64_t> idx = in_[1].to_int64_vector();
    const int64_t outer = std::accumulate(xs.begin(), xs.begin() + axis, int64_t{1}, std::multiplies<>());
    const int64_t inner = std::accumulate(xs.begin() + axis + 1, xs.end(), int64_t{1}, std::multiplies<>());
    const int64_t dim = xs[axis], ni = static_cast<int64_t>(idx.size());
    Tensor dx(DType::kFloat32, xs);
    const float* pg = gy[0].data<float>();
    float* pd = dx.data<float>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < ni; ++j) {
        const int64_t k = idx[j] < 0 ? idx[j] + dim : idx[j];
        const float* src = pg + (o * ni + j) * inner;
        float* dst = pd + (o * dim + k) * inner;
        for (int64_t q = 0; q < inner; ++q) dst[q] += src[q];
      }
    r[0] = dx;
    return r;
  }
};

// Pad (constant mode): the gradient is the output gradient's window over the unpadded input;
// negative pads (crops) give the cropped elements no gradient.
class PadOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const std::string mode = node_.attr_string("mode", "constant");
    SQ_CHECK(mode == "constant", ErrorKind::kUnsupported,
             node_.describe() + ": training supports Pad mode 'constant' only, not '" + mode + "'");
    const Shape& xs = in_[0].shape();
    const Shape& ys = gy[0].shape();
    const size_t rank = xs.size();
    const std::vector<int64_t> pads = opset_ < 11 ? node_.attr_ints("pads") : in_[1].to_int64_vector();
    std::vector<int64_t> axes;
    if (in_.size() > 3 && in_[3].defined()) axes = in_[3].to_int64_vector();
    if (axes.empty())
      for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
    SQ_CHECK(pads.size() == 2 * axes.size(), ErrorKind::kInvalidModel,
             node_.describe() + ": pads has " + std::to_string(pads.size()) + " values for " +
                 std::to_string(axes.size()) + " axes");
    std::vector<int64_t> begin(rank, 0);
    for (size_t i = 0; i < axes.size(); ++i)
      begin[normalize_axis(axes[i], static_cast<int64_t>(rank), node_.describe() + " axes")] = pads[i];
    const auto ycs = contiguous_strides(ys);
    Tensor dx(DType::kFloat32, xs);
    const float* pg = gy[0].data<float>();
    float* pd = dx.data<float>();
    const auto xcs = contiguous_strides(xs);
    // For each x element: its position in y is x's index + begin, when inside y.
    for (int64_t e = 0; e < dx.numel(); ++e) {
      int64_t rem = e, off = 0;
      bool inside = true;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t i = rem / xcs[d] + begin[d];
        rem %= xcs[d];
        inside = inside && i >= 0 && i < ys[d];
        off += i * ycs[d];
      }
      if (inside) pd[e] = pg[off];
    }
    r[0] = dx;
    return r;
  }
};

// Resize, mode nearest: every output element is a copy of one input element, found by running
// the forward kernel on an input holding each element's index within its (n, c) plane (exact in
// float32 up to 2^24 elements per plane); the gradient is scattered (added) back to those.
class ResizeOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const std::string mode = node_.attr_string("mode", "nearest");
    SQ_CHECK(mode == "nearest", ErrorKind::kUnsupported,
             node_.describe() + ": training supports Resize mode 'nearest' only, not '" + mode + "'");
    const Shape& xs = in_[0].shape();
    const Shape& ys = gy[0].shape();
    SQ_CHECK(xs.size() >= 2 && ys.size() == xs.size() && ys[0] == xs[0] && ys[1] == xs[1], ErrorKind::kUnsupported,
             node_.describe() + ": training supports Resize of the spatial dims only (" + shape_str(xs) + " -> " +
                 shape_str(ys) + ")");
    const int64_t planes = xs[0] * xs[1];
    const int64_t in_plane = planes ? in_[0].numel() / planes : 0, out_plane = planes ? gy[0].numel() / planes : 0;
    SQ_CHECK(in_plane <= (int64_t{1} << 24), ErrorKind::kUnsupported,
             node_.describe() + ": spatial planes above 2^24 elements are not supported in training");
    Tensor index(DType::kFloat32, xs);
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t i = 0; i < in_plane; ++i) index.data<float>()[p * in_plane + i] = static_cast<float>(i);
    std::vector<Tensor> inputs = in_;
    inputs[0] = index;
    const Tensor source = run_forward_kernel(inputs).at(0);
    Tensor dx(DType::kFloat32, xs);
    const float* pg = gy[0].data<float>();
    const float* ps = source.data<float>();
    float* pd = dx.data<float>();
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t o = 0; o < out_plane; ++o)
        pd[p * in_plane + static_cast<int64_t>(ps[p * out_plane + o])] += pg[p * out_plane + o];
    r[0] = dx;
    return r;
  }
};

class ExpandOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (needed(0)) r[0] = reduce_to_shape(gy[0], in_[0].shape());
    return r;
  }
};

}  // namespace

void add_shape_ops(std::map<std::string, OpMaker>& t) {
  for (const char* op : {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}) t[op] = &make<ViewOp>;
  t["Transpose"] = &make<TransposeOp>;
  t["Concat"] = &make<ConcatOp>;
  t["Split"] = &make<SplitOp>;
  t["Slice"] = &make<SliceOp>;
  t["Gather"] = &make<GatherOp>;
  t["Expand"] = &make<ExpandOp>;
  t["Pad"] = &make<PadOp>;
  t["Resize"] = &make<ResizeOp>;
}

}  // namespace slimquant::train::detail
