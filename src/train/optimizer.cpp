#include "slimquant/train/optimizer.h"

#include <cmath>
#include <numbers>

namespace slimquant::train {

void Optimizer::add(Parameter* p, bool decay) {
  SQ_CHECK(p != nullptr, ErrorKind::kInternal, "optimizer: null parameter");
  SQ_CHECK(p->value.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           "optimizer: parameter '" + p->name + "' is not float32");
  for (const auto& s : slots_)
    SQ_CHECK(s.param != p && s.param->name != p->name, ErrorKind::kInvalidArgument,
             "optimizer: parameter '" + p->name + "' added twice");
  slots_.push_back({p, decay, {}});
}

void Optimizer::zero_grad() {
  for (auto& s : slots_) s.param->zero_grad();
}

Tensor& Optimizer::buffer(Slot& s, const std::string& key) {
  auto it = s.buffers.find(key);
  if (it == s.buffers.end() || it->second.shape() != s.param->value.shape())
    it = s.buffers.insert_or_assign(key, Tensor(DType::kFloat32, s.param->value.shape())).first;
  return it->second;
}

std::map<std::string, Tensor> Optimizer::state() const {
  std::map<std::string, Tensor> out;
  for (const auto& s : slots_)
    for (const auto& [k, t] : s.buffers) out[s.param->name + "#" + k] = t.clone();
  out["#steps"] = Tensor::scalar<int64_t>(steps_);
  return out;
}

void Optimizer::load_state(const std::map<std::string, Tensor>& state) {
  std::map<std::string, Slot*> by_name;
  for (auto& s : slots_) by_name[s.param->name] = &s;
  for (const auto& [key, t] : state) {
    if (key == "#steps") {
      steps_ = t.to_int64_vector().at(0);
      continue;
    }
    const auto hash = key.rfind('#');
    SQ_CHECK(hash != std::string::npos, ErrorKind::kInvalidData, "optimizer state: malformed entry '" + key + "'");
    auto it = by_name.find(key.substr(0, hash));
    SQ_CHECK(it != by_name.end(), ErrorKind::kInvalidData,
             "optimizer state: no parameter '" + key.substr(0, hash) + "' in this model");
    SQ_CHECK(t.shape() == it->second->param->value.shape() && t.dtype() == DType::kFloat32, ErrorKind::kInvalidData,
             "optimizer state: '" + key + "' has shape " + shape_str(t.shape()) + ", parameter has " +
                 shape_str(it->second->param->value.shape()));
    it->second->buffers[key.substr(hash + 1)] = t.clone();
  }
}

namespace {

class SGD : public Optimizer {
 public:
  explicit SGD(OptimizerOptions o) : Optimizer(std::move(o)) {}
  void step(float lr) override {
    ++steps_;
    const float mu = options_.momentum;
    for (auto& s : slots_) {
      Parameter& p = *s.param;
      if (!p.grad.defined()) continue;
      const float wd = s.decay ? options_.weight_decay : 0.0f;
      float* w = p.value.data<float>();
      const float* g = p.grad.data<float>();
      float* v = mu != 0.0f ? buffer(s, "velocity").data<float>() : nullptr;
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        const float gi = g[i] + wd * w[i];
        float d = gi;
        if (v) {
          v[i] = mu * v[i] + gi;
          d = options_.nesterov ? gi + mu * v[i] : v[i];
        }
        w[i] -= lr * p.lr_scale * d;
      }
    }
  }
};

class Adam : public Optimizer {
 public:
  Adam(OptimizerOptions o, bool decoupled) : Optimizer(std::move(o)), decoupled_(decoupled) {}
  void step(float lr) override {
    ++steps_;
    const double b1 = options_.beta1, b2 = options_.beta2;
    const double c1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
    const double c2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
    for (auto& s : slots_) {
      Parameter& p = *s.param;
      if (!p.grad.defined()) continue;
      const float wd = s.decay ? options_.weight_decay : 0.0f;
      float* w = p.value.data<float>();
      const float* g = p.grad.data<float>();
      float* m = buffer(s, "m").data<float>();
      float* v = buffer(s, "v").data<float>();
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        float gi = g[i];
        if (decoupled_) w[i] -= lr * p.lr_scale * wd * w[i];
        else gi += wd * w[i];
        m[i] = static_cast<float>(b1 * m[i] + (1.0 - b1) * gi);
        v[i] = static_cast<float>(b2 * v[i] + (1.0 - b2) * static_cast<double>(gi) * gi);
        const double mhat = m[i] / c1, vhat = v[i] / c2;
        w[i] -= static_cast<float>(lr * p.lr_scale * mhat / (std::sqrt(vhat) + options_.eps));
      }
    }
  }

 private:
  bool decoupled_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& o) {
  if (o.type == "sgd") return std::make_unique<SGD>(o);
  if (o.type == "adam") return std::make_unique<Adam>(o, false);
  if (o.type == "adamw") return std::make_unique<Adam>(o, true);
  fail(ErrorKind::kInvalidArgument, "unknown optimizer '" + o.type + "' (known: sgd, adam, adamw)");
}

float LRSchedule::at(int64_t t) const {
  if (warmup_steps > 0 && t < warmup_steps)
    return lr * static_cast<float>(t + 1) / static_cast<float>(warmup_steps);
  if (type == "constant") return lr;
  if (type == "step") {
    SQ_CHECK(step_size > 0, ErrorKind::kInvalidArgument, "step schedule: step_size must be positive");
    return lr * std::pow(gamma, static_cast<float>((t - warmup_steps) / step_size));
  }
  if (type == "cosine") {
    const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
    const double x = std::min(1.0, static_cast<double>(t - warmup_steps) / static_cast<double>(span));
    return static_cast<float>(min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * x)));
  }
  fail(ErrorKind::kInvalidArgument, "unknown learning-rate schedule '" + type + "' (known: cosine, step, constant)");
}

}  // namespace slimquant::train
