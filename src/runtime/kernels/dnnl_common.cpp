#include "runtime/kernels/dnnl_common.h"

#include <algorithm>

namespace slimquant::runtime::dnnl_kernels {

namespace {
std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}
}  // namespace

WindowAttrs WindowAttrs::parse(const ir::Node& node) {
  WindowAttrs a;
  a.kernel = node.attr_ints("kernel_shape");
  a.strides = node.attr_ints("strides");
  a.dilations = node.attr_ints("dilations");
  a.pads = node.attr_ints("pads");
  std::string ap = node.attr_string("auto_pad", "NOTSET");
  if (ap == "NOTSET" || ap.empty()) a.auto_pad = AutoPad::kNotSet;
  else if (ap == "SAME_UPPER") a.auto_pad = AutoPad::kSameUpper;
  else if (ap == "SAME_LOWER") a.auto_pad = AutoPad::kSameLower;
  else if (ap == "VALID") a.auto_pad = AutoPad::kValid;
  else fail(ErrorKind::kInvalidModel, node.describe() + ": unknown auto_pad '" + ap + "'");
  return a;
}

WindowAttrs WindowAttrs::resolved(const ir::Node& node, size_t spatial) const {
  WindowAttrs r = *this;
  auto fill = [&](std::vector<int64_t>& v, size_t n, int64_t def, const char* name, int64_t min) {
    if (v.empty()) v.assign(n, def);
    if (v.size() != n)
      fail(ErrorKind::kInvalidModel, node.describe() + ": attribute '" + name + "' has " +
                                         std::to_string(v.size()) + " values, expected " +
                                         std::to_string(n) + " for " + std::to_string(spatial) +
                                         " spatial dims");
    for (int64_t x : v)
      if (x < min)
        fail(ErrorKind::kInvalidModel, node.describe() + ": attribute '" + name + "' = " + join(v) +
                                           " must be >= " + std::to_string(min));
  };
  fill(r.kernel, spatial, 1, "kernel_shape", 1);
  fill(r.strides, spatial, 1, "strides", 1);
  fill(r.dilations, spatial, 1, "dilations", 1);
  fill(r.pads, 2 * spatial, 0, "pads", 0);
  return r;
}

WindowGeometry forward_geometry(const ir::Node& node, const WindowAttrs& a, const Shape& in, bool ceil_mode) {
  const size_t n = in.size();
  WindowGeometry g;
  g.out.resize(n);
  g.pad_begin.resize(n);
  g.pad_end.resize(n);
  g.explicit_pad_end.resize(n);
  g.strides.assign(a.strides.begin(), a.strides.end());
  g.kernel.assign(a.kernel.begin(), a.kernel.end());
  g.dilations.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = a.strides[i], ext = (a.kernel[i] - 1) * a.dilations[i] + 1;
    g.dilations[i] = a.dilations[i] - 1;
    int64_t pb = 0, pe = 0, out = 0;
    switch (a.auto_pad) {
      case AutoPad::kNotSet: {
        pb = a.pads[i];
        pe = a.pads[i + n];
        const int64_t span = in[i] + pb + pe - ext;
        if (span < 0)
          fail(ErrorKind::kInvalidArgument,
               node.describe() + ": window of extent " + std::to_string(ext) + " is larger than the padded input (" +
                   std::to_string(in[i] + pb + pe) + ") along spatial dim " + std::to_string(i));
        out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
        // A window may not start in the end padding (the rule PyTorch and newer ONNX specify).
        if (ceil_mode && (out - 1) * s >= in[i] + pb) --out;
        break;
      }
      case AutoPad::kValid:
        if (in[i] < ext)
          fail(ErrorKind::kInvalidArgument, node.describe() + ": window of extent " + std::to_string(ext) +
                                                " is larger than the input (" + std::to_string(in[i]) +
                                                ") with auto_pad VALID");
        out = (in[i] - ext) / s + 1;
        break;
      case AutoPad::kSameUpper:
      case AutoPad::kSameLower: {
        out = (in[i] + s - 1) / s;
        const int64_t total = std::max<int64_t>(0, (out - 1) * s + ext - in[i]);
        const int64_t small = total / 2;
        pb = a.auto_pad == AutoPad::kSameUpper ? small : total - small;
        pe = total - pb;
        break;
      }
    }
    g.out[i] = out;
    g.pad_begin[i] = pb;
    g.explicit_pad_end[i] = pe;
    // oneDNN derives the output size by flooring, so the end pad must cover the last window exactly
    // when ceil_mode (or SAME) made it reach past the input.
    g.pad_end[i] = std::max(pe, (out - 1) * s + ext - in[i] - pb);
  }
  return g;
}

namespace {
bool known_activation(const std::string& op) {
  static const char* kOps[] = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Gelu"};
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* k) { return op == k; });
}
}  // namespace

void check_fused_activation(const ir::Node& node) {
  const std::string& op = node.fused.op;
  if (!op.empty() && !known_activation(op))
    fail(ErrorKind::kUnsupported, node.describe() + ": fused activation '" + op +
                                      "' has no oneDNN post-op (supported: Relu, Clip, LeakyRelu, Sigmoid, "
                                      "Tanh, HardSigmoid, HardSwish, Elu, Gelu)");
}

void append_fused_activation(dnnl::post_ops& ops, const ir::Node& node) {
  using alg = dnnl::algorithm;
  const ir::FusedActivation& f = node.fused;
  if (f.op.empty()) return;
  check_fused_activation(node);
  if (f.op == "Relu") ops.append_eltwise(1.f, alg::eltwise_relu, 0.f, 0.f);
  else if (f.op == "LeakyRelu") ops.append_eltwise(1.f, alg::eltwise_relu, f.alpha, 0.f);
  else if (f.op == "Clip") ops.append_eltwise(1.f, alg::eltwise_clip, f.alpha, f.beta);
  else if (f.op == "Sigmoid") ops.append_eltwise(1.f, alg::eltwise_logistic, 0.f, 0.f);
  else if (f.op == "Tanh") ops.append_eltwise(1.f, alg::eltwise_tanh, 0.f, 0.f);
  else if (f.op == "HardSigmoid") {
    // max(0, min(1, alpha*x + beta)): oneDNN 2.6 has no hardsigmoid, so linear then clip.
    ops.append_eltwise(1.f, alg::eltwise_linear, f.alpha, f.beta);
    ops.append_eltwise(1.f, alg::eltwise_clip, 0.f, 1.f);
  } else if (f.op == "HardSwish") ops.append_eltwise(1.f, alg::eltwise_hardswish, 0.f, 0.f);
  else if (f.op == "Elu") ops.append_eltwise(1.f, alg::eltwise_elu, f.alpha, 0.f);
  else if (f.op == "Gelu") ops.append_eltwise(1.f, alg::eltwise_gelu_erf, 0.f, 0.f);
}

void reject_fused_activation(const ir::Node& node) {
  if (!node.fused.op.empty())
    fail(ErrorKind::kUnsupported,
         node.describe() + ": cannot fuse activation '" + node.fused.op + "' into " + node.op_type);
}

memory::desc plain_desc(const Shape& shape, dt type) {
  if (shape.empty()) return memory::desc({1}, type, memory::format_tag::a);
  return memory::desc(to_dnnl_dims(shape), type, plain_tag(shape.size()));
}

memory wrap(const memory::desc& desc, const void* data) {
  return memory(desc, dnnl_engine(), const_cast<void*>(data));
}

void execute(const dnnl::primitive& p, const std::unordered_map<int, memory>& args) {
  p.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

dnnl::primitive_attr base_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void add_scratchpad(std::unordered_map<int, memory>& args, const memory::desc& scratchpad_desc) {
  if (scratchpad_desc.get_size() > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl_scratch_memory(DnnlScratch::kScratchpad, scratchpad_desc));
}

void require_float32(const ir::Node& node, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kFloat32)
    fail(ErrorKind::kUnsupported, node.describe() + ": " + what + " has dtype " + dtype_name(t.dtype()) +
                                      "; only float32 is supported");
}

bool output_requested(const KernelContext& ctx, size_t i) {
  const auto& outs = ctx.node().outputs;
  return ctx.output_wanted(i) && i < outs.size() && !outs[i].empty();
}

void PackedWeights::set_source(Tensor owner, const memory::desc& user_desc) {
  source_ = std::move(owner);
  user_desc_ = user_desc;
  packed_.clear();
}

const memory& PackedWeights::get(const memory::desc& want) {
  for (const auto& [d, m] : packed_)
    if (d == want) return m;
  // The primitive may see the weights with extra leading 1-dims (MatMul batch broadcasting); the
  // bytes are the same, so view the source with the primitive's dims.
  memory::desc user_desc = user_desc_.dims() == want.dims() ? user_desc_ : user_desc_.reshape(want.dims());
  memory user = wrap(user_desc, source_.raw());
  memory packed(want, dnnl_engine());
  dnnl::reorder(user, packed).execute(dnnl_stream(), user, packed);
  dnnl_stream().wait();
  packed_.emplace_back(want, std::move(packed));
  return packed_.back().second;
}

memory reorder_into_scratch(const memory& src, const memory::desc& dst_desc, DnnlScratch slot) {
  if (src.get_desc() == dst_desc) return src;
  memory in = src;  // a handle copy: reorder::execute takes non-const references
  memory dst = dnnl_scratch_memory(slot, dst_desc);
  dnnl::reorder(in, dst).execute(dnnl_stream(), in, dst);
  dnnl_stream().wait();
  return dst;
}

std::optional<dnnl::reorder> make_reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to));
}

void run_conv_like(const ConvLikePlan& p, const Tensor& x, const Tensor* runtime_w, PackedWeights& packed,
                   const Tensor* bias, Tensor& y) {
  dnnl::stream& s = dnnl_stream();
  memory src = wrap(p.src_user, x.raw());
  if (p.src_reorder) {
    memory blocked = dnnl_scratch_memory(DnnlScratch::kSrc, p.src_desc);
    p.src_reorder->execute(s, src, blocked);
    src = blocked;
  }
  memory weights;
  if (runtime_w) {
    weights = wrap(p.weights_user, runtime_w->raw());
    if (p.weights_reorder) {
      memory reordered = dnnl_scratch_memory(DnnlScratch::kWeights, p.weights_desc);
      p.weights_reorder->execute(s, weights, reordered);
      weights = reordered;
    }
  } else {
    weights = packed.get(p.weights_desc);
  }
  memory dst_user = wrap(p.dst_user, y.raw());
  memory dst = p.dst_reorder ? dnnl_scratch_memory(DnnlScratch::kDst, p.dst_desc) : dst_user;

  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
  if (bias) args.emplace(DNNL_ARG_BIAS, wrap(p.bias_user, bias->raw()));
  add_scratchpad(args, p.scratchpad_desc);
  p.prim.execute(s, args);
  if (p.dst_reorder) p.dst_reorder->execute(s, dst, dst_user);
  s.wait();
}

}  // namespace slimquant::runtime::dnnl_kernels
