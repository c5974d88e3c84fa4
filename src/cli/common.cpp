#include "cli/common.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <vector>

#include "slimquant/ir/onnx_io.h"

namespace slimquant::cli {

data::DataOptions DataFlags::options(const std::string& default_spec, const ir::Graph* model) const {
  data::DataOptions o;
  o.spec = dataset.empty() ? default_spec : dataset;
  if (!mean.empty()) o.mean = data::parse_float_list(mean, "--mean");
  if (!stddev.empty()) o.stddev = data::parse_float_list(stddev, "--std");
  if (!resize.empty()) o.resize = data::parse_image_size(resize, "--resize");
  o.channel_order = data::parse_channel_order(channel_order, "--channel-order");
  o.limit = limit;
  o.channels = channels;
  for (const auto& text : side_inputs) {
    data::SideInputSpec side = data::parse_side_input(text, "--side-input");
    if (model)
      for (const auto& in : model->inputs)
        if (in.name == side.name && in.dims) side.model_rank = in.dims->size();
    o.side_inputs.push_back(std::move(side));
  }
  return o;
}

void add_ptq_flags(CLI::App* app, PtqFlags& f) {
  app->add_option("--algo", f.algo, "activation observer: emd (default), mse, KL, hist, abs_max (direct), min_max, avg");
  app->add_option("--hist-percent", f.hist_percent, "percentile for algo hist (default 0.99999)");
  app->add_option("--batch-size", f.batch_size, "calibration batch size")->capture_default_str();
  app->add_option("--batch-nums", f.batch_nums, "calibration batches (0 = the whole data set)")->capture_default_str();
  app->add_option("--weight-quantize-type", f.weight_type, "abs_max, channel_wise_abs_max, mse_channel_wise");
  app->add_option("--weight-bits", f.weight_bits,
                  "weight bits, 2..8 (default: 8 on CPUs with VNNI, else 7, which lets INT8 run int8 kernels)");
  app->add_option("--quantizable-op-type", f.op_types, "op types to quantize, e.g. Conv,MatMul,Gemm");
  app->add_flag("--is-full-quantize", f.full, "also quantize pooling, Add, Concat, Softmax, Reshape, ...");
  app->add_option("--skip-tensor-list", f.skip_tensors, "tensors whose readers/writers stay float (a,b,...)");
  app->add_option("--skip-nodes", f.skip_nodes, "op types, node names or globs that stay float (repeatable)");
}

void apply_ptq_flags(const PtqFlags& f, quant::QuantConfig& config) {
  if (!f.algo.empty()) config.global().activation = f.algo;
  if (!f.weight_type.empty()) config.global().weight = f.weight_type;
  if (f.hist_percent > 0) config.observer_options.hist_percent = f.hist_percent;
  if (f.weight_bits > 0) config.weight_bits = f.weight_bits;
  if (!f.op_types.empty()) config.quantizable_op_type = split_list(f.op_types);
  if (f.full) config.is_full_quantize = true;
  for (const auto& t : split_list(f.skip_tensors)) config.skip_tensor_list.push_back(t);
  for (const auto& p : f.skip_nodes) config.skip_quant.push_back(p);
  quant::make_activation_observer(config.global().activation);  // early, clear errors for bad names
  quant::make_weight_observer(config.global().weight, config.observer_options);
  config.validate();
}

void add_data_flags(CLI::App* app, DataFlags& flags, std::string& positional) {
  app->add_option("DATA", positional,
                  "data set: fashion-mnist[:train|:test], images:LIST_FILE, npy:DIR (same as --dataset)");
  app->add_option("--dataset", flags.dataset, "data set: fashion-mnist[:train|:test], images:LIST_FILE, npy:DIR");
  app->add_option("--mean", flags.mean, "per-channel mean, applied after scaling pixels to [0,1] (a or a,b,c)");
  app->add_option("--std", flags.stddev, "per-channel standard deviation (a or a,b,c)");
  app->add_option("--resize", flags.resize, "resize images to HxW");
  app->add_option("--channel-order", flags.channel_order, "rgb or bgr")->capture_default_str();
  app->add_option("--channels", flags.channels, "decode images with 1 or 3 channels (0 = as stored)");
  app->add_option("--limit", flags.limit, "use only the first N samples (0 = all)");
  app->add_option("--side-input", flags.side_inputs,
                  "NAME=FILE.npy: a further model input fed with the samples, one row per sample or one for all "
                  "(multi-input models; repeatable)");
}

ir::Graph load_model_arg(const std::string& path) { return ir::load_model(path); }

std::vector<std::string> graph_input_names(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const auto& in : g.inputs) names.push_back(in.name);
  return names;
}

void print_json(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

Timing time_runs(runtime::Session& session, const std::map<std::string, Tensor>& feeds, int runs, int warmup) {
  SQ_CHECK(runs > 0, ErrorKind::kInvalidArgument, "the number of timed runs must be at least 1");
  for (int i = 0; i < warmup; ++i) session.run(feeds);
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    session.run(feeds);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return {n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2, ms.front()};
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidModel: return 3;
    case ErrorKind::kUnsupported: return 4;
    case ErrorKind::kInvalidArgument: return 5;
    case ErrorKind::kInvalidData: return 6;
    case ErrorKind::kIo: return 7;
    case ErrorKind::kInternal: return 70;
  }
  return 1;
}

}  // namespace slimquant::cli
