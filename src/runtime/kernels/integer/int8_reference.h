#pragma once
// Plain-loop, integer-exact reference of the fused INT8 ops (arithmetic in int8_common.h): the
// tests check the oneDNN kernels against it, and the kernels fall back to it when oneDNN has no
// implementation for a configuration. Slow by design: no blocking, no vectorisation.
#include <cstdint>

#include "runtime/kernels/integer/int8_common.h"

namespace slimquant::runtime::int8 {

// An N-D convolution (1 to 3 spatial dims) in ONNX terms, already resolved for concrete shapes.
struct ConvProblem {
  int64_t batch = 1, in_channels = 1, out_channels = 1, group = 1;
  Shape in_spatial, out_spatial, kernel, strides, dilations, pad_begin;  // dilations: ONNX (1 = dense)
};

// x_q: [N, C, spatial...] u8/s8; w_q: [M, C/group, kernel...] s8; y: [N, M, out_spatial...] of q.y.dtype.
void reference_qconv(const QLinearAttrs& q, const Requant& r, const ConvProblem& p, const Tensor& x, const Tensor& w,
                     Tensor& y);

// y[m, n] for x viewed as [m, k] (stored [k, m] when trans_x) and w as [k, n] (stored [n, k] when
// trans_w); y: [m, n] elements of q.y.dtype. Channels are the n columns.
void reference_qmatmul(const QLinearAttrs& q, const Requant& r, const Tensor& x, int64_t m, int64_t k, bool trans_x,
                       const Tensor& w, int64_t n, bool trans_w, Tensor& y);

// y = x @ w with numpy-style broadcasting of the batch dims (both of rank >= 2; w: s8 run-time
// tensor, per-tensor scale). y: the broadcast batch dims + [m, n], elements of q.y.dtype.
void reference_qmatmul_batched(const QLinearAttrs& q, const Requant& r, const Tensor& x, const Tensor& w, Tensor& y);

// The output step both share: one s32 accumulator of channel c -> the stored value.
struct OutputStage {
  const QLinearAttrs& q;
  const Requant& r;
  float act_lo, act_hi;  // activation bounds in v's units
  explicit OutputStage(const QLinearAttrs& q, const Requant& r);
  float value(int64_t acc, int64_t c) const;  // v after the activation (before rounding / zero point)
  float value_before_channel_multiply(int64_t acc, int64_t c) const;  // without a per-channel 1 / s_y[c]
  void store(int64_t acc, int64_t c, void* y, int64_t index) const;
};

}  // namespace slimquant::runtime::int8
