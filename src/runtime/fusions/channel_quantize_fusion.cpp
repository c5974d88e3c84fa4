#include "runtime/fusions/channel_quantize_fusion.h"

#include <cmath>
#include <optional>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise_qdq.h"
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

}  // namespace

int fold_channel_quantize_into_elementwise(ir::Graph& g, const std::set<std::string>& keep) {
  int folded = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& op = g.nodes[i];
    const bool arithmetic = is_binary_arithmetic(op);
    const bool concat = op.op_type == "Concat" && !op.inputs.empty();
    if (!(arithmetic || concat) || !op.domain.empty() || (arithmetic && op.inputs.size() != 2) || op.outputs.size() != 1 ||
        op.attrs.count(kFoldedQuantizeScale) || op.attrs.count(kFoldedQuantizeChannelScale))
      continue;
    const std::string& y = op.outputs[0];
    // The kernel quantizes float32 arithmetic only: the result's type must be known.
    const ir::ValueInfo* info = g.find_value_info(y);
    if (!info || info->dtype != DType::kFloat32 || keep.count(y) || g.is_graph_output(y)) continue;
    const auto readers = g.consumers(y);
    if (readers.size() != 1) continue;
    const int64_t rank = info->dims ? static_cast<int64_t>(info->dims->size()) : -1;
    const auto q = foldable_channel_quantize(g, g.nodes[readers[0]], rank);
    if (!q) continue;
    op.attrs[kFoldedQuantizeChannelScale] = q->scale;
    op.attrs[kFoldedQuantizeChannelZeroPoint] = std::vector<int64_t>(q->zero_point.begin(), q->zero_point.end());
    op.attrs[kFoldedQuantizeType] = static_cast<int64_t>(q->dtype);
    op.attrs[kFoldedQuantizeAxis] = q->axis;
    op.outputs[0] = g.nodes[readers[0]].outputs[0];
    g.nodes.erase(g.nodes.begin() + readers[0]);  // after op: indices up to i stay valid
    ++folded;
  }
  return folded;
}

}  // namespace slimquant::runtime
