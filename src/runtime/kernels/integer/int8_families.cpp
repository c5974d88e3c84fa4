// The fused INT8 families (domain com.slimquant) that INT8 lowering produces, one place each: the
// kernel's factory declaration, registration (layouts, folds) and the op's ONNX schema. A new family
// adds its kernel file (which defines the factory), its entry here, and its lowering (quant/lowering:
// the family table names the fused op; LoweringFamilies.EveryFusedOpHasAKernelAndASchema checks that
// the names agree; docs/rewrites.md).
//
// The schemas let ONNX type and shape inference run through lowered graphs: without them inference stops at the first fused node (and the Shape
// chains behind it cannot be folded), and ONNX 1.12's data propagation crashes on a Shape reading a
// value of unknown type. Also documents the ops for anyone loading an exported lowered model.
#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>

#include <algorithm>
#include <mutex>

#include "runtime/fused_ops/matmul_qb4w.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime::int8 {

// The factories, one kernel file each.
std::unique_ptr<Kernel> make_qconv(const KernelInit& init);    // int8_conv.cpp
std::unique_ptr<Kernel> make_qgemm(const KernelInit& init);    // int8_matmul.cpp
std::unique_ptr<Kernel> make_qmatmul(const KernelInit& init);  // int8_matmul.cpp

namespace {

using onnx::AttributeProto;
using onnx::InferenceContext;
using onnx::OpSchema;
using onnx::TensorShapeProto;

void output_type(InferenceContext& ctx) {
  const auto* a = ctx.getAttribute(attr::kYType);
  onnx::updateOutputElemType(ctx, 0, a && a->has_i() ? static_cast<int32_t>(a->i()) : onnx::TensorProto::FLOAT);
}

std::vector<int64_t> ints(InferenceContext& ctx, const char* name) {
  const auto* a = ctx.getAttribute(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

void qconv_inference(InferenceContext& ctx) {
  output_type(ctx);
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 1)) return;
  const TensorShapeProto& x = onnx::getInputShape(ctx, 0);
  const TensorShapeProto& w = onnx::getInputShape(ctx, 1);
  const int rank = x.dim_size();
  if (rank < 3 || w.dim_size() != rank) return;
  const size_t sp = static_cast<size_t>(rank - 2);
  auto strides = ints(ctx, "strides"), dilations = ints(ctx, "dilations"), pads = ints(ctx, "pads");
  strides.resize(sp, 1);
  dilations.resize(sp, 1);
  pads.resize(2 * sp, 0);
  const auto* ap = ctx.getAttribute("auto_pad");
  const std::string auto_pad = ap && ap->has_s() ? ap->s() : "NOTSET";
  TensorShapeProto out;
  *out.add_dim() = x.dim(0);
  *out.add_dim() = w.dim(0);
  for (size_t i = 0; i < sp; ++i) {
    auto* d = out.add_dim();
    const auto& in = x.dim(static_cast<int>(i + 2));
    const auto& k = w.dim(static_cast<int>(i + 2));
    if (!in.has_dim_value() || !k.has_dim_value()) continue;  // unknown: leave the dim symbolic
    const int64_t ext = (k.dim_value() - 1) * dilations[i] + 1, s = strides[i], n = in.dim_value();
    int64_t o;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") o = (n + s - 1) / s;
    else if (auto_pad == "VALID") o = (n - ext) / s + 1;
    else o = (n + pads[i] + pads[i + sp] - ext) / s + 1;
    d->set_dim_value(o);
  }
  onnx::updateOutputShape(ctx, 0, out);
}

void qgemm_inference(InferenceContext& ctx) {
  output_type(ctx);
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 1)) return;
  const TensorShapeProto& x = onnx::getInputShape(ctx, 0);
  const TensorShapeProto& w = onnx::getInputShape(ctx, 1);
  if (x.dim_size() != 2 || w.dim_size() != 2) return;
  const bool ta = onnx::getAttribute(ctx, "transA", 0) != 0, tb = onnx::getAttribute(ctx, "transB", 0) != 0;
  TensorShapeProto out;
  *out.add_dim() = x.dim(ta ? 1 : 0);
  *out.add_dim() = w.dim(tb ? 0 : 1);
  onnx::updateOutputShape(ctx, 0, out);
}

// numpy MatMul shapes: broadcast batch dims + [M, N] (a rank-2 w_q keeps all leading dims of x).
void qmatmul_inference(InferenceContext& ctx) {
  output_type(ctx);
  if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 1)) return;
  const TensorShapeProto& x = onnx::getInputShape(ctx, 0);
  const TensorShapeProto& w = onnx::getInputShape(ctx, 1);
  if (x.dim_size() < 2 || w.dim_size() < 2) return;
  const int xb = x.dim_size() - 2, wb = w.dim_size() - 2, batch = std::max(xb, wb);
  TensorShapeProto out;
  for (int i = 0; i < batch; ++i) {
    const int xi = i - (batch - xb), wi = i - (batch - wb);
    auto* d = out.add_dim();
    if (xi < 0) *d = w.dim(wi);
    else if (wi < 0) *d = x.dim(xi);
    else if (x.dim(xi).has_dim_value() && x.dim(xi).dim_value() == 1) *d = w.dim(wi);
    else if (w.dim(wi).has_dim_value() && w.dim(wi).dim_value() == 1) *d = x.dim(xi);
    else if (x.dim(xi).has_dim_value() && w.dim(wi).has_dim_value()) *d = x.dim(xi);
    // otherwise unknown: left symbolic
  }
  *out.add_dim() = x.dim(x.dim_size() - 2);
  *out.add_dim() = w.dim(w.dim_size() - 1);
  onnx::updateOutputShape(ctx, 0, out);
}

OpSchema base_schema(const char* name, const char* doc, const char* bias_name) {
  OpSchema s;
  s.SetName(name)
      .SetDomain(kDomain)
      .SinceVersion(1)
      .SetDoc(doc)
      .Input(0, "x_q", "uint8/int8 activation, quantized per tensor", "T1")
      .Input(1, "w_q", "int8 weight, zero point 0, per tensor or per output channel (QMatMul: or a run-time s8 tensor)", "T2")
      .Input(2, bias_name, "float32 bias, one value per output channel", "T3", OpSchema::Optional)
      .Output(0, "y", "y_q (uint8/int8, per tensor) or float32, as y_type says", "T4")
      .TypeConstraint("T1", {"tensor(uint8)", "tensor(int8)"}, "activation type")
      .TypeConstraint("T2", {"tensor(int8)"}, "weight type")
      .TypeConstraint("T3", {"tensor(float)"}, "bias type")
      .TypeConstraint("T4", {"tensor(uint8)", "tensor(int8)", "tensor(float)"}, "output type")
      .Attr(attr::kXScale, "scale of x_q", AttributeProto::FLOAT)
      .Attr(attr::kXZeroPoint, "zero point of x_q", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr(attr::kWScale, "weight scales (1 or one per output channel)", AttributeProto::FLOATS)
      .Attr(attr::kYType, "TensorProto type of y: 1 float, 2 uint8, 3 int8", AttributeProto::INT, static_cast<int64_t>(1))
      .Attr(attr::kYScale, "scale of y_q (quantized y only)", AttributeProto::FLOAT, false)
      .Attr(attr::kYZeroPoint, "zero point of y_q", AttributeProto::INT, static_cast<int64_t>(0))
      .Attr(attr::kYChannelScale, "QConv: scales of y_q per output channel (y_scale 1, y_zero_point 0)",
            AttributeProto::FLOATS, false)
      .Attr(attr::kActivation,
            "fused activation: Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Elu, Swish or Gelu (erf)",
            AttributeProto::STRING, false)
      .Attr(attr::kActivationMin, "Clip's min", AttributeProto::FLOAT, false)
      .Attr(attr::kActivationMax, "Clip's max", AttributeProto::FLOAT, false)
      .Attr(attr::kActivationAlpha, "LeakyRelu / HardSigmoid / Elu / Swish alpha", AttributeProto::FLOAT, false)
      .Attr(attr::kActivationBeta, "HardSigmoid beta", AttributeProto::FLOAT, false)
      .Attr(attr::kCompute, "auto, int8 or f32 (how the products are accumulated)", AttributeProto::STRING, false);
  return s;
}

void register_int8_onnx_schemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& domains = onnx::OpSchemaRegistry::DomainToVersionRange::Instance();
    if (!domains.Map().count(kDomain)) domains.AddDomainToVersion(kDomain, 1, 1);
    if (onnx::OpSchemaRegistry::Schema(kQConv, 1, kDomain)) return;  // registered by another copy

    OpSchema conv = base_schema(kQConv, "Conv on integers; see slimquant docs/int8_execution.md", "B");
    conv.Attr("auto_pad", "as Conv", AttributeProto::STRING, std::string("NOTSET"))
        .Attr("dilations", "as Conv", AttributeProto::INTS, false)
        .Attr("group", "as Conv", AttributeProto::INT, static_cast<int64_t>(1))
        .Attr("kernel_shape", "as Conv", AttributeProto::INTS, false)
        .Attr("pads", "as Conv", AttributeProto::INTS, false)
        .Attr("strides", "as Conv", AttributeProto::INTS, false)
        .TypeAndShapeInferenceFunction(qconv_inference);
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce register_conv(conv);

    OpSchema gemm = base_schema(kQGemm, "Gemm on integers; see slimquant docs/int8_execution.md", "C");
    gemm.Attr("alpha", "as Gemm", AttributeProto::FLOAT, 1.f)
        .Attr("beta", "as Gemm", AttributeProto::FLOAT, 1.f)
        .Attr("transA", "as Gemm", AttributeProto::INT, static_cast<int64_t>(0))
        .Attr("transB", "as Gemm", AttributeProto::INT, static_cast<int64_t>(0))
        .TypeAndShapeInferenceFunction(qgemm_inference);
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce register_gemm(gemm);

    OpSchema matmul = base_schema(kQMatMul, "MatMul (+ bias Add) on integers; see slimquant docs/int8_execution.md", "B");
    matmul.TypeAndShapeInferenceFunction(qmatmul_inference);
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce register_matmul(matmul);

    OpSchema swish;
    swish.SetName(kSwish)
        .SetDomain(kDomain)
        .SinceVersion(1)
        .SetDoc("x * sigmoid(alpha * x): SiLU as exporters write it, Mul(x, Sigmoid(x)), merged into one node "
                "for execution (ir::merge_swish)")
        .Input(0, "X", "input", "T")
        .Output(0, "Y", "output", "T")
        .TypeConstraint("T", {"tensor(float)"}, "float32")
        .Attr("alpha", "slope inside the sigmoid", AttributeProto::FLOAT, 1.f)
        .TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce register_swish(swish);
  });
}

}  // namespace
}  // namespace slimquant::runtime::int8

namespace slimquant::runtime {
namespace {

// A QConv with a float32 output (a residual sum added after it, in real units) takes the
// QuantizeLinear after it; one whose output is already 8-bit has nothing left to quantize.
bool qconv_refuses(const ir::Node& n, Fold fold, int /*input*/) {
  return fold == Fold::kTensorQuantize && n.attr_int(int8::attr::kYType, 1) != static_cast<int64_t>(DType::kFloat32);
}
constexpr KernelFolds kQConvFolds{.tensor_quantize = true, .refuses = qconv_refuses};

}  // namespace

void register_int8_kernels(KernelRegistry& r) {
  int8::register_int8_onnx_schemas();
  r.add(int8::kQConv, int8::make_qconv, int8::kDomain, layouts::kQuantizedConvolution, kQConvFolds);
  r.add(int8::kQGemm, int8::make_qgemm, int8::kDomain);
  r.add(int8::kQMatMul, int8::make_qmatmul, int8::kDomain);
  r.add(fused_ops::kMatMulQb4w, fused_ops::make_matmul_f32_qb4w, fused_ops::kMatMulQb4wDomain);  // weight-only 4-bit
}

}  // namespace slimquant::runtime
