// qat: quantization-aware training from the command line (docs/qat.md).
#include <omp.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/common.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/train/qat.h"

namespace slimquant::cli {

namespace {

double top1(runtime::Session& session, const data::Dataset& data, const std::string& label) {
  auto metric = analysis::make_metric("top1");
  analysis::EvalOptions eo;
  eo.progress_label = label;
  return analysis::evaluate(session, data, *metric, eo).value;
}

}  // namespace

Action register_qat(CLI::App& app) {
  auto* cmd = app.add_subcommand("qat", "quantization-aware training to a QDQ ONNX model");
  struct Args {
    std::string model, data, output, config_path, eval_data, checkpoint;
    std::string weight_quanter, act_quanter, optimizer, lr_schedule, algo, op_types, skip_tensors;
    std::vector<std::string> skip_nodes;
    DataFlags flags;
    int epochs = -1, threads = 0, weight_bits = 0;
    float lr = -1, weight_decay = -1, momentum = -1, temperature = -1;
    size_t batch_size = 0, steps_per_epoch = 0, calib_batches = 8, eval_limit = 0;
    uint64_t seed = 0;
    bool distill = false, nesterov = false, json = false, no_eval = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "FP32 ONNX model")->required();
  add_data_flags(cmd, a->flags, a->data);
  cmd->add_option("-o,--output", a->output, "where to write the QDQ model")->required();
  cmd->add_option("--epochs", a->epochs, "training epochs (default 1)")->check(non_negative_integer());
  cmd->add_option("--lr", a->lr, "peak learning rate (default 1e-3 for sgd, 1e-4 for adam)")->check(positive_number());
  cmd->add_option("--optimizer", a->optimizer, "sgd (default, momentum 0.9), adam or adamw");
  cmd->add_option("--momentum", a->momentum, "sgd momentum (default 0.9)")->check(number_range(0.0, 1.0));
  cmd->add_flag("--nesterov", a->nesterov, "sgd with Nesterov momentum");
  cmd->add_option("--weight-decay", a->weight_decay, "weight decay on weight tensors (default 0; decoupled for adamw)")
      ->check(non_negative_number());
  cmd->add_option("--lr-schedule", a->lr_schedule, "cosine (default, 5% warmup), step or constant");
  cmd->add_option("--weight-quanter", a->weight_quanter, "lsq_plus (default), pact or abs_max");
  cmd->add_option("--weight-bits", a->weight_bits,
                  "weight bits, 2..8 (default 8)")
      ->check(non_negative_integer());  // 2..8 is checked with the config (exit 5)
  cmd->add_option("--act-quanter", a->act_quanter, "pact (default), lsq_plus or moving_abs_max");
  cmd->add_flag("--distill", a->distill, "learn from the FP32 model's outputs (KL divergence); no labels needed");
  cmd->add_option("--temperature", a->temperature, "distillation temperature (default 1)")->check(positive_number());
  cmd->add_option("--batch-size", a->batch_size, "training batch size (default 32)")->check(positive_integer());
  cmd->add_option("--steps-per-epoch", a->steps_per_epoch, "optimizer steps per epoch, each epoch a new random subset (0 = all data)")
      ->check(non_negative_integer());
  cmd->add_option("--calib-batches", a->calib_batches, "PTQ calibration batches that initialise activation scales (0 = none)")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--algo", a->algo, "calibration observer for that initialisation (default emd)");
  cmd->add_option("--quantizable-op-type", a->op_types, "op types to quantize, e.g. Conv,MatMul,Gemm");
  cmd->add_option("--skip-tensor-list", a->skip_tensors, "tensors whose readers/writers stay float (a,b,...)");
  cmd->add_option("--skip-nodes", a->skip_nodes, "op types, node names or globs that stay float (repeatable)");
  cmd->add_option("--config", a->config_path, "YAML with the same settings (seed names; act_quanter/weight_quanter per rule)");
  cmd->add_option("--checkpoint", a->checkpoint, "checkpoint file written after every epoch and resumed from (default OUT.ckpt)");
  cmd->add_option("--eval-dataset", a->eval_data, "data set for the FP32 / PTQ / QAT top-1 (default: DATA)");
  cmd->add_option("--eval-limit", a->eval_limit, "evaluate on the first N samples only (0 = all)")->check(non_negative_integer());
  cmd->add_flag("--no-eval", a->no_eval, "skip the FP32 / PTQ / QAT evaluation");
  cmd->add_option("--seed", a->seed, "shuffling seed")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--threads", a->threads, "threads for training and evaluation (0 = all cores; 1 avoids OpenMP spinning on a busy machine)")
      ->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  return [=] {
    quant::QuantConfig config;
    std::map<std::string, std::string> extra;
    if (!a->config_path.empty()) config = quant::load_quant_config_yaml(a->config_path, config, &extra);
    train::QATOptions o;
    // The YAML's flow keys first, then flags given explicitly.
    auto get = [&](const char* key) { return extra.count(key) ? extra[key] : std::string(); };
    // Checked like the flags: a negative count never wraps, text that is not a number names its key.
    auto positive = [&](const char* key) {
      const size_t v = parse_config_size(get(key), key);
      SQ_CHECK(v > 0, ErrorKind::kInvalidArgument, std::string("config key '") + key + "' must be at least 1");
      return v;
    };
    auto finite_at_least = [&](const char* key, double lo, bool inclusive) {
      const double v = parse_config_double(get(key), key);
      SQ_CHECK(inclusive ? v >= lo : v > lo, ErrorKind::kInvalidArgument,
               std::string("config key '") + key + "' must be " + (inclusive ? "at least " : "greater than ") +
                   std::to_string(lo) + ", got '" + get(key) + "'");
      return static_cast<float>(v);
    };
    if (!get("epochs").empty()) {
      const size_t epochs = parse_config_size(get("epochs"), "epochs");
      SQ_CHECK(epochs <= 1000000, ErrorKind::kInvalidArgument, "config key 'epochs' is too large");
      o.epochs = static_cast<int>(epochs);
    }
    if (!get("lr").empty()) o.lr = finite_at_least("lr", 0, false);
    if (!get("batch_size").empty()) o.batch_size = positive("batch_size");
    if (!get("batch_nums").empty() && !cmd->count("--calib-batches")) a->calib_batches = parse_config_size(get("batch_nums"), "batch_nums");
    if (!get("temperature").empty()) o.temperature = finite_at_least("temperature", 0, false);
    if (!get("steps_per_epoch").empty() && !cmd->count("--steps-per-epoch"))
      a->steps_per_epoch = parse_config_size(get("steps_per_epoch"), "steps_per_epoch");
    if (!get("weight_decay").empty()) o.optimizer.weight_decay = finite_at_least("weight_decay", 0, true);
    if (!get("momentum").empty()) o.optimizer.momentum = finite_at_least("momentum", 0, true);
    if (!get("seed").empty() && !cmd->count("--seed")) a->seed = parse_config_size(get("seed"), "seed");
    if (!get("lr_schedule").empty()) o.lr_schedule = get("lr_schedule");
    if (get("nesterov") == "true") o.optimizer.nesterov = true;
    if (!get("checkpoint").empty() && a->checkpoint.empty()) a->checkpoint = get("checkpoint");
    if (!get("optimizer").empty()) o.optimizer.type = get("optimizer");
    if (!get("weight_quanter").empty()) o.weight_quanter = get("weight_quanter");
    if (!get("act_quanter").empty()) o.act_quanter = get("act_quanter");
    if (get("distill") == "true") o.distill = true;
    if (a->epochs >= 0) o.epochs = a->epochs;
    if (!a->optimizer.empty()) o.optimizer.type = a->optimizer;
    if (a->lr > 0) o.lr = a->lr;
    if (a->momentum >= 0) o.optimizer.momentum = a->momentum;
    if (a->nesterov) o.optimizer.nesterov = true;
    if (a->weight_decay >= 0) o.optimizer.weight_decay = a->weight_decay;
    if (!a->lr_schedule.empty()) o.lr_schedule = a->lr_schedule;
    if (!a->weight_quanter.empty()) o.weight_quanter = a->weight_quanter;
    if (!a->act_quanter.empty()) o.act_quanter = a->act_quanter;
    if (a->distill) o.distill = true;
    if (a->temperature > 0) o.temperature = a->temperature;
    if (a->batch_size > 0) o.batch_size = a->batch_size;
    o.steps_per_epoch = a->steps_per_epoch;
    o.calib_batches = a->calib_batches;
    o.seed = a->seed;
    o.num_threads = a->threads;
    if (a->threads > 0) omp_set_num_threads(a->threads);  // training kernels too, not only the sessions
    if (!a->algo.empty()) config.global().activation = a->algo;
    if (a->weight_bits > 0) config.weight_bits = a->weight_bits;
    if (!a->op_types.empty()) config.quantizable_op_type = split_list(a->op_types);
    config.validate();  // a bad --weight-bits or op type fails before any work
    for (const auto& t : split_list(a->skip_tensors)) config.skip_tensor_list.push_back(t);
    for (const auto& p : a->skip_nodes) config.skip_quant.push_back(p);
    quant::make_activation_observer(config.global().activation);  // a bad --algo fails before any work
    o.checkpoint = a->checkpoint.empty() ? a->output + ".ckpt" : a->checkpoint;
    train::QAT qat(config, o);  // validates quanter and optimizer names

    // Before any training: the output and the checkpoint must be writable files that are none of
    // the inputs (a -o naming the FP32 model would overwrite it).
    const std::string model_file = resolve_model_file(a->model);
    {
      DataFlags data_flags = a->flags;
      if (!a->data.empty()) data_flags.dataset = a->data;
      const std::vector<std::string> inputs{model_file, a->config_path, data_spec_path(data_flags.dataset),
                                            data_spec_path(a->eval_data)};
      check_output_path(a->output, inputs, "-o");
      check_output_path(o.checkpoint, inputs, "--checkpoint");
      std::error_code ec;
      SQ_CHECK(!std::filesystem::equivalent(o.checkpoint, a->output, ec) && o.checkpoint != a->output,
               ErrorKind::kInvalidArgument, "--checkpoint '" + o.checkpoint + "' is the -o output: give another path");
      std::filesystem::path out(a->output);
      auto dir = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
      const auto probe = dir / (".slimquant_write_probe_" + std::to_string(::getpid()));
      { std::ofstream f(probe); SQ_CHECK(f.good(), ErrorKind::kIo, "cannot write '" + a->output + "': directory '" + dir.string() + "' is not writable"); }
      std::filesystem::remove(probe, ec);
    }
    DataFlags flags = a->flags;
    if (!a->data.empty()) flags.dataset = a->data;
    SQ_CHECK(flags.side_inputs.empty(), ErrorKind::kInvalidArgument,
             "qat trains single-input models; --side-input is for quantize, analyze and eval");
    auto train_set = data::open_dataset(flags.options("qat: the training"));
    SQ_CHECK(o.distill || train_set->has_labels(), ErrorKind::kInvalidArgument,
             "training data '" + train_set->name() + "' has no labels: pass --distill to train against the FP32 model's outputs");
    ir::Graph model = ir::load_model(model_file);

    qat.prepare(model, train_set.get());
    std::cout << "QAT of " << qat.layers().size() << " layers: weights " << o.weight_quanter << " ("
              << config.effective_weight_bits() << "-bit), activations "
              << o.act_quanter << ", " << o.optimizer.type << " lr " << qat.options().lr << ", " << o.epochs << " epoch(s) of "
              << qat.total_steps(train_set->size()) / std::max(1, o.epochs) << " steps x " << o.batch_size << " on "
              << train_set->name() << (o.distill ? " (distillation)" : "") << std::endl;
    std::vector<double> epoch_seconds, epoch_loss;
    qat.fit(*train_set, [&](const train::EpochReport& r) {
      epoch_seconds.push_back(r.seconds);
      epoch_loss.push_back(r.mean_loss);
      std::cout << "epoch " << r.epoch << "/" << o.epochs << ": mean loss " << std::setprecision(4) << r.mean_loss
                << ", " << std::fixed << std::setprecision(1) << r.seconds << " s (" << r.samples << " samples, "
                << std::setprecision(0) << r.samples / std::max(r.seconds, 1e-9) << "/s)" << std::defaultfloat
                << std::endl;
    });
    if (epoch_seconds.empty() && o.epochs > 0)
      std::cout << "all " << o.epochs << " epochs already done in checkpoint '" << o.checkpoint << "'" << std::endl;
    ir::Graph qdq = qat.convert();
    ir::save_onnx(qdq, a->output);
    std::cout << "wrote " << a->output << std::endl;

    nlohmann::json j{{"layers", qat.layers().size()}, {"output", a->output}, {"epochs", o.epochs},
                     {"epochs_run", epoch_seconds.size()}, {"train_samples", train_set->size()},
                     {"epoch_loss", epoch_loss}, {"distill", o.distill}};
    double total = 0;
    for (double s : epoch_seconds) total += s;
    j["seconds_per_epoch"] = epoch_seconds.empty() ? nlohmann::json() : nlohmann::json(total / epoch_seconds.size());
    if (!a->no_eval) {
      DataFlags eval_flags = flags;
      if (!a->eval_data.empty()) eval_flags.dataset = a->eval_data;
      eval_flags.limit = a->eval_limit;
      auto eval_set = data::open_dataset(eval_flags.options("qat: --eval-dataset"));
      if (!eval_set->has_labels()) {
        std::cout << "evaluation data '" << eval_set->name() << "' has no labels: no top-1 figures" << std::endl;
      } else {
        runtime::SessionOptions so;
        so.num_threads = a->threads;
        runtime::Session fp32(model, so);
        const double f = top1(fp32, *eval_set, "eval fp32");
        j["fp32_top1"] = f;
        std::cout << "fp32 top1: " << std::setprecision(4) << f;
        if (qat.calibrated()) {
          // INT8 figures from the integer execution users deploy.
          runtime::Session ptq = quant::make_int8_session(qat.ptq_graph(), so);
          const double p = top1(ptq, *eval_set, "eval ptq int8");
          j["ptq_top1"] = p;
          std::cout << "\nptq int8 top1: " << p;
        }
        runtime::Session int8 = quant::make_int8_session(qdq, so);
        const double q = top1(int8, *eval_set, "eval qat int8");
        j["qat_top1"] = q;
        j["samples"] = eval_set->size();
        std::cout << "\nqat int8 top1: " << q << " (" << eval_set->size() << " samples of " << eval_set->name() << ")"
                  << std::endl;
      }
    }
    if (a->json) print_json(j);
    return 0;
  };
}

}  // namespace slimquant::cli
