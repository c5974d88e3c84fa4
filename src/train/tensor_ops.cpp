#include "train/tensor_ops.h"

#include <dnnl.hpp>

#include <algorithm>
#include <cstdlib>

namespace slimquant::train::detail {

Tensor zeros_f32(const Shape& shape) { return Tensor(DType::kFloat32, shape); }

Tensor empty_tensor(DType dtype, const Shape& shape) {
  constexpr size_t kAlign = 64;
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) fail(ErrorKind::kInternal, "out of memory allocating " + std::to_string(bytes) + " bytes");
  return Tensor(dtype, shape, std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); }),
                rounded);
}

namespace {
// Strides of x aligned to the trailing dims of `shape`, 0 along broadcast dims.
std::vector<int64_t> broadcast_strides(const Shape& xs, const Shape& shape, const char* what) {
  SQ_CHECK(xs.size() <= shape.size(), ErrorKind::kInternal,
           std::string(what) + ": cannot broadcast " + shape_str(xs) + " to " + shape_str(shape));
  std::vector<int64_t> st(shape.size(), 0);
  const auto cs = contiguous_strides(xs);
  const size_t off = shape.size() - xs.size();
  for (size_t i = 0; i < xs.size(); ++i) {
    SQ_CHECK(xs[i] == 1 || xs[i] == shape[off + i], ErrorKind::kInternal,
             std::string(what) + ": cannot broadcast " + shape_str(xs) + " to " + shape_str(shape));
    if (xs[i] != 1) st[off + i] = cs[i];
  }
  return st;
}
}  // namespace

Tensor expand_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor y = empty_f32(shape);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  walk_rows(shape, broadcast_strides(x.shape(), shape, "expand"), 0,
            [&](int64_t o, int64_t i, int64_t n, int64_t s) {
              for (int64_t k = 0; k < n; ++k) py[o + k] = px[i + k * s];
            });
  return y;
}

Tensor reduce_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor y(DType::kFloat32, shape);
  const float* pg = g.data<float>();
  float* py = y.data<float>();
  // Walk g; the "input" offsets are positions in y (stride 0 where y was broadcast).
  walk_rows(g.shape(), broadcast_strides(shape, g.shape(), "reduce_to_shape"), 0,
            [&](int64_t o, int64_t i, int64_t n, int64_t s) {
              if (s == 0) {
                double acc = 0;
                for (int64_t k = 0; k < n; ++k) acc += pg[o + k];
                py[i] += static_cast<float>(acc);
              } else {
                for (int64_t k = 0; k < n; ++k) py[i + k * s] += pg[o + k];
              }
            });
  return y;
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  const Shape& xs = x.shape();
  SQ_CHECK(perm.size() == xs.size(), ErrorKind::kInternal, "transpose: perm rank mismatch");
  Shape ys(xs.size());
  std::vector<int64_t> st(xs.size());
  const auto cs = contiguous_strides(xs);
  for (size_t i = 0; i < perm.size(); ++i) {
    ys[i] = xs[perm[i]];
    st[i] = cs[perm[i]];
  }
  Tensor y = empty_f32(ys);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  walk_rows(ys, st, 0, [&](int64_t o, int64_t i, int64_t n, int64_t s) {
    for (int64_t k = 0; k < n; ++k) py[o + k] = px[i + k * s];
  });
  return y;
}

void add_into(Tensor& acc, const Tensor& g) {
  SQ_CHECK(acc.numel() == g.numel(), ErrorKind::kInternal,
           "gradient accumulation: shapes " + shape_str(acc.shape()) + " and " + shape_str(g.shape()) + " differ");
  float* pa = acc.data<float>();
  const float* pg = g.data<float>();
  const int64_t n = acc.numel();
#pragma omp parallel for simd if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) pa[i] += pg[i];
}

Tensor add_grads(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  Tensor r = a.clone();
  add_into(r, b);
  return r;
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
          float beta, float* c) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, ta ? m : k, b,
                                      tb ? k : n, beta, c, n);
  SQ_CHECK(st == dnnl_success, ErrorKind::kInternal, "oneDNN sgemm failed (status " + std::to_string(st) + ")");
}

}  // namespace slimquant::train::detail
