#include "runtime/fusions/channel_quantize_fusion.h"

#include <cmath>
#include <optional>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "slimquant/ir/qdq_params.h"

namespace slimquant::runtime {
namespace {

// The parameters of a per-channel QuantizeLinear with constant float32 scales and u8/s8 zero
// points (or none), whose axis is known for a value of `rank` dims (-1: unknown), or nullopt.
std::optional<FoldedChannelQuantize> foldable_channel_quantize(const ir::Graph& g, const ir::Node& q, int64_t rank) {
  if (q.op_type != "QuantizeLinear" || !q.domain.empty() || q.inputs.size() < 2 || q.outputs.size() != 1 ||
      q.attrs.count("output_dtype") || q.attrs.count("block_size"))
    return std::nullopt;
  QuantParam p;
  if (ir::read_qdq_params(g, q, p, {.rank = rank}) || p.per_tensor() ||
      (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
    return std::nullopt;
  return FoldedChannelQuantize{std::move(p)};
}

// An elementwise op or Concat whose float32 result only a foldable per-channel QuantizeLinear reads.
struct ChannelQuantizedOutput {
  int op = -1, quantize = -1;
  FoldedChannelQuantize q;
};

std::optional<ChannelQuantizedOutput> select_channel_quantized_output(const ir::Rewriter& rw, int i) {
  const ir::Graph& g = rw.graph();
  const ir::Node& op = rw.node(i);
  const bool arithmetic = is_binary_arithmetic(op);
  const bool concat = op.op_type == "Concat" && !op.inputs.empty();
  if (!(arithmetic || concat) || !op.domain.empty() || (arithmetic && !has_binary_operands(op)) ||
      op.outputs.size() != 1 ||
      op.attrs.count(kFoldedQuantizeScale) || op.attrs.count(kFoldedQuantizeChannelScale))
    return std::nullopt;
  const std::string& y = op.outputs[0];
  // The kernel quantizes float32 arithmetic only: the result's type must be known.
  const ir::ValueInfo* info = g.find_value_info(y);
  if (!info || info->dtype != DType::kFloat32) return std::nullopt;
  const int reader = rw.sole_reader(y);  // not kept, not a graph output, one reader
  if (reader < 0) return std::nullopt;
  const int64_t rank = info->dims ? static_cast<int64_t>(info->dims->size()) : -1;
  std::optional<FoldedChannelQuantize> q = foldable_channel_quantize(g, rw.node(reader), rank);
  if (!q) return std::nullopt;
  return ChannelQuantizedOutput{i, reader, std::move(*q)};
}

void fold_channel_quantize(ir::Rewriter& rw, const ChannelQuantizedOutput& m) {
  ir::Node op = rw.node(m.op);
  write_folded_channel_quantize(op, m.q);
  op.outputs[0] = rw.node(m.quantize).outputs[0];
  rw.remove(m.quantize);
  rw.replace(m.op, std::move(op));
}

}  // namespace

ir::Rule channel_quantize_fusion_rule() {
  return ir::make_rule<ChannelQuantizedOutput>("fold_channel_quantize_into_elementwise",
                                               select_channel_quantized_output, fold_channel_quantize);
}

}  // namespace slimquant::runtime
