#pragma once
// Shared machinery of the elementwise family (binary/unary/where/reduce/cast/Q-DQ kernels):
// a broadcast plan that walks the output row by row with strided inputs (no per-element index
// arithmetic), a parallel-for over large ranges, and small attribute helpers.
//
// Broadcasting model: the output is contiguous; every input is viewed through strides over the
// output's dimensions (stride 0 where the input broadcasts). Adjacent dimensions are collapsed
// whenever every input stays linear across them, so the common cases shrink to one or two dims:
//   same shape            [N]           strides a:1  b:1
//   tensor op scalar      [N]           strides a:1  b:0
//   NCHW op [C,1,1]       [N, C, H*W]   strides a:(C*HW, HW, 1)  b:(0, 1, 0)
// The innermost collapsed dim is a "row": kernels receive one row at a time with the inner stride
// of each input (0 or 1), and pick a tight loop for that stride pattern.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <omp.h>

#include "runtime/fused_ops/fused_activation.h"
#include "slimquant/core/tensor.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::ew {

constexpr int kMaxInputs = 3;

struct BroadcastPlan {
  int num_inputs = 0;
  Shape dims;                                               // collapsed output dims, >= 1 entry
  std::array<std::vector<int64_t>, kMaxInputs> strides;     // per input, per collapsed dim
  int64_t numel = 0;

  int64_t row_len() const { return dims.back(); }
  int64_t rows() const { return row_len() == 0 ? 0 : numel / row_len(); }
  int64_t inner_stride(int k) const { return strides[k].back(); }
};

// Plan for inputs broadcast (numpy rules, unidirectionally) to `out`. Throws kInvalidArgument
// naming `who` when an input cannot be broadcast to `out`.
BroadcastPlan make_broadcast_plan(const Shape& out, const std::vector<const Shape*>& inputs,
                                  const std::string& who);

// Output shape of numpy multidirectional broadcasting over all inputs; errors name `who`.
Shape broadcast_all(const std::vector<const Shape*>& shapes, const std::string& who);

// Attributes of an Add / Sub / Mul / Div that reads one operand through a nearest Resize the plan
// folded in (execution only: Fold::kUpsampledInput, fusions/declared_folds.h): operand kNearestUpsampledInput is [N, C, h, w]
// and stands for [N, C, h * kh, w * kw] with element [n, c, y / kh, x / kw].
inline constexpr const char* kNearestUpsampledInput = "slimquant.nearest_upsampled_input";  // int: 0 or 1
inline constexpr const char* kNearestUpsampleFactors = "slimquant.nearest_upsample_factors";  // ints: {kh, kw}

// Attribute of an Add / Sub whose operand kScaledInput (0 or 1) is multiplied first by input 2, a
// per-channel or scalar factor ([N|1, C|1, 1, 1] or one element): the plan folded the Mul(x, s)
// it read (execution only: Fold::kScaledInput, fusions/declared_folds.h). The product is the Mul's
// float32 result, rounded as it was, before the op.
inline constexpr const char* kScaledInput = "slimquant.scaled_input";  // int: 0 or 1

// Work below this many elements runs on the calling thread: forking a team costs more.
constexpr int64_t kParallelGrain = 1 << 15;

inline int threads_for(int64_t work) {
  if (work < 2 * kParallelGrain) return 1;
  int64_t t = std::min<int64_t>(omp_get_max_threads(), work / kParallelGrain);
  return static_cast<int>(std::max<int64_t>(t, 1));
}

// Calls fn(begin, end) over disjoint chunks covering [0, n), in parallel when n is large.
template <typename Fn>
void parallel_range(int64_t n, Fn&& fn) {
  const int nt = threads_for(n);
  if (nt <= 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t begin = n * t / T, end = n * (t + 1) / T;
    if (begin < end) fn(begin, end);
  }
}

// Element offset of each input at the start of output row r (one division per dim).
inline std::array<int64_t, kMaxInputs> row_start_offsets(const BroadcastPlan& p, int64_t r) {
  std::array<int64_t, kMaxInputs> off{};
  for (int d = static_cast<int>(p.dims.size()) - 2; d >= 0; --d) {
    const int64_t i = r % p.dims[d];
    r /= p.dims[d];
    for (int k = 0; k < p.num_inputs; ++k) off[k] += i * p.strides[k][d];
  }
  return off;
}

// Visits every output row of the plan: fn(in_offsets, out_offset, len) where in_offsets[k] is
// the element offset of input k at the row start and len the number of elements (a whole row or,
// when rows are few and long, a piece of one). Offsets advance by an odometer, not by division.
template <typename Fn>
void for_each_row(const BroadcastPlan& p, Fn&& fn) {
  if (p.numel == 0) return;
  const int nd = static_cast<int>(p.dims.size());
  const int64_t len = p.row_len(), rows = p.rows();
  const int nt = threads_for(p.numel);

  // Few long rows (same-shape or scalar broadcast): split rows into pieces.
  if (nt > 1 && rows < nt * 4) {
    const int64_t pieces = (nt * 4 + rows - 1) / rows;
    const int64_t piece_len = (len + pieces - 1) / pieces;
    const int64_t units = rows * pieces;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t r = u / pieces, start = (u % pieces) * piece_len;
      if (start >= len) continue;
      std::array<int64_t, kMaxInputs> off = row_start_offsets(p, r);
      for (int k = 0; k < p.num_inputs; ++k) off[k] += start * p.strides[k][nd - 1];
      fn(off.data(), r * len + start, std::min(piece_len, len - start));
    }
    return;
  }

  auto run_rows = [&](int64_t r0, int64_t r1) {
    // Position the odometer at row r0 (one division per dim per chunk).
    std::array<int64_t, kMaxInputs> off{};
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
    int64_t rem = r0;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rem % p.dims[d];
      rem /= p.dims[d];
      for (int k = 0; k < p.num_inputs; ++k) off[k] += idx[d] * p.strides[k][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      fn(off.data(), r * len, len);
      for (int d = nd - 2; d >= 0; --d) {
        for (int k = 0; k < p.num_inputs; ++k) off[k] += p.strides[k][d];
        if (++idx[d] < p.dims[d]) break;
        for (int k = 0; k < p.num_inputs; ++k) off[k] -= p.strides[k][d] * p.dims[d];
        idx[d] = 0;
      }
    }
  };
  if (nt <= 1) {
    run_rows(0, rows);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t r0 = rows * t / T, r1 = rows * (t + 1) / T;
    if (r0 < r1) run_rows(r0, r1);
  }
}

// Name of an ONNX TensorProto element type id, for messages about types we do not have.
std::string onnx_type_name(int64_t onnx_type);

// An activation that an execution-only fusion pass attached to an elementwise node
// (runtime/fused_ops/fused_activation.h), resolved once at plan compile time so the run loop only switches on an enum.
// Parameters: LeakyRelu alpha; Elu alpha; Clip alpha = min, beta = max; HardSigmoid alpha, beta.
// Kinds: the runtime's one vocabulary (fused_ops::Activation) less Gelu and Scale, which only the
// oneDNN kernels apply.
struct Activation {
  using Kind = fused_ops::Activation;
  Kind kind = Kind::kNone;
  float alpha = 0.f, beta = 0.f;
  explicit operator bool() const { return kind != Kind::kNone; }
};
// Resolves the node's fused activation; throws kUnsupported naming the node for an activation we cannot apply.
Activation resolve_fused_activation(const ir::Node& node);
// Fails with kUnsupported when the node carries a fused activation (kernels that cannot apply one).
void reject_fused_activation(const ir::Node& node);
// Applies the activation in place.
void apply_activation(const Activation& act, float* data, int64_t n);

}  // namespace slimquant::runtime::ew
