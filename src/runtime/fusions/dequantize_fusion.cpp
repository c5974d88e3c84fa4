#include "runtime/fusions/dequantize_fusion.h"

#include <optional>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "slimquant/ir/qdq_params.h"

namespace slimquant::runtime {
namespace {

// Whether `reader` can take a folded DequantizeLinear at the inputs that read it.
bool reads_codes(const ir::Node& reader, const std::string& v) {
  if (!reader.domain.empty() || reader.outputs.size() != 1) return false;
  if (is_binary_arithmetic(reader))  // operands 0 and 1 (a folded scaling's factor, input 2, stays float)
    return has_binary_operands(reader) && (reader.inputs.size() < 3 || reader.inputs[2] != v) &&
           (!reader.has_attr(ew::kNearestUpsampledInput) ||
            reader.inputs[static_cast<size_t>(reader.attr_int(ew::kNearestUpsampledInput, 0))] != v);
  if (reader.op_type == "GlobalAveragePool" || reader.op_type == "GlobalMaxPool")
    return reader.inputs.size() == 1;
  return false;
}

struct FoldedReaders {
  int dequantize = -1;
  std::vector<int> readers;
  FoldedDequantize params;  // input set per reader
};

std::optional<FoldedReaders> select_dequantize(const ir::Rewriter& rw, int i) {
  const ir::Node& dq = rw.node(i);
  if (!ir::is_onnx_op(dq, "DequantizeLinear") || dq.inputs.size() < 2 || dq.outputs.size() != 1 ||
      dq.attrs.count("block_size") || dq.attrs.count("output_dtype"))
    return std::nullopt;
  QuantParam p;
  if (ir::read_qdq_params(rw.graph(), dq, p) || !p.per_tensor() ||
      (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
    return std::nullopt;
  const std::string& v = dq.outputs[0];
  if (!rw.is_private(v) || rw.graph().is_initializer(dq.inputs[0])) return std::nullopt;
  FoldedReaders m;
  m.dequantize = i;
  m.readers = rw.readers(v);
  if (m.readers.empty()) return std::nullopt;
  for (int r : m.readers)
    if (!reads_codes(rw.node(r), v)) return std::nullopt;
  m.params.scale = p.scale[0];
  m.params.zero_point = p.zero_point[0];
  return m;
}

void fold_dequantize(ir::Rewriter& rw, const FoldedReaders& m) {
  const ir::Node& dq = rw.node(m.dequantize);
  const std::string codes = dq.inputs[0], v = dq.outputs[0];
  for (int r : m.readers) {
    ir::Node reader = rw.node(r);
    for (size_t k = 0; k < reader.inputs.size(); ++k) {
      if (reader.inputs[k] != v) continue;
      reader.inputs[k] = codes;
      FoldedDequantize d = m.params;
      d.input = k;
      add_folded_dequantize(reader, d);
    }
    rw.replace(r, std::move(reader));
  }
  rw.remove(m.dequantize);
}

}  // namespace

ir::Rule dequantize_fusion_rule() {
  return ir::make_rule<FoldedReaders>("fold_dequantize_into_readers", select_dequantize, fold_dequantize);
}

}  // namespace slimquant::runtime
