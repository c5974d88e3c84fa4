#include "slimquant/ir/qdq_params.h"

#include <cmath>

#include "slimquant/core/error.h"

namespace slimquant::ir {

namespace {

DType input_dtype(const Graph& g, const std::string& x, DType known) {
  if (known != DType::kUndefined) return known;
  if (const Tensor* t = g.initializer(x)) return t->dtype();
  if (const ValueInfo* vi = g.find_value_info(x)) return vi->dtype;
  return DType::kUndefined;
}

int64_t input_rank(const Graph& g, const std::string& x, int64_t known) {
  if (known >= 0) return known;
  if (const Tensor* t = g.initializer(x)) return static_cast<int64_t>(t->rank());
  if (const ValueInfo* vi = g.find_value_info(x); vi && vi->dims) return static_cast<int64_t>(vi->dims->size());
  return -1;
}

}  // namespace

std::optional<std::string> read_qdq_params(const Graph& g, const Node& n, QuantParam& out, QdqInputFacts facts) {
  const std::string who = n.describe();
  const bool quantize = n.op_type == "QuantizeLinear";
  if ((!quantize && n.op_type != "DequantizeLinear") || !n.domain.empty())
    return who + " is not a QuantizeLinear or DequantizeLinear";
  if (n.inputs.size() < 2 || n.input(1).empty()) return who + " has no scale input";
  QuantParam p;
  const Tensor* scale = g.initializer(n.input(1));
  if (!scale || scale->dtype() != DType::kFloat32) return "the scale of " + who + " is not a float32 constant";
  if (scale->rank() > 1) return "the scale of " + who + " has shape " + shape_str(scale->shape());
  if (scale->numel() == 0) return "the scale of " + who + " is empty";
  p.scale = scale->to_float_vector();
  for (float s : p.scale)
    if (!(s > 0.f) || !std::isfinite(s)) return who + " has a scale that is not positive and finite";
  p.zero_point.assign(p.scale.size(), 0);
  if (const std::string& zp_name = n.input(2); !zp_name.empty()) {
    const Tensor* zp = g.initializer(zp_name);
    if (!zp) return "the zero point of " + who + " is not a constant";
    if (zp->numel() != static_cast<int64_t>(p.scale.size()))
      return "the zero point of " + who + " has " + std::to_string(zp->numel()) + " values for " +
             std::to_string(p.scale.size()) + " scales";
    const auto v = zp->to_int64_vector();
    for (size_t i = 0; i < v.size(); ++i) p.zero_point[i] = static_cast<int32_t>(v[i]);
    p.dtype = zp->dtype();
  } else if (quantize) {
    p.dtype = n.has_attr("output_dtype") ? static_cast<DType>(n.attr_int("output_dtype", 2)) : DType::kUInt8;
  } else {
    p.dtype = input_dtype(g, n.input(0), facts.dtype);
    if (p.dtype == DType::kUndefined) return "the integer type of " + who + "'s input is unknown";
  }
  if (p.scale.size() > 1) {
    const int64_t r = input_rank(g, n.input(0), facts.rank);
    if (r < 0) return "the rank of " + who + "'s input is unknown";
    const int64_t axis = n.attr_int("axis", 1);
    if (axis < -r || axis >= r) return who + " has axis " + std::to_string(axis) + " for rank " + std::to_string(r);
    p.axis = axis < 0 ? axis + r : axis;
  }
  out = std::move(p);
  return std::nullopt;
}

QuantParam qdq_params(const Graph& g, const Node& n, QdqInputFacts facts) {
  QuantParam p;
  if (std::optional<std::string> why = read_qdq_params(g, n, p, facts)) fail(ErrorKind::kInvalidModel, *why);
  return p;
}

}  // namespace slimquant::ir
