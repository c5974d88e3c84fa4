#include "slimquant/train/quanters.h"

#include <algorithm>
#include <cmath>

#include "slimquant/core/quant_param.h"

namespace slimquant::train {

namespace {

constexpr float kMovingRate = 0.9f;

Parameter make_param(const std::string& name, Shape shape, float value) {
  Parameter p;
  p.name = name;
  p.value = Tensor(DType::kFloat32, std::move(shape));
  std::fill(p.value.data<float>(), p.value.data<float>() + p.value.numel(), value);
  p.grad = Tensor(DType::kFloat32, p.value.shape());
  return p;
}

const Tensor& single_input(const std::vector<Tensor>& inputs, const std::string& who) {
  SQ_CHECK(inputs.size() == 1, ErrorKind::kInternal, who + " quanter takes exactly one input");
  SQ_CHECK(inputs[0].dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           who + " quanter: input must be float32, got " + dtype_name(inputs[0].dtype()));
  return inputs[0];
}

const Tensor& single_grad(const std::vector<Tensor>& grads, const Tensor& cached, const std::string& who) {
  SQ_CHECK(grads.size() == 1, ErrorKind::kInternal, who + " quanter: backward needs one gradient");
  SQ_CHECK(cached.defined(), ErrorKind::kInternal, who + " quanter: backward called without a training forward");
  SQ_CHECK(grads[0].numel() == cached.numel(), ErrorKind::kInternal,
           who + " quanter: gradient shape " + shape_str(grads[0].shape()) + " does not match the forward input");
  return grads[0];
}

// QuantizeLinear -> DequantizeLinear of one value with zero point 0 (every fake_quant caller's):
// the runtime's arithmetic (x / s, saturate, round half to even), from core/quant_param.h.
inline float fake_quant(float x, float s, float qmin, float qmax) {
  return quant_math::quantize_offset(x, s, qmin, qmax) * s;
}

float abs_max_of(const Tensor& x) {
  float m = 0.0f;
  for (float v : x.values<float>()) m = std::max(m, std::fabs(v));
  return m;
}

void add_grad(Parameter& p, size_t i, float g) {
  if (!p.grad.defined()) p.grad = Tensor(DType::kFloat32, p.value.shape());
  p.grad.data<float>()[i] += g;
}

// outer x channels x inner view of a weight for per-channel work along `axis`.
struct ChannelView {
  int64_t outer = 1, channels = 1, inner = 1;
  int64_t channel_of(int64_t i) const { return (i / inner) % channels; }
};
ChannelView channel_view(const Tensor& w, int64_t axis, bool per_channel) {
  ChannelView v;
  if (!per_channel || w.rank() == 0) {
    v.inner = w.numel();
    return v;
  }
  const int64_t ax = normalize_axis(axis, static_cast<int64_t>(w.rank()), "weight quanter channel axis");
  v.channels = w.dim(static_cast<size_t>(ax));
  for (int64_t d = 0; d < ax; ++d) v.outer *= w.dim(static_cast<size_t>(d));
  for (size_t d = static_cast<size_t>(ax) + 1; d < w.rank(); ++d) v.inner *= w.dim(d);
  return v;
}

QuantParam per_tensor_params(DType dtype, float scale, int32_t zp) {
  QuantParam p;
  p.dtype = dtype;
  p.scale = {std::max(scale, quant::kMinScale)};
  p.zero_point = {zp};
  return p;
}

}  // namespace

// ---- factory ----------------------------------------------------------------------------------

const std::vector<std::string>& weight_quanter_names() {
  static const std::vector<std::string> names = {"lsq_plus", "pact", "abs_max"};
  return names;
}
const std::vector<std::string>& activation_quanter_names() {
  static const std::vector<std::string> names = {"pact", "lsq_plus", "moving_abs_max"};
  return names;
}

namespace {
std::string canonical_quanter(const std::string& name, bool is_weight) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "pactquanter") return "pact";
  if (n == "weightlsqplusquanter" || n == "actlsqplusquanter" || n == "lsqplus" || n == "lsq+") return "lsq_plus";
  if (n == "moving_average_abs_max" || n == "fakequanterwithabsmaxobserver") return "moving_abs_max";
  if (n == "channel_wise_abs_max" && is_weight) return "abs_max";
  const auto& known = is_weight ? weight_quanter_names() : activation_quanter_names();
  if (std::find(known.begin(), known.end(), n) != known.end()) return n;
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  fail(ErrorKind::kInvalidArgument, std::string("unknown ") + (is_weight ? "weight" : "activation") + " quanter '" +
                                        name + "' (known: " + list + ")");
}
}  // namespace

void check_quanter_name(const std::string& name, bool is_weight) { canonical_quanter(name, is_weight); }

std::unique_ptr<Quanter> make_quanter(const std::string& name, const QuanterInit& init, const std::string& prefix) {
  const std::string n = canonical_quanter(name, init.is_weight);
  if (init.is_weight)
    SQ_CHECK(init.bits >= 2 && init.bits <= 8, ErrorKind::kInvalidArgument,
             "weight quanter '" + name + "': bits must be in [2, 8], got " + std::to_string(init.bits));
  else
    SQ_CHECK(init.bits == 8, ErrorKind::kUnsupported,
             "activation quanter '" + name + "': only 8-bit activations are exported, got " + std::to_string(init.bits) +
                 " bits");
  SQ_CHECK(!init.init_value || n == "pact", ErrorKind::kInvalidArgument,
           "quanter '" + name + "': init_value is PACT's initial clip; " + n + " has none");
  SQ_CHECK(!init.symmetric || (n == "lsq_plus" && !init.is_weight), ErrorKind::kInvalidArgument,
           "quanter '" + name + "': the symmetric setting is the activation lsq_plus quanter's");
  SQ_CHECK(!init.sign || init.symmetric, ErrorKind::kInvalidArgument,
           "quanter '" + name + "': sign applies to the symmetric activation lsq_plus quanter only");
  SQ_CHECK(std::isfinite(init.lr_scale) && init.lr_scale > 0.0f, ErrorKind::kInvalidArgument,
           "quanter '" + name + "': the learning-rate factor must be positive, got " + std::to_string(init.lr_scale));
  std::unique_ptr<Quanter> q;
  if (n == "pact") q = std::make_unique<PACTQuanter>(init, prefix);
  else if (n == "lsq_plus" && init.is_weight) q = std::make_unique<WeightLSQplusQuanter>(init, prefix);
  else if (n == "lsq_plus") q = std::make_unique<ActLSQplusQuanter>(init, prefix);
  else if (n == "moving_abs_max") q = std::make_unique<MovingAbsMaxQuanter>(init, prefix, kMovingRate);
  else q = std::make_unique<AbsMaxWeightQuanter>(init, prefix);
  for (Parameter* p : q->parameters()) p->lr_scale = init.lr_scale;
  return q;
}

// ---- PACT ---------------------------------------------------------------------------------------

PACTQuanter::PACTQuanter(const QuanterInit& init, const std::string& prefix)
    : Quanter(init), alpha_(make_param(prefix + ".alpha", {}, 1.0f)) {
  // Weights are signed; activations are signed unless calibration saw no negative value.
  signed_ = init.is_weight || !init.never_negative;
  sign_known_ = init.is_weight || init.has_range;
  if (init.init_value) {
    SQ_CHECK(std::isfinite(*init.init_value) && *init.init_value > 0.0f, ErrorKind::kInvalidArgument,
             "PACT quanter '" + prefix + "': init_value must be a positive number, got " + std::to_string(*init.init_value));
    alpha_.value.data<float>()[0] = *init.init_value;
    initialised_ = true;
  } else if (!init.is_weight && init.has_range) {
    alpha_.value.data<float>()[0] = std::max({init.range.hi, -init.range.lo, quant::kMinScale});
    initialised_ = true;
  } else if (init.is_weight && init.initial_weight.defined()) {
    alpha_.value.data<float>()[0] = std::max(abs_max_of(init.initial_weight), quant::kMinScale);
    initialised_ = true;
  }
}

std::vector<Tensor> PACTQuanter::forward(const std::vector<Tensor>& inputs, bool training) {
  const Tensor& x = single_input(inputs, "pact");
  float& alpha = alpha_.value.data<float>()[0];
  if (!sign_known_) {
    // No calibration: the first tensor seen decides between s8 and u8 (zero point 0).
    float lo = 0.0f;
    for (float v : x.values<float>()) lo = std::min(lo, v);
    signed_ = lo < 0.0f;
    sign_known_ = true;
  }
  if (!initialised_) {
    // No calibration: start from the abs max of the first tensor seen (no clipping at first).
    alpha = std::max(abs_max_of(x), quant::kMinScale);
    initialised_ = true;
  }
  alpha = std::max(alpha, quant::kMinScale);  // an optimizer step must not make the clip negative
  const float qmax = !signed_ ? 255.0f : init_.is_weight ? weight_qmax() : 127.0f;
  const float lo = signed_ ? -alpha : 0.0f;
  const float s = alpha / qmax;
  Tensor y(DType::kFloat32, x.shape());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t n = x.numel();
  int8_t* region = nullptr;
  if (training) {
    region_ = Tensor(DType::kInt8, x.shape());
    region = region_.data<int8_t>();
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(xp[i], lo, alpha);
    yp[i] = fake_quant(v, s, signed_ ? -qmax : 0.0f, qmax);
    if (region) region[i] = xp[i] >= alpha ? 1 : (xp[i] <= lo ? -1 : 0);
  }
  return {y};
}

std::vector<Tensor> PACTQuanter::backward(const std::vector<Tensor>& grads) {
  if (grads.empty() || !grads[0].defined()) return {Tensor()};  // no gradient reached the output
  const Tensor& g = single_grad(grads, region_, "pact");
  Tensor dx(DType::kFloat32, g.shape());
  const float* gp = g.data<float>();
  const int8_t* region = region_.data<int8_t>();
  float* dxp = dx.data<float>();
  double dalpha = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (region[i] == 0) {
      dxp[i] = gp[i];
    } else if (region[i] > 0) {
      dalpha += gp[i];
    } else if (signed_) {
      dalpha -= gp[i];  // below -alpha; for unsigned PACT the lower bound 0 does not move with alpha
    }
  }
  add_grad(alpha_, 0, static_cast<float>(dalpha));
  return {dx};
}

QuantParam PACTQuanter::export_params() const {
  SQ_CHECK(initialised_, ErrorKind::kInvalidData, "PACT quanter '" + alpha_.name + "' has seen no data");
  const float alpha = std::max(alpha_.value.data<float>()[0], quant::kMinScale);
  if (!init_.is_weight) {
    return signed_ ? per_tensor_params(DType::kInt8, alpha / 127.0f, 0)
                   : per_tensor_params(DType::kUInt8, alpha / 255.0f, 0);
  }
  QuantParam p = per_tensor_params(DType::kInt8, alpha / weight_qmax(), 0);
  p.bits = init_.bits;
  return p;  // one scale: the exporter repeats it per channel
}

// ---- WeightLSQplus ------------------------------------------------------------------------------

WeightLSQplusQuanter::WeightLSQplusQuanter(const QuanterInit& init, const std::string& prefix)
    : Quanter(init), scale_(make_param(prefix + ".scale", {1}, 1.0f)) {
  SQ_CHECK(init.is_weight, ErrorKind::kInternal, "WeightLSQplusQuanter on an activation");
  if (init.initial_weight.defined()) initialise(init.initial_weight);
}

void WeightLSQplusQuanter::initialise(const Tensor& w) {
  // LSQ+: s = max(|mu - 3 sigma|, |mu + 3 sigma|) / 2^(b-1), per channel when per_channel.
  const ChannelView view = channel_view(w, init_.channel_axis, init_.per_channel);
  const float* wp = w.data<float>();
  outer_ = view.outer, channels_ = view.channels, inner_ = view.inner;
  scale_.value = Tensor(DType::kFloat32, {channels_});
  scale_.grad = Tensor(DType::kFloat32, {channels_});
  std::vector<double> sum(channels_, 0.0), sq(channels_, 0.0);
  for (int64_t i = 0; i < w.numel(); ++i) {
    const int64_t c = view.channel_of(i);
    sum[c] += wp[i];
    sq[c] += static_cast<double>(wp[i]) * wp[i];
  }
  const double count = static_cast<double>(view.outer * view.inner);
  for (int64_t c = 0; c < channels_; ++c) {
    const double mu = sum[c] / count;
    const double sigma = std::sqrt(std::max(0.0, sq[c] / count - mu * mu));
    const double s = std::max(std::fabs(mu - 3 * sigma), std::fabs(mu + 3 * sigma)) / (weight_qmax() + 1.0);
    scale_.value.data<float>()[c] = std::max(static_cast<float>(s), quant::kMinScale);
  }
  initialised_ = true;
}

std::vector<Tensor> WeightLSQplusQuanter::forward(const std::vector<Tensor>& inputs, bool training) {
  const Tensor& w = single_input(inputs, "lsq_plus");
  const ChannelView view = channel_view(w, init_.channel_axis, init_.per_channel);
  const float* wp = w.data<float>();
  if (!initialised_) initialise(w);
  SQ_CHECK(view.channels == channels_ && view.inner == inner_, ErrorKind::kInternal,
           "lsq_plus quanter '" + scale_.name + "': weight shape changed to " + shape_str(w.shape()));
  float* s = scale_.value.data<float>();
  for (int64_t c = 0; c < channels_; ++c) s[c] = std::max(s[c], quant::kMinScale);
  Tensor y(DType::kFloat32, w.shape());
  float* yp = y.data<float>();
  float* ds = nullptr;
  uint8_t* inside = nullptr;
  if (training) {
    ds_ = Tensor(DType::kFloat32, w.shape());
    inside_ = Tensor(DType::kUInt8, w.shape());
    ds = ds_.data<float>();
    inside = inside_.data<uint8_t>();
  }
  const float q = weight_qmax();
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float sc = s[view.channel_of(i)];
    const float u = wp[i] / sc;
    const float r = quant_math::saturate_round(u, -q, q);
    yp[i] = r * sc;
    if (ds) {
      const bool in = u >= -q && u <= q;
      inside[i] = in;
      ds[i] = in ? r - u : (u < 0 ? -q : q);
    }
  }
  return {y};
}

std::vector<Tensor> WeightLSQplusQuanter::backward(const std::vector<Tensor>& grads) {
  if (grads.empty() || !grads[0].defined()) return {Tensor()};  // no gradient reached the output
  const Tensor& g = single_grad(grads, ds_, "lsq_plus");
  Tensor dw(DType::kFloat32, g.shape());
  const float* gp = g.data<float>();
  const float* ds = ds_.data<float>();
  const uint8_t* inside = inside_.data<uint8_t>();
  float* dwp = dw.data<float>();
  ChannelView view{outer_, channels_, inner_};
  std::vector<double> dscale(channels_, 0.0);
  for (int64_t i = 0; i < g.numel(); ++i) {
    dwp[i] = inside[i] ? gp[i] : 0.0f;
    dscale[view.channel_of(i)] += static_cast<double>(gp[i]) * ds[i];
  }
  // LSQ gradient scale: 1 / sqrt(elements sharing the step * Qp).
  const double gs = 1.0 / std::sqrt(static_cast<double>(outer_ * inner_) * weight_qmax());
  for (int64_t c = 0; c < channels_; ++c) add_grad(scale_, static_cast<size_t>(c), static_cast<float>(dscale[c] * gs));
  return {dw};
}

QuantParam WeightLSQplusQuanter::export_params() const {
  SQ_CHECK(initialised_, ErrorKind::kInvalidData, "lsq_plus quanter '" + scale_.name + "' has seen no weights");
  QuantParam p;
  p.dtype = DType::kInt8;
  for (float s : scale_.value.values<float>()) p.scale.push_back(std::max(s, quant::kMinScale));
  p.zero_point.assign(p.scale.size(), 0);
  p.axis = init_.per_channel ? init_.channel_axis : -1;
  p.bits = init_.bits;
  return p;
}

// ---- ActLSQplus ---------------------------------------------------------------------------------

ActLSQplusQuanter::ActLSQplusQuanter(const QuanterInit& init, const std::string& prefix)
    : Quanter(init), scale_(make_param(prefix + ".scale", {}, 1.0f)), beta_(make_param(prefix + ".beta", {}, 0.0f)) {
  SQ_CHECK(!init.is_weight, ErrorKind::kInternal, "ActLSQplusQuanter on a weight");
  sign_known_ = true;  // asymmetric: the offset covers either sign
  if (init.symmetric) {
    sign_known_ = init.sign.has_value() || init.has_range;
    signed_ = init.sign ? *init.sign : !init.never_negative;
  }
  if (init.has_range) {
    const float lo = std::min(init.range.lo, 0.0f), hi = std::max(init.range.hi, 0.0f);
    if (init.symmetric) {
      // The symmetric grid covering the calibrated range.
      scale_.value.data<float>()[0] = std::max(signed_ ? std::max(hi, -lo) / 127.0f : hi / 255.0f, quant::kMinScale);
    } else {
      // The asymmetric u8 parameters of the calibrated range: s = (hi - lo) / 255, beta = lo.
      scale_.value.data<float>()[0] = std::max((hi - lo) / 255.0f, quant::kMinScale);
      beta_.value.data<float>()[0] = lo;
    }
    initialised_ = true;
  }
}

std::vector<Tensor> ActLSQplusQuanter::forward(const std::vector<Tensor>& inputs, bool training) {
  const Tensor& x = single_input(inputs, "lsq_plus");
  const float* xp = x.data<float>();
  float& s = scale_.value.data<float>()[0];
  float& beta = beta_.value.data<float>()[0];
  if (!initialised_ || !sign_known_) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < x.numel(); ++i) lo = std::min(lo, xp[i]), hi = std::max(hi, xp[i]);
    if (init_.symmetric && !sign_known_) {
      signed_ = lo < 0.0f;
      sign_known_ = true;
    }
    if (!initialised_) {
      if (init_.symmetric) {
        s = std::max(signed_ ? std::max(hi, -lo) / 127.0f : hi / 255.0f, quant::kMinScale);
      } else {
        s = std::max((hi - lo) / 255.0f, quant::kMinScale);
        beta = lo;
      }
      initialised_ = true;
    }
  }
  s = std::max(s, quant::kMinScale);
  const float qmin = this->qmin(), qmax = this->qmax();
  const float zp = init_.symmetric ? 0.0f : quant_math::saturate_round(-beta / s, 0.0f, 255.0f);
  Tensor y(DType::kFloat32, x.shape());
  float* yp = y.data<float>();
  float* ds = nullptr;
  int8_t* region = nullptr;
  if (training) {
    ds_ = Tensor(DType::kFloat32, x.shape());
    region_ = Tensor(DType::kInt8, x.shape());
    ds = ds_.data<float>();
    region = region_.data<int8_t>();
    per_sample_ = x.rank() > 1 && x.dim(0) > 0 ? x.numel() / x.dim(0) : x.numel();
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float u = xp[i] / s + zp;
    const float r = quant_math::saturate_round(u, qmin, qmax);
    yp[i] = (r - zp) * s;
    if (ds) {
      const int8_t reg = u < qmin ? -1 : (u > qmax ? 1 : 0);
      region[i] = reg;
      // Below the range the asymmetric form's output is beta (the offset), not a multiple of s.
      ds[i] = reg == 0 ? r - u : (reg < 0 ? (init_.symmetric ? qmin : 0.0f) : qmax);
    }
  }
  return {y};
}

std::vector<Tensor> ActLSQplusQuanter::backward(const std::vector<Tensor>& grads) {
  if (grads.empty() || !grads[0].defined()) return {Tensor()};  // no gradient reached the output
  const Tensor& g = single_grad(grads, ds_, "lsq_plus");
  Tensor dx(DType::kFloat32, g.shape());
  const float* gp = g.data<float>();
  const float* ds = ds_.data<float>();
  const int8_t* region = region_.data<int8_t>();
  float* dxp = dx.data<float>();
  double dscale = 0.0, dbeta = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    dscale += static_cast<double>(gp[i]) * ds[i];
    if (region[i] == 0) dxp[i] = gp[i];
    else dbeta += gp[i];
  }
  const double gs = 1.0 / std::sqrt(static_cast<double>(per_sample_) * qmax());
  add_grad(scale_, 0, static_cast<float>(dscale * gs));
  if (!init_.symmetric) add_grad(beta_, 0, static_cast<float>(dbeta * gs));
  return {dx};
}

QuantParam ActLSQplusQuanter::export_params() const {
  SQ_CHECK(initialised_, ErrorKind::kInvalidData, "lsq_plus quanter '" + scale_.name + "' has seen no data");
  const float s = std::max(scale_.value.data<float>()[0], quant::kMinScale);
  if (init_.symmetric) return per_tensor_params(signed_ ? DType::kInt8 : DType::kUInt8, s, 0);
  const float zp = quant_math::saturate_round(-beta_.value.data<float>()[0] / s, 0.0f, 255.0f);
  return per_tensor_params(DType::kUInt8, s, static_cast<int32_t>(zp));
}

// ---- moving-average abs max -----------------------------------------------------------------------

MovingAbsMaxQuanter::MovingAbsMaxQuanter(const QuanterInit& init, const std::string& /*prefix*/, float moving_rate)
    : Quanter(init), rate_(moving_rate), accum_(Tensor::scalar<float>(0.0f)), state_(Tensor::scalar<float>(0.0f)) {
  signed_ = init.is_weight || !init.never_negative;
  if (init.has_range) {
    accum_.data<float>()[0] = std::max(init.range.hi, -init.range.lo);
    state_.data<float>()[0] = 1.0f;
  }
}

float MovingAbsMaxQuanter::threshold() const {
  const float state = state_.data<float>()[0];
  return state > 0.0f ? std::max(accum_.data<float>()[0] / state, quant::kMinScale) : 0.0f;
}

std::vector<Tensor> MovingAbsMaxQuanter::forward(const std::vector<Tensor>& inputs, bool training) {
  const Tensor& x = single_input(inputs, "moving_abs_max");
  const float* xp = x.data<float>();
  if (training || state_.data<float>()[0] == 0.0f) {
    if (state_.data<float>()[0] == 0.0f && !init_.has_range && !init_.is_weight) {
      float lo = 0.0f;
      for (float v : x.values<float>()) lo = std::min(lo, v);
      signed_ = lo < 0.0f;
    }
    accum_.data<float>()[0] = rate_ * accum_.data<float>()[0] + abs_max_of(x);
    state_.data<float>()[0] = rate_ * state_.data<float>()[0] + 1.0f;
  }
  const float t = threshold();
  const float qmax = !signed_ ? 255.0f : init_.is_weight ? weight_qmax() : 127.0f;
  const float qmin = signed_ ? -qmax : 0.0f;
  const float s = t / qmax;
  Tensor y(DType::kFloat32, x.shape());
  float* yp = y.data<float>();
  uint8_t* inside = nullptr;
  if (training) {
    inside_ = Tensor(DType::kUInt8, x.shape());
    inside = inside_.data<uint8_t>();
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    yp[i] = fake_quant(xp[i], s, qmin, qmax);
    if (inside) inside[i] = xp[i] <= t && xp[i] >= (signed_ ? -t : 0.0f);
  }
  return {y};
}

std::vector<Tensor> MovingAbsMaxQuanter::backward(const std::vector<Tensor>& grads) {
  if (grads.empty() || !grads[0].defined()) return {Tensor()};  // no gradient reached the output
  const Tensor& g = single_grad(grads, inside_, "moving_abs_max");
  Tensor dx(DType::kFloat32, g.shape());
  const float* gp = g.data<float>();
  const uint8_t* inside = inside_.data<uint8_t>();
  float* dxp = dx.data<float>();
  for (int64_t i = 0; i < g.numel(); ++i) dxp[i] = inside[i] ? gp[i] : 0.0f;
  return {dx};
}

QuantParam MovingAbsMaxQuanter::export_params() const {
  SQ_CHECK(state_.data<float>()[0] > 0.0f, ErrorKind::kInvalidData, "moving_abs_max quanter has seen no data");
  const float t = threshold();
  if (init_.is_weight) {
    QuantParam p = per_tensor_params(DType::kInt8, t / weight_qmax(), 0);
    p.bits = init_.bits;
    return p;
  }
  return signed_ ? per_tensor_params(DType::kInt8, t / 127.0f, 0)
                 : per_tensor_params(DType::kUInt8, t / 255.0f, 0);
}

// ---- abs_max (weights) ------------------------------------------------------------------------------

AbsMaxWeightQuanter::AbsMaxWeightQuanter(const QuanterInit& init, const std::string& /*prefix*/) : Quanter(init) {
  SQ_CHECK(init.is_weight, ErrorKind::kInternal, "AbsMaxWeightQuanter on an activation");
}

std::vector<float> AbsMaxWeightQuanter::channel_scales(const Tensor& w) const {
  const ChannelView view = channel_view(w, init_.channel_axis, init_.per_channel);
  std::vector<float> m(view.channels, 0.0f);
  const float* wp = w.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) m[view.channel_of(i)] = std::max(m[view.channel_of(i)], std::fabs(wp[i]));
  const float qmax = weight_qmax();
  for (float& v : m) v = std::max(v / qmax, quant::kMinScale);
  return m;
}

std::vector<Tensor> AbsMaxWeightQuanter::forward(const std::vector<Tensor>& inputs, bool /*training*/) {
  const Tensor& w = single_input(inputs, "abs_max");
  scales_ = channel_scales(w);
  const ChannelView view = channel_view(w, init_.channel_axis, init_.per_channel);
  Tensor y(DType::kFloat32, w.shape());
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  const float qmax = weight_qmax();
  for (int64_t i = 0; i < w.numel(); ++i) yp[i] = fake_quant(wp[i], scales_[view.channel_of(i)], -qmax, qmax);
  return {y};
}

std::vector<Tensor> AbsMaxWeightQuanter::backward(const std::vector<Tensor>& grads) {
  if (grads.empty() || !grads[0].defined()) return {Tensor()};  // no gradient reached the output
  return {grads[0]};  // nothing is clipped: max|w| is inside the range by construction
}

QuantParam AbsMaxWeightQuanter::export_params() const {
  SQ_CHECK(!scales_.empty(), ErrorKind::kInvalidData, "abs_max weight quanter has seen no weights");
  QuantParam p;
  p.dtype = DType::kInt8;
  p.scale = scales_;
  p.zero_point.assign(scales_.size(), 0);
  p.axis = init_.per_channel ? init_.channel_axis : -1;
  p.bits = init_.bits;
  return p;
}

}  // namespace slimquant::train
