#include "runtime/kernels/dnnl/dnnl_common.h"

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/elementwise/swish_avx512.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

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

void check_fused_activation(const ir::Node& node) {
  fused_ops::FusedActivation::parse(node);  // every activation of the vocabulary has a oneDNN post-op
}

std::vector<EltwiseStep> activation_eltwise_steps(fused_ops::Activation kind, float alpha, float beta, float unit,
                                                  float zero_point) {
  using alg = dnnl::algorithm;
  switch (kind) {
    case fused_ops::Activation::kNone: return {};
    case fused_ops::Activation::kRelu: return {{alg::eltwise_relu, 0.f, 0.f}};
    case fused_ops::Activation::kLeakyRelu: return {{alg::eltwise_relu, alpha, 0.f}};
    case fused_ops::Activation::kClip: return {{alg::eltwise_clip, alpha, beta}};
    // clip(a x + b, 0, 1) / unit + zp = clip(a v + b / unit + zp, zp, 1 / unit + zp) with v = x / unit:
    // linear then clip, as oneDNN 2.6 has no hardsigmoid; the zero point is folded in because its
    // JIT post-op injector gives a second eltwise_linear in one chain the first one's alpha and beta
    // (measured).
    case fused_ops::Activation::kHardSigmoid:
      return {{alg::eltwise_linear, alpha, beta * unit + zero_point}, {alg::eltwise_clip, zero_point, unit + zero_point}};
    case fused_ops::Activation::kSigmoid: return {{alg::eltwise_logistic, 0.f, 0.f}};
    case fused_ops::Activation::kTanh: return {{alg::eltwise_tanh, 0.f, 0.f}};
    case fused_ops::Activation::kHardSwish: return {{alg::eltwise_hardswish, 0.f, 0.f}};
    case fused_ops::Activation::kElu: return {{alg::eltwise_elu, alpha, 0.f}};
    case fused_ops::Activation::kSwish: return {{alg::eltwise_swish, alpha, 0.f}};
    case fused_ops::Activation::kGelu: return {{alg::eltwise_gelu_erf, 0.f, 0.f}};
    case fused_ops::Activation::kScale: return {{alg::eltwise_linear, alpha, 0.f}};  // MatMul -> Mul(scalar)
  }
  return {};
}

namespace {
std::vector<EltwiseStep> activation_steps(const ir::Node& node) {
  const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node);
  std::vector<EltwiseStep> steps = activation_eltwise_steps(f.kind, f.alpha, f.beta);
  if (!steps.empty() && f.has_post_affine())
    steps.push_back({dnnl::algorithm::eltwise_linear, f.post_scale, f.post_shift});
  if (!steps.empty() && f.has_post_clamp()) steps.push_back({dnnl::algorithm::eltwise_clip, f.post_min, f.post_max});
  return steps;
}
}  // namespace

void append_fused_activation(dnnl::post_ops& ops, const ir::Node& node) {
  for (const EltwiseStep& e : activation_steps(node)) ops.append_eltwise(1.f, e.alg, e.alpha, e.beta);
}

std::vector<dnnl::eltwise_forward> make_activation_primitives(const ir::Node& node, const memory::desc& desc) {
  // One primitive per step: an eltwise primitive with eltwise post-ops falls back to oneDNN's
  // reference implementation (measured 100x slower than two JIT passes).
  std::vector<dnnl::eltwise_forward> out;
  using ef = dnnl::eltwise_forward;
  for (const EltwiseStep& e : activation_steps(node))
    out.emplace_back(make_pd(node, "the fused activation", [&] {
      return ef::primitive_desc(ef::desc(dnnl::prop_kind::forward_inference, e.alg, desc, e.alpha, e.beta),
                                base_attr(), dnnl_engine());
    }));
  return out;
}

void reject_fused_activation(const ir::Node& node) {
  if (const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node); !f.empty())
    fail(ErrorKind::kUnsupported, node.describe() + ": cannot fuse activation '" + f.name() + "' into " + node.op_type);
}

memory::desc plain_desc(const Shape& shape, dt type) {
  if (shape.empty()) return memory::desc({1}, type, memory::format_tag::a);
  return memory::desc(to_dnnl_dims(shape), type, plain_tag(shape.size()));
}

memory::format_tag blocked_channel_tag(size_t rank) {
  using tag = memory::format_tag;
  const bool wide = effective_isa_includes(dnnl::cpu_isa::avx512_core);
  switch (rank) {
    case 3: return wide ? tag::nCw16c : tag::nCw8c;
    case 4: return wide ? tag::nChw16c : tag::nChw8c;
    case 5: return wide ? tag::nCdhw16c : tag::nCdhw8c;
    default: fail(ErrorKind::kInternal, "no channel-blocked layout for rank " + std::to_string(rank));
  }
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

struct SharedPacking {
  Tensor source;  // the bytes packed (kept: a later request compares its own with them)
  memory::desc user, want;
  memory packed;
};

namespace {

// The packings in use, by a hash of their source bytes. Entries expire with their last user; the
// source bytes are compared in full before one is shared, so equal hashes of different weights
// (or the same address reused for other weights) cannot mix.
class PackingRegistry {
 public:
  std::shared_ptr<const SharedPacking> find_or_pack(const Tensor& source, const memory::desc& user,
                                                    const memory::desc& want) {
    const std::string_view bytes(static_cast<const char*>(source.raw()), source.nbytes());
    const size_t key = std::hash<std::string_view>{}(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto [first, last] = entries_.equal_range(key);
    for (auto it = first; it != last;) {
      std::shared_ptr<const SharedPacking> p = it->second.lock();
      if (!p) {
        it = entries_.erase(it);
        continue;
      }
      if (p->user == user && p->want == want && p->source.nbytes() == source.nbytes() &&
          std::memcmp(p->source.raw(), source.raw(), source.nbytes()) == 0)
        return p;
      ++it;
    }
    auto p = std::make_shared<SharedPacking>(SharedPacking{source, user, want, memory(want, dnnl_engine())});
    memory from = wrap(user, source.raw());
    dnnl::reorder(from, p->packed).execute(dnnl_stream(), from, p->packed);
    dnnl_stream().wait();
    if (++inserts_ % 256 == 0) std::erase_if(entries_, [](const auto& e) { return e.second.expired(); });
    entries_.emplace(key, p);
    return p;
  }

  SharedPackingStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    SharedPackingStats s;
    for (const auto& [key, weak] : entries_)
      if (std::shared_ptr<const SharedPacking> p = weak.lock()) {
        ++s.count;
        s.bytes += p->want.get_size();
      }
    return s;
  }

 private:
  std::mutex mutex_;
  std::unordered_multimap<size_t, std::weak_ptr<const SharedPacking>> entries_;
  size_t inserts_ = 0;
};

PackingRegistry& packing_registry() {
  static PackingRegistry registry;
  return registry;
}

}  // namespace

SharedPackingStats shared_packing_stats() { return packing_registry().stats(); }

const memory& PackedWeights::get(const memory::desc& want) {
  for (const auto& p : packed_)
    if (p->want == want) return p->packed;
  // The primitive may see the weights with extra leading 1-dims (MatMul batch broadcasting); the
  // bytes are the same, so view the source with the primitive's dims.
  memory::desc user_desc = user_desc_.dims() == want.dims() ? user_desc_ : user_desc_.reshape(want.dims());
  packed_.push_back(packing_registry().find_or_pack(source_, user_desc, want));
  return packed_.back()->packed;
}

std::optional<dnnl::reorder> make_reorder(const memory::desc& from, const memory::desc& to,
                                          const dnnl::primitive_attr& attr) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to, attr));
}

LayoutPtr output_layout_for(const memory::desc& desc, const Shape& shape, DType dtype, bool allowed) {
  if (!allowed || shape.size() < 3) return nullptr;
  const memory::desc plain = plain_desc(shape, to_dnnl_type(dtype));
  if (desc == plain || desc.get_size() != plain.get_size()) return nullptr;
  return std::make_shared<const Layout>(Layout{desc});
}

Tensor to_plain(const Tensor& t, const Layout& layout) {
  Tensor out(t.dtype(), t.shape());
  reorder_to_plain(t, layout, out);
  return out;
}

void reorder_to_plain(const Tensor& t, const Layout& layout, Tensor& out) {
  memory from = wrap(layout.desc, t.raw()), to = wrap(plain_desc(t.shape(), to_dnnl_type(t.dtype())), out.raw());
  dnnl::reorder(from, to).execute(dnnl_stream(), from, to);
  dnnl_stream().wait();
}

namespace {
memory::desc with_type(memory::desc d, dt type) {
  d.data.data_type = static_cast<dnnl_data_type_t>(type);  // blocking strides count elements, not bytes
  return d;
}
}  // namespace

LayoutPtr retyped_layout(const Layout& layout, DType dtype) {
  const dt type = to_dnnl_type(dtype);
  if (layout.desc.data_type() == type) return std::make_shared<const Layout>(layout);
  return std::make_shared<const Layout>(Layout{with_type(layout.desc, type)});
}

bool same_blocking(const Layout& a, const Layout& b) {
  return a.desc == with_type(b.desc, a.desc.data_type());
}

memory unbound_memory(const memory::desc& desc) { return memory(desc, dnnl_engine(), DNNL_MEMORY_NONE); }

void bind_scratchpad(memory& scratchpad) {
  const size_t size = scratchpad.get_desc().get_size();
  if (size > 0) scratchpad.set_data_handle(dnnl_scratch(DnnlScratch::kScratchpad, size));
}

void run_conv_like(ConvLikePlan& p, const Tensor& x, const Tensor* runtime_w, const Tensor* bias, Tensor& y,
                   const Tensor* sum) {
  dnnl::stream& s = dnnl_stream();
  p.src_user_mem.set_data_handle(const_cast<void*>(x.raw()));
  if (p.src_reorder) {
    p.src_mem.set_data_handle(dnnl_scratch(DnnlScratch::kSrc, p.src_desc.get_size()));
    p.src_reorder->execute(s, p.src_reorder_args);
  }
  if (runtime_w) {
    p.weights_user_mem.set_data_handle(const_cast<void*>(runtime_w->raw()));
    if (p.weights_reorder) {
      p.weights_mem.set_data_handle(dnnl_scratch(DnnlScratch::kWeights, p.weights_desc.get_size()));
      p.weights_reorder->execute(s, p.weights_reorder_args);
    }
  }
  if (bias) p.bias_mem.set_data_handle(const_cast<void*>(bias->raw()));
  p.dst_user_mem.set_data_handle(y.raw());
  if (p.dst_reorder) p.dst_mem.set_data_handle(dnnl_scratch(DnnlScratch::kDst, p.dst_desc.get_size()));
  if (p.has_sum) {
    SQ_CHECK(sum != nullptr, ErrorKind::kInternal, "fused residual addend missing");
    if (p.sum_reorder) {
      p.sum_user_mem.set_data_handle(const_cast<void*>(sum->raw()));
      p.sum_reorder->execute(s, p.sum_reorder_args);
    } else if (void* dst = p.dst_mem.get_data_handle(); dst != sum->raw()) {
      std::memcpy(dst, sum->raw(), p.dst_desc.get_size());
    }
  }
  bind_scratchpad(p.scratchpad_mem);
  p.prim.execute(s, p.args);
  if (p.dst_reorder) p.dst_reorder->execute(s, p.dst_reorder_args);
  for (const dnnl::eltwise_forward& act : p.activations) act.execute(s, p.activation_args);
  s.wait();
  // The output's bytes as written (a blocked layout's padding included: swish(0) = 0).
  if (p.swish_pass_alpha)
    ew::swish_in_place_avx512(static_cast<float*>(y.raw()), static_cast<int64_t>(p.dst_user.get_size() / sizeof(float)),
                              *p.swish_pass_alpha);
}

}  // namespace slimquant::runtime::dnnl_kernels
