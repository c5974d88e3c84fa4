#pragma once
// Optimizers over train::Parameters and learning-rate schedules.
//   SGD   (PyTorch convention) g = grad + wd w; v = mu v + g; step = nesterov ? g + mu v : v;
//         w -= lr step
//   Adam  g = grad + wd w (L2); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//         w -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//   AdamW the same with decoupled decay instead of L2: w -= lr wd w before the Adam step.
// Weight decay applies only to parameters added with decay = true (the flow adds weight tensors
// that way; quanter scales, clips, offsets and biases are added without decay).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slimquant/train/parameter.h"

namespace slimquant::train {

struct OptimizerOptions {
  std::string type = "adam";  // sgd | adam | adamw
  float momentum = 0.9f;      // sgd
  bool nesterov = false;      // sgd
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adam / adamw
  float weight_decay = 0.0f;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Parameters must outlive the optimizer; a parameter added twice is kInvalidArgument.
  void add(Parameter* p, bool decay);
  // One update of every parameter from its current grad, with learning rate lr.
  virtual void step(float lr) = 0;
  void zero_grad();
  int64_t steps() const { return steps_; }
  const OptimizerOptions& options() const { return options_; }
  // State for checkpoints: per parameter name, the moment buffers ("<name>#m", "<name>#v",
  // "<name>#velocity") and "#steps". load_state() refuses state of other parameters or shapes.
  std::map<std::string, Tensor> state() const;
  void load_state(const std::map<std::string, Tensor>& state);

 protected:
  explicit Optimizer(OptimizerOptions options) : options_(std::move(options)) {}
  struct Slot {
    Parameter* param;
    bool decay;
    std::map<std::string, Tensor> buffers;  // zero-initialised, same shape as the parameter
  };
  Tensor& buffer(Slot& s, const std::string& key);
  OptimizerOptions options_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

// kInvalidArgument naming the type for anything but sgd / adam / adamw.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options);

// Learning rate at step t (0-based) of total_steps.
//   cosine   linear warmup from lr/warmup_steps to lr over warmup_steps, then
//            lr_min + (lr - lr_min) (1 + cos(pi (t - warmup) / (total - warmup))) / 2
//   step     lr * gamma^floor(t / step_size)     (after the same warmup)
//   constant lr
struct LRSchedule {
  std::string type = "cosine";
  float lr = 1e-4f;
  float min_lr = 0.0f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  int64_t step_size = 1000;  // step
  float gamma = 0.1f;        // step
  float at(int64_t t) const;
};

}  // namespace slimquant::train
