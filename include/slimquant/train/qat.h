#pragma once
// Quantization-aware training: start from the FP32 model, put quanters on every tensor PTQ would
// quantize (the same layers, QuantConfig rules and shared tensors), fine-tune with cross-entropy on
// labelled data or by distillation from the FP32 model, and export the same QDQ ONNX form as PTQ.
//
//   QAT qat(config, options);
//   qat.prepare(float_graph, &calibration_set);   // PTQ layers, short calibration, quanters
//   qat.fit(train_set);                           // epochs, per-epoch checkpoint / resume
//   ir::Graph qdq = qat.convert();                // runs in make_int8_session and ONNX Runtime
//
// BatchNorm is folded into the convolutions before training (PTQ::quantize does it), so the
// weights that are trained and fake-quantized are exactly the folded weights the INT8 graph holds;
// one that follows no convolution runs with its running statistics frozen (per sample, as deployed).
//
// A batch the model cannot take is run in parts, as Session::run does: when its input declares a
// fixed batch B (parts of B), or when the whole batch fails with a shape error and one sample does
// not (parts of 1: a batch of 1 baked into a Reshape by an exporter). A training step then
// accumulates the gradients of its parts, each part's loss weighted by its share of the batch, so
// the step is that of the whole batch's mean loss. One line on stderr says so, once.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/data/batch.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/graph.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"
#include "slimquant/train/optimizer.h"
#include "slimquant/train/quanters.h"
#include "slimquant/train/train_graph.h"

namespace slimquant::train {

// A quanter with settings, registered under a name in QATOptions::quanter_specs (the Python API
// registers each quanter object given to a QuantConfig this way: PaddleSlim's constructor arguments).
struct QuanterSpec {
  std::string type;                 // a make_quanter name: pact, lsq_plus, moving_abs_max, abs_max
  std::optional<float> init_value;  // QuanterInit::init_value (pact)
  std::optional<bool> per_channel;  // weight quanters: QuanterInit::per_channel
  float lr_scale = 1.0f;            // QuanterInit::lr_scale
  bool symmetric = false;           // activation lsq_plus: QuanterInit::symmetric
  std::optional<bool> sign;         // with symmetric: QuanterInit::sign
};

struct QATOptions {
  // Default quanters; QuantRule::activation_quanter / weight_quanter override them per rule.
  // Each of these names is a make_quanter name or a key of quanter_specs.
  std::string weight_quanter = "lsq_plus";  // lsq_plus | pact | abs_max
  std::string act_quanter = "pact";         // pact | lsq_plus | moving_abs_max
  int epochs = 1;
  size_t batch_size = 32;
  // Optimizer steps per epoch (0 = one pass over the training set). Each epoch draws its own
  // shuffled subset, so a small number of steps still sees varied data.
  size_t steps_per_epoch = 0;
  // SGD with momentum 0.9 by default: LSQ's gradient scaling assumes plain gradient steps, and Adam's
  // per-parameter normalisation moves the small quantizer steps by a large fraction each step.
  OptimizerOptions optimizer = [] {
    OptimizerOptions o;
    o.type = "sgd";
    return o;
  }();
  float lr = 0.0f;  // peak learning rate; 0 = 1e-3 for sgd, 1e-4 for adam / adamw
  std::string lr_schedule = "cosine";  // cosine | step | constant
  float warmup_fraction = 0.05f;        // of all steps, linear warmup
  // Distillation: loss = KL(teacher || student) at this temperature, teacher = the FP32 model.
  bool distill = false;
  float temperature = 1.0f;
  // Activation quanters start from a PTQ calibration (the config's `algo`) over this many batches
  // of the calibration set; 0 = initialise from the first training batch instead.
  size_t calib_batches = 8;
  uint64_t seed = 0;  // shuffling
  // Written after every epoch (atomically) and resumed from by fit() when it exists.
  std::string checkpoint;
  int num_threads = 0;  // teacher session threads (0 = OpenMP default)
  // Named quanter settings (see QuanterSpec); empty from the CLI.
  std::map<std::string, QuanterSpec> quanter_specs;
};

struct EpochReport {
  int epoch = 0;  // 1-based
  size_t steps = 0;
  double mean_loss = 0.0;
  double seconds = 0.0;
  size_t samples = 0;
};

class QAT {
 public:
  QAT(quant::QuantConfig config, QATOptions options);
  ~QAT();

  // Prepares the float graph as PTQ does (BN folded, opset 13), calibrates activation ranges on
  // `calib` (when given and calib_batches > 0), builds the training graph and inserts one quanter per
  // quantized activation tensor and weight. Unknown quanter names are kInvalidArgument.
  void prepare(const ir::Graph& float_graph, const data::Dataset* calib = nullptr);
  // Trains the epochs not yet done: loads the checkpoint when options.checkpoint exists (refusing
  // one of another model or configuration), then runs epoch after epoch, saving after each.
  // Without distill the data set must have labels (kInvalidArgument otherwise).
  void fit(const data::Dataset& train, const std::function<void(const EpochReport&)>& on_epoch = {});
  // New training settings after prepare() (the Python API takes them per train() call): epochs,
  // batch size, steps, optimizer, learning rate and schedule, distillation, seed, checkpoint. The
  // weights, quanters and calibration are kept; the optimizer starts afresh (its state and the
  // schedule's step count from zero) and fit() runs all the new epochs. The quanter settings of
  // `options` are ignored: prepare() placed the quanters.
  void set_training_options(QATOptions options);
  // One optimizer step on a batch (labels needed unless distilling); returns the loss before it.
  // A batch larger than the model takes is run in parts with their gradients accumulated.
  double train_step(const data::Batch& batch, float lr);
  // Logits of the training graph in evaluation mode: the float simulation of the exported model
  // (in parts, joined, when the model takes fewer samples).
  Tensor simulate(const Tensor& input);
  // The most samples one forward of the training graph takes, or 0 while none is known.
  int64_t batch_limit() const { return batch_limit_; }
  // The QDQ graph with the trained weights and the quanters' scales.
  ir::Graph convert();
  // The PTQ result of the calibration prepare() ran (the baseline QAT improves on); kInvalidData
  // when prepare() did not calibrate.
  ir::Graph ptq_graph() const;
  bool calibrated() const { return calibrated_; }

  const std::vector<quant::Layer>& layers() const;
  // Quanters by the tensor they sit on (activation tensors and weight initializers).
  const std::map<std::string, Quanter*>& quanters() const { return quanters_; }
  TrainGraph& graph() { return *graph_; }
  Optimizer& optimizer() { return *optimizer_; }
  int completed_epochs() const { return completed_epochs_; }
  const QATOptions& options() const { return options_; }
  int64_t total_steps(size_t train_size) const;
  const ir::Graph& float_graph() const;  // prepared (BN folded, opset >= 13)
  const std::string& input_name() const { return input_name_; }
  const std::string& output_name() const { return output_name_; }

  // Checkpoint: parameters, quanter state, optimizer state, completed epochs, and fingerprints
  // of the model and of the training configuration. Written to path + ".tmp", then renamed.
  void save_checkpoint(const std::string& path) const;
  // Throws kInvalidArgument when the checkpoint belongs to another model or configuration (naming
  // which), kInvalidData when it is corrupt.
  void load_checkpoint(const std::string& path);
  std::string model_fingerprint() const { return model_fingerprint_; }
  std::string config_fingerprint() const;

 private:
  Tensor teacher_logits(const Tensor& input);
  // The make_quanter name a quanter name stands for (a quanter_specs key or itself), checked.
  std::string quanter_type(const std::string& name, bool is_weight) const;
  // Applies the settings of a quanter_specs entry to `init` (nothing for a plain name).
  void apply_quanter_spec(const std::string& name, QuanterInit& init) const;
  void check_training_options();  // also sets the default learning rate
  void build_optimizer();
  float lr_at(int64_t step, size_t train_size) const;
  // Calls run(first, count) over the rows of a batch of `inputs`: all at once, or in parts the
  // model takes (see the class comment), learning the limit on the way. `restart` undoes what a
  // whole-batch try that failed did before falling back to parts of one sample.
  void over_parts(const Tensor& inputs, const std::function<void(int64_t first, int64_t count)>& run,
                  const std::function<void()>& restart);
  void limit_batch(int64_t limit, const std::string& why);

  quant::QuantConfig config_;
  QATOptions options_;
  std::unique_ptr<quant::PTQ> ptq_;
  std::unique_ptr<TrainGraph> graph_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<runtime::Session> teacher_;
  std::map<std::string, Quanter*> quanters_;
  std::map<std::string, std::string> quanter_names_;  // tensor -> quanter name (fingerprint)
  std::string input_name_, output_name_, model_fingerprint_;
  int completed_epochs_ = 0;
  bool calibrated_ = false;
  int64_t batch_limit_ = 0;  // see batch_limit()
};

}  // namespace slimquant::train
