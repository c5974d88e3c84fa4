#include "slimquant/analysis/statistics.h"
#include "slimquant/core/atomic_file.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"

namespace slimquant::analysis {

namespace {

// min / max / mean / std of a stream of values: two passes over each chunk (its mean, then the
// squared deviations from it), chunks merged with Chan's formula, so the result neither needs the
// data kept nor cancels catastrophically, and the inner loops have no division.
struct Moments {
  uint64_t n = 0;
  double mean = 0, m2 = 0;
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();

  void add(const float* x, size_t count) {
    if (count == 0) return;
    double sum = 0;
    float lo = x[0], hi = x[0];
    for (size_t i = 0; i < count; ++i) {
      sum += x[i];
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const double mu = sum / static_cast<double>(count);
    double s = 0;
    for (size_t i = 0; i < count; ++i) {
      const double d = x[i] - mu;
      s += d * d;
    }
    min = std::min(min, static_cast<double>(lo));
    max = std::max(max, static_cast<double>(hi));
    const double na = static_cast<double>(n), nb = static_cast<double>(count), nt = na + nb;
    const double d = mu - mean;
    mean += d * nb / nt;
    m2 += s + d * d * na * nb / nt;
    n += count;
  }
  double stddev() const { return n ? std::sqrt(std::max(0.0, m2 / static_cast<double>(n))) : 0.0; }
};

// Sums for SQNR over all data.
struct ErrorSums {
  double signal = 0, noise = 0;
  uint64_t n = 0;
  void add(const float* x, const float* xq, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const double a = x[i], e = a - static_cast<double>(xq[i]);
      signal += a * a;
      noise += e * e;
    }
    n += count;
  }
  double sqnr_db() const {
    if (n == 0) return std::numeric_limits<double>::quiet_NaN();
    if (noise == 0) return std::numeric_limits<double>::infinity();
    if (signal == 0) return -std::numeric_limits<double>::infinity();
    return 10.0 * std::log10(signal / noise);
  }
};

nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json moments_json(const Moments& m) {
  if (m.n == 0) return nullptr;
  return {{"count", m.n}, {"min", m.min}, {"max", m.max}, {"mean", m.mean}, {"std", m.stddev()}};
}

std::string csv_number(double v) {
  if (std::isnan(v)) return "";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

const ir::Node& find_node(const ir::Graph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    if (n.name == name) return n;
  fail(ErrorKind::kInternal, "statistics: layer node '" + name + "' not found in the graph");
}

const Tensor& initializer(const ir::Graph& g, const std::string& name, const std::string& who) {
  const Tensor* t = g.initializer(name);
  SQ_CHECK(t != nullptr, ErrorKind::kInternal, "statistics: " + who + " reads '" + name + "', which is not an initializer");
  return *t;
}

// One activation tensor's QuantizeLinear parameters as the single-layer QDQ graph has them.
struct ActQuant {
  std::string tensor;
  Tensor scale, zero_point;
};

struct LayerState {
  const quant::Layer* layer = nullptr;
  std::vector<std::string> inputs;   // values the layer node reads that are not constants
  std::vector<std::string> outputs;  // the layer node's outputs
  std::unique_ptr<runtime::Session> isolated;  // only this layer quantized
  std::vector<ActQuant> acts;
  Moments w_fp, w_q, a_fp, a_q;
  ErrorSums w_err, a_err, iso, acc;
};

void add_outputs(ErrorSums& sums, const LayerState& s, const std::map<std::string, Tensor>& reference,
                 const std::map<std::string, Tensor>& quantized, const char* which) {
  for (const auto& o : s.outputs) {
    const Tensor& x = reference.at(o);
    const Tensor& xq = quantized.at(o);
    if (x.dtype() != DType::kFloat32) continue;  // integer outputs (e.g. ArgMax) carry no error
    SQ_CHECK(xq.dtype() == DType::kFloat32 && xq.shape() == x.shape(), ErrorKind::kInternal,
             std::string("statistics: ") + which + " output '" + o + "' of layer '" + s.layer->name +
                 "' has shape " + shape_str(xq.shape()) + ", FP32 has " + shape_str(x.shape()));
    sums.add(x.data<float>(), xq.data<float>(), static_cast<size_t>(x.numel()));
  }
}

}  // namespace

nlohmann::json run_layer_statistics(const quant::PTQ& ptq, const data::Dataset& data, const std::string& save_dir,
                                    const StatisticsOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SQ_CHECK(options.batch_size > 0, ErrorKind::kInvalidArgument, "statistics: batch_size must be at least 1");
  const ir::Graph& fg = ptq.float_graph();
  SQ_CHECK(data.size() > 0, ErrorKind::kInvalidData, "statistics: data set '" + data.name() + "' is empty");
  std::vector<std::string> graph_inputs;
  for (const auto& in : fg.inputs) graph_inputs.push_back(in.name);
  const std::string input_name = data::main_input_name(graph_inputs, data);

  // Before any work: fail on an unwritable save_dir now, not after the data pass.
  std::error_code ec;
  std::filesystem::create_directories(save_dir, ec);
  SQ_CHECK(std::filesystem::is_directory(save_dir), ErrorKind::kIo,
           "statistics: cannot create save_dir '" + save_dir + "'" + (ec ? ": " + ec.message() : ""));

  // Every value must be visible, pre-activation Conv outputs included.
  runtime::SessionOptions so;
  so.fuse_activations = false;
  runtime::Session float_session(fg, so);
  runtime::Session quant_session(ptq.convert(), so);  // accumulated: every layer quantized

  std::vector<LayerState> layers(ptq.layers().size());
  std::set<std::string> float_wanted, layer_outputs;
  runtime::SessionOptions isolated_options = so;  // one layer each, run one after another
  isolated_options.buffer_pool = runtime::make_shared_buffer_pool();
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerState& s = layers[i];
    const quant::Layer& layer = ptq.layers()[i];
    s.layer = &layer;
    const ir::Node& fnode = find_node(fg, layer.name);
    for (const auto& in : fnode.inputs)
      if (!in.empty() && !fg.is_initializer(in) && std::find(s.inputs.begin(), s.inputs.end(), in) == s.inputs.end())
        s.inputs.push_back(in);
    for (const auto& o : fnode.outputs)
      if (!o.empty()) s.outputs.push_back(o);
    for (const auto& in : s.inputs)
      if (std::find(graph_inputs.begin(), graph_inputs.end(), in) == graph_inputs.end()) float_wanted.insert(in);
    float_wanted.insert(s.outputs.begin(), s.outputs.end());
    layer_outputs.insert(s.outputs.begin(), s.outputs.end());

    ir::Graph g = ptq.convert(std::set<std::string>{layer.name});
    // The activation parameters exactly as this layer's Q/DQ pairs use them (convert() may widen
    // them, e.g. across a Concat group).
    for (const auto& t : layer.activations) {
      auto q = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) {
        return n.op_type == "QuantizeLinear" && !n.inputs.empty() && n.inputs[0] == t;
      });
      SQ_CHECK(q != g.nodes.end(), ErrorKind::kInternal,
               "statistics: no QuantizeLinear for activation '" + t + "' of layer '" + layer.name + "'");
      // No zero point: QuantizeLinear's default, uint8 with zero point 0.
      s.acts.push_back({t, initializer(g, q->input(1), q->describe()),
                        q->input(2).empty() ? Tensor::scalar<uint8_t>(0) : initializer(g, q->input(2), q->describe())});
    }
    // Weight: FP32 initializer vs what the weight DequantizeLinear produces.
    if (!layer.weight.empty()) {
      const ir::Node& qnode = find_node(g, layer.name);
      const auto k = static_cast<size_t>(std::find(fnode.inputs.begin(), fnode.inputs.end(), layer.weight) -
                                         fnode.inputs.begin());
      SQ_CHECK(k < qnode.inputs.size(), ErrorKind::kInternal, "statistics: weight of layer '" + layer.name + "' not found");
      const int p = g.producer(qnode.inputs[k]);
      SQ_CHECK(p >= 0 && g.nodes[p].op_type == "DequantizeLinear", ErrorKind::kInternal,
               "statistics: weight of layer '" + layer.name + "' is not read through a DequantizeLinear");
      const ir::Node& dq = g.nodes[p];
      const Tensor& wq = initializer(g, dq.input(0), dq.describe());
      const Tensor& w = initializer(fg, layer.weight, fnode.describe());
      Tensor wdq(DType::kFloat32, wq.shape());
      const Tensor* zp = dq.input(2).empty() ? nullptr : &initializer(g, dq.input(2), dq.describe());  // 0 by default
      runtime::dequantize_linear(wq, initializer(g, dq.input(1), dq.describe()), zp, dq.attr_int("axis", 1), wdq,
                                 dq.describe());
      const auto n = static_cast<size_t>(w.numel());
      s.w_fp.add(w.data<float>(), n);
      s.w_q.add(wdq.data<float>(), n);
      s.w_err.add(w.data<float>(), wdq.data<float>(), n);
    }
    s.isolated = std::make_unique<runtime::Session>(std::move(g), isolated_options);
  }

  const double setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  data::BatchLoader loader(data, options.batch_size);
  size_t batches = loader.num_batches();
  if (options.max_batches) batches = std::min(batches, options.max_batches);
  if (layers.empty()) batches = 0;  // nothing quantized: empty reports, no data pass
  Progress progress("statistics", batches, "batches");
  size_t samples = 0;
  runtime::RunOptions float_run, quant_run;
  float_run.outputs.assign(float_wanted.begin(), float_wanted.end());
  quant_run.outputs.assign(layer_outputs.begin(), layer_outputs.end());
  for (size_t b = 0; b < batches; ++b) {
    const data::Batch batch = loader.batch(b);
    samples += batch.size();
    const std::map<std::string, Tensor> feeds = batch.feeds(input_name);
    std::map<std::string, Tensor> fp = float_session.run(feeds, float_run);
    fp.insert(feeds.begin(), feeds.end());
    const std::map<std::string, Tensor> accumulated = quant_session.run(feeds, quant_run);
    for (LayerState& s : layers) {
      for (const ActQuant& a : s.acts) {
        const Tensor& x = fp.at(a.tensor);
        if (x.dtype() != DType::kFloat32) continue;
        Tensor xq(DType::kFloat32, x.shape());
        runtime::fake_quantize_linear(x, a.scale, &a.zero_point, 1, a.zero_point.dtype(), xq,
                                      "activation '" + a.tensor + "'");
        const auto n = static_cast<size_t>(x.numel());
        s.a_fp.add(x.data<float>(), n);
        s.a_q.add(xq.data<float>(), n);
        s.a_err.add(x.data<float>(), xq.data<float>(), n);
      }
      // Isolated: the layer's FP32 inputs through the graph where only it is quantized; the
      // partial run executes just its Q/DQ pairs and the layer itself.
      std::map<std::string, Tensor> in;
      for (const auto& name : s.inputs) in[name] = fp.at(name);
      runtime::RunOptions iso_run;
      iso_run.outputs = s.outputs;
      const auto isolated = s.isolated->run(in, iso_run);
      add_outputs(s.iso, s, fp, isolated, "isolated");
      add_outputs(s.acc, s, fp, accumulated, "accumulated");
    }
    progress.advance();
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // ---- reports
  nlohmann::json j;
  j["data"] = data.name();
  j["samples"] = samples;
  j["batches"] = batches;
  j["batch_size"] = options.batch_size;
  j["wall_seconds"] = seconds;
  j["setup_seconds"] = setup_seconds;  // sessions and single-layer graphs, before the data pass
  j["definitions"] = {
      {"weight_quant", "dequantized weight (scale * q) from the layer's weight DequantizeLinear"},
      {"act_quant", "input activation(s) on the data, fake-quantized with the layer's Q/DQ parameters; "
                    "several inputs are pooled"},
      {"sqnr_db", "10*log10(sum x^2 / sum (x - x_q)^2) over all data; null = infinite (no error)"},
      {"output_sqnr_isolated_db", "layer output with only this layer quantized, fed FP32 inputs"},
      {"output_sqnr_accumulated_db", "layer output in the fully quantized model (every layer up to and "
                                     "including this one quantized, as deployed)"}};
  std::ostringstream csv;
  csv << "index,layer,op_type,weight,activations,"
         "weight_fp32_min,weight_fp32_max,weight_fp32_mean,weight_fp32_std,"
         "weight_quant_min,weight_quant_max,weight_quant_mean,weight_quant_std,weight_sqnr_db,"
         "act_fp32_min,act_fp32_max,act_fp32_mean,act_fp32_std,"
         "act_quant_min,act_quant_max,act_quant_mean,act_quant_std,act_sqnr_db,"
         "output_sqnr_isolated_db,output_sqnr_accumulated_db\n";
  auto csv_moments = [&](const Moments& m) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const bool any = m.n > 0;
    csv << ',' << csv_number(any ? m.min : nan) << ',' << csv_number(any ? m.max : nan) << ','
        << csv_number(any ? m.mean : nan) << ',' << csv_number(any ? m.stddev() : nan);
  };
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerState& s = layers[i];
    std::string acts;
    for (const auto& a : s.layer->activations) acts += (acts.empty() ? "" : ";") + a;
    const double w_sqnr = s.w_err.sqnr_db(), a_sqnr = s.a_err.sqnr_db();
    const double iso = s.iso.sqnr_db(), acc = s.acc.sqnr_db();
    nlohmann::json row;
    row["index"] = i;
    row["layer"] = s.layer->name;
    row["op_type"] = s.layer->op_type;
    row["weight"] = s.layer->weight.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.layer->weight);
    row["activations"] = s.layer->activations;
    row["weight_fp32"] = moments_json(s.w_fp);
    row["weight_quant"] = moments_json(s.w_q);
    row["weight_sqnr_db"] = number(w_sqnr);
    row["act_fp32"] = moments_json(s.a_fp);
    row["act_quant"] = moments_json(s.a_q);
    row["act_sqnr_db"] = number(a_sqnr);
    row["output_sqnr_isolated_db"] = number(iso);
    row["output_sqnr_accumulated_db"] = number(acc);
    rows.push_back(std::move(row));

    csv << i << ',' << csv_field(s.layer->name) << ',' << csv_field(s.layer->op_type) << ','
        << csv_field(s.layer->weight) << ',' << csv_field(acts);
    csv_moments(s.w_fp);
    csv_moments(s.w_q);
    csv << ',' << csv_number(w_sqnr);
    csv_moments(s.a_fp);
    csv_moments(s.a_q);
    csv << ',' << csv_number(a_sqnr) << ',' << csv_number(iso) << ',' << csv_number(acc) << '\n';
  }
  j["layers"] = std::move(rows);
  const std::filesystem::path dir(save_dir);
  write_file_atomic((dir / "statistics.csv").string(), csv.str());
  // Measured times apart, so the same command writes the same statistics.json.
  nlohmann::json results = j, timing;
  for (const char* key : {"wall_seconds", "setup_seconds"}) {
    timing[key] = j[key];
    results.erase(key);
  }
  write_file_atomic((dir / "statistics.json").string(), results.dump(2) + "\n");
  write_file_atomic((dir / "statistics_timing.json").string(), timing.dump(2) + "\n");
  return j;
}

}  // namespace slimquant::analysis
