#include "runtime/fusions/scaled_operand_fusion.h"

#include <optional>

#include "runtime/kernels/elementwise/elementwise_common.h"

namespace slimquant::runtime {
namespace {

// v's shape, when known and v is float32 (or of any type: a result a folded Q made 8-bit).
bool known_shape(const ir::Graph& g, const std::string& v, Shape& shape, bool float32 = true) {
  const ir::ValueInfo* info = g.find_value_info(v);
  if (!info || !info->fully_known() || (float32 && info->dtype != DType::kFloat32)) return false;
  shape = info->shape();
  return true;
}

// A factor the elementwise kernel applies per (n, c) or to everything: [N|1, C|1, 1, 1] against
// x's [N, C, H, W] (numpy alignment: fewer dims are padded with leading 1s), or one element.
bool per_channel_factor(const Shape& s, const Shape& x) {
  if (x.size() != 4 || s.size() > 4) return false;
  Shape p(4 - s.size(), 1);
  p.insert(p.end(), s.begin(), s.end());
  return (p[0] == 1 || p[0] == x[0]) && (p[1] == 1 || p[1] == x[1]) && p[2] == 1 && p[3] == 1;
}

struct ScaledOperand {
  int op = -1, mul = -1, side = 0;
  std::string x, factor;
};

std::optional<ScaledOperand> select_scaled_operand(const ir::Rewriter& rw, int i) {
  const ir::Graph& g = rw.graph();
  const ir::Node& op = rw.node(i);
  if (!ir::is_onnx_op(op, "Add") && !ir::is_onnx_op(op, "Sub")) return std::nullopt;
  if (op.inputs.size() != 2 || op.outputs.size() != 1 || op.has_attr(ew::kScaledInput) || op.inputs[0] == op.inputs[1])
    return std::nullopt;
  const int upsampled = static_cast<int>(op.attr_int(ew::kNearestUpsampledInput, -1));
  Shape out;
  if (!known_shape(g, op.outputs[0], out, false)) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    if (side == upsampled) continue;
    const std::string& v = op.inputs[static_cast<size_t>(side)];
    const int m = rw.producer(v);
    if (m < 0 || rw.sole_reader(v, true) != i) continue;
    const ir::Node& mul = rw.node(m);
    if (!ir::is_onnx_op(mul, "Mul") || mul.inputs.size() != 2 || mul.outputs.size() != 1 || !mul.attrs.empty() ||
        mul.inputs[0] == mul.inputs[1])
      continue;
    for (size_t xi = 0; xi < 2; ++xi) {
      Shape x, s;
      if (!known_shape(g, mul.inputs[xi], x) || !known_shape(g, mul.inputs[1 - xi], s) || x != out ||
          !per_channel_factor(s, x))
        continue;
      return ScaledOperand{i, m, side, mul.inputs[xi], mul.inputs[1 - xi]};
    }
  }
  return std::nullopt;
}

void fold_scaled_operand(ir::Rewriter& rw, const ScaledOperand& m) {
  ir::Node op = rw.node(m.op);
  op.inputs[static_cast<size_t>(m.side)] = m.x;
  op.inputs.push_back(m.factor);
  op.attrs[ew::kScaledInput] = static_cast<int64_t>(m.side);
  rw.remove(m.mul);
  rw.replace(m.op, std::move(op));
}

}  // namespace

ir::Rule scaled_operand_fusion_rule() {
  return ir::make_rule<ScaledOperand>("fold_scaling_into_elementwise", select_scaled_operand, fold_scaled_operand);
}

}  // namespace slimquant::runtime
