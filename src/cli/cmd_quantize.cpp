// quantize: post-training quantization from the command line.
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string_view>

#include "cli/common.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/quant/post_training_quantization.h"

namespace slimquant::cli {


Action register_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "post-training quantization to a QDQ ONNX model");
  struct Args {
    std::string model, data, eval_data, output, config_path, metric = "top1", keys, mode, weight_rounding;
    std::string int4_activations;
    int block_size = 0;
    std::string cache_dir = "./temp_post_training";
    bool use_cache = false;
    bool requantize = false;
    DataFlags flags;
    PtqFlags ptq;
    EvalCommandFlags eval_command;
    bool json = false, no_eval = false;
    int threads = 0;
    double fallback_sqnr_db = 20.0;
    size_t eval_batch_size = 64;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "FP32 ONNX model (.onnx file, or a directory holding exactly one)")->required();
  add_data_flags(cmd, a->flags, a->data);
  cmd->add_option("-o,--output", a->output, "where to write the QDQ model")->required();
  add_ptq_flags(cmd, a->ptq);
  cmd->add_option("--mode", a->mode,
                  "static (default: weights and activations, activation ranges calibrated on DATA), weight-only "
                  "(weights only, per channel; activations stay float; DATA optional, for the evaluation) or dynamic "
                  "(per-channel weights, activation scales computed per inference; DATA optional)");
  cmd->add_option("--block-size", a->block_size,
                  "weight-only with --weight-bits 4: MatMul/Gemm weights as INT4 with one scale per this many input "
                  "features (32, 64 or 128; default 32), an opset-21 blocked DequantizeLinear");
  cmd->add_option("--weight-rounding", a->weight_rounding,
                  "4-bit weight-only rounding: rtn (to nearest, default) or gptq (error feedback through the layer "
                  "inputs' Hessian; calibrates on DATA, rtn without it)");
  cmd->add_option("--int4-activations", a->int4_activations,
                  "4-bit weight-only: how our runtime multiplies the 4-bit weights: float (default: the activations "
                  "as they are, exact weights) or int8 (each group of 32 activations rounded to int8 first, as ONNX "
                  "Runtime's MatMulNBits does by default; faster at batch 1, at that rounding's cost)");
  cmd->add_flag("--is-use-cache-file", a->use_cache,
                "keep the calibration state in --cache-dir while calibrating (resumes after a crash)");
  cmd->add_option("--cache-dir", a->cache_dir, "directory of the calibration cache")->capture_default_str();
  cmd->add_flag("--requantize", a->requantize,
                "MODEL is already quantized (static QDQ): dequantize its weights, drop its Q/DQ pairs and quantize "
                "again (without it such a model is refused, exit 4)");
  cmd->add_option("--fallback-sqnr", a->fallback_sqnr_db,
                  "precision fallback: when the INT8 outputs are below this SQNR (dB) against FP32 on the first "
                  "calibration samples, the most damaging layers (at most 10%) stay in float; 0 disables")
      ->capture_default_str()
      ->check(number_range(0.0, 200.0));
  cmd->add_option("--config", a->config_path, "YAML file with the same settings (seed parameter names)");
  auto* metric_flag = cmd->add_option("--metric", a->metric, std::string("metric printed for FP32 and INT8: ") + kMetricHelp);
  add_eval_command_flags(cmd, a->eval_command, metric_flag);
  add_keys_flag(cmd, a->keys);
  cmd->add_option("--eval-dataset", a->eval_data, "data set for the FP32/INT8 comparison (default: DATA)");
  cmd->add_flag("--no-eval", a->no_eval, "skip the FP32/INT8 evaluation");
  cmd->add_option("--eval-batch-size", a->eval_batch_size, "batch size of the FP32/INT8 evaluation")
      ->capture_default_str()
      ->check(positive_integer());
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  return [=] {
    quant::QuantConfig config;
    std::map<std::string, std::string> extra;
    if (!a->config_path.empty()) config = quant::load_quant_config_yaml(a->config_path, config, &extra);
    const auto [batch_size, batch_nums] = calibration_batches(a->ptq, *cmd, extra);
    bool use_cache = a->use_cache;
    std::string cache_dir = a->cache_dir;
    auto flag_given = [&](const char* name) { return cmd->count(name) > 0; };
    // The config file's flow keys apply unless the same setting is given as a flag.
    if (extra.count("is_use_cache_file") && !flag_given("--is-use-cache-file")) use_cache = parse_config_bool(extra["is_use_cache_file"], "is_use_cache_file");
    if (extra.count("cache_dir") && !flag_given("--cache-dir")) cache_dir = extra["cache_dir"];
    double fallback_sqnr_db = a->fallback_sqnr_db;
    if (extra.count("fallback_sqnr_db") && !flag_given("--fallback-sqnr"))
      fallback_sqnr_db = parse_config_double(extra["fallback_sqnr_db"], "fallback_sqnr_db");
    if (!a->mode.empty()) config.mode = quant::parse_quant_mode(a->mode);
    if (a->block_size != 0) config.block_size = a->block_size;
    if (!a->weight_rounding.empty()) config.weight_rounding = quant::parse_weight_rounding(a->weight_rounding);
    if (!a->int4_activations.empty()) config.int4_activations = quant::parse_int4_activations(a->int4_activations);
    apply_ptq_flags(a->ptq, config);  // flags given explicitly override the config file
    const bool uncalibrated = !config.calibrates();  // weight-only or dynamic: no activation ranges
    const bool gptq = config.weight_rounding == quant::WeightRounding::kGptq;  // calibrates (4-bit weight-only)
    // Flags that only a calibration uses would be silently ignored.
    for (const char* calibration_flag : {"--algo", "--hist-percent", "--batch-size", "--batch-nums", "--activation-quantize-type",
                                         "--is-use-cache-file", "--fallback-sqnr"})
      SQ_CHECK(!uncalibrated || !flag_given(calibration_flag) ||
                   (gptq && std::string_view(calibration_flag).starts_with("--batch-")),
               ErrorKind::kInvalidArgument,
               std::string(calibration_flag) + " sets up the calibration of activations, which --mode " +
                   quant::quant_mode_name(config.mode) + " does not run (it needs no data)");
    SQ_CHECK(batch_size > 0, ErrorKind::kInvalidArgument, "--batch-size must be at least 1");
    // Bad metric names and key files fail before calibration.
    SQ_CHECK(!a->no_eval || !a->eval_command.given(), ErrorKind::kInvalidArgument,
             "--no-eval skips the evaluation that --eval-command runs: give one of them");
    std::optional<analysis::UserMetric> user_metric;  // only to check the command before calibrating
    if (a->eval_command.given()) user_metric = analysis::command_metric(a->eval_command.options());
    std::unique_ptr<analysis::Metric> metric =
        a->no_eval || user_metric ? nullptr : make_cli_metric(a->metric, a->keys);

    // MODEL may be a directory holding exactly one .onnx file (README); from here on, that file.
    const std::string model_file = resolve_model_file(a->model);
    DataFlags flags = a->flags;
    if (!a->data.empty()) flags.dataset = a->data;
    // Fail on an output that cannot or must not be written before spending time on calibration:
    // a missing directory, a directory or device, or one of this command's inputs.
    check_output_path(a->output,
                      {model_file, a->config_path, data_spec_path(flags.dataset), data_spec_path(a->eval_data)}, "-o");
    // Side inputs take their ranks from the model's inputs, and the samples the type of theirs.
    ir::Graph model_inputs;
    model_inputs.inputs = ir::read_model_inputs(model_file);
    const ir::Graph* for_ranks = &model_inputs;
    // Weight-only needs no data; given, it is the evaluation's.
    const bool no_data = uncalibrated && flags.dataset.empty();
    auto dataset = no_data ? nullptr : data::open_dataset(flags.options("quantize: the calibration", for_ranks));
    if (no_data && a->eval_data.empty() && !a->eval_command.given()) metric.reset();

    quant::PostTrainingQuantizationOptions po;
    po.model_dir = model_file;
    po.dataset = uncalibrated && !gptq ? nullptr : dataset.get();
    po.batch_size = batch_size;
    if (batch_nums > 0) po.batch_nums = batch_nums;
    po.config = config;
    po.is_use_cache_file = use_cache;
    po.requantize = a->requantize;
    po.cache_dir = cache_dir;
    po.fallback_sqnr_db = fallback_sqnr_db;
    quant::PostTrainingQuantization ptq(po);
    const ir::Graph& qdq = ptq.quantize();
    if (distributed::is_root())
      for (const auto& w : ptq.warnings()) std::cerr << "warning: " << w << std::endl;
    ptq.save_quantized_model(a->output);
    const ir::Graph& model = ptq.float_graph();
    const auto& rep = ptq.report();
    const double calib_seconds = rep.seconds;
    const int weight_bits = config.effective_weight_bits();
    if (config.mode == quant::QuantMode::kDynamic) {
      size_t dynamic = 0;  // If branches' too
      ir::for_each_node(qdq, [&](const ir::Node& n) { dynamic += n.op_type == "MatMulInteger" || n.op_type == "ConvInteger"; });
      std::cout << "quantized " << dynamic << " layers dynamically (" << weight_bits
                << "-bit weights per channel, activation scales computed per inference)";
    } else if (config.mode == quant::QuantMode::kWeightOnly) {
      size_t weighted = 0;
      for (const quant::Layer* l : ptq.ptq().all_layers()) weighted += l->weight.empty() ? 0 : 1;
      std::cout << "quantized the weights of " << weighted << " layers (" << config.global().weight << ", " << weight_bits
                << "-bit, activations float)";
      if (weight_bits == 4)
        std::cout << "; MatMul/Gemm weights INT4 in blocks of " << (config.block_size ? config.block_size : 32)
                  << " input features, " << quant::weight_rounding_name(config.weight_rounding) << " rounding"
                  << (config.int4_activations == quant::Int4Activations::kInt8
                          ? ", multiplied by int8-rounded activations (--int4-activations int8)"
                          : "");
    } else {
      // Layers that saw no values in calibration stay float (said in a warning above).
      std::cout << "quantized " << ptq.ptq().all_layers().size() - ptq.ptq().unobserved_layers().size() << " layers ("
                << config.global().activation << ", " << config.global().weight << ", " << weight_bits
                << "-bit weights, for " << quant::deploy_backend_name(config.deploy_backend) << ") from " << rep.batches
                << (rep.batches == 1 ? " batch" : " batches") << " of " << batch_size << " in " << std::fixed
                << std::setprecision(2) << calib_seconds << " s";
    }
    if (rep.resumed_batches) std::cout << " (" << rep.resumed_batches << " batches resumed from the cache)";
    if (const auto mixed = qdq.metadata.find("slimquant.mode"); mixed != qdq.metadata.end() && mixed->second == "mixed") {
      auto count = [&](const char* key) { return qdq.metadata.count(key) ? qdq.metadata.at(key) : std::string("0"); };
      const auto& layers = ptq.ptq().layers();
      std::cout << "; modes mixed by --node-mode: "
                << std::count_if(layers.begin(), layers.end(), [](const auto& l) { return l.mode == quant::QuantMode::kStatic; })
                << " static, " << count("slimquant.weight_only_layers") << " weight-only, "
                << count("slimquant.dynamic_layers") << " dynamic";
    }
    std::cout << " -> " << a->output << std::endl;
    if (config.deploy_backend == quant::DeployBackend::kSlimquant && !uncalibrated)
      std::cout << "the file is shaped for slimquant's runtime; for ONNX Runtime or TensorRT quantize with "
                   "--deploy-backend onnxruntime or tensorrt (docs/quantization.md)" << std::endl;
    const quant::ActivationAlgoChoice& algo_choice = ptq.algo_choice();
    if (!algo_choice.chosen.empty())
      std::cout << "activation observer: auto chose " << algo_choice.describe() << "; --algo NAME fixes one" << std::endl;
    const quant::PrecisionFallbackResult& fallback = ptq.fallback();
    if (fallback.triggered) {
      std::cout << "precision fallback: INT8 output SQNR " << std::setprecision(1) << fallback.sqnr_db_per_tensor
                << " dB" << (algo_choice.channel_wise_conv_inputs ? " (per-channel convolution inputs)" : "") << " < "
                << fallback_sqnr_db << " dB on the first calibration samples; ";
      if (fallback.channel_wise_conv_inputs && !algo_choice.channel_wise_conv_inputs)
        std::cout << "convolution inputs quantized per channel: " << fallback.sqnr_db_before << " dB; ";
      if (fallback.sqnr_db_before >= fallback_sqnr_db) {
        std::cout << "no layer left in float" << std::endl;
      } else if (fallback.float_layers.empty()) {
        std::cout << "no layer left in float helps" << std::endl;
      } else {
        std::cout << fallback.float_layers.size() << " of " << ptq.ptq().all_layers().size() << " layers kept in float, ranked by "
                  << (fallback.ranking == "output" ? "output SQNR" : "added noise") << " (";
        for (size_t i = 0; i < fallback.float_layers.size(); ++i) std::cout << (i ? ", " : "") << fallback.float_layers[i];
        std::cout << "): " << fallback.sqnr_db_after << " dB" << std::endl;
      }
    }
    // Distributed: the output exists where rank 0 wrote it (the others print nothing).
    const auto fp32_bytes = std::filesystem::file_size(model_file);
    const auto int8_bytes = distributed::is_root() ? std::filesystem::file_size(a->output) : fp32_bytes;
    std::cout << "model size: fp32 " << fp32_bytes / 1024 << " KiB, int8 " << int8_bytes / 1024 << " KiB ("
              << std::setprecision(2) << static_cast<double>(int8_bytes) / static_cast<double>(fp32_bytes) << "x)"
              << std::endl;

    nlohmann::json j{{"layers", ptq.ptq().all_layers().size()},
                     {"calib_seconds", calib_seconds},
                     {"calib_batches", rep.batches},
                     {"weight_bits", weight_bits},
                     {"deploy_backend", quant::deploy_backend_name(config.deploy_backend)},
                     {"mode", quant::quant_mode_name(config.mode)},
                     {"algo", algo_choice.chosen.empty() ? config.global().activation : algo_choice.chosen},
                     {"fallback_float_layers", fallback.float_layers},
                     {"fallback_channel_wise_conv_inputs", fallback.channel_wise_conv_inputs},
                     {"fallback_sqnr_db_per_tensor", fallback.sqnr_db_per_tensor},
                     {"fallback_sqnr_db_before", fallback.sqnr_db_before},
                     {"fallback_sqnr_db_after", fallback.sqnr_db_after},
                     {"fallback_ranking", fallback.ranking},
                     {"fallback_samples", fallback.samples},
                     {"fallback_evaluations", fallback.evaluations},
                     {"output", a->output},
                     {"fp32_bytes", fp32_bytes},
                     {"int8_bytes", int8_bytes}};
    if (!algo_choice.chosen.empty()) {
      nlohmann::json measured = nlohmann::json::array();
      for (const auto& c : algo_choice.scores)
        measured.push_back({{"algo", c.algo}, {"channel_wise_conv_inputs", c.channel_wise_conv_inputs}, {"sqnr_db", c.sqnr_db},
                            {"agreement", c.agreement}});
      j["algo_choice_scores"] = measured;
      j["algo_choice_channel_wise_conv_inputs"] = algo_choice.channel_wise_conv_inputs;
      j["algo_choice_samples"] = algo_choice.samples;
      j["algo_choice_held_back"] = algo_choice.held_back;
    }
    if (user_metric) {
      // The user's program scores the model files themselves: the FP32 input and the QDQ output.
      const double v_fp32 = analysis::run_metric_command(a->eval_command.options(), model_file);
      const double v_int8 = analysis::run_metric_command(a->eval_command.options(), a->output);
      std::cout << "fp32 " << user_metric->name << ": " << std::setprecision(4) << v_fp32 << "\nint8 "
                << user_metric->name << ": " << v_int8 << " (--eval-command)" << std::endl;
      j["fp32_" + user_metric->name] = v_fp32;
      j["int8_" + user_metric->name] = v_int8;
    } else if (!a->no_eval && metric) {
      std::unique_ptr<data::Dataset> eval_owned;
      if (!a->eval_data.empty()) {
        DataFlags eval_flags = flags;
        eval_flags.dataset = a->eval_data;
        eval_owned = data::open_dataset(eval_flags.options("quantize: --eval-dataset", &model));
      }
      const data::Dataset& eval_set = eval_owned ? *eval_owned : *dataset;
      if ((metric->needs_labels() && !eval_set.has_labels()) || (metric->needs_text_labels() && !eval_set.has_text_labels())) {
        std::cout << "data has no " << (metric->needs_text_labels() ? "text " : "") << "labels: skipping the "
                  << a->metric << " comparison" << std::endl;
      } else {
        runtime::SessionOptions so;
        so.num_threads = a->threads;
        runtime::Session fp32(model, so);
        // INT8 figures come from the integer execution users deploy, not the float simulation.
        runtime::Session int8 = quant::make_int8_session(qdq, so);
        // Outputs chosen or decided by the data (a detector's boxes after NMS, ArgMax classes) are
        // compared against FP32 at the values they come from, as the analysis compares them.
        const std::vector<std::string> measured =
            metric->needs_reference() ? quant::selection_inputs(model) : std::vector<std::string>{};
        std::optional<runtime::Session> fp32_measured, int8_measured;
        if (!measured.empty()) {
          fp32_measured.emplace(quant::join_measured_values(model, measured), so);
          int8_measured.emplace(quant::make_int8_session(quant::join_measured_values(qdq, measured), so));
          print_measured_values_note(metric->name(), measured.size());
        }
        runtime::Session& fp32_evaluated = fp32_measured ? *fp32_measured : fp32;
        runtime::Session& int8_evaluated = int8_measured ? *int8_measured : int8;
        analysis::EvalOptions eo;
        eo.reference = &fp32_evaluated;
        eo.batch_size = a->eval_batch_size;
        eo.progress_label = "eval fp32";
        auto m_fp32 = metric->clone_empty();
        auto m_int8 = metric->clone_empty();
        double v_fp32 = metric->needs_reference() ? 0.0 : analysis::evaluate(fp32, eval_set, *m_fp32, eo).value;
        eo.progress_label = "eval int8";
        double v_int8 = analysis::evaluate(int8_evaluated, eval_set, *m_int8, eo).value;
        // A metric against the FP32 model has no FP32 figure of its own (the reference scores itself perfectly).
        std::cout << "fp32 " << metric->name() << ": " << std::setprecision(4);
        if (metric->needs_reference()) std::cout << "(the reference)";
        else std::cout << v_fp32;
        if (!metric->needs_reference())
          for (const auto& [name, v] : m_fp32->extra_values()) std::cout << ", " << name << ": " << v;
        std::cout << "\nint8 " << metric->name() << ": " << v_int8;
        for (const auto& [name, v] : m_int8->extra_values()) std::cout << ", " << name << ": " << v;
        std::cout << " (" << eval_set.size() << " samples)" << std::endl;
        j["fp32_" + metric->name()] = v_fp32;
        j["int8_" + metric->name()] = v_int8;
        if (!metric->needs_reference())
          for (const auto& [name, v] : m_fp32->extra_values()) j["fp32_" + name] = v;
        for (const auto& [name, v] : m_int8->extra_values()) j["int8_" + name] = v;
        j["samples"] = eval_set.size();
        // Latency of one evaluation-sized batch, both executions in the same process; distributed,
        // rank 0 alone (the other ranks would compete for its cores).
        if (distributed::is_root()) {
          data::BatchLoader eval_loader(eval_set, std::min<size_t>({32, a->eval_batch_size, eval_set.size()}));
          const std::map<std::string, Tensor> feeds =
              eval_loader.batch(0).feeds(data::main_input_name(fp32.input_names(), eval_set));
          const Timing t_fp32 = time_runs(fp32, feeds, 20), t_int8 = time_runs(int8, feeds, 20);
          std::cout << "latency (batch " << eval_loader.batch_size() << ", median of 20): fp32 " << std::setprecision(3)
                    << t_fp32.median_ms << " ms, int8 " << t_int8.median_ms << " ms (" << std::setprecision(2)
                    << t_fp32.median_ms / t_int8.median_ms << "x)" << std::endl;
          j["fp32_latency_ms"] = t_fp32.median_ms;
          j["int8_latency_ms"] = t_int8.median_ms;
        }
      }
    }
    if (a->json) print_json(j);
    return 0;
  };
}

}  // namespace slimquant::cli
