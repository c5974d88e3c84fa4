#include "runtime/fusions/execution_fusions.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fusions/declared_folds.h"
#include "runtime/fusions/dynamic_matmul_fusion.h"
#include "runtime/fusions/qb4w_matmul_fusion.h"
#include "runtime/fused_ops/residual_conv.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/ir/passes.h"

namespace slimquant::runtime {

namespace {

using ir::Rewriter;

// An activation that alone reads the output of a node whose kernel applies it (a float Conv,
// ConvTranspose, Gemm; a MatMul's scalar scale), with a scalar Mul and/or Add after it as the
// post affine map where the kernel declares one (Conv): fused_ops::FusedActivation.
ir::Rule activation_fold_rule() { return epilogue_fold_rule("fuse_activation", {Fold::kActivation, Fold::kPostAffine, Fold::kPostClamp}); }

bool same_known_shape(const ir::Graph& g, const std::string& a, const std::string& b) {
  const ir::ValueInfo *va = g.find_value_info(a), *vb = g.find_value_info(b);
  return va && vb && va->fully_known() && vb->fully_known() && va->shape() == vb->shape() &&
         va->dtype == DType::kFloat32 && vb->dtype == DType::kFloat32;
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

// Whether a QConv runs on oneDNN's int8 primitives (int8::resolve_compute for its constant weights).
bool computes_in_int8(const ir::Graph& g, const ir::Node& qconv) {
  const Tensor* w = qconv.inputs.size() > 1 ? g.initializer(qconv.inputs[1]) : nullptr;
  if (!w || w->dtype() != DType::kInt8) return false;
  return int8::resolve_compute(int8::parse_compute(qconv), int8::max_abs_int8(*w)) == int8::Compute::kInt8;
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
    if (conv.inputs.size() > 1 && !rw.graph().is_initializer(conv.inputs[1])) continue;
    // An activation before the sum (x + silu(conv), YOLO's bottleneck; x + relu(conv), U-Net's
    // residual blocks) sends oneDNN 2.6's f32 AVX2 convolutions to the reference implementation,
    // hundreds of times slower (measured): the Add stays separate, unless the convolution is a
    // QConv computing on the int8 primitives, which take the activation then the sum. Not a QConv's
    // Swish: that runs in bands with an own pass (int8_conv_bands.h), worth more than the fused sum.
    const std::string qconv_activation = conv.attr_string(int8::attr::kActivation, "");
    const bool activation = !fused_ops::FusedActivation::parse(conv).empty() || !qconv_activation.empty();
    if (activation && !(qconv && qconv_activation != "Swish" && computes_in_int8(rw.graph(), conv))) continue;
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

// GlobalAveragePool(y) of a depthwise INT8 QConv's float32 y (a squeeze-excitation's pool)
// becomes the QConv's second output: the direct depthwise kernel sums each channel as it writes y,
// which saves the pool's pass over y (1.8 MB a sample at 56x56x144 in EfficientNet-B0).
struct ChannelMeans {
  int pool = -1, conv = -1;
};

std::optional<ChannelMeans> select_channel_means(const Rewriter& rw, int i) {
  const ir::Node& pool = rw.node(i);
  if (!ir::is_onnx_op(pool, "GlobalAveragePool") || pool.inputs.size() != 1 || pool.outputs.size() != 1 ||
      pool.attrs.size() != 0)
    return std::nullopt;
  const int p = rw.producer(pool.inputs[0]);
  if (p < 0) return std::nullopt;
  const ir::Node& conv = rw.node(p);
  if (conv.op_type != int8::kQConv || conv.domain != ir::kSlimquantDomain || conv.outputs.size() != 1 ||
      conv.outputs[0] != pool.inputs[0] || conv.inputs.size() > 3 || conv.attr_int(int8::attr::kYType, 1) != 1)
    return std::nullopt;
  const Tensor* w = conv.inputs.size() > 1 ? rw.graph().initializer(conv.inputs[1]) : nullptr;
  if (!w || w->rank() != 4 || w->dim(1) != 1 || conv.attr_int("group", 1) != w->dim(0)) return std::nullopt;
  return ChannelMeans{i, p};
}

void fuse_channel_means(Rewriter& rw, const ChannelMeans& m) {
  ir::Node conv = rw.node(m.conv);
  conv.outputs.push_back(rw.node(m.pool).outputs[0]);
  rw.remove(m.pool);
  rw.replace(m.conv, std::move(conv));
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
  // activation fold then puts into the producing Conv.
  std::vector<ir::Rule> rules = ir::execution_merge_rules();
  std::vector<ir::Rule> fusions = {
      // Before the MatMul folds: each part takes its own bias, activation and layout.
      ir::split_matmul_by_column_slices_rule(),
      // The scaled-input fold would take the chain's per-channel scale Mul.
      dynamic_matmul_fusion_rule(),
      qb4w_matmul_fusion_rule(),  // early: it takes only a plain MatMul / Gemm
      activation_fold_rule(),
      // After the activations: a Conv with its own activation keeps its Add apart (see above).
      ir::make_rule<ResidualAdd>("fuse_residual_add", select_residual_add, fuse_residual_add),
      ir::make_rule<MatMulBias>("fuse_matmul_bias", select_matmul_bias, fuse_matmul_bias),
      ir::make_rule<ErfGelu>("fuse_erf_gelu", select_erf_gelu, fuse_erf_gelu),
      gelu_range_rule(),  // after the GELU nodes exist
      // After the residual sums (a QConv's quantized sum) and the MatMul bias (whose Add it would take).
      epilogue_fold_rule("fold_output_quantize", {Fold::kTensorQuantize, Fold::kChannelQuantize}),
      epilogue_fold_rule("fold_transposed_output", {Fold::kTransposedOutput}),
      prologue_fold_rule("fold_upsampled_input", Fold::kUpsampledInput),
      prologue_fold_rule("fold_transposed_input", Fold::kTransposedInput),
      prologue_fold_rule("fold_scaled_input", Fold::kScaledInput),
      // Last: codes read under a scaled input (x + x * s of a squeeze-excitation), not under an upsampling.
      prologue_fold_rule("fold_dequantized_input", Fold::kDequantizedInput),
      // After the output folds: a QConv whose y they quantized keeps its pool apart.
      ir::make_rule<ChannelMeans>("fuse_channel_means", select_channel_means, fuse_channel_means),
  };
  rules.insert(rules.end(), std::make_move_iterator(fusions.begin()), std::make_move_iterator(fusions.end()));
  return rules;
}

int fuse_activations(ir::Graph& g, const std::set<std::string>& keep) {
  static const std::vector<ir::Rule> rules = {activation_fold_rule()};
  return ir::total(ir::apply_rules(g, rules, keep));
}

ir::RuleCounts apply_execution_fusions(ir::Graph& g, const std::set<std::string>& keep) {
  static const std::vector<ir::Rule> rules = execution_fusion_rules();
  return ir::apply_rules(g, rules, keep);
}

}  // namespace slimquant::runtime
