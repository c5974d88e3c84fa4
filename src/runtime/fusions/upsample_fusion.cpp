#include "runtime/fusions/upsample_fusion.h"

#include <cmath>
#include <optional>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise/elementwise_common.h"

namespace slimquant::runtime {
namespace {

using ew::kNearestUpsampledInput;
using ew::kNearestUpsampleFactors;

// The integer factors {kh, kw} of a Resize that repeats each element of a rank-4 value kh x kw
// times (nearest, asymmetric, floor, constant scales {1, 1, kh, kw}), or {} otherwise.
std::vector<int64_t> nearest_upsample_factors(const ir::Graph& g, const ir::Node& resize) {
  if (resize.op_type != "Resize" || !resize.domain.empty() || g.opset < 11 || resize.inputs.size() < 3 ||
      resize.outputs.size() != 1 || !resize.input(3).empty())
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

bool known_shape(const ir::Graph& g, const std::string& v, Shape& shape) {
  const ir::ValueInfo* info = g.find_value_info(v);
  if (!info || !info->fully_known() || info->dtype != DType::kFloat32) return false;
  shape = info->shape();
  return true;
}

// An elementwise op reading, on `side`, a nearest integer-factor Resize that it alone reads.
struct UpsampledOperand {
  int op = -1, resize = -1, side = 0;
  std::vector<int64_t> factors;
};

std::optional<UpsampledOperand> select_upsampled_operand(const ir::Rewriter& rw, int i) {
  const ir::Graph& g = rw.graph();
  const ir::Node& op = rw.node(i);
  const bool arithmetic = is_binary_arithmetic(op);
  if (!arithmetic || !op.domain.empty() || op.inputs.size() != 2 || op.outputs.size() != 1 ||
      op.has_attr(kNearestUpsampledInput) || op.inputs[0] == op.inputs[1])
    return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const std::string& up = op.inputs[side];
    const int p = rw.producer(up);
    if (p < 0 || rw.sole_reader(up) < 0) continue;  // not kept, not a graph output, read by op alone
    const ir::Node& resize = rw.node(p);
    const std::vector<int64_t> factors = nearest_upsample_factors(g, resize);
    Shape source, upsampled, other;
    if (factors.empty() || !known_shape(g, resize.inputs[0], source) || !known_shape(g, up, upsampled) ||
        !known_shape(g, op.inputs[1 - side], other) || source.size() != 4 || other != upsampled ||
        upsampled[0] != source[0] || upsampled[1] != source[1] || upsampled[2] != source[2] * factors[0] ||
        upsampled[3] != source[3] * factors[1])
      continue;
    return UpsampledOperand{i, p, side, factors};
  }
  return std::nullopt;
}

void fold_nearest_upsample(ir::Rewriter& rw, const UpsampledOperand& m) {
  ir::Node op = rw.node(m.op);
  op.inputs[static_cast<size_t>(m.side)] = rw.node(m.resize).inputs[0];
  op.attrs[kNearestUpsampledInput] = static_cast<int64_t>(m.side);
  op.attrs[kNearestUpsampleFactors] = m.factors;
  rw.remove(m.resize);
  rw.replace(m.op, std::move(op));
}

}  // namespace

ir::Rule nearest_upsample_fusion_rule() {
  return ir::make_rule<UpsampledOperand>("fold_nearest_upsample_into_elementwise", select_upsampled_operand,
                                         fold_nearest_upsample);
}

}  // namespace slimquant::runtime
