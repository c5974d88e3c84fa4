#include "runtime/fusions/qb4w_matmul_fusion.h"

#include <algorithm>
#include <optional>

#include "runtime/fused_ops/matmul_qb4w.h"

namespace slimquant::runtime {
namespace {

// The fusion's conditions on the DequantizeLinear and its reader, or -1: the weight's reduction
// axis otherwise.
int64_t qb4w_axis(const ir::Graph& g, const ir::Node& dq, const ir::Node& reader) {
  if (!ir::is_onnx_op(dq, "DequantizeLinear") || dq.outputs.size() != 1 || dq.inputs.size() < 2) return -1;
  const int64_t block = dq.attr_int("block_size", 0);
  if (block <= 0 || block % 32 != 0) return -1;
  const Tensor* codes = g.initializer(dq.inputs[0]);
  const Tensor* scales = g.initializer(dq.inputs[1]);
  if (!codes || !scales || codes->dtype() != DType::kInt8 || codes->rank() != 2 || scales->dtype() != DType::kFloat32 ||
      scales->rank() != 2)
    return -1;
  if (dq.inputs.size() > 2 && !dq.inputs[2].empty()) {
    const Tensor* zp = g.initializer(dq.inputs[2]);
    if (!zp || zp->dtype() != DType::kInt8) return -1;
    const auto* z = zp->data<int8_t>();
    if (std::any_of(z, z + zp->numel(), [](int8_t v) { return v != 0; })) return -1;
  }
  const auto* c = codes->data<int8_t>();
  if (std::any_of(c, c + codes->numel(), [](int8_t v) { return v < -8 || v > 7; })) return -1;
  int64_t axis = dq.attr_int("axis", 1);
  if (axis < 0) axis += 2;
  if (axis != 0 && axis != 1) return -1;
  const int64_t k = codes->dim(axis), n = codes->dim(1 - axis), kb = (k + block - 1) / block;
  if (scales->shape() != (axis == 0 ? Shape{kb, n} : Shape{n, kb})) return -1;
  const std::string& v = dq.outputs[0];
  if (!reader.domain.empty() || reader.outputs.size() != 1 || reader.inputs.size() < 2 || reader.inputs[1] != v ||
      reader.inputs[0] == v)
    return -1;
  if (reader.op_type == "MatMul") return reader.inputs.size() == 2 && reader.attrs.empty() && axis == 0 ? axis : -1;
  if (reader.op_type != "Gemm") return -1;
  for (const auto& [key, value] : reader.attrs)
    if (key != "transA" && key != "transB" && key != "alpha" && key != "beta") return -1;
  if (reader.attr_int("transA", 0) != 0 || reader.attr_float("alpha", 1.f) != 1.f || reader.attr_float("beta", 1.f) != 1.f)
    return -1;
  if (axis != (reader.attr_int("transB", 0) != 0 ? 1 : 0)) return -1;
  if (reader.inputs.size() > 2 && !reader.inputs[2].empty()) {
    const Tensor* bias = g.initializer(reader.inputs[2]);
    if (!bias || bias->dtype() != DType::kFloat32 || bias->numel() != n || bias->rank() > 2) return -1;
    if (reader.inputs[2] == v) return -1;
  }
  return axis;
}

struct Qb4wMatMul {
  int dequantize = -1, reader = -1;
  int64_t axis = 0;
};

std::optional<Qb4wMatMul> select_qb4w(const ir::Rewriter& rw, int i) {
  const ir::Node& dq = rw.node(i);
  if (!ir::is_onnx_op(dq, "DequantizeLinear") || dq.outputs.size() != 1 || !rw.is_private(dq.outputs[0]))
    return std::nullopt;
  const std::vector<int> readers = rw.readers(dq.outputs[0]);
  if (readers.size() != 1) return std::nullopt;
  const int64_t axis = qb4w_axis(rw.graph(), dq, rw.node(readers[0]));
  if (axis < 0) return std::nullopt;
  return Qb4wMatMul{i, readers[0], axis};
}

void fold_qb4w(ir::Rewriter& rw, const Qb4wMatMul& m) {
  const ir::Node& dq = rw.node(m.dequantize);
  const ir::Node& reader = rw.node(m.reader);
  ir::Node fused;
  fused.op_type = fused_ops::kMatMulQb4w;
  fused.domain = fused_ops::kMatMulQb4wDomain;
  fused.name = reader.name;
  fused.inputs = {reader.inputs[0], dq.inputs[0], dq.inputs[1]};
  if (reader.op_type == "Gemm" && reader.inputs.size() > 2 && !reader.inputs[2].empty())
    fused.inputs.push_back(reader.inputs[2]);
  fused.outputs = reader.outputs;
  fused_ops::MatMulQb4wAttrs attrs;
  attrs.block_size = dq.attr_int("block_size", 0);
  attrs.weight_transposed = m.axis == 1;
  const auto compute = rw.graph().metadata.find(fused_ops::kInt4ActivationsKey);
  attrs.int8_activations = compute != rw.graph().metadata.end() && compute->second == "int8";
  attrs.write(fused);
  rw.replace(m.reader, std::move(fused));
  rw.remove(m.dequantize);
}

}  // namespace

ir::Rule qb4w_matmul_fusion_rule() {
  return ir::make_rule<Qb4wMatMul>("fold_blocked_dequantize_into_matmul", select_qb4w, fold_qb4w);
}

bool foldable_into_qb4w_matmul(const ir::Graph& g, const ir::Node& dq) {
  if (!ir::is_onnx_op(dq, "DequantizeLinear") || !dq.attrs.count("block_size") || dq.outputs.size() != 1) return false;
  const std::vector<int> readers = g.consumers(dq.outputs[0]);
  return readers.size() == 1 && !g.is_graph_output(dq.outputs[0]) &&
         qb4w_axis(g, dq, g.nodes[static_cast<size_t>(readers[0])]) >= 0;
}

}  // namespace slimquant::runtime
