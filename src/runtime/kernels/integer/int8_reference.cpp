// Reference INT8 kernels. Arithmetic (see int8_common.h), rounding half to even:
//   acc = sum (x_q - z_x) * w_q        (int64 here: exact for any size)
//   v   = act(M[c] * (float(acc) + B'[c]))   (real_units(): act(M_real[c] * (...)) / s_y)
//   y_q = saturate(round_half_even(v) + z_y)   or   y = v
#include "runtime/kernels/integer/int8_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace slimquant::runtime::int8 {

OutputStage::OutputStage(const QLinearAttrs& qa, const Requant& ra) : q(qa), r(ra), act_lo(-FLT_MAX), act_hi(FLT_MAX) {
  const float inv = q.quantized_output() ? 1.f / q.y_tensor_scale() : 1.f;
  if (q.activation == Activation::kRelu) act_lo = 0.f;
  if (q.activation == Activation::kClip) {
    if (std::isfinite(q.activation_min)) act_lo = q.activation_min * inv;
    if (std::isfinite(q.activation_max)) act_hi = q.activation_max * inv;
  }
}

float OutputStage::value(int64_t acc, int64_t c) const {
  const float v = value_before_channel_multiply(acc, c);
  // A per-channel output scale the activation does not commute with (make_post_ops' binary multiply).
  return q.needs_channel_multiply() ? v * (1.f / q.y.scale[c]) : v;
}

float OutputStage::value_before_channel_multiply(int64_t acc, int64_t c) const {
  float v = static_cast<float>(acc);
  if (!r.bias.empty()) v += r.bias[c];
  v *= r.multiplier[c];
  if (q.real_units()) {  // the multiplier left 1 / s_y out: the activation sees real values
    v = q.activate(v) * q.post_scale + q.post_shift;
    return q.quantized_output() ? v * (1.f / q.y_tensor_scale()) : v;
  }
  if (q.activation == Activation::kLeakyRelu) return v >= 0.f ? v : q.activation_alpha * v;  // commutes with s_y
  if (q.activation == Activation::kHardSigmoid) {  // in y units: clip(a v + b / s_y, 0, 1 / s_y)
    const float inv = q.quantized_output() ? 1.f / q.y_tensor_scale() : 1.f;
    return std::min(std::max(q.activation_alpha * v + q.activation_beta * inv, 0.f), inv);
  }
  return std::min(std::max(v, act_lo), act_hi);
}

void OutputStage::store(int64_t acc, int64_t c, void* y, int64_t index) const {
  const float v = value(acc, c);
  if (!q.quantized_output()) {
    static_cast<float*>(y)[index] = v;
    return;
  }
  const int32_t z = q.y_tensor_zero_point();
  const float lo = static_cast<float>(qmin_of(q.y.dtype) - z), hi = static_cast<float>(qmax_of(q.y.dtype) - z);
  const int32_t code = static_cast<int32_t>(quant_math::saturate_round(v, lo, hi)) + z;  // half to even
  if (q.y.dtype == DType::kUInt8) static_cast<uint8_t*>(y)[index] = static_cast<uint8_t>(code);
  else static_cast<int8_t*>(y)[index] = static_cast<int8_t>(code);
}

namespace {

int32_t load_q(const Tensor& x, int64_t i) {
  return x.dtype() == DType::kUInt8 ? static_cast<int32_t>(x.data<uint8_t>()[i]) : static_cast<int32_t>(x.data<int8_t>()[i]);
}

// Spatial vectors padded to 3 dims (leading 1s) so one loop nest covers 1-D, 2-D and 3-D.
Shape to3(const Shape& s, int64_t fill) {
  Shape r(3 - s.size(), fill);
  r.insert(r.end(), s.begin(), s.end());
  return r;
}

}  // namespace

void reference_qconv(const QLinearAttrs& q, const Requant& r, const ConvProblem& p, const Tensor& x, const Tensor& w,
                     Tensor& y) {
  const OutputStage out(q, r);
  const Shape in = to3(p.in_spatial, 1), os = to3(p.out_spatial, 1), k = to3(p.kernel, 1), st = to3(p.strides, 1),
              dl = to3(p.dilations, 1), pb = to3(p.pad_begin, 0);
  const int64_t cg = p.in_channels / p.group, mg = p.out_channels / p.group;
  const int64_t in_size = in[0] * in[1] * in[2], out_size = os[0] * os[1] * os[2], k_size = k[0] * k[1] * k[2];
  const int8_t* wd = w.data<int8_t>();
  for (int64_t n = 0; n < p.batch; ++n)
    for (int64_t m = 0; m < p.out_channels; ++m) {
      const int64_t g = m / mg;
      for (int64_t od = 0; od < os[0]; ++od)
        for (int64_t oh = 0; oh < os[1]; ++oh)
          for (int64_t ow = 0; ow < os[2]; ++ow) {
            int64_t acc = 0;
            for (int64_t ci = 0; ci < cg; ++ci) {
              const int64_t c = g * cg + ci;
              for (int64_t kd = 0; kd < k[0]; ++kd)
                for (int64_t kh = 0; kh < k[1]; ++kh)
                  for (int64_t kw = 0; kw < k[2]; ++kw) {
                    const int64_t id = od * st[0] - pb[0] + kd * dl[0], ih = oh * st[1] - pb[1] + kh * dl[1],
                                  iw = ow * st[2] - pb[2] + kw * dl[2];
                    // Padding holds the real value 0, i.e. x_q == z_x: it contributes nothing.
                    if (id < 0 || id >= in[0] || ih < 0 || ih >= in[1] || iw < 0 || iw >= in[2]) continue;
                    const int64_t xi = (n * p.in_channels + c) * in_size + (id * in[1] + ih) * in[2] + iw;
                    const int64_t wi = (m * cg + ci) * k_size + (kd * k[1] + kh) * k[2] + kw;
                    acc += static_cast<int64_t>(load_q(x, xi) - q.x.zero_point[0]) * wd[wi];
                  }
            }
            out.store(acc, m, y.raw(), (n * p.out_channels + m) * out_size + (od * os[1] + oh) * os[2] + ow);
          }
    }
}

namespace {
// One [m, k] x [k, n] product; x, w and y start at the given element offsets.
void matmul_block(const OutputStage& out, const QLinearAttrs& q, const Tensor& x, int64_t x0, int64_t m, int64_t k,
                  bool trans_x, const int8_t* wd, int64_t n, bool trans_w, void* y, int64_t y0, bool per_column) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t acc = 0;
      for (int64_t l = 0; l < k; ++l) {
        const int32_t xv = load_q(x, x0 + (trans_x ? l * m + i : i * k + l)) - q.x.zero_point[0];
        acc += static_cast<int64_t>(xv) * wd[trans_w ? j * k + l : l * n + j];
      }
      out.store(acc, per_column ? j : 0, y, y0 + i * n + j);
    }
}
}  // namespace

void reference_qmatmul(const QLinearAttrs& q, const Requant& r, const Tensor& x, int64_t m, int64_t k, bool trans_x,
                       const Tensor& w, int64_t n, bool trans_w, Tensor& y) {
  const OutputStage out(q, r);
  matmul_block(out, q, x, 0, m, k, trans_x, w.data<int8_t>(), n, trans_w, y.raw(), 0, true);
}

void reference_qmatmul_batched(const QLinearAttrs& q, const Requant& r, const Tensor& x, const Tensor& w, Tensor& y) {
  const OutputStage out(q, r);
  const size_t rank = y.rank();
  auto padded = [&](const Shape& s) {
    Shape p(rank - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const Shape xs = padded(x.shape()), ws = padded(w.shape()), ys = y.shape();
  const int64_t m = xs[rank - 2], k = xs[rank - 1], n = ws[rank - 1];
  const int64_t batches = shape_numel(ys) / (m * n);
  for (int64_t b = 0; b < batches; ++b) {
    // Unravel b over the output batch dims; a size-1 input dim repeats its only slice.
    int64_t rest = b, xb = 0, wb = 0, x_stride = 1, w_stride = 1;
    for (size_t d = rank - 2; d-- > 0;) {
      const int64_t i = rest % ys[d];
      rest /= ys[d];
      xb += (xs[d] == 1 ? 0 : i) * x_stride;
      wb += (ws[d] == 1 ? 0 : i) * w_stride;
      x_stride *= xs[d];
      w_stride *= ws[d];
    }
    matmul_block(out, q, x, xb * m * k, m, k, false, w.data<int8_t>() + wb * k * n, n, false, y.raw(), b * m * n,
                 false);
  }
}

}  // namespace slimquant::runtime::int8
