#include "runtime/fusions/execution_fusions.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fusions/channel_quantize_fusion.h"
#include "runtime/fusions/dequantize_fusion.h"
#include "runtime/fusions/dynamic_matmul_fusion.h"
#include "runtime/fusions/qb4w_matmul_fusion.h"
#include "runtime/fusions/scaled_operand_fusion.h"
#include "runtime/fusions/upsample_fusion.h"
#include "runtime/fused_ops/residual_conv.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/ir/passes.h"
#include "slimquant/ir/qdq_params.h"

namespace slimquant::runtime {

namespace {

using ir::Rewriter;

bool same_known_shape(const ir::Graph& g, const std::string& a, const std::string& b) {
  const ir::ValueInfo *va = g.find_value_info(a), *vb = g.find_value_info(b);
  return va && vb && va->fully_known() && vb->fully_known() && va->shape() == vb->shape() &&
         va->dtype == DType::kFloat32 && vb->dtype == DType::kFloat32;
}

// An activation that alone reads the output of a float Conv / ConvTranspose / Gemm (or a scalar Mul
// after a MatMul: attention's 1/sqrt(d) after Q K^T) becomes that node's fused activation
// (fused_ops::FusedActivation), with a scalar Mul and/or Add after it on a Conv as the post affine map.
struct ActivationFusion {
  int producer = -1;
  std::vector<int> absorbed;  // the activation, then the post affine Mul / Add
  fused_ops::FusedActivation activation;
  std::string output;
};

// The activation node `act` describes, with the value it reads; nullopt when it is none the float
// kernels apply (GELU: none of them) or, for a Clip, one oneDNN refuses (min > max or NaN; the Clip
// kernel gives max there).
std::optional<fused_ops::FusedActivation> activation_of(const Rewriter& rw, const ir::Node& act, std::string& x) {
  const ir::Graph& g = rw.graph();
  x = act.inputs[0];
  if (act.op_type == "Mul" && act.domain.empty() && act.inputs.size() == 2) {
    const bool constant_first = ir::scalar_constant(g, act.inputs[0]).has_value();  // Mul(c, y)
    x = act.inputs[constant_first ? 1 : 0];
    const std::optional<float> c = ir::scalar_constant(g, act.inputs[constant_first ? 0 : 1]);
    const int p = rw.producer(x);
    if (!c || p < 0 || rw.node(p).op_type != "MatMul") return std::nullopt;
    fused_ops::FusedActivation f;
    f.kind = fused_ops::Activation::kScale;
    f.alpha = *c;
    return f;
  }
  std::optional<fused_ops::FusedActivation> f = fused_ops::read_activation_node(g, act);
  if (!f || f->kind == fused_ops::Activation::kGelu) return std::nullopt;
  if (f->kind == fused_ops::Activation::kClip && !(f->alpha <= f->beta)) return std::nullopt;
  return f;
}

// A scalar Mul and/or Add after the activation of a Conv: one linear post-op more. Not after
// activations that already end in a linear step: oneDNN 2.6's JIT injector gives a second
// eltwise_linear in one chain the first one's parameters (measured, see int8_common.cpp).
void take_post_affine(const Rewriter& rw, ActivationFusion& m) {
  const ir::Graph& g = rw.graph();
  for (const char* affine : {"Mul", "Add"}) {
    const std::string& z = m.output;
    if (rw.sole_reader(z) < 0) break;
    const int r = rw.sole_reader(z);
    const ir::Node& n = rw.node(r);
    if (n.op_type != affine || !n.domain.empty() || n.outputs.size() != 1) continue;
    const std::optional<float> c = ir::scalar_constant(g, ir::other_input(n, z));
    if (!c || !std::isfinite(*c)) continue;
    // Only a scalar that does not broadcast the output to a higher rank.
    const Tensor* ct = g.initializer(ir::other_input(n, z));
    const ir::ValueInfo* vz = g.find_value_info(z);
    if (ct->rank() > 1 && (!vz || !vz->dims || ct->rank() > vz->dims->size())) continue;
    if (affine == std::string("Mul")) {
      m.activation.post_scale *= *c;
      m.activation.post_shift *= *c;
    } else {
      m.activation.post_shift += *c;
    }
    m.output = n.outputs[0];
    m.absorbed.push_back(r);
  }
}

std::optional<ActivationFusion> select_activation(const Rewriter& rw, int i) {
  const ir::Node& act = rw.node(i);
  if (act.inputs.empty() || act.outputs.size() != 1) return std::nullopt;
  std::string x;
  std::optional<fused_ops::FusedActivation> f = activation_of(rw, act, x);
  if (!f || rw.sole_reader(x) < 0) return std::nullopt;
  const int p = rw.producer(x);
  if (p < 0) return std::nullopt;
  const ir::Node& prod = rw.node(p);
  if (!prod.domain.empty() || !fused_ops::FusedActivation::parse(prod).empty() || prod.outputs.size() != 1)
    return std::nullopt;
  const bool matmul_scale = f->kind == fused_ops::Activation::kScale;  // the only fusion into a MatMul here
  if (matmul_scale != (prod.op_type == "MatMul")) return std::nullopt;
  if (!matmul_scale && prod.op_type != "Conv" && prod.op_type != "ConvTranspose" && prod.op_type != "Gemm")
    return std::nullopt;
  ActivationFusion m{p, {i}, *f, act.outputs[0]};
  if (prod.op_type == "Conv" && f->kind != fused_ops::Activation::kHardSigmoid && !matmul_scale) take_post_affine(rw, m);
  return m;
}

void fuse_activation(Rewriter& rw, const ActivationFusion& m) {
  ir::Node prod = rw.node(m.producer);
  m.activation.write(prod);
  prod.outputs[0] = m.output;
  for (int n : m.absorbed) rw.remove(n);
  rw.replace(m.producer, std::move(prod));
}

// Add(Conv(...), r) [-> Relu | Clip] becomes one Conv that reads r as a 4th input and adds it with
// oneDNN's sum post-op, saving the Add's (and activation's) pass over memory. The Conv moves to
// the Add's place, where r is available; the Conv output must be read by the Add alone and not be
// kept, and both operands must have the same known shape.
struct ResidualAdd {
  int add = -1, conv = -1, activation = -1;  // activation: the node after the sum, or -1
  std::string addend;
  fused_ops::SumActivation sum_activation;
};

// The Relu or Clip (constant bounds, min <= max) that alone reads the sum z: its node, or -1.
int sum_activation(const Rewriter& rw, const std::string& z, fused_ops::SumActivation& out) {
  const int r = rw.sole_reader(z);
  if (r < 0 || rw.node(r).outputs.size() != 1) return -1;
  const std::optional<fused_ops::FusedActivation> a = fused_ops::read_activation_node(rw.graph(), rw.node(r));
  if (!a) return -1;
  if (a->kind == fused_ops::Activation::kRelu) {
    out = {a->kind, 0.f, INFINITY};
    return r;
  }
  // oneDNN refuses min > max (or NaN); the Clip kernel handles it.
  if (a->kind != fused_ops::Activation::kClip || !(a->alpha <= a->beta)) return -1;
  out = {a->kind, a->alpha, a->beta};
  return r;
}

std::optional<ResidualAdd> select_residual_add(const Rewriter& rw, int i) {
  const ir::Node& add = rw.node(i);
  if (!ir::is_onnx_op(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const std::string& a = add.inputs[side];
    const std::string& r = add.inputs[1 - side];
    const int p = rw.producer(a);
    if (p < 0 || a == r || rw.sole_reader(a) < 0) continue;
    const ir::Node& conv = rw.node(p);
    // A float Conv, or an INT8 QConv with a float32 output (ONNX type 1).
    const bool float_conv = ir::is_onnx_op(conv, "Conv");
    const bool qconv = conv.op_type == int8::kQConv && conv.domain == ir::kSlimquantDomain &&
                       conv.attr_int(int8::attr::kYType, 1) == 1;
    if (!(float_conv || qconv) || conv.outputs.size() != 1 || conv.inputs.size() > 3) continue;
    // An activation before the sum (x + silu(conv), YOLO's bottleneck; x + relu(conv)) sends
    // oneDNN 2.6's f32 AVX2 convolutions to the reference implementation, hundreds of times
    // slower (measured; QConv computes in f32 too where int8 is inexact): the Add stays separate.
    if (!fused_ops::FusedActivation::parse(conv).empty() || !conv.attr_string(int8::attr::kActivation, "").empty())
      continue;
    if (conv.inputs.size() > 1 && !rw.graph().is_initializer(conv.inputs[1])) continue;
    if (!same_known_shape(rw.graph(), a, r)) continue;
    ResidualAdd m{i, p, -1, r, {}};
    m.activation = sum_activation(rw, add.outputs[0], m.sum_activation);
    return m;
  }
  return std::nullopt;
}

void fuse_residual_add(Rewriter& rw, const ResidualAdd& m) {
  ir::Node fused = rw.node(m.conv);
  fused.inputs.resize(fused_ops::kConvAddend);
  fused.inputs.push_back(m.addend);
  fused.outputs[0] = rw.node(m.add).outputs[0];
  if (m.activation >= 0) {
    m.sum_activation.write(fused);
    fused.outputs[0] = rw.node(m.activation).outputs[0];
    rw.remove(m.activation);
  }
  rw.remove(m.conv);
  rw.replace(m.add, std::move(fused));
}

// A per-tensor QuantizeLinear with constant u8/s8 parameters (the ones a producer can take over).
std::optional<FoldedQuantize> foldable_quantize(const ir::Graph& g, const ir::Node& q) {
  if (!ir::is_onnx_op(q, "QuantizeLinear") || q.outputs.size() != 1 || q.attrs.count("output_dtype"))
    return std::nullopt;
  QuantParam p;
  if (ir::read_qdq_params(g, q, p) || !p.per_tensor() || (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
    return std::nullopt;
  return FoldedQuantize{std::move(p)};
}

// A node whose float32 output v is read only by a foldable QuantizeLinear (v not kept).
struct QuantizedOutput {
  int producer = -1, quantize = -1;
  FoldedQuantize q;
};

std::optional<QuantizedOutput> sole_quantize_reader(const Rewriter& rw, int producer) {
  const int reader = rw.sole_reader(rw.node(producer).outputs[0]);
  if (reader < 0) return std::nullopt;
  const std::optional<FoldedQuantize> q = foldable_quantize(rw.graph(), rw.node(reader));
  if (!q) return std::nullopt;
  return QuantizedOutput{producer, reader, *q};
}

// After the residual fusion: an INT8 QConv with a fused residual Add whose float32 result is read
// only by a per-tensor QuantizeLinear takes that Q's parameters and output, so it writes the 8-bit
// tensor itself (the QConv kernel adds the float32 addend in its epilogue) instead of a float32
// tensor that a separate pass quantizes. The QConv moves to the Q's place.
std::optional<QuantizedOutput> select_residual_qconv_quantize(const Rewriter& rw, int i) {
  const ir::Node& conv = rw.node(i);
  if (conv.op_type != int8::kQConv || conv.domain != ir::kSlimquantDomain || !fused_ops::has_residual_addend(conv) ||
      conv.outputs.size() != 1 || conv.attr_int(int8::attr::kYType, 1) != 1)
    return std::nullopt;
  return sole_quantize_reader(rw, i);
}

void fold_quantize_into_residual_qconv(Rewriter& rw, const QuantizedOutput& m) {
  ir::Node fused = rw.node(m.producer);
  int8::QLinearAttrs q = int8::QLinearAttrs::parse(fused);
  q.y = m.q;
  q.write(fused);
  fused.outputs[0] = rw.node(m.quantize).outputs[0];
  rw.remove(m.producer);
  rw.replace(m.quantize, std::move(fused));  // after the Q's place every value it reads exists
}

// Add / Sub / Mul / Div whose float32 result is read only by a per-tensor QuantizeLinear compute
// each row and quantize it while it is in cache (the elementwise kernel reads the
// folded_quantize_* attributes), instead of writing float32 for a separate pass to read back: e.g.
// the squeeze-excitation scaling x * s -> Q of EfficientNet and MobileNetV3 blocks.
std::optional<QuantizedOutput> select_elementwise_quantize(const Rewriter& rw, int i) {
  const ir::Node& op = rw.node(i);
  const bool arithmetic = is_binary_arithmetic(op);
  if (!arithmetic || !op.domain.empty() || !has_binary_operands(op) || op.outputs.size() != 1) return std::nullopt;
  return sole_quantize_reader(rw, i);
}

void fold_quantize_into_elementwise(Rewriter& rw, const QuantizedOutput& m) {
  ir::Node op = rw.node(m.producer);
  write_folded_quantize(op, m.q);
  op.outputs[0] = rw.node(m.quantize).outputs[0];
  rw.remove(m.quantize);
  rw.replace(m.producer, std::move(op));
}

// For transformer MLPs: MatMul(a, W) -> Add(b [N]) becomes a MatMul with a bias (a 3rd input its
// kernel reads), and an erf GELU after it its fused activation. One pass instead of six.
struct MatMulBias {
  int matmul = -1;
  std::string bias, output;
  std::vector<int> absorbed;  // the Add, then the GELU chain if any
  bool gelu = false;
};

std::optional<MatMulBias> select_matmul_bias(const Rewriter& rw, int i) {
  const ir::Graph& g = rw.graph();
  const ir::Node& mm = rw.node(i);
  if (!ir::is_onnx_op(mm, "MatMul") || mm.inputs.size() != 2 ||
      !fused_ops::FusedActivation::parse(mm).empty())  // a fused Scale comes after the product: no bias before it
    return std::nullopt;
  const Tensor* w = g.initializer(mm.inputs[1]);
  if (!w || w->rank() != 2 || w->dtype() != DType::kFloat32) return std::nullopt;
  // Any rank of A: with one 2-D B the kernel folds A's leading dims into M (a 1-D A is one row), and
  // an [N] bias adds to the last axis of A x W whatever its rank, as the Add broadcasts it. Exports
  // often carry no shapes for A (torchvision's ViT), so none is asked for.
  const int add = rw.sole_reader(mm.outputs[0]);
  if (add < 0) return std::nullopt;
  const ir::Node& an = rw.node(add);
  const std::string b = ir::is_onnx_op(an, "Add") ? ir::other_input(an, mm.outputs[0]) : "";
  const Tensor* bias = b.empty() ? nullptr : g.initializer(b);
  if (!bias || bias->rank() != 1 || bias->dim(0) != w->dim(1) || bias->dtype() != DType::kFloat32)
    return std::nullopt;
  MatMulBias m{i, b, an.outputs[0], {add}};
  std::string gelu_out;
  if (auto gelu = ir::match_erf_gelu(rw, m.output, gelu_out); !gelu.empty()) {
    m.gelu = true;
    m.output = gelu_out;
    m.absorbed.insert(m.absorbed.end(), gelu.begin(), gelu.end());
  }
  return m;
}

void fuse_matmul_bias(Rewriter& rw, const MatMulBias& m) {
  ir::Node mm = rw.node(m.matmul);
  mm.inputs.push_back(m.bias);
  if (m.gelu) fused_ops::FusedActivation{fused_ops::Activation::kGelu}.write(mm);
  mm.outputs[0] = m.output;
  for (int n : m.absorbed) rw.remove(n);
  rw.replace(m.matmul, std::move(mm));
}

// Any other erf GELU (after a QMatMul, an Add, ...) becomes one Gelu node (kGeluDomain, oneDNN's
// JIT gelu_erf), anchored at its Div.
struct ErfGelu {
  std::vector<int> nodes;  // div, erf, add, mul, mul
  std::string x, output;
};

std::optional<ErfGelu> select_erf_gelu(const Rewriter& rw, int i) {
  if (rw.node(i).op_type != "Div" || rw.node(i).inputs.empty()) return std::nullopt;
  ErfGelu m;
  m.x = rw.node(i).inputs[0];
  m.nodes = ir::match_erf_gelu(rw, m.x, m.output);
  if (m.nodes.empty()) return std::nullopt;
  return m;
}

void fuse_erf_gelu(Rewriter& rw, const ErfGelu& m) {
  ir::Node node;
  node.op_type = "Gelu";
  node.domain = dnnl_kernels::kGeluDomain;
  node.name = rw.node(m.nodes.back()).name;
  node.inputs = {m.x};
  node.outputs = {m.output};
  // Every pattern node reads only x and constants: the earliest position is valid for all.
  const int first = *std::min_element(m.nodes.begin(), m.nodes.end());
  for (int n : m.nodes)
    if (n != first) rw.remove(n);
  rw.replace(first, std::move(node));
}

}  // namespace

std::vector<ir::Rule> execution_fusion_rules() {
  // Hard-swish written as x * HardSigmoid(x) and swish as x * Sigmoid(x): one node each, which the
  // activation fusion then puts into the producing Conv.
  std::vector<ir::Rule> rules = ir::execution_merge_rules();
  std::vector<ir::Rule> fusions = {
      // First: fold_scaling_into_elementwise would take the chain's per-channel scale Mul.
      dynamic_matmul_fusion_rule(),
      qb4w_matmul_fusion_rule(),  // early: it takes only a plain MatMul / Gemm
      ir::make_rule<ActivationFusion>("fuse_activation", select_activation, fuse_activation),
      ir::make_rule<ResidualAdd>("fuse_residual_add", select_residual_add, fuse_residual_add),
      ir::make_rule<QuantizedOutput>("fold_quantize_into_residual_qconv", select_residual_qconv_quantize,
                                     fold_quantize_into_residual_qconv),
      ir::make_rule<MatMulBias>("fuse_matmul_bias", select_matmul_bias, fuse_matmul_bias),
      ir::make_rule<ErfGelu>("fuse_erf_gelu", select_erf_gelu, fuse_erf_gelu),
      ir::make_rule<QuantizedOutput>("fold_quantize_into_elementwise", select_elementwise_quantize,
                                     fold_quantize_into_elementwise),
      nearest_upsample_fusion_rule(),
      channel_quantize_fusion_rule(),
      scaled_operand_fusion_rule(),
      dequantize_fusion_rule(),
  };
  rules.insert(rules.end(), std::make_move_iterator(fusions.begin()), std::make_move_iterator(fusions.end()));
  return rules;
}

int fuse_activations(ir::Graph& g, const std::set<std::string>& keep) {
  static const std::vector<ir::Rule> rules = {
      ir::make_rule<ActivationFusion>("fuse_activation", select_activation, fuse_activation)};
  return ir::total(ir::apply_rules(g, rules, keep));
}

ir::RuleCounts apply_execution_fusions(ir::Graph& g, const std::set<std::string>& keep) {
  static const std::vector<ir::Rule> rules = execution_fusion_rules();
  return ir::apply_rules(g, rules, keep);
}

}  // namespace slimquant::runtime
