// split_matmul_by_column_slices (slimquant/ir/passes.h).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/core/error.h"
#include "slimquant/ir/passes.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::ir {
namespace {

// Columns [begin, end) of a constant [K, N] matrix (any element type), or entries [begin, end) of
// a per-column vector [N].
Tensor column_range(const Tensor& t, int64_t begin, int64_t end) {
  const bool matrix = t.rank() == 2;
  const int64_t rows = matrix ? t.shape()[0] : 1, cols = matrix ? t.shape()[1] : t.shape()[0];
  Tensor out(t.dtype(), matrix ? Shape{rows, end - begin} : Shape{end - begin});
  const size_t elem = dtype_size(t.dtype()), width = static_cast<size_t>(end - begin) * elem;
  const auto* src = static_cast<const unsigned char*>(t.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + static_cast<size_t>(r) * width, src + (static_cast<size_t>(r * cols + begin)) * elem, width);
  return out;
}

// A constant one-element integer input's value.
std::optional<int64_t> one_int(const Graph& g, const std::string& v) {
  const Tensor* t = g.initializer(v);
  if (!t || t->numel() != 1 || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32)) return std::nullopt;
  return t->to_int64_vector()[0];
}

// The weights of a MatMul: a float constant [K, N], or DequantizeLinear of constant codes [K, N]
// per tensor or per column (axis 1), read by this MatMul alone.
struct SplitWeights {
  std::string w;     // the float constant, or the codes
  int dequantize = -1;
  bool per_column = false;
};

std::optional<SplitWeights> splittable_weights(const Rewriter& rw, const std::string& b, int matmul) {
  const Graph& g = rw.graph();
  if (const Tensor* w = g.initializer(b))
    return w->rank() == 2 && w->dtype() == DType::kFloat32 ? std::optional<SplitWeights>(SplitWeights{b, -1, false})
                                                           : std::nullopt;
  const int dq = rw.producer(b);
  if (dq < 0 || !is_onnx_op(rw.node(dq), "DequantizeLinear") || rw.readers(b) != std::vector<int>{matmul} ||
      !rw.is_private(b) || rw.node(dq).has_attr("block_size"))
    return std::nullopt;
  const Node& d = rw.node(dq);
  const Tensor* codes = g.initializer(d.input(0));
  const Tensor* scale = g.initializer(d.input(1));
  const Tensor* zp = d.input(2).empty() ? nullptr : g.initializer(d.input(2));
  if (!codes || codes->rank() != 2 || (codes->dtype() != DType::kInt8 && codes->dtype() != DType::kUInt8) || !scale ||
      (!d.input(2).empty() && !zp))
    return std::nullopt;
  const int64_t n = codes->shape()[1];
  if (scale->numel() == 1) return SplitWeights{d.input(0), dq, false};
  int64_t axis = d.attr_int("axis", 1);
  if (axis < 0) axis += 2;
  if (axis != 1 || scale->rank() != 1 || scale->numel() != n || (zp && zp->shape() != scale->shape()))
    return std::nullopt;
  return SplitWeights{d.input(0), dq, true};
}

struct ColumnSlice {
  int slice = -1;
  int64_t begin = 0, end = 0;
};

// MatMul(a, W) [-> Add(bias [N])] read only by Slices of the last axis with constant bounds and
// step 1.
struct ColumnSplit {
  int matmul = -1, bias_add = -1;
  std::string bias;
  SplitWeights weights;
  std::vector<ColumnSlice> slices;
};

std::optional<ColumnSplit> select_column_split(const Rewriter& rw, int id) {
  const Node& mm = rw.node(id);
  const Graph& g = rw.graph();
  if (!is_onnx_op(mm, "MatMul") || mm.inputs.size() != 2 || mm.outputs.size() != 1 || g.is_initializer(mm.inputs[0]))
    return std::nullopt;
  ColumnSplit m;
  m.matmul = id;
  const std::optional<SplitWeights> w = splittable_weights(rw, mm.inputs[1], id);
  if (!w) return std::nullopt;
  m.weights = *w;
  const int64_t n = g.initializer(w->w)->shape()[1];
  std::string z = mm.outputs[0];
  if (!rw.is_private(z)) return std::nullopt;
  if (const int add = rw.sole_reader_op(z, "Add"); add >= 0) {
    const std::string bias = other_input(rw.node(add), z);
    const Tensor* b = g.initializer(bias);
    if (b && b->dtype() == DType::kFloat32 && b->rank() == 1 && b->numel() == n) {
      m.bias_add = add;
      m.bias = bias;
      z = rw.node(add).outputs[0];
      if (!rw.is_private(z)) return std::nullopt;
    }
  }
  // The rank of z, when some value info gives it (a last axis named by its index).
  std::optional<int64_t> rank;
  for (const std::string& v : {z, mm.outputs[0], mm.inputs[0]})
    if (const ValueInfo* vi = g.find_value_info(v); vi && vi->dims && !rank) rank = static_cast<int64_t>(vi->dims->size());
  int64_t columns = 0;
  for (int r : rw.readers(z)) {
    const Node& s = rw.node(r);
    if (!is_onnx_op(s, "Slice") || s.inputs.size() < 4 || s.inputs[0] != z || s.outputs.size() != 1) return std::nullopt;
    const std::optional<int64_t> start = one_int(g, s.input(1)), stop = one_int(g, s.input(2)), axis = one_int(g, s.input(3));
    if (!start || !stop || !axis || !(*axis == -1 || (rank && *axis == *rank - 1))) return std::nullopt;
    if (!s.input(4).empty() && one_int(g, s.input(4)) != 1) return std::nullopt;
    auto clamp = [n](int64_t v) { return std::clamp(v < 0 ? v + n : v, int64_t{0}, n); };
    const int64_t begin = clamp(*start), end = clamp(*stop);
    if (end <= begin) return std::nullopt;
    columns += end - begin;
    m.slices.push_back({r, begin, end});
  }
  // A split that computes no more columns than the whole product did.
  if (m.slices.empty() || columns > n) return std::nullopt;
  return m;
}

void split_columns(Rewriter& rw, const ColumnSplit& m) {
  Graph& g = rw.graph();
  const Node mm = rw.node(m.matmul);
  const Tensor w = *g.initializer(m.weights.w);
  for (const ColumnSlice& cs : m.slices) {
    const std::string tag = "_columns_" + std::to_string(cs.begin) + "_" + std::to_string(cs.end);
    const std::string out = rw.node(cs.slice).outputs[0];
    std::string b = g.unique_value_name(m.weights.w + tag);
    g.initializers[b] = column_range(w, cs.begin, cs.end);
    if (m.weights.dequantize >= 0) {
      Node dq = rw.node(m.weights.dequantize);
      dq.name = dq.name.empty() ? std::string() : dq.name + tag;
      dq.inputs[0] = b;
      if (m.weights.per_column)
        for (size_t k : {size_t{1}, size_t{2}}) {
          if (dq.input(k).empty()) continue;
          const std::string part = g.unique_value_name(dq.inputs[k] + tag);
          g.initializers[part] = column_range(*g.initializer(dq.inputs[k]), cs.begin, cs.end);
          dq.inputs[k] = part;
        }
      dq.outputs = {g.unique_value_name(dq.outputs[0] + tag)};
      b = dq.outputs[0];
      rw.insert_before(cs.slice, std::move(dq));
    }
    Node part = mm;
    part.name = mm.name.empty() ? std::string() : mm.name + tag;
    part.inputs = {mm.inputs[0], b};
    if (m.bias_add < 0) {
      part.outputs = {out};
      rw.insert_before(cs.slice, std::move(part));
    } else {
      part.outputs = {g.unique_value_name(mm.outputs[0] + tag)};
      Node add = rw.node(m.bias_add);
      add.name = add.name.empty() ? std::string() : add.name + tag;
      const std::string bias = g.unique_value_name(m.bias + tag);
      g.initializers[bias] = column_range(*g.initializer(m.bias), cs.begin, cs.end);
      for (std::string& in : add.inputs) in = in == m.bias ? bias : part.outputs[0];
      add.outputs = {out};
      rw.insert_before(cs.slice, std::move(part));
      rw.insert_before(cs.slice, std::move(add));
    }
    rw.remove(cs.slice);
  }
  if (m.bias_add >= 0) {
    g.value_info.erase(rw.node(m.bias_add).outputs[0]);
    rw.remove(m.bias_add);
  }
  g.value_info.erase(mm.outputs[0]);
  rw.remove(m.matmul);
  if (m.weights.dequantize >= 0) {
    g.value_info.erase(rw.node(m.weights.dequantize).outputs[0]);
    rw.remove(m.weights.dequantize);
  }
}

}  // namespace

Rule split_matmul_by_column_slices_rule() {
  return make_rule<ColumnSplit>("split_matmul_by_column_slices", select_column_split, split_columns,
                                [](Graph& g) { g.remove_unused_initializers(); });
}

}  // namespace slimquant::ir
