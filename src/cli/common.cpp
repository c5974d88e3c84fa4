#include "cli/common.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <vector>

#include "slimquant/ir/onnx_io.h"

namespace slimquant::cli {

data::DataOptions DataFlags::options(const std::string& default_spec) const {
  data::DataOptions o;
  o.spec = dataset.empty() ? default_spec : dataset;
  if (!mean.empty()) o.mean = data::parse_float_list(mean, "--mean");
  if (!stddev.empty()) o.stddev = data::parse_float_list(stddev, "--std");
  if (!resize.empty()) o.resize = data::parse_image_size(resize, "--resize");
  o.channel_order = data::parse_channel_order(channel_order, "--channel-order");
  o.limit = limit;
  o.channels = channels;
  return o;
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
}

ir::Graph load_model_arg(const std::string& path) { return ir::load_model(path); }

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
