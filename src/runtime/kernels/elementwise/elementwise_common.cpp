#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/fused_ops/fused_activation.h"

#include "runtime/kernels/elementwise/elementwise_math.h"

namespace slimquant::runtime::ew {

BroadcastPlan make_broadcast_plan(const Shape& out, const std::vector<const Shape*>& inputs,
                                  const std::string& who) {
  BroadcastPlan p;
  const size_t num = inputs.size();
  SQ_CHECK(num >= 1 && num <= kMaxInputs, ErrorKind::kInternal, who + ": bad broadcast input count");
  p.num_inputs = static_cast<int>(num);
  p.numel = shape_numel(out);
  const size_t rank = out.size();

  // Strides of each input over the output's dims (0 where it broadcasts or the dim is 1).
  std::array<std::vector<int64_t>, kMaxInputs> full;
  for (size_t k = 0; k < num; ++k) {
    const Shape& s = *inputs[k];
    if (s.size() > rank)
      fail(ErrorKind::kInvalidArgument, who + ": input " + std::to_string(k) + " of shape " +
                                            shape_str(s) + " cannot be broadcast to " + shape_str(out));
    full[k].assign(rank, 0);
    const size_t lead = rank - s.size();
    int64_t stride = 1;
    for (size_t j = s.size(); j-- > 0;) {
      const int64_t d = s[j], od = out[lead + j];
      if (d != od && d != 1)
        fail(ErrorKind::kInvalidArgument, who + ": input " + std::to_string(k) + " of shape " +
                                              shape_str(s) + " cannot be broadcast to " + shape_str(out));
      full[k][lead + j] = (d == 1) ? 0 : stride;
      stride *= d;
    }
  }

  // Drop unit dims and merge neighbours across which every input stays linear.
  for (size_t i = 0; i < rank; ++i) {
    const int64_t d = out[i];
    if (d == 1) continue;
    bool merge = !p.dims.empty();
    for (size_t k = 0; merge && k < num; ++k) merge = p.strides[k].back() == full[k][i] * d;
    if (merge) {
      p.dims.back() *= d;
      for (size_t k = 0; k < num; ++k) p.strides[k].back() = full[k][i];
    } else {
      p.dims.push_back(d);
      for (size_t k = 0; k < num; ++k) p.strides[k].push_back(full[k][i]);
    }
  }
  if (p.dims.empty()) {
    p.dims.push_back(1);
    for (size_t k = 0; k < num; ++k) p.strides[k].push_back(0);
  }
  return p;
}

Shape broadcast_all(const std::vector<const Shape*>& shapes, const std::string& who) {
  size_t rank = 0;
  for (const Shape* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (const Shape* s : shapes) {
    const size_t lead = rank - s->size();
    for (size_t j = 0; j < s->size(); ++j) {
      const int64_t d = (*s)[j];
      int64_t& o = out[lead + j];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string list;
      for (const Shape* t : shapes) list += (list.empty() ? "" : ", ") + shape_str(*t);
      fail(ErrorKind::kInvalidArgument, who + ": input shapes " + list + " cannot be broadcast together");
    }
  }
  return out;
}

std::string onnx_type_name(int64_t onnx_type) {
  static const char* kNames[] = {"undefined", "float32",   "uint8",      "int8",    "uint16",
                                 "int16",     "int32",     "int64",      "string",  "bool",
                                 "float16",   "float64",   "uint32",     "uint64",  "complex64",
                                 "complex128", "bfloat16"};
  if (onnx_type >= 0 && onnx_type <= 16) return kNames[onnx_type];
  return "type id " + std::to_string(onnx_type);
}

Activation resolve_fused_activation(const ir::Node& node) {
  const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node);
  Activation a;
  a.alpha = f.alpha;
  a.beta = f.beta;
  a.kind = f.kind;
  if (f.kind == Activation::Kind::kGelu || f.kind == Activation::Kind::kScale)
    fail(ErrorKind::kUnsupported, node.describe() + ": fused activation " + f.name() +
                                      " is not supported by elementwise kernels");
  return a;
}

void reject_fused_activation(const ir::Node& node) {
  if (const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node); !f.empty())
    fail(ErrorKind::kUnsupported, node.describe() + ": a fused " + std::string(f.name()) +
                                      " activation is not supported on " + node.op_type);
}

SQ_AVX512_AVX2_CLONES void apply_activation(const Activation& act, float* x, int64_t n) {
  const float a = act.alpha, b = act.beta;
  switch (act.kind) {
    case Activation::Kind::kNone: return;
    case Activation::Kind::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] > 0.f, x[i], 0.f);
      return;
    case Activation::Kind::kLeakyRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] < 0.f, x[i] * a, x[i]);
      return;
    case Activation::Kind::kClip:
      for (int64_t i = 0; i < n; ++i) x[i] = clamp_t(x[i], a, b);
      return;
    case Activation::Kind::kSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = sigmoid_t(x[i]);
      return;
    case Activation::Kind::kTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = tanh_f32(x[i]);
      return;
    case Activation::Kind::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = clamp_t(a * x[i] + b, 0.f, 1.f);
      return;
    case Activation::Kind::kHardSwish:
      for (int64_t i = 0; i < n; ++i) x[i] *= clamp_t(x[i] * (1.f / 6.f) + 0.5f, 0.f, 1.f);
      return;
    case Activation::Kind::kElu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] < 0.f, a * (exp_f32(x[i]) - 1.f), x[i]);
      return;
    case Activation::Kind::kSwish:
      for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid_t(a * x[i]);
      return;
    case Activation::Kind::kGelu:
    case Activation::Kind::kScale: return;  // refused by resolve_fused_activation
  }
}

}  // namespace slimquant::runtime::ew
