#pragma once
// Quanters: fake quantization with trainable parameters, as TrainOps inserted on a tensor of the
// training graph (one input, one output). The forward pass is exactly the arithmetic of the
// QuantizeLinear -> DequantizeLinear pair the quanter exports to (round half to even, saturate), so
// the trained graph's evaluation and the exported QDQ model agree. Gradients use the straight-through
// estimator inside the quantization range; each quanter's parameter gradients follow its paper:
//
//   PACT          y = fq(clip(x, lo, a)), lo = -a (signed) or 0 (never-negative input), scale
//                 a/127 (s8) or a/255 (u8, zero point 0). dL/dx = g inside (lo, a), 0 outside;
//                 dL/da = +g where x >= a, -g where x <= -a (signed), 0 inside.
//   WeightLSQplus u = w/s, y = s * clamp(round(u), -127, 127), s per tensor or per output channel,
//                 initialised to max(|mu - 3 sigma|, |mu + 3 sigma|) / 2^(b-1) of the weights (of the
//                 channel). dL/dw = g inside, 0 outside; dL/ds = gs * g * (round(u) - u) inside,
//                 -127 or 127 outside, with gs = 1 / sqrt(n * Qp), n = elements sharing s.
//   ActLSQplus    (QuanterInit::symmetric: LSQ without offset, s8 or u8 with zero point 0, dL/ds as
//                 below with Qp = 127 or 255.) Otherwise asymmetric u8: u = x/s + z with z = clamp(round(-beta/s), 0, 255) (the offset beta
//                 snapped to the zero point the export can state), y = s * (clamp(round(u), 0, 255) - z).
//                 dL/dx = g inside; dL/ds = gs * g * (round(u) - u) inside, 0 below, 255 above;
//                 dL/dbeta = gs * g outside, 0 inside; gs = 1 / sqrt(n * Qp), n = elements per sample.
//   moving_abs_max  activation scale from an exponential moving average of max|x| (training only;
//                 frozen in evaluation): state = r*state + 1, accum = r*accum + max|x|,
//                 threshold = accum / state (r = 0.9); no trainable parameters, STE inside.
//   abs_max (weights)  per-channel max|w| / 127 of the current weights, recomputed every forward.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slimquant/quant/observer.h"
#include "slimquant/train/parameter.h"
#include "slimquant/train/train_graph.h"

namespace slimquant::train {

// What a quanter knows about its tensor before training starts (from PTQ calibration when run).
struct QuanterInit {
  bool is_weight = false;
  // Weights: the per-channel axis (output channels); per_channel = false gives one scale.
  int64_t channel_axis = 0;
  bool per_channel = true;
  // Weights: the initial values. When given, scales are set at construction (so optimizers see
  // their final shapes); otherwise on the first forward.
  Tensor initial_weight;
  // Activations: the calibrated clipping range; has_range = false means "initialise from the first
  // training batch". never_negative picks u8 with zero point 0 over s8 for symmetric quanters.
  bool has_range = false;
  quant::ClipRange range;
  bool never_negative = false;
  // Weights: 2..8 (QuantConfig::weight_bits; values within +-(2^(bits-1) - 1)). Activations: 8.
  int bits = 8;
  // PACT: the initial clip alpha, instead of the calibrated range, the initial weights or the first
  // batch (PaddleSlim's PACTQuanter init_value). Must be positive.
  std::optional<float> init_value;
  // Multiplies the learning rate of the quanter's parameters (PaddleSlim's PACT learning_rate).
  float lr_scale = 1.0f;
  // ActLSQplus: symmetric = no offset (LSQ, PaddleSlim's symmetric=True): y = s * clamp(round(x/s)),
  // on s8 [-127, 127] when signed, u8 [0, 255] (zero point 0) otherwise; `sign` unset = u8 when
  // calibration saw no negative value (or the first batch has none).
  bool symmetric = false;
  std::optional<bool> sign;
};

class Quanter : public TrainOp {
 public:
  // Canonical name: "pact", "lsq_plus", "moving_abs_max", "abs_max".
  virtual std::string name() const = 0;
  // The QuantizeLinear / DequantizeLinear parameters the export writes: per tensor for
  // activations, per channel (along the init's channel axis) for weights. Throws kInvalidData
  // before the quanter has seen data when it initialises lazily.
  virtual QuantParam export_params() const = 0;
  // Non-trainable state a checkpoint must keep (moving averages), by short name.
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  // Weight quanters whose scale follows the weights (abs_max) recompute it from the final weights
  // before export; the others ignore this.
  virtual void observe_final(const Tensor& /*value*/) {}
  // Trainable parameters: quanter scales/offsets/clips. Optimizers apply no weight decay to them.
  std::vector<Parameter*> parameters() override { return {}; }
  const QuanterInit& init() const { return init_; }

 protected:
  explicit Quanter(QuanterInit init) : init_(init) {}
  // The largest |w_q| of a weight quanter: 2^(bits-1) - 1 (127 for 8 bits).
  float weight_qmax() const { return static_cast<float>((1 << (init_.bits - 1)) - 1); }
  QuanterInit init_;
};

// Names accepted by make_quanter, per role (the CLI's --weight-quanter / --act-quanter values).
const std::vector<std::string>& weight_quanter_names();      // lsq_plus, pact, abs_max
const std::vector<std::string>& activation_quanter_names();  // pact, lsq_plus, moving_abs_max
// Builds the quanter `name` ("lsq_plus" means WeightLSQplus for weights, ActLSQplus for activations;
// PaddleSlim's class names PACTQuanter/WeightLSQplusQuanter/ActLSQplusQuanter are accepted too).
// `param_prefix` names its parameters ("<prefix>.alpha", ".scale", ".beta"). Unknown names throw
// kInvalidArgument listing the known ones.
std::unique_ptr<Quanter> make_quanter(const std::string& name, const QuanterInit& init, const std::string& param_prefix);
// Throws the same error as make_quanter for an unknown name, without building anything.
void check_quanter_name(const std::string& name, bool is_weight);

class PACTQuanter : public Quanter {
 public:
  PACTQuanter(const QuanterInit& init, const std::string& prefix);
  std::string name() const override { return "pact"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  std::vector<Parameter*> parameters() override { return {&alpha_}; }
  QuantParam export_params() const override;
  Parameter& alpha() { return alpha_; }
  bool is_signed() const { return signed_; }

 private:
  Parameter alpha_;
  bool signed_ = true, initialised_ = false;
  bool sign_known_ = false;  // activations without calibration take the sign of the first batch
  Tensor region_;  // per element: -1 below the range, 0 inside, +1 above
};

class WeightLSQplusQuanter : public Quanter {
 public:
  WeightLSQplusQuanter(const QuanterInit& init, const std::string& prefix);
  std::string name() const override { return "lsq_plus"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  std::vector<Parameter*> parameters() override { return {&scale_}; }
  QuantParam export_params() const override;
  Parameter& scale() { return scale_; }

 private:
  void initialise(const Tensor& w);
  Parameter scale_;
  bool initialised_ = false;
  int64_t outer_ = 1, channels_ = 1, inner_ = 1;
  Tensor ds_;       // per element d(y)/d(s) before the gradient scale
  Tensor inside_;   // per element 1 inside the range, 0 clipped
};

class ActLSQplusQuanter : public Quanter {
 public:
  ActLSQplusQuanter(const QuanterInit& init, const std::string& prefix);
  std::string name() const override { return "lsq_plus"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  std::vector<Parameter*> parameters() override {
    if (init_.symmetric) return {&scale_};
    return {&scale_, &beta_};
  }
  QuantParam export_params() const override;
  Parameter& scale() { return scale_; }
  Parameter& beta() { return beta_; }

 private:
  // The integer range: [0, 255] asymmetric or unsigned, [-127, 127] signed symmetric.
  float qmin() const { return init_.symmetric && signed_ ? -127.0f : 0.0f; }
  float qmax() const { return init_.symmetric && signed_ ? 127.0f : 255.0f; }
  Parameter scale_, beta_;
  bool initialised_ = false;
  bool signed_ = false, sign_known_ = false;  // symmetric only
  Tensor ds_, region_;
  int64_t per_sample_ = 1;
};

class MovingAbsMaxQuanter : public Quanter {
 public:
  MovingAbsMaxQuanter(const QuanterInit& init, const std::string& prefix, float moving_rate = 0.9f);
  std::string name() const override { return "moving_abs_max"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  std::vector<std::pair<std::string, Tensor*>> buffers() override { return {{"accum", &accum_}, {"state", &state_}}; }
  QuantParam export_params() const override;
  float threshold() const;

 private:
  float rate_;
  Tensor accum_, state_;  // scalars; state 0 = nothing seen yet
  bool signed_ = true;
  Tensor inside_;
};

class AbsMaxWeightQuanter : public Quanter {
 public:
  AbsMaxWeightQuanter(const QuanterInit& init, const std::string& prefix);
  std::string name() const override { return "abs_max"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  QuantParam export_params() const override;
  void observe_final(const Tensor& value) override { scales_ = channel_scales(value); }

 private:
  std::vector<float> channel_scales(const Tensor& w) const;
  std::vector<float> scales_;  // from the last forward
};

}  // namespace slimquant::train
