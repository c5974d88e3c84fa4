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
#include "slimquant/train/qat_config.h"

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
    std::string model, data, output, config_path, eval_data;
    DataFlags flags;
    PtqFlags ptq;
    OptionsFlags<train::QATOptions> training;
    size_t eval_limit = 0;
    bool json = false, no_eval = false;
  };
  using O = train::QATOptions;
  auto a = std::make_shared<Args>();
  auto& t = a->training;
  cmd->add_option("MODEL", a->model, "FP32 ONNX model")->required();
  add_data_flags(cmd, a->flags, a->data);
  cmd->add_option("-o,--output", a->output, "where to write the QDQ model")->required();
  t.add_option(cmd, "--epochs", [](O& o) -> auto& { return o.epochs; }, "training epochs")->check(non_negative_integer());
  // 0 in QATOptions: the optimizer's own default, not a rate to show.
  t.add_option(cmd, "--lr", [](O& o) -> auto& { return o.lr; }, "peak learning rate (default 1e-3 for sgd, 1e-4 for adam)")
      ->default_str("")
      ->check(positive_number());
  t.add_option(cmd, "--optimizer", [](O& o) -> auto& { return o.optimizer.type; }, "sgd, adam or adamw");
  t.add_option(cmd, "--momentum", [](O& o) -> auto& { return o.optimizer.momentum; }, "sgd momentum")
      ->check(number_range(0.0, 1.0));
  t.add_flag(cmd, "--nesterov", [](O& o) -> auto& { return o.optimizer.nesterov; }, "sgd with Nesterov momentum");
  t.add_option(cmd, "--weight-decay", [](O& o) -> auto& { return o.optimizer.weight_decay; },
               "weight decay on weight tensors (decoupled for adamw)")
      ->check(non_negative_number());
  t.add_option(cmd, "--lr-schedule", [](O& o) -> auto& { return o.lr_schedule; },
               "cosine (with warmup), step or constant");
  t.add_option(cmd, "--weight-quanter", [](O& o) -> auto& { return o.weight_quanter; }, "lsq_plus, pact or abs_max");
  t.add_option(cmd, "--act-quanter", [](O& o) -> auto& { return o.act_quanter; }, "pact, lsq_plus or moving_abs_max");
  t.add_flag(cmd, "--distill", [](O& o) -> auto& { return o.distill; },
             "learn from the FP32 model's outputs (KL divergence); no labels needed");
  t.add_option(cmd, "--temperature", [](O& o) -> auto& { return o.temperature; }, "distillation temperature")
      ->check(positive_number());
  t.add_option(cmd, "--batch-size", [](O& o) -> auto& { return o.batch_size; }, "training batch size")
      ->check(positive_integer());
  t.add_option(cmd, "--steps-per-epoch", [](O& o) -> auto& { return o.steps_per_epoch; },
               "optimizer steps per epoch, each epoch a new random subset (0 = all data)")
      ->check(non_negative_integer());
  t.add_option(cmd, "--calib-batches", [](O& o) -> auto& { return o.calib_batches; },
               "PTQ calibration batches that initialise activation scales (0 = none)")
      ->check(non_negative_integer());
  add_ptq_flags(cmd, a->ptq, PtqFlagSet::kQat);
  cmd->add_option("--config", a->config_path, "YAML with the same settings (seed names; act_quanter/weight_quanter per rule)");
  t.add_option(cmd, "--checkpoint", [](O& o) -> auto& { return o.checkpoint; },
               "checkpoint file written after every epoch and resumed from (default OUT.ckpt)");
  cmd->add_option("--eval-dataset", a->eval_data, "data set for the FP32 / PTQ / QAT top-1 (default: DATA)");
  cmd->add_option("--eval-limit", a->eval_limit, "evaluate on the first N samples only (0 = all)")->check(non_negative_integer());
  cmd->add_flag("--no-eval", a->no_eval, "skip the FP32 / PTQ / QAT evaluation");
  t.add_option(cmd, "--seed", [](O& o) -> auto& { return o.seed; }, "shuffling seed")->check(non_negative_integer());
  t.add_option(cmd, "--threads", [](O& o) -> auto& { return o.num_threads; },
               "threads for training and evaluation (0 = all cores; 1 avoids OpenMP spinning on a busy machine)")
      ->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  return [=] {
    quant::QuantConfig config;
    train::QATOptions o;
    // The config file's settings first, then the flags given explicitly.
    if (!a->config_path.empty()) {
      train::QATConfigFile file = train::load_qat_config_yaml(a->config_path, config);
      config = std::move(file.quant);
      file.training.apply_to(o);
    }
    a->training.apply(o);
    if (o.num_threads > 0) omp_set_num_threads(o.num_threads);  // training kernels too, not only the sessions
    apply_ptq_flags(a->ptq, config);  // a bad --algo, --weight-bits or op type fails before any work
    if (o.checkpoint.empty()) o.checkpoint = a->output + ".ckpt";
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
        so.num_threads = o.num_threads;
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
