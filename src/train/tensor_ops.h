#pragma once
// Small float32 tensor helpers shared by the backward kernels: broadcasting (expand / its adjoint,
// the sum over broadcast dims), transposition, accumulation and a row-major GEMM.
#include <cstdint>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant::train::detail {

Tensor zeros_f32(const Shape& shape);
// Uninitialised storage (64-byte aligned) for buffers a kernel overwrites entirely: zeroing them
// first was a measurable share of a training step.
Tensor empty_tensor(DType dtype, const Shape& shape);
inline Tensor empty_f32(const Shape& shape) { return empty_tensor(DType::kFloat32, shape); }
// Numpy-broadcasts a float tensor to `shape` (returns x itself when the shape already matches).
Tensor expand_to(const Tensor& x, const Shape& shape);
// The adjoint of expand_to: sums g over the dims along which `shape` was broadcast to g's shape.
Tensor reduce_to_shape(const Tensor& g, const Shape& shape);
// y = x with axes permuted: y.shape[i] = x.shape[perm[i]].
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm);
// acc += g (same element count); acc must own its storage exclusively or be fresh.
void add_into(Tensor& acc, const Tensor& g);
// Sum of two gradients, a new tensor (either may be undefined).
Tensor add_grads(const Tensor& a, const Tensor& b);
// Row-major C[MxN] = alpha * op(A)[MxK] * op(B)[KxN] + beta * C, A stored [M,K] (or [K,M] when
// ta), B stored [K,N] (or [N,K] when tb).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
          float beta, float* c);
// Calls f(out_offset, in_offset, inner_len, inner_in_stride) for every innermost row of a walk
// over `shape` in row-major order, with in offsets following `in_strides` (any sign) from in_base.
template <class F>
void walk_rows(const Shape& shape, const std::vector<int64_t>& in_strides, int64_t in_base, F&& f) {
  const size_t r = shape.size();
  const int64_t total = shape_numel(shape);
  if (total == 0) return;
  if (r == 0) {
    f(int64_t{0}, in_base, int64_t{1}, int64_t{0});
    return;
  }
  const int64_t inner = shape[r - 1];
  const int64_t inner_stride = in_strides[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t in_off = in_base;
  for (int64_t out_off = 0; out_off < total; out_off += inner) {
    f(out_off, in_off, inner, inner_stride);
    for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        in_off += in_strides[d];
        break;
      }
      in_off -= in_strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace slimquant::train::detail
