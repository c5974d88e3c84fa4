#include "runtime/fusions/dynamic_matmul_fusion.h"

#include <algorithm>
#include <optional>

#include "runtime/fused_ops/dynamic_matmul.h"
#include "runtime/fused_ops/gelu_erf.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/integer/int8_common.h"

namespace slimquant::runtime {
namespace {

struct DynamicMatMul {
  int quantize = -1, matmul = -1, cast = -1, scales = -1, scale = -1, bias_add = -1, residual_add = -1;
  std::string x, w, w_zero_point, w_scale, bias, residual, output;
  bool conv = false;
  // The DynamicQuantizeLinear's codes feed other readers too: the fused MatMul reads its codes,
  // scale and zero point (computed once) instead of quantizing x again.
  bool shared_codes = false;
};

// A float32 initializer of one or n values.
bool one_or_n_floats(const ir::Graph& g, const std::string& v, int64_t n) {
  const Tensor* t = g.initializer(v);
  return t && t->dtype() == DType::kFloat32 && (t->numel() == 1 || t->numel() == n);
}

// One value, or n along axis 1 of a rank-4 output ([n, 1, 1] or [1, n, 1, 1]).
bool per_output_channel(const ir::Graph& g, const std::string& v, int64_t n) {
  const Tensor* t = g.initializer(v);
  if (!t) return false;
  if (t->numel() == 1) return true;
  return t->rank() >= 3 && t->rank() <= 4 && t->dim(t->rank() - 3) == n && t->numel() == n;
}

// One value, or n along the last axis ([n] or [1, n]).
bool per_column(const ir::Graph& g, const std::string& v, int64_t n) {
  const Tensor* t = g.initializer(v);
  if (!t) return false;
  return t->numel() == 1 || (t->rank() <= 2 && t->shape().back() == n && t->numel() == n);
}

std::optional<DynamicMatMul> select_dynamic_matmul(const ir::Rewriter& rw, int i) {
  const ir::Graph& g = rw.graph();
  const ir::Node& mm = rw.node(i);
  // The fused convolution runs on oneDNN's int8 primitive alone, exact with VNNI only (the
  // unfused ConvInteger is exact everywhere).
  const bool conv = ir::is_onnx_op(mm, "ConvInteger") && int8::cpu_has_exact_int8_dot();
  if ((!conv && !ir::is_onnx_op(mm, "MatMulInteger")) || mm.inputs.size() < 3 || mm.outputs.size() != 1)
    return std::nullopt;
  DynamicMatMul m;
  m.conv = conv;
  m.matmul = i;
  // x_q and z_x from one DynamicQuantizeLinear.
  m.quantize = rw.producer(mm.inputs[0]);
  if (m.quantize < 0) return std::nullopt;
  const ir::Node& dq = rw.node(m.quantize);
  if (!ir::is_onnx_op(dq, "DynamicQuantizeLinear") || dq.outputs.size() != 3 || mm.inputs[2] != dq.outputs[2] ||
      !rw.is_private(dq.outputs[0]))
    return std::nullopt;
  m.x = dq.inputs[0];
  m.shared_codes = !conv && rw.readers(dq.outputs[0]).size() > 1;
  // Constant symmetric s8 weights [K, N].
  m.w = mm.inputs[1];
  const Tensor* w = g.initializer(m.w);
  if (!w || w->rank() != (conv ? 4u : 2u)) return std::nullopt;
  const int64_t n = conv ? w->dim(0) : w->dim(1);
  m.w_zero_point = mm.input(3);
  const Tensor* zp = m.w_zero_point.empty() ? nullptr : g.initializer(m.w_zero_point);
  if (!m.w_zero_point.empty() && (!zp || zp->dtype() != w->dtype())) return std::nullopt;
  if (w->dtype() == DType::kInt8) {  // symmetric: zero points 0
    if (zp && zp->numel() != 1 && zp->numel() != n) return std::nullopt;
    if (zp)
      for (int8_t z : zp->values<int8_t>())
        if (z != 0) return std::nullopt;
  } else if (!conv || w->dtype() != DType::kUInt8 || !zp || zp->numel() != 1 || zp->data<uint8_t>()[0] != 128) {
    return std::nullopt;  // u8 weights: only the exporter's s8 + 128 form
  }
  // Cast to float, then the scale Mul by S = Mul(s_x, w_scale).
  m.cast = rw.sole_reader_op(mm.outputs[0], "Cast");
  if (m.cast < 0 || rw.node(m.cast).attr_int("to", 0) != 1) return std::nullopt;
  const std::string& accf = rw.node(m.cast).outputs[0];
  m.scale = rw.sole_reader_op(accf, "Mul");
  if (m.scale < 0 || rw.node(m.scale).inputs.size() != 2) return std::nullopt;
  const std::string s = ir::other_input(rw.node(m.scale), accf);
  m.scales = rw.producer(s);
  if (s.empty() || m.scales < 0 || rw.sole_reader(s) != m.scale) return std::nullopt;
  const ir::Node& sm = rw.node(m.scales);
  if (!ir::is_onnx_op(sm, "Mul") || sm.inputs.size() != 2) return std::nullopt;
  m.w_scale = ir::other_input(sm, dq.outputs[1]);
  if (m.w_scale.empty() || !one_or_n_floats(g, m.w_scale, n) ||
      !(conv ? per_output_channel(g, m.w_scale, n) : per_column(g, m.w_scale, n)))
    return std::nullopt;
  m.output = rw.node(m.scale).outputs[0];
  // An Add of a per-column constant.
  const int add = rw.sole_reader_op(m.output, "Add");
  if (add >= 0 && rw.node(add).inputs.size() == 2) {
    const std::string b = ir::other_input(rw.node(add), m.output);
    if (one_or_n_floats(g, b, n) && (conv ? per_output_channel(g, b, n) : per_column(g, b, n))) {
      m.bias_add = add;
      m.bias = b;
      m.output = rw.node(add).outputs[0];
    }
  }
  // Then the Add of a value of the output's own (known) shape: a transformer's skip connection,
  // added in the kernel's epilogue pass.
  const int residual_add = conv ? -1 : rw.sole_reader_op(m.output, "Add");
  if (residual_add >= 0 && rw.node(residual_add).inputs.size() == 2) {
    const std::string r = ir::other_input(rw.node(residual_add), m.output);
    const ir::ValueInfo* vr = r.empty() ? nullptr : g.find_value_info(r);
    const ir::ValueInfo* vy = g.find_value_info(m.output);
    if (vr && vy && r != m.output && !g.is_initializer(r) && vr->fully_known() && vy->fully_known() &&
        vr->dtype == DType::kFloat32 && vr->shape() == vy->shape()) {
      m.residual_add = residual_add;
      m.residual = r;
      m.output = rw.node(residual_add).outputs[0];
    }
  }
  return m;
}

void fuse_dynamic_matmul(ir::Rewriter& rw, const DynamicMatMul& m) {
  ir::Node fused;
  fused.op_type = m.conv ? fused_ops::kDynamicConv : fused_ops::kDynamicMatMul;
  if (m.conv) fused.attrs = rw.node(m.matmul).attrs;
  fused.domain = fused_ops::kDynamicMatMulDomain;
  fused.name = rw.node(m.matmul).name;
  const ir::Node& dq = rw.node(m.quantize);
  if (m.shared_codes) fused.inputs = {dq.outputs[0], m.w, m.w_zero_point, m.w_scale, m.bias, dq.outputs[1], dq.outputs[2]};
  else fused.inputs = {m.x, m.w, m.w_zero_point, m.w_scale, m.bias};
  if (!m.residual.empty()) {
    fused.inputs.resize(fused_ops::kDynamicResidual);
    fused.inputs.push_back(m.residual);
  }
  fused.outputs = {m.output};
  // At the last node's place: everything it reads (the residual included) exists there.
  const int last = m.residual_add >= 0 ? m.residual_add : m.bias_add >= 0 ? m.bias_add : m.scale;
  for (int n : {m.matmul, m.cast, m.scales, m.scale, m.bias_add})
    if (n >= 0 && n != last) rw.remove(n);
  rw.replace(last, std::move(fused));
  // The DynamicQuantizeLinear goes when nothing reads it any more.
  bool read = false;
  for (const auto& v : rw.node(m.quantize).outputs) read |= !rw.readers(v).empty() || !rw.is_private(v);
  if (!read) rw.remove(m.quantize);
}

// A fused dynamic MatMul reading a float x that a GELU node alone writes (a transformer's second
// MLP product): the GELU pass hands over x's range as its second output (fused_ops::kDynamicXRange),
// and the MatMul skips its own scan of x. Only where the GELU runs as the AVX-512 pass, which takes
// the range in the same pass.
struct GeluRange {
  int gelu = -1, matmul = -1;
};

std::optional<GeluRange> select_gelu_range(const ir::Rewriter& rw, int i) {
  const ir::Node& mm = rw.node(i);
  if (mm.domain != fused_ops::kDynamicMatMulDomain || mm.op_type != fused_ops::kDynamicMatMul || mm.inputs.empty() ||
      !mm.input(fused_ops::kDynamicXScale).empty() || !mm.input(fused_ops::kDynamicXRange).empty() ||
      !ew::gelu_pass_available())
    return std::nullopt;
  const int g = rw.producer(mm.inputs[0]);
  if (g < 0) return std::nullopt;
  const ir::Node& gelu = rw.node(g);
  if (gelu.op_type != "Gelu" || gelu.domain != dnnl_kernels::kGeluDomain || gelu.outputs.size() != 1 ||
      rw.sole_reader(gelu.outputs[0]) != i)
    return std::nullopt;
  return GeluRange{g, i};
}

void hand_over_gelu_range(ir::Rewriter& rw, const GeluRange& m) {
  ir::Node gelu = rw.node(m.gelu);
  const std::string range = rw.graph().unique_value_name(gelu.outputs[0] + "_range");
  gelu.outputs.push_back(range);
  ir::Node mm = rw.node(m.matmul);
  mm.inputs.resize(std::max(mm.inputs.size(), size_t{fused_ops::kDynamicXRange + 1}));
  mm.inputs[fused_ops::kDynamicXRange] = range;
  rw.replace(m.gelu, std::move(gelu));
  rw.replace(m.matmul, std::move(mm));
}

}  // namespace

ir::Rule dynamic_matmul_fusion_rule() {
  return ir::make_rule<DynamicMatMul>("fuse_dynamic_matmul", select_dynamic_matmul, fuse_dynamic_matmul);
}

ir::Rule gelu_range_rule() {
  return ir::make_rule<GeluRange>("hand_over_gelu_range", select_gelu_range, hand_over_gelu_range);
}

}  // namespace slimquant::runtime
