#include "runtime/fusions/declared_folds.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <vector>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fused_ops/transposed_views.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "slimquant/ir/qdq_params.h"

namespace slimquant::runtime {
namespace {

using fused_ops::Activation;
using fused_ops::FusedActivation;

const KernelFolds& folds_of(const ir::Node& n) { return KernelRegistry::instance().folds(n.op_type, n.domain); }

// v's shape, when known and v is float32 (any type with any_type: a result a folded Q made 8-bit).
std::optional<Shape> known_shape(const ir::Graph& g, const std::string& v, bool any_type = false) {
  const ir::ValueInfo* info = g.find_value_info(v);
  if (!info || !info->fully_known() || (!any_type && info->dtype != DType::kFloat32)) return std::nullopt;
  return info->shape();
}

// The permutation of a Transpose with an explicit, valid perm of a non-constant value (constant
// Transposes fold away before this; the default reversed order needs the rank, which the
// attribute names).
std::optional<std::vector<int64_t>> transpose_perm(const ir::Graph& g, const ir::Node& t) {
  if (!ir::is_onnx_op(t, "Transpose") || t.inputs.size() != 1 || !t.has_attr("perm") || g.is_initializer(t.inputs[0]))
    return std::nullopt;
  std::vector<int64_t> perm = t.attr_ints("perm");
  std::vector<bool> seen(perm.size(), false);
  for (int64_t d : perm) {
    if (d < 0 || d >= static_cast<int64_t>(perm.size()) || seen[static_cast<size_t>(d)]) return std::nullopt;
    seen[static_cast<size_t>(d)] = true;
  }
  return perm;
}

// ---- Epilogues ----------------------------------------------------------------------------------

// The value of k when it is a finite scalar constant that does not broadcast z to a higher rank
// (the operand of a Mul / Add / Max / Min folded after z), else nullopt.
std::optional<float> folded_scalar(const ir::Graph& g, const std::string& k, const std::string& z) {
  const std::optional<float> s = ir::scalar_constant(g, k);
  if (!s || !std::isfinite(*s)) return std::nullopt;
  const Tensor* t = g.initializer(k);
  const ir::ValueInfo* vz = g.find_value_info(z);
  if (t && t->rank() > 1 && (!vz || !vz->dims || t->rank() > vz->dims->size())) return std::nullopt;
  return s;
}

// s when c computes op(z, s) or op(s, z) for one of `ops`, s a folded_scalar, else nullopt.
std::optional<float> scalar_operand(const ir::Graph& g, const ir::Node& c, const std::string& z,
                                    std::initializer_list<const char*> ops) {
  if (std::none_of(ops.begin(), ops.end(), [&](const char* op) { return ir::is_onnx_op(c, op); }) ||
      c.inputs.size() != 2 || c.inputs[0] == c.inputs[1] || (c.inputs[0] != z && c.inputs[1] != z))
    return std::nullopt;
  return folded_scalar(g, ir::other_input(c, z), z);
}

// Epilogues apply in stages: an activation, then an affine map after it, then quantization, then
// the layout the result is written in.
int stage_of(Fold epilogue) {
  switch (epilogue) {
    case Fold::kActivation: return 1;
    case Fold::kPostAffine: return 2;
    case Fold::kPostClamp: return 3;
    case Fold::kTransposedOutput: return 5;
    default: return 4;  // kTensorQuantize, kChannelQuantize
  }
}

// The last stage the node's epilogue already holds (0: none).
int carried_stage(const ir::Node& n) {
  if (n.has_attr(fused_ops::kTransposedOutput)) return 5;
  if (n.has_attr(kFoldedQuantizeScale) || n.has_attr(kFoldedQuantizeChannelScale)) return 4;
  const FusedActivation a = FusedActivation::parse(n);
  return a.has_post_clamp() ? 3 : a.has_post_affine() ? 2 : a.empty() ? 0 : 1;
}

bool stage_allows(Fold epilogue, int carried) {
  // A post-affine map composes with the one before it, a clamp with the clamp before it; both
  // need an activation to follow.
  if (epilogue == Fold::kPostAffine) return carried == 1 || carried == 2;
  if (epilogue == Fold::kPostClamp) return carried >= 1 && carried <= 3;
  return carried < stage_of(epilogue);
}

// The activation consumer c applies to z: its kind and parameters, or nullopt. A scalar Mul is
// kScale (attention's 1/sqrt(d) after Q K^T). A Clip with min > max (or NaN) is never folded: the
// Clip kernel defines that result (max), which oneDNN's clip does not.
std::optional<FusedActivation> activation_of(const ir::Graph& g, const ir::Node& c, const std::string& z) {
  if (ir::is_onnx_op(c, "Mul")) {
    if (c.inputs.size() != 2 || c.inputs[0] == c.inputs[1] || (c.inputs[0] != z && c.inputs[1] != z))
      return std::nullopt;
    const std::optional<float> s = ir::scalar_constant(g, ir::other_input(c, z));
    if (!s) return std::nullopt;
    FusedActivation f;
    f.kind = Activation::kScale;
    f.alpha = *s;
    return f;
  }
  if (ir::is_onnx_op(c, "Max") || ir::is_onnx_op(c, "Min")) {
    // Max / Min with a scalar: a Clip with one bound.
    const std::optional<float> s = scalar_operand(g, c, z, {"Max", "Min"});
    if (!s) return std::nullopt;
    FusedActivation f;
    f.kind = Activation::kClip;
    f.alpha = c.op_type == "Max" ? *s : -INFINITY;
    f.beta = c.op_type == "Max" ? INFINITY : *s;
    return f;
  }
  if (c.inputs.empty() || c.inputs[0] != z) return std::nullopt;
  std::optional<FusedActivation> f = fused_ops::read_activation_node(g, c);
  if (f && f->kind == Activation::kClip && !(f->alpha <= f->beta)) return std::nullopt;
  return f;
}

// Folds the consumer c of z into `fused` as `epilogue`; false (fused unchanged) when c is not of
// that form or the declaration refuses its kind.
bool fold_epilogue(const ir::Graph& g, Fold epilogue, const ir::Node& c, const std::string& z, const KernelFolds& f,
                   ir::Node& fused) {
  switch (epilogue) {
    case Fold::kActivation: {
      const std::optional<FusedActivation> a = activation_of(g, c, z);
      if (!a || !(f.activations >> static_cast<unsigned>(a->kind) & 1u)) return false;
      a->write(fused);
      return true;
    }
    case Fold::kPostAffine: {
      const std::optional<float> s = scalar_operand(g, c, z, {"Mul", "Add"});
      if (!s) return false;
      FusedActivation a = FusedActivation::parse(fused);
      // The map is act(x) * post_scale + post_shift: one Mul, then one Add (a longer chain would
      // round differently from the ops it replaces).
      if (c.op_type == "Mul" ? a.has_post_affine() : a.post_shift != 0.f) return false;
      if (c.op_type == "Mul") {
        a.post_scale *= *s;
        a.post_shift *= *s;
      } else {
        a.post_shift += *s;
      }
      a.write(fused);
      return true;
    }
    case Fold::kPostClamp: {
      const std::optional<float> s = scalar_operand(g, c, z, {"Max", "Min"});
      if (!s) return false;
      FusedActivation a = FusedActivation::parse(fused);
      // max(clamp(y, lo, hi), s) = clamp(y, max(lo, s), hi) while s <= hi (min alike); past the
      // other bound the result is a constant, left to the op.
      if (c.op_type == "Max") {
        if (!(*s <= a.post_max)) return false;
        a.post_min = std::max(a.post_min, *s);
      } else {
        if (!(*s >= a.post_min)) return false;
        a.post_max = std::min(a.post_max, *s);
      }
      a.write(fused);
      return true;
    }
    case Fold::kTensorQuantize: {
      QuantParam p;
      if (!ir::is_onnx_op(c, "QuantizeLinear") || c.attrs.count("output_dtype") || ir::read_qdq_params(g, c, p) ||
          !p.per_tensor() || (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
        return false;
      write_folded_quantize(fused, FoldedQuantize{std::move(p)});
      return true;
    }
    case Fold::kChannelQuantize: {
      // The kernels quantize float32 results only: z's type must be known.
      const ir::ValueInfo* info = g.find_value_info(z);
      if (!info || info->dtype != DType::kFloat32 || !ir::is_onnx_op(c, "QuantizeLinear") || c.inputs.size() < 2 ||
          c.attrs.count("output_dtype") || c.attrs.count("block_size"))
        return false;
      const int64_t rank = info->dims ? static_cast<int64_t>(info->dims->size()) : -1;
      QuantParam p;
      if (ir::read_qdq_params(g, c, p, {.rank = rank}) || p.per_tensor() ||
          (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
        return false;
      write_folded_channel_quantize(fused, FoldedChannelQuantize{std::move(p)});
      return true;
    }
    case Fold::kTransposedOutput: {
      const std::optional<std::vector<int64_t>> perm = transpose_perm(g, c);
      if (!perm) return false;
      fused.attrs[fused_ops::kTransposedOutput] = *perm;
      return true;
    }
    default:
      return false;
  }
}

struct EpilogueMatch {
  int node = -1;
  ir::Node fused;
  std::vector<int> absorbed;  // the consumers, in chain order
};

std::optional<EpilogueMatch> select_epilogues(const ir::Rewriter& rw, int i, const std::vector<Fold>& epilogues) {
  const ir::Node& n = rw.node(i);
  const KernelFolds& f = folds_of(n);
  if (n.outputs.size() != 1 || std::none_of(epilogues.begin(), epilogues.end(), [&](Fold e) { return f.declares(e); }))
    return std::nullopt;
  EpilogueMatch m{i, n, {}};
  int carried = carried_stage(n);
  std::string z = n.outputs[0];
  for (bool took = true; took;) {
    took = false;
    const int r = rw.sole_reader(z);  // z not kept, not a graph output, read by one node
    if (r < 0 || rw.node(r).outputs.size() != 1) break;
    for (Fold e : epilogues) {
      if (!stage_allows(e, carried) || !f.accepts(m.fused, e) ||
          !fold_epilogue(rw.graph(), e, rw.node(r), z, f, m.fused))
        continue;
      carried = stage_of(e);
      z = rw.node(r).outputs[0];
      m.absorbed.push_back(r);
      took = true;
      break;
    }
  }
  if (m.absorbed.empty()) return std::nullopt;
  m.fused.outputs[0] = z;
  return m;
}

void apply_epilogues(ir::Rewriter& rw, const EpilogueMatch& m) {
  for (int c : m.absorbed) rw.remove(c);
  rw.replace(m.node, m.fused);  // reads what it read before: valid at its own place
}

// ---- Prologues ----------------------------------------------------------------------------------

// What a prologue's producer gives its readers.
struct ProducerForm {
  std::string source;  // what the readers read instead: the codes, x of x * s, the Resize's input
  FoldedDequantize dequantize;      // kDequantizedInput (input set per reader)
  std::string factor;               // kScaledInput: s
  Shape shape;                      // kScaledInput: x's; kUpsampledInput: the upsampled value's
  std::vector<int64_t> factors;     // kUpsampledInput: {kh, kw}
  std::vector<int64_t> perm;        // kTransposedInput: the Transpose's permutation
};

// A factor the elementwise kernels apply per (n, c) or to everything: [N|1, C|1, 1, 1] against
// x's [N, C, H, W] (numpy alignment: fewer dims are padded with leading 1s), or one element.
bool per_channel_factor(const Shape& s, const Shape& x) {
  if (x.size() != 4 || s.size() > 4) return false;
  Shape p(4 - s.size(), 1);
  p.insert(p.end(), s.begin(), s.end());
  return (p[0] == 1 || p[0] == x[0]) && (p[1] == 1 || p[1] == x[1]) && p[2] == 1 && p[3] == 1;
}

// The integer factors {kh, kw} of a Resize that repeats each element of a rank-4 value kh x kw
// times (nearest, asymmetric, floor, constant scales {1, 1, kh, kw}), or {} otherwise.
std::vector<int64_t> nearest_upsample_factors(const ir::Graph& g, const ir::Node& resize) {
  if (!ir::is_onnx_op(resize, "Resize") || g.opset < 11 || resize.inputs.size() < 3 || !resize.input(3).empty())
    return {};
  if (resize.attr_string("mode", "nearest") != "nearest" ||
      resize.attr_string("coordinate_transformation_mode", "half_pixel") != "asymmetric" ||
      resize.attr_string("nearest_mode", "round_prefer_floor") != "floor" || resize.has_attr("axes") ||
      resize.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
    return {};
  const Tensor* scales = g.initializer(resize.input(2));
  if (!scales || scales->dtype() != DType::kFloat32 || scales->numel() != 4) return {};
  const std::vector<float> s = scales->to_float_vector();
  if (s[0] != 1.f || s[1] != 1.f) return {};
  std::vector<int64_t> factors;
  for (float f : {s[2], s[3]}) {
    // x / f is exact for these: the source index is exactly floor(x / f).
    if (!(f >= 1.f && f <= 64.f) || f != std::floor(f)) return {};
    factors.push_back(static_cast<int64_t>(f));
  }
  return factors;
}

std::optional<ProducerForm> producer_form(const ir::Graph& g, Fold prologue, const ir::Node& p) {
  ProducerForm form;
  switch (prologue) {
    case Fold::kDequantizedInput: {
      QuantParam q;
      if (!ir::is_onnx_op(p, "DequantizeLinear") || p.inputs.size() < 2 || p.attrs.count("block_size") ||
          p.attrs.count("output_dtype") || g.is_initializer(p.inputs[0]) || ir::read_qdq_params(g, p, q) ||
          !q.per_tensor() || (q.dtype != DType::kUInt8 && q.dtype != DType::kInt8))
        return std::nullopt;
      form.source = p.inputs[0];
      form.dequantize.scale = q.scale[0];
      form.dequantize.zero_point = q.zero_point[0];
      return form;
    }
    case Fold::kScaledInput: {
      if (!ir::is_onnx_op(p, "Mul") || p.inputs.size() != 2 || !p.attrs.empty() || p.inputs[0] == p.inputs[1])
        return std::nullopt;
      for (size_t xi = 0; xi < 2; ++xi) {
        const std::optional<Shape> x = known_shape(g, p.inputs[xi]), s = known_shape(g, p.inputs[1 - xi]);
        if (!x || !s || !per_channel_factor(*s, *x)) continue;
        form.source = p.inputs[xi];
        form.factor = p.inputs[1 - xi];
        form.shape = *x;
        return form;
      }
      return std::nullopt;
    }
    case Fold::kUpsampledInput: {
      form.factors = nearest_upsample_factors(g, p);
      const std::optional<Shape> source = known_shape(g, p.inputs.empty() ? "" : p.inputs[0]);
      const std::optional<Shape> upsampled = known_shape(g, p.outputs[0]);
      if (form.factors.empty() || !source || !upsampled || source->size() != 4 || *upsampled !=
          Shape{(*source)[0], (*source)[1], (*source)[2] * form.factors[0], (*source)[3] * form.factors[1]})
        return std::nullopt;
      form.source = p.inputs[0];
      form.shape = *upsampled;
      return form;
    }
    case Fold::kTransposedInput: {
      std::optional<std::vector<int64_t>> perm = transpose_perm(g, p);
      if (!perm) return std::nullopt;
      form.perm = std::move(*perm);
      form.source = p.inputs[0];
      return form;
    }
    default:
      return std::nullopt;
  }
}

// Whether reader r can take the prologue at its input `input` (what the form needs of the reader
// beyond the declaration).
bool reader_fits(const ir::Graph& g, Fold prologue, const ProducerForm& form, const ir::Node& r, size_t input,
                 const KernelFolds& f) {
  switch (prologue) {
    case Fold::kScaledInput: {  // x is not broadcast: the result has x's shape
      const std::optional<Shape> out = known_shape(g, r.outputs[0], true);
      return out && *out == form.shape;
    }
    case Fold::kUpsampledInput:  // the other operands have the upsampled shape (nothing broadcasts)
      for (size_t k = 0; k < r.inputs.size(); ++k) {
        if (k == input || k >= 32 || !(f.prologue_inputs(Fold::kUpsampledInput) >> k & 1u)) continue;
        const std::optional<Shape> other = known_shape(g, r.inputs[k]);
        if (!other || *other != form.shape) return false;
      }
      return true;
    default:
      return true;
  }
}

struct PrologueMatch {
  int producer = -1;
  std::vector<int> readers;
  ProducerForm form;
};

std::optional<PrologueMatch> select_prologue(const ir::Rewriter& rw, int i, Fold prologue) {
  const ir::Graph& g = rw.graph();
  const ir::Node& p = rw.node(i);
  if (p.outputs.size() != 1 || !rw.is_private(p.outputs[0])) return std::nullopt;
  std::optional<ProducerForm> form = producer_form(g, prologue, p);
  if (!form) return std::nullopt;
  const std::string& v = p.outputs[0];
  PrologueMatch m{i, rw.readers(v), std::move(*form)};
  if (m.readers.empty()) return std::nullopt;
  // Scaled and upsampled inputs are one per node: their attribute names a single input.
  const bool one_per_node = prologue == Fold::kScaledInput || prologue == Fold::kUpsampledInput;
  for (int r : m.readers) {
    const ir::Node& reader = rw.node(r);
    const KernelFolds& f = folds_of(reader);
    if (reader.outputs.size() != 1 || !f.accepts_every_read(reader, prologue, v)) return std::nullopt;
    int slots = 0;
    for (size_t k = 0; k < reader.inputs.size(); ++k) {
      if (reader.inputs[k] != v) continue;
      ++slots;
      if (!reader_fits(g, prologue, m.form, reader, k, f)) return std::nullopt;
    }
    if (one_per_node && slots > 1) return std::nullopt;
  }
  return m;
}

void apply_prologue(ir::Rewriter& rw, Fold prologue, const PrologueMatch& m) {
  const std::string v = rw.node(m.producer).outputs[0];
  for (int r : m.readers) {
    ir::Node reader = rw.node(r);
    for (size_t k = 0; k < reader.inputs.size(); ++k) {
      if (reader.inputs[k] != v) continue;
      reader.inputs[k] = m.form.source;
      switch (prologue) {
        case Fold::kDequantizedInput: {
          FoldedDequantize d = m.form.dequantize;
          d.input = k;
          add_folded_dequantize(reader, d);
          break;
        }
        case Fold::kScaledInput:
          reader.inputs.push_back(m.form.factor);
          reader.attrs[ew::kScaledInput] = static_cast<int64_t>(k);
          break;
        case Fold::kUpsampledInput:
          reader.attrs[ew::kNearestUpsampledInput] = static_cast<int64_t>(k);
          reader.attrs[ew::kNearestUpsampleFactors] = m.form.factors;
          break;
        case Fold::kTransposedInput:
          reader.attrs[fused_ops::transposed_input_attr(k)] = m.form.perm;
          break;
        default:
          break;
      }
    }
    rw.replace(r, std::move(reader));  // it reads the producer's inputs, which exist before it
  }
  rw.remove(m.producer);
}

}  // namespace

ir::Rule epilogue_fold_rule(std::string name, std::initializer_list<Fold> epilogues) {
  std::vector<Fold> kinds(epilogues);
  return ir::make_rule<EpilogueMatch>(
      std::move(name), [kinds](const ir::Rewriter& rw, int i) { return select_epilogues(rw, i, kinds); },
      apply_epilogues);
}

ir::Rule prologue_fold_rule(std::string name, Fold prologue) {
  return ir::make_rule<PrologueMatch>(
      std::move(name), [prologue](const ir::Rewriter& rw, int i) { return select_prologue(rw, i, prologue); },
      [prologue](ir::Rewriter& rw, const PrologueMatch& m) { apply_prologue(rw, prologue, m); });
}

}  // namespace slimquant::runtime
