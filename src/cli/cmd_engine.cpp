// info, run, eval, bench: the engine's subcommands.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "cli/common.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/core/npy.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"

namespace slimquant::cli {
namespace fs = std::filesystem;

namespace {

std::string dims_str(const ir::ValueInfo& v) {
  if (!v.dims) return "?";
  std::string s = "[";
  for (size_t i = 0; i < v.dims->size(); ++i) {
    const auto& d = (*v.dims)[i];
    s += (i ? "x" : "") + (d.known() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param));
  }
  return s + "]";
}

// The element type the file declares (float16/bfloat16 are held as float32 inside).
std::string declared_type(const ir::Graph& g, const ir::ValueInfo& v) {
  const auto stored = g.stored_float_types.find(v.name);
  return stored != g.stored_float_types.end() ? onnx_16bit_float_name(stored->second) : dtype_name(v.dtype);
}

nlohmann::json value_json(const ir::Graph& g, const ir::ValueInfo& v) {
  nlohmann::json dims = nlohmann::json::array();
  if (v.dims)
    for (const auto& d : *v.dims) dims.push_back(d.known() ? nlohmann::json(d.value) : nlohmann::json(d.param));
  return {{"name", v.name}, {"dtype", declared_type(g, v)}, {"shape", dims}};
}

Shape parse_shape(const std::string& text, const std::string& what) {
  Shape s;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t x = text.find('x', pos);
    std::string part = text.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    try {
      size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size() || v <= 0) throw std::invalid_argument(part);
      s.push_back(v);
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument, what + ": '" + text + "' is not a shape like 1x3x224x224");
    }
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return s;
}

runtime::SessionOptions session_options(int threads) {
  runtime::SessionOptions o;
  o.num_threads = threads;
  return o;
}

// QDQ models run as integer execution (INT8 lowering) unless --simulate asks for the float simulation.
runtime::Session make_session(ir::Graph g, int threads, bool simulate) {
  if (!simulate && quant::has_qdq_nodes(g)) return quant::make_int8_session(g, session_options(threads));
  return runtime::Session(std::move(g), session_options(threads));
}
// File names for the outputs, in order: the name with characters that paths treat specially
// ('/', '\\', control characters, a leading '.') replaced by '_', plus ".npy". Names that collide
// after that (e.g. "a/b" and "a_b") get
// "_2", "_3", ... in output order, so the mapping is deterministic and no file overwrites another.
std::vector<std::string> output_file_names(const std::vector<std::string>& names) {
  std::set<std::string> taken;
  std::vector<std::string> out;
  for (const auto& name : names) {
    std::string base = name.empty() ? "output" : name;
    for (char& c : base)
      if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = '_';
    if (base[0] == '.') base[0] = '_';
    if (base.size() > 200) base.resize(200);  // file names are limited to 255 bytes
    std::string file = base + ".npy";
    for (int k = 2; taken.count(file); ++k) file = base + "_" + std::to_string(k) + ".npy";
    taken.insert(file);
    out.push_back(file);
  }
  return out;
}

constexpr const char* kSimulateHelp = "run a QDQ model as float simulation instead of integer execution";

}  // namespace

Action register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "inputs, outputs, op counts and parameter size of a model");
  auto model = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("MODEL", *model, "ONNX model file (or directory)")->required();
  cmd->add_flag("--json", *json, "print a JSON object as the last line");
  return [=] {
    ir::Graph g = load_model_arg(*model);
    std::map<std::string, int> ops;
    for (const auto& n : g.nodes) ops[n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type]++;
    std::vector<std::pair<std::string, int>> sorted(ops.begin(), ops.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second > b.second; });
    std::cout << "model: " << *model << "\n";
    std::cout << "producer: " << g.producer_name << " " << g.producer_version << ", opset " << g.opset
              << ", ir_version " << g.ir_version << "\n";
    std::cout << "inputs:\n";
    for (const auto& i : g.inputs) std::cout << "  " << i.name << "  " << declared_type(g, i) << " " << dims_str(i) << "\n";
    std::cout << "outputs:\n";
    for (const auto& o : g.outputs) std::cout << "  " << o.name << "  " << declared_type(g, o) << " " << dims_str(o) << "\n";
    std::cout << "nodes: " << g.nodes.size() << "\n";
    for (const auto& [op, count] : sorted) std::cout << "  " << op << ": " << count << "\n";
    const double mib = static_cast<double>(g.parameter_bytes()) / (1024.0 * 1024.0);
    std::cout << "parameters: " << g.parameter_count() << " (" << g.initializers.size() << " initializers, "
              << std::fixed << std::setprecision(2) << mib << " MiB)\n";
    const runtime::SampleIndependence samples =
        runtime::analyze_sample_independence(g, runtime::input_batch_axes(g.inputs));
    std::cout << "samples: " << (samples.independent ? "computed each on its own (large batches run in parts)"
                                                     : "not proved independent: " + samples.reason)
              << "\n";
    if (*json) {
      nlohmann::json j;
      j["inputs"] = nlohmann::json::array();
      for (const auto& i : g.inputs) j["inputs"].push_back(value_json(g, i));
      j["outputs"] = nlohmann::json::array();
      for (const auto& o : g.outputs) j["outputs"].push_back(value_json(g, o));
      j["op_counts"] = ops;
      j["nodes"] = g.nodes.size();
      j["opset"] = g.opset;
      j["parameters"] = g.parameter_count();
      j["parameter_bytes"] = g.parameter_bytes();
      j["samples_independent"] = samples.independent;
      if (!samples.independent) j["samples_dependence"] = samples.reason;
      print_json(j);
    }
    return 0;
  };
}

Action register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "run a model on .npy inputs and write its outputs as .npy");
  struct Args {
    std::string model, output_dir;
    std::vector<std::string> inputs;
    int threads = 0;
    bool simulate = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "ONNX model file")->required();
  cmd->add_option("--input", a->inputs, "NAME=FILE.npy (repeat for several inputs)")->required();
  cmd->add_option("--output-dir", a->output_dir, "directory for <output name>.npy files, <output name>.K.npy per element of a sequence output (and outputs.json: file -> output name)")->required();
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->check(non_negative_integer());
  cmd->add_flag("--simulate", a->simulate, kSimulateHelp);
  return [=] {
    ir::Graph model = load_model_arg(a->model);
    const std::map<std::string, int> stored_float_types = model.stored_float_types;
    runtime::Session session = make_session(std::move(model), a->threads, a->simulate);
    std::map<std::string, Tensor> feeds;
    for (const auto& spec : a->inputs) {
      auto eq = spec.find('=');
      std::string name, file;
      if (eq == std::string::npos) {
        SQ_CHECK(session.inputs().size() == 1, ErrorKind::kInvalidArgument,
                 "--input '" + spec + "' must be NAME=FILE.npy for a model with several inputs");
        name = session.inputs()[0].name;
        file = spec;
      } else {
        name = spec.substr(0, eq);
        file = spec.substr(eq + 1);
      }
      feeds[name] = read_npy(file);
    }
    std::error_code ec;
    fs::create_directories(a->output_dir, ec);
    if (ec || !fs::is_directory(a->output_dir))
      fail(ErrorKind::kIo, "cannot create output directory '" + a->output_dir + "'");
    std::vector<std::string> output_names;
    for (const auto& o : session.outputs()) output_names.push_back(o.name);
    const std::vector<std::string> files = output_file_names(output_names);
    std::vector<std::string> paths, inputs{a->model};
    for (const auto& spec : a->inputs) inputs.push_back(spec.substr(spec.find('=') + 1));
    for (const auto& f : files) {  // before running: no output replaces an input or a special file
      paths.push_back((fs::path(a->output_dir) / f).string());
      check_output_path(paths.back(), inputs, "output");
    }
    auto outputs = session.run(feeds);
    nlohmann::json index = nlohmann::json::object();
    for (size_t i = 0; i < output_names.size(); ++i) {
      const Tensor& t = outputs.at(output_names[i]);
      if (!t.defined()) {  // an empty optional has nothing to write
        std::cout << output_names[i] << " (empty optional, no file)\n";
        continue;
      }
      if (t.is_sequence()) {  // one file per element: NAME.0.npy, NAME.1.npy, ...
        const std::string stem = paths[i].substr(0, paths[i].size() - std::string(".npy").size());
        for (size_t k = 0; k < t.elements().size(); ++k) {
          const std::string path = stem + "." + std::to_string(k) + ".npy";
          check_output_path(path, inputs, "output");
          write_npy(path, t.elements()[k]);
          index[fs::path(path).filename().string()] = output_names[i] + "[" + std::to_string(k) + "]";
        }
        std::cout << output_names[i] << " sequence of " << t.elements().size() << " " << dtype_name(t.dtype())
                  << " tensors -> " << stem << ".K.npy\n";
        continue;
      }
      // A float16 output is written as float16, as the model declares it; numpy has no bfloat16,
      // so a bfloat16 output is written as float32 holding the bfloat16-rounded values.
      const auto stored = stored_float_types.find(output_names[i]);
      std::string type = dtype_name(t.dtype());
      if (stored != stored_float_types.end() && t.dtype() == DType::kFloat32 && stored->second == kOnnxFloat16) {
        write_npy_float16(paths[i], t);
        type = "float16";
      } else if (stored != stored_float_types.end() && t.dtype() == DType::kFloat32) {
        write_npy(paths[i], t);  // already rounded: the loader ends a 16-bit output with a rounding Cast
        type = "bfloat16 (as float32)";
      } else {
        write_npy(paths[i], t);
      }
      index[files[i]] = output_names[i];
      std::cout << output_names[i] << " " << type << shape_str(t.shape()) << " -> " << paths[i] << "\n";
    }
    // Which file holds which output, for names that had to be changed to be file names.
    const std::string index_path = (fs::path(a->output_dir) / "outputs.json").string();
    write_file_atomic(index_path, index.dump(2) + "\n");
    std::cout << "index -> " << index_path << std::endl;
    return 0;
  };
}

Action register_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "evaluate a model on a data set");
  struct Args {
    std::string model, data, metric = "top1", keys, reference;
    DataFlags flags;
    bool json = false;
    size_t batch_size = 64;
    int threads = 0;
    bool simulate = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "ONNX model file")->required();
  add_data_flags(cmd, a->flags, a->data);
  cmd->add_option("--metric", a->metric, kMetricHelp)->capture_default_str();
  add_keys_flag(cmd, a->keys);
  cmd->add_option("--reference", a->reference,
                  "FP32 model the metrics cosine, sqnr, top1_agreement and mask_iou compare against (fed the same data)");
  cmd->add_option("--batch-size", a->batch_size, "samples per batch")->capture_default_str()->check(positive_integer());
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  cmd->add_flag("--simulate", a->simulate, kSimulateHelp);
  return [=] {
    DataFlags flags = a->flags;
    if (!a->data.empty()) flags.dataset = a->data;
    auto metric = make_cli_metric(a->metric, a->keys);  // before loading anything: bad names and key files fail fast
    SQ_CHECK(!metric->needs_reference() || !a->reference.empty(), ErrorKind::kInvalidArgument,
             "eval: metric '" + a->metric + "' compares against the FP32 model: give it with --reference FP32.onnx");
    SQ_CHECK(metric->needs_reference() || a->reference.empty(), ErrorKind::kInvalidArgument,
             "eval: --reference is only used by cosine, sqnr, top1_agreement and mask_iou, not by '" + a->metric + "'");
    ir::Graph model = load_model_arg(a->model);
    auto dataset = data::open_dataset(flags.options("eval", &model));
    check_metric_labels(*metric, *dataset);
    std::optional<ir::Graph> reference_model;
    if (!a->reference.empty()) {
      reference_model = load_model_arg(a->reference);
      // Outputs chosen or decided by the data (a detector's boxes after NMS, ArgMax classes) are
      // compared at the values they come from, when the model computes them too (a QDQ file of the
      // reference keeps its values' names).
      const std::vector<std::string> measured = quant::selection_inputs(*reference_model);
      std::set<std::string> computed;
      for (const auto& n : model.nodes) computed.insert(n.outputs.begin(), n.outputs.end());
      if (!measured.empty() &&
          std::all_of(measured.begin(), measured.end(), [&](const std::string& v) { return computed.count(v); })) {
        model = quant::join_measured_values(std::move(model), measured);
        reference_model = quant::join_measured_values(std::move(*reference_model), measured);
        print_measured_values_note(metric->name(), measured.size());
      }
    }
    runtime::Session session = make_session(std::move(model), a->threads, a->simulate);
    std::optional<runtime::Session> reference;
    analysis::EvalOptions options;
    options.batch_size = a->batch_size;
    if (reference_model) {
      // The reference is the FP32 model: a QDQ file given here runs as its float simulation.
      reference.emplace(std::move(*reference_model), session_options(a->threads));
      options.reference = &*reference;
    }
    auto r = analysis::evaluate(session, *dataset, *metric, options);
    std::cout << metric->name() << ": " << std::fixed << std::setprecision(4) << r.value;
    for (const auto& [name, v] : metric->extra_values()) std::cout << ", " << name << ": " << v;
    std::cout << " (" << r.samples << " samples, " << std::setprecision(2) << r.seconds << " s)" << std::endl;
    nlohmann::json j{{metric->name(), r.value}, {"samples", r.samples}, {"seconds", r.seconds}};
    for (const auto& [name, v] : metric->extra_values()) j[name] = v;
    if (a->json) print_json(j);
    return 0;
  };
}

Action register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "measure a model's latency on random inputs");
  struct Args {
    std::string model;
    std::vector<std::string> shapes;
    int runs = 30, warmup = 5, threads = 1;
    bool json = false, simulate = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "ONNX model file")->required();
  cmd->add_option("--shape", a->shapes, "input shape, e.g. 1x1x28x28, or NAME=1x1x28x28 per input");
  cmd->add_option("--runs", a->runs, "timed runs")->capture_default_str()->check(positive_integer());
  cmd->add_option("--warmup", a->warmup, "untimed runs first (more while the session times its part size for a batch)")->capture_default_str()->check(non_negative_integer());
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->capture_default_str()->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  cmd->add_flag("--simulate", a->simulate, kSimulateHelp);
  return [=] {
    SQ_CHECK(a->runs > 0, ErrorKind::kInvalidArgument, "--runs must be positive");
    ir::Graph model = load_model_arg(a->model);
    const std::map<std::string, int> stored_float_types = model.stored_float_types;
    runtime::Session session = make_session(std::move(model), a->threads, a->simulate);
    std::map<std::string, Shape> shapes;
    for (const auto& spec : a->shapes) {
      auto eq = spec.find('=');
      if (eq == std::string::npos) {
        SQ_CHECK(session.inputs().size() == 1, ErrorKind::kInvalidArgument,
                 "--shape must be NAME=SHAPE for a model with several inputs");
        shapes[session.inputs()[0].name] = parse_shape(spec, "--shape");
      } else {
        shapes[spec.substr(0, eq)] = parse_shape(spec.substr(eq + 1), "--shape");
      }
    }
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> uniform(0.f, 1.f);
    std::map<std::string, Tensor> feeds;
    for (const auto& in : session.inputs()) {
      Shape s;
      if (shapes.count(in.name)) {
        s = shapes[in.name];
      } else {
        SQ_CHECK(in.fully_known(), ErrorKind::kInvalidArgument,
                 "input '" + in.name + "' has dynamic dimensions: give --shape");
        s = in.shape();
      }
      DType dt = in.dtype == DType::kUndefined ? DType::kFloat32 : in.dtype;
      Tensor t(dt, s);
      if (dt == DType::kFloat32)
        for (float& v : t.values<float>()) v = uniform(rng);
      feeds[in.name] = t;
    }
    for (const auto& [name, s] : shapes)
      SQ_CHECK(feeds.count(name), ErrorKind::kInvalidArgument, "--shape names unknown input '" + name + "'");
    const Timing t = time_runs(session, feeds, a->runs, a->warmup);
    const double median = t.median_ms;
    std::cout << "median " << std::fixed << std::setprecision(3) << median << " ms, min " << t.min_ms
              << " ms over " << a->runs << " runs (" << a->threads << " thread(s))" << std::endl;
    if (a->json) print_json({{"median_ms", median}, {"min_ms", t.min_ms}, {"runs", a->runs}});
    return 0;
  };
}

}  // namespace slimquant::cli
