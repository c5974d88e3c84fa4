#include "slimquant/train/qat.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <zlib.h>

#include "quant/qdq_export.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/core/npy.h"
#include "slimquant/core/progress.h"
#include "slimquant/quant/calibration.h"
#include "slimquant/train/loss.h"

namespace slimquant::train {

namespace {

// Version 2 adds CRC-32 checksums: one over the header, one per tensor (listed in the header).
constexpr char kCheckpointMagic[8] = {'S', 'Q', 'Q', 'A', 'T', 'C', 'K', '2'};
constexpr char kCheckpointMagicV1[8] = {'S', 'Q', 'Q', 'A', 'T', 'C', 'K', '1'};

uint32_t crc32_of(const void* data, size_t size) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes uInt lengths
    const uInt chunk = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

// FNV-1a, 64 bit: a cheap, stable fingerprint of the model (structure and weights).
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  void add(const std::string& s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
  std::string hex() const {
    std::ostringstream os;
    os << std::hex << std::setw(16) << std::setfill('0') << h;
    return os.str();
  }
};

std::string fingerprint_graph(const ir::Graph& g) {
  Fnv f;
  for (const auto& n : g.nodes) {
    f.add(n.op_type);
    f.add(n.name);
    for (const auto& i : n.inputs) f.add(i);
    for (const auto& o : n.outputs) f.add(o);
  }
  for (const auto& [name, t] : g.initializers) {
    f.add(name);
    f.add(shape_str(t.shape()));
    if (t.nbytes()) f.add(t.raw(), t.nbytes());
  }
  return f.hex();
}

size_t steps_in_epoch(size_t train_size, size_t batch_size, size_t limit) {
  const size_t full = (train_size + batch_size - 1) / batch_size;
  return limit ? std::min(limit, full) : full;
}

}  // namespace

QAT::QAT(quant::QuantConfig config, QATOptions options) : config_(std::move(config)), options_(std::move(options)) {
  SQ_CHECK(config_.mode == quant::QuantMode::kStatic, ErrorKind::kInvalidArgument,
           std::string("QAT trains quanters on weights and activations (mode static); mode ") +
               quant::quant_mode_name(config_.mode) + " quantizes without training: use quantize --mode " +
               quant::quant_mode_name(config_.mode));
  check_training_options();
  for (const auto& [name, spec] : options_.quanter_specs) {
    SQ_CHECK(spec.type != name, ErrorKind::kInvalidArgument,
             "QAT: quanter spec '" + name + "' must not reuse a quanter type name");
    SQ_CHECK(!spec.init_value || spec.type == "pact", ErrorKind::kInvalidArgument,
             "QAT: quanter spec '" + name + "': init_value is PACT's initial clip; " + spec.type + " has none");
  }
  quanter_type(options_.weight_quanter, true);
  quanter_type(options_.act_quanter, false);
}

void QAT::check_training_options() {
  SQ_CHECK(options_.batch_size > 0, ErrorKind::kInvalidArgument, "QAT: batch_size must be at least 1");
  SQ_CHECK(options_.epochs >= 0, ErrorKind::kInvalidArgument, "QAT: epochs must not be negative");
  if (options_.lr == 0.0f) options_.lr = options_.optimizer.type == "sgd" ? 1e-3f : 1e-4f;
  SQ_CHECK(options_.lr > 0 && std::isfinite(options_.lr), ErrorKind::kInvalidArgument,
           "QAT: the learning rate must be positive, got " + std::to_string(options_.lr));
  make_optimizer(options_.optimizer);  // unknown optimizer names fail before any work
  LRSchedule probe;
  probe.type = options_.lr_schedule;
  probe.at(0);
}

std::string QAT::quanter_type(const std::string& name, bool is_weight) const {
  auto it = options_.quanter_specs.find(name);
  const std::string& type = it == options_.quanter_specs.end() ? name : it->second.type;
  check_quanter_name(type, is_weight);
  return type;
}

void QAT::apply_quanter_spec(const std::string& name, QuanterInit& init) const {
  auto it = options_.quanter_specs.find(name);
  if (it == options_.quanter_specs.end()) return;
  const QuanterSpec& spec = it->second;
  init.init_value = spec.init_value;
  if (spec.per_channel && init.is_weight) init.per_channel = *spec.per_channel;
  init.lr_scale = spec.lr_scale;
  init.symmetric = spec.symmetric;
  init.sign = spec.sign;
}

void QAT::set_training_options(QATOptions options) {
  // The quanters are placed: keep the settings that made them.
  options.weight_quanter = options_.weight_quanter;
  options.act_quanter = options_.act_quanter;
  options.quanter_specs = options_.quanter_specs;
  options.calib_batches = options_.calib_batches;
  QATOptions previous = std::move(options_);
  options_ = std::move(options);
  try {
    check_training_options();
  } catch (...) {
    options_ = std::move(previous);
    throw;
  }
  if (!graph_) return;
  build_optimizer();
  completed_epochs_ = 0;
  if (options_.distill && !teacher_) {
    runtime::SessionOptions so;
    so.num_threads = options_.num_threads;
    teacher_ = std::make_unique<runtime::Session>(ptq_->float_graph(), so);
  }
}

void QAT::build_optimizer() {
  // Weight decay on weight tensors only: not on biases, LayerNorm scales or quanter parameters.
  optimizer_ = make_optimizer(options_.optimizer);
  std::set<Parameter*> quanter_params;
  for (const auto& [t, q] : quanters_)
    for (Parameter* p : q->parameters()) quanter_params.insert(p);
  std::set<Parameter*> added;
  for (Parameter* p : graph_->parameters()) {
    if (!added.insert(p).second) continue;
    optimizer_->add(p, !quanter_params.count(p) && p->value.rank() >= 2);
  }
  for (Parameter* p : quanter_params)
    if (added.insert(p).second) optimizer_->add(p, false);
}

QAT::~QAT() = default;

const std::vector<quant::Layer>& QAT::layers() const {
  SQ_CHECK(ptq_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() first");
  return ptq_->layers();
}

const ir::Graph& QAT::float_graph() const {
  SQ_CHECK(ptq_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() first");
  return ptq_->float_graph();
}

void QAT::prepare(const ir::Graph& float_graph, const data::Dataset* calib) {
  // Validate every rule's quanter names before any work.
  for (const auto& node : float_graph.nodes) {
    const quant::QuantRule& rule = config_.rule_for(node);
    if (!rule.activation_quanter.empty()) quanter_type(rule.activation_quanter, false);
    if (!rule.weight_quanter.empty()) quanter_type(rule.weight_quanter, true);
  }
  ptq_ = std::make_unique<quant::PTQ>(config_);
  ptq_->quantize(float_graph);
  const ir::Graph& g = ptq_->float_graph();
  SQ_CHECK(g.inputs.size() == 1 && g.outputs.size() >= 1, ErrorKind::kUnsupported,
           "QAT trains single-input models with logits as the first output; this model has " +
               std::to_string(g.inputs.size()) + " inputs");
  input_name_ = g.inputs[0].name;
  output_name_ = g.outputs[0].name;
  model_fingerprint_ = fingerprint_graph(g);

  bool& calibrated = calibrated_;
  calibrated = false;
  if (calib && options_.calib_batches > 0 && calib->size() > 0) {
    const auto source = quant::dataset_calibration_source(*calib, options_.batch_size, g.inputs);
    quant::CalibrationLoopOptions lo;
    lo.batch_nums = std::min(options_.calib_batches, *source->known_batches());
    calibrated = quant::calibrate(*ptq_, *source, lo).batches > 0;
  }

  graph_ = std::make_unique<TrainGraph>(g);
  quanters_.clear();
  quanter_names_.clear();
  std::map<std::string, const ir::Node*> nodes;
  for (const auto& n : g.nodes) nodes[n.name] = &n;
  for (const auto& layer : ptq_->layers()) {
    const quant::QuantRule& rule = config_.rule_for(*nodes.at(layer.name));
    for (const auto& t : layer.activations) {
      if (quanters_.count(t)) continue;  // a tensor read by several layers gets one quanter
      const std::string name = rule.activation_quanter.empty() ? options_.act_quanter : rule.activation_quanter;
      QuanterInit init;
      if (calibrated) {
        const quant::Observer& obs = ptq_->activation_observer(t);
        if (obs.observed_count() > 0) {
          init.has_range = true;
          init.range = obs.range();
          init.never_negative = !obs.seen_negative();
        }
      }
      apply_quanter_spec(name, init);
      auto q = make_quanter(quanter_type(name, false), init, t);
      quanters_[t] = q.get();
      quanter_names_[t] = q->name();
      graph_->insert_on_tensor(t, std::move(q), t + "_quanter");
    }
    if (!layer.weight.empty() && !quanters_.count(layer.weight)) {
      Parameter* p = graph_->parameter(layer.weight);
      SQ_CHECK(p != nullptr, ErrorKind::kInternal,
               "QAT: weight '" + layer.weight + "' of layer '" + layer.name + "' is not a trainable parameter");
      const std::string name = rule.weight_quanter.empty() ? options_.weight_quanter : rule.weight_quanter;
      QuanterInit init;
      init.is_weight = true;
      init.bits = config_.effective_weight_bits();
      init.channel_axis = layer.weight_axis;
      init.initial_weight = p->value.clone();
      apply_quanter_spec(name, init);
      auto q = make_quanter(quanter_type(name, true), init, layer.weight);
      quanters_[layer.weight] = q.get();
      quanter_names_[layer.weight] = q->name();
      graph_->insert_on_tensor(layer.weight, std::move(q), layer.weight + "_quanter");
    }
  }

  build_optimizer();

  teacher_.reset();
  if (options_.distill) {
    runtime::SessionOptions so;
    so.num_threads = options_.num_threads;
    teacher_ = std::make_unique<runtime::Session>(g, so);
  }
  completed_epochs_ = 0;
  batch_limit_ = 0;
}

Tensor QAT::teacher_logits(const Tensor& input) {
  SQ_CHECK(teacher_ != nullptr, ErrorKind::kInternal, "QAT: no teacher session (distill is off)");
  runtime::RunOptions ro;
  ro.outputs = {output_name_};
  return teacher_->run({{input_name_, input}}, ro).at(output_name_);
}

int64_t QAT::total_steps(size_t train_size) const {
  return static_cast<int64_t>(options_.epochs) *
         static_cast<int64_t>(steps_in_epoch(train_size, options_.batch_size, options_.steps_per_epoch));
}

float QAT::lr_at(int64_t step, size_t train_size) const {
  LRSchedule s;
  s.type = options_.lr_schedule;
  s.lr = options_.lr;
  s.total_steps = std::max<int64_t>(1, total_steps(train_size));
  s.warmup_steps = static_cast<int64_t>(options_.warmup_fraction * static_cast<float>(s.total_steps));
  // step schedule: divide by 10 at 2/3 of the run (a common fine-tuning choice).
  s.step_size = std::max<int64_t>(1, s.total_steps * 2 / 3);
  return s.at(step);
}

void QAT::limit_batch(int64_t limit, const std::string& why) {
  batch_limit_ = limit;
  runtime::print_batch_limit(limit, why, "each training step accumulating the gradients of its parts");
}

void QAT::over_parts(const Tensor& inputs, const std::function<void(int64_t first, int64_t count)>& run,
                     const std::function<void()>& restart) {
  const int64_t n = inputs.rank() ? inputs.dim(0) : 1;
  if (n > 1 && batch_limit_ == 0) {
    // The declared batch is checked here (the training graph runs whatever it is fed).
    const int64_t declared = runtime::declared_batch(graph_->graph(), {{input_name_, inputs}});
    if (declared > 0 && declared < n) limit_batch(declared, "its inputs declare batch " + std::to_string(declared));
  }
  if (batch_limit_ > 0 && n > batch_limit_) {
    for (int64_t first = 0; first < n; first += batch_limit_) run(first, std::min(batch_limit_, n - first));
    return;
  }
  try {
    run(0, n);
  } catch (const Error& e) {
    // A batch of 1 baked into the graph behind a dynamic declared batch: one sample at a time.
    if (n <= 1 || batch_limit_ != 0 || !runtime::is_shape_error(e)) throw;
    restart();
    try {
      run(0, 1);
    } catch (const Error&) {
      throw e;  // not a matter of batch size
    }
    limit_batch(1, "it fails at batch " + std::to_string(n) + ": " + e.what());
    for (int64_t first = 1; first < n; ++first) run(first, 1);
  }
}

namespace {

// A part's logits must be one row per sample (a graph with a baked batch may compute some other
// shape without failing); kInvalidArgument, a shape error, otherwise.
void check_rows(const Tensor& logits, int64_t count, const std::string& output) {
  SQ_CHECK(count <= 1 || (logits.rank() >= 1 && logits.dim(0) == count), ErrorKind::kInvalidArgument,
           "QAT: the model's output '" + output + "' is " + shape_str(logits.shape()) + " for a batch of " +
               std::to_string(count) + ", not one row per sample");
}

}  // namespace

double QAT::train_step(const data::Batch& batch, float lr) {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() before training");
  SQ_CHECK(options_.distill || !batch.labels.empty(), ErrorKind::kInvalidArgument,
           "QAT: the batch has no labels; train with distill to learn from the FP32 model's outputs");
  const int64_t n = batch.inputs.rank() ? batch.inputs.dim(0) : 1;
  SQ_CHECK(batch.labels.empty() || static_cast<int64_t>(batch.labels.size()) == n, ErrorKind::kInvalidArgument,
           "QAT: " + std::to_string(batch.labels.size()) + " labels for a batch of " + std::to_string(n) + " samples");
  optimizer_->zero_grad();
  double loss = 0.0;
  // Each part adds the gradient of its share of the batch's mean loss: its own mean loss (the
  // losses average over their rows) weighted by count / n.
  auto run = [&](int64_t first, int64_t count) {
    const bool whole = count == n;
    const Tensor x = whole ? batch.inputs : runtime::feed_rows({{input_name_, batch.inputs}}, first, count).at(input_name_);
    auto out = graph_->forward({{input_name_, x}}, true);
    const Tensor& logits = out.at(output_name_);
    check_rows(logits, count, output_name_);
    LossResult r;
    if (options_.distill) {
      r = kl_divergence(logits, teacher_logits(x), options_.temperature);
    } else {
      const std::vector<int64_t> labels(batch.labels.begin() + first, batch.labels.begin() + first + count);
      r = softmax_cross_entropy(logits, labels);
    }
    SQ_CHECK(std::isfinite(r.loss), ErrorKind::kInvalidData,
             "QAT: the loss became " + std::to_string(r.loss) + " at step " + std::to_string(optimizer_->steps() + 1) +
                 " (training diverged): lower the learning rate (--lr)");
    if (!whole) {
      const float share = static_cast<float>(count) / static_cast<float>(n);
      for (float& d : r.dlogits.values<float>()) d *= share;
      r.loss *= static_cast<double>(count) / static_cast<double>(n);
    }
    graph_->backward({{output_name_, r.dlogits}});
    loss += r.loss;
  };
  over_parts(batch.inputs, run, [&] {
    optimizer_->zero_grad();
    loss = 0.0;
  });
  optimizer_->step(lr);
  return loss;
}

void QAT::fit(const data::Dataset& train, const std::function<void(const EpochReport&)>& on_epoch) {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() before fit()");
  SQ_CHECK(options_.distill || train.has_labels(), ErrorKind::kInvalidArgument,
           "training data '" + train.name() +
               "' has no labels: use distill (--distill) to train against the FP32 model's outputs");
  SQ_CHECK(train.size() > 0, ErrorKind::kInvalidData, "training data '" + train.name() + "' is empty");
  const size_t bs = options_.batch_size;
  const size_t steps = steps_in_epoch(train.size(), bs, options_.steps_per_epoch);
  // Quanters without calibration initialise on the first tensor they see: do that now, before a
  // checkpoint's values are loaded over them.
  {
    data::BatchLoader loader(train, bs);
    simulate(loader.batch(0).inputs);
  }
  if (!options_.checkpoint.empty() && std::filesystem::exists(options_.checkpoint)) load_checkpoint(options_.checkpoint);

  const int64_t sample_numel = train.sample_numel();
  Shape batch_shape = {0};
  for (int64_t d : train.sample_shape()) batch_shape.push_back(d);
  for (int epoch = completed_epochs_ + 1; epoch <= options_.epochs; ++epoch) {
    // Every epoch its own permutation, a function of (seed, epoch) only, so a resumed run sees the
    // same batches an uninterrupted one would.
    std::vector<size_t> order(train.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::mt19937_64 rng(options_.seed * 1000003ull + static_cast<uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);

    Progress progress("epoch " + std::to_string(epoch) + "/" + std::to_string(options_.epochs), steps, "steps");
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    size_t samples = 0;
    for (size_t s = 0; s < steps; ++s) {
      const size_t first = s * bs;
      const size_t n = std::min(bs, train.size() - first);
      data::Batch batch;
      batch_shape[0] = static_cast<int64_t>(n);
      batch.inputs = Tensor(DType::kFloat32, batch_shape);
      float* dst = batch.inputs.data<float>();
      for (size_t i = 0; i < n; ++i) {
        train.load(order[first + i], dst + static_cast<int64_t>(i) * sample_numel);
        if (train.has_labels()) batch.labels.push_back(train.label(order[first + i]));
      }
      const float lr = lr_at(optimizer_->steps(), train.size());
      const double loss = train_step(batch, lr);
      loss_sum += loss;
      samples += n;
      std::ostringstream note;
      note << "loss " << std::setprecision(4) << loss << ", lr " << std::setprecision(3) << lr;
      progress.set_note(note.str());
      progress.advance();
    }
    progress.finish();
    completed_epochs_ = epoch;
    if (!options_.checkpoint.empty()) save_checkpoint(options_.checkpoint);
    EpochReport report;
    report.epoch = epoch;
    report.steps = steps;
    report.mean_loss = steps ? loss_sum / static_cast<double>(steps) : 0.0;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.samples = samples;
    if (on_epoch) on_epoch(report);
  }
}

Tensor QAT::simulate(const Tensor& input) {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() first");
  const int64_t n = input.rank() ? input.dim(0) : 1;
  std::vector<std::map<std::string, Tensor>> parts;
  int64_t part = n;
  over_parts(input, [&](int64_t first, int64_t count) {
    const bool whole = count == n;
    const Tensor x = whole ? input : runtime::feed_rows({{input_name_, input}}, first, count).at(input_name_);
    Tensor y = graph_->forward({{input_name_, x}}, false).at(output_name_);
    check_rows(y, count, output_name_);
    if (first == 0) part = count;
    parts.push_back({{output_name_, std::move(y)}});
  }, [&] { parts.clear(); });
  if (parts.size() == 1) return parts.front().at(output_name_);
  return runtime::join_rows(parts, n, part).at(output_name_);
}

ir::Graph QAT::convert() {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() before convert()");
  ir::Graph trained = graph_->float_graph_with_parameters();
  std::map<std::string, QuantParam> act;
  std::vector<const quant::Layer*> chosen;
  for (const auto& layer : ptq_->layers()) {
    chosen.push_back(&layer);
    for (const auto& t : layer.activations) act[t] = quanters_.at(t)->export_params();
    if (!layer.weight.empty()) {
      const Tensor* w = trained.initializer(layer.weight);
      SQ_CHECK(w != nullptr, ErrorKind::kInternal, "QAT: trained graph lost weight '" + layer.weight + "'");
      quanters_.at(layer.weight)->observe_final(*w);
    }
  }
  auto weight_params = [&](const quant::Layer& layer) {
    QuantParam p = quanters_.at(layer.weight)->export_params();
    const Tensor& w = *trained.initializer(layer.weight);
    const int64_t channels = w.rank() ? w.dim(static_cast<size_t>(layer.weight_axis)) : 1;
    if (p.scale.size() == 1 && channels > 1) {
      // One trained scale (per-tensor quanter): stated per channel, the form PTQ writes.
      p.scale.assign(static_cast<size_t>(channels), p.scale[0]);
      p.zero_point.assign(static_cast<size_t>(channels), 0);
    }
    p.axis = layer.weight_axis;
    return p;
  };
  quant::QdqExportOptions eo;
  eo.rewire_all_readers = true;  // the training graph's quanter fed every reader of the tensor
  ir::Graph out = quant::write_qdq_graph(trained, chosen, act, weight_params, eo);
  out.metadata["slimquant.weight_bits"] = std::to_string(config_.effective_weight_bits());
  return out;
}

ir::Graph QAT::ptq_graph() const {
  SQ_CHECK(calibrated_, ErrorKind::kInvalidData, "QAT: no PTQ baseline: prepare() ran without calibration data");
  return ptq_->convert();
}

// ---- checkpoints ------------------------------------------------------------------------------------

std::string QAT::config_fingerprint() const {
  nlohmann::json j;
  j["quant_config"] = config_.fingerprint();
  j["quanters"] = quanter_names_;
  const auto& o = options_.optimizer;
  j["optimizer"] = o.type + " momentum=" + std::to_string(o.momentum) + " nesterov=" + std::to_string(o.nesterov) +
                   " betas=" + std::to_string(o.beta1) + "," + std::to_string(o.beta2) +
                   " weight_decay=" + std::to_string(o.weight_decay);
  j["lr"] = std::to_string(options_.lr) + " " + options_.lr_schedule + " warmup=" + std::to_string(options_.warmup_fraction);
  j["batch_size"] = options_.batch_size;
  j["steps_per_epoch"] = options_.steps_per_epoch;
  j["epochs"] = options_.epochs;
  j["distill"] = options_.distill ? "T=" + std::to_string(options_.temperature) : "off";
  j["calib_batches"] = options_.calib_batches;
  j["seed"] = options_.seed;
  // Only when there are any, so that the CLI's checkpoints keep their fingerprint.
  for (const auto& [name, spec] : options_.quanter_specs) {
    nlohmann::json& e = j["quanter_specs"][name];
    e["type"] = spec.type;
    if (spec.init_value) e["init_value"] = std::to_string(*spec.init_value);
    if (spec.per_channel) e["per_channel"] = *spec.per_channel;
    e["lr_scale"] = std::to_string(spec.lr_scale);
    e["symmetric"] = spec.symmetric;
    if (spec.sign) e["sign"] = *spec.sign;
  }
  return j.dump();
}

void QAT::save_checkpoint(const std::string& path) const {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: nothing to checkpoint before prepare()");
  std::vector<std::pair<std::string, Tensor>> entries;
  for (Parameter* p : graph_->parameters()) entries.push_back({"param/" + p->name, p->value});
  for (const auto& [t, q] : quanters_)
    for (const auto& [b, tensor] : q->buffers()) entries.push_back({"buffer/" + t + "/" + b, *tensor});
  for (const auto& [k, t] : optimizer_->state()) entries.push_back({"opt/" + k, t});
  nlohmann::json header;
  header["model"] = model_fingerprint_;
  header["config"] = nlohmann::json::parse(config_fingerprint());
  header["completed_epochs"] = completed_epochs_;
  std::vector<std::vector<std::byte>> blobs;
  uint64_t offset = 0;
  for (const auto& [name, t] : entries) {
    blobs.push_back(encode_npy(t));
    header["tensors"].push_back({{"name", name},
                                 {"offset", offset},
                                 {"size", blobs.back().size()},
                                 {"crc32", crc32_of(blobs.back().data(), blobs.back().size())}});
    offset += blobs.back().size();
  }
  // Layout: magic, header length (u64), header JSON, header CRC-32 (u32), tensors as .npy.
  const std::string text = header.dump();
  const uint64_t len = text.size();
  const uint32_t header_crc = crc32_of(text.data(), text.size());
  std::string file;
  file.reserve(sizeof kCheckpointMagic + sizeof len + text.size() + sizeof header_crc + offset);
  file.append(kCheckpointMagic, sizeof kCheckpointMagic);
  file.append(reinterpret_cast<const char*>(&len), sizeof len);
  file += text;
  file.append(reinterpret_cast<const char*>(&header_crc), sizeof header_crc);
  for (const auto& b : blobs) file.append(reinterpret_cast<const char*>(b.data()), b.size());
  write_file_atomic(path, file);
}

void QAT::load_checkpoint(const std::string& path) {
  SQ_CHECK(graph_ != nullptr, ErrorKind::kInvalidArgument, "QAT: call prepare() before loading a checkpoint");
  std::ifstream in(path, std::ios::binary);
  SQ_CHECK(in.good(), ErrorKind::kIo, "cannot read checkpoint '" + path + "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string what = "checkpoint '" + path + "'";
  SQ_CHECK(!(bytes.size() >= 8 && std::memcmp(bytes.data(), kCheckpointMagicV1, 8) == 0), ErrorKind::kInvalidData,
           what + " was written by an older slimquant without checksums: delete it to train from the start");
  SQ_CHECK(bytes.size() >= 16 && std::memcmp(bytes.data(), kCheckpointMagic, 8) == 0, ErrorKind::kInvalidData,
           what + " is not a slimquant QAT checkpoint");
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + 8, sizeof len);
  SQ_CHECK(len <= bytes.size() && 16 + len + 4 <= bytes.size(), ErrorKind::kInvalidData, what + " is truncated");
  uint32_t header_crc = 0;
  std::memcpy(&header_crc, bytes.data() + 16 + len, sizeof header_crc);
  SQ_CHECK(crc32_of(bytes.data() + 16, len) == header_crc, ErrorKind::kInvalidData,
           what + " is corrupted: its header fails the CRC-32 check (delete it to train from the start)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(std::string(bytes.data() + 16, len));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidData, what + " has a corrupt header: " + e.what());
  }
  SQ_CHECK(header.value("model", "") == model_fingerprint_, ErrorKind::kInvalidArgument,
           what + " was written for another model (fingerprint " + header.value("model", "?") + ", this model " +
               model_fingerprint_ + "): delete it or pass another --checkpoint");
  const nlohmann::json mine = nlohmann::json::parse(config_fingerprint());
  for (const auto& [key, value] : mine.items()) {
    const nlohmann::json theirs = header["config"].contains(key) ? header["config"][key] : nlohmann::json();
    SQ_CHECK(theirs == value, ErrorKind::kInvalidArgument,
             what + " was written with another configuration: " + key + " was " + theirs.dump() + ", now " +
                 value.dump() + " (delete it or rerun with the same settings)");
  }
  const size_t base = 16 + len + 4;
  std::map<std::string, Parameter*> params;
  for (Parameter* p : graph_->parameters()) params[p->name] = p;
  std::map<std::string, Tensor*> buffers;
  for (const auto& [t, q] : quanters_)
    for (const auto& [b, tensor] : q->buffers()) buffers["buffer/" + t + "/" + b] = tensor;
  std::map<std::string, Tensor> opt_state;
  size_t loaded_params = 0;
  for (const auto& e : header.at("tensors")) {
    const std::string name = e.at("name");
    const uint64_t off = e.at("offset"), size = e.at("size");
    SQ_CHECK(off <= bytes.size() && size <= bytes.size() && base + off + size <= bytes.size(), ErrorKind::kInvalidData,
             what + " is truncated at '" + name + "'");
    SQ_CHECK(e.contains("crc32") && e.at("crc32").get<uint32_t>() == crc32_of(bytes.data() + base + off, size),
             ErrorKind::kInvalidData,
             what + " is corrupted: tensor '" + name + "' fails its CRC-32 check (delete it to train from the start)");
    Tensor t = parse_npy(bytes.data() + base + off, size, what + "/" + name);
    if (name.rfind("param/", 0) == 0) {
      auto it = params.find(name.substr(6));
      SQ_CHECK(it != params.end() && it->second->value.shape() == t.shape(), ErrorKind::kInvalidArgument,
               what + ": parameter '" + name.substr(6) + "' does not match this model");
      // Copy into the existing storage: ops may hold the parameter's tensor.
      SQ_CHECK(t.dtype() == DType::kFloat32, ErrorKind::kInvalidData, what + ": parameter '" + name + "' is not float32");
      std::memcpy(it->second->value.raw(), t.raw(), t.nbytes());
      ++loaded_params;
    } else if (name.rfind("buffer/", 0) == 0) {
      auto it = buffers.find(name);
      SQ_CHECK(it != buffers.end() && it->second->shape() == t.shape() && t.dtype() == it->second->dtype(),
               ErrorKind::kInvalidArgument, what + ": no quanter state '" + name + "' of that shape here");
      std::memcpy(it->second->raw(), t.raw(), t.nbytes());
    } else if (name.rfind("opt/", 0) == 0) {
      opt_state[name.substr(4)] = t;
    }
  }
  SQ_CHECK(loaded_params == params.size(), ErrorKind::kInvalidArgument,
           what + " holds " + std::to_string(loaded_params) + " of this model's " + std::to_string(params.size()) +
               " parameters");
  optimizer_->load_state(opt_state);
  completed_epochs_ = header.value("completed_epochs", 0);
}

}  // namespace slimquant::train
