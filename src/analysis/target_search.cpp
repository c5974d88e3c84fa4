#include "slimquant/analysis/target_search.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <sstream>

#include "slimquant/analysis/checkpoint.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/core/distributed.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/precision_fallback.h"

namespace slimquant::analysis {

namespace {

double median_latency_ms(runtime::Session& s, const std::map<std::string, Tensor>& feeds, int runs) {
  runtime::RunOptions timed;
  timed.outputs_needed = false;  // a batch run in parts is not joined: only the time is wanted
  for (int i = 0; i < 2; ++i) s.run(feeds, timed);  // plans compiled, caches warm
  std::vector<double> t;
  for (int i = 0; i < std::max(1, runs); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    s.run(feeds, timed);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

FallbackMode parse_fallback_mode(const std::string& name) {
  if (name == "float") return FallbackMode::kFloat;
  if (name == "weight-only" || name == "weight_only") return FallbackMode::kWeightOnly;
  if (name == "dynamic") return FallbackMode::kDynamic;
  fail(ErrorKind::kInvalidArgument, "fallback mode must be float, weight-only or dynamic, got '" + name + "'");
}

const char* fallback_mode_name(FallbackMode mode) {
  if (mode == FallbackMode::kDynamic) return "dynamic";
  return mode == FallbackMode::kWeightOnly ? "weight-only" : "float";
}

std::map<std::string, std::string> TargetCandidate::layer_modes(const quant::PTQ& ptq) const {
  std::map<std::string, std::string> out;
  for (const auto& [name, mode] : ptq.leaf_layer_modes()) out[name] = quant::quant_mode_name(mode);
  for (const auto& l : weight_only) out[l] = quant::quant_mode_name(quant::QuantMode::kWeightOnly);
  for (const auto& l : dynamic) out[l] = quant::quant_mode_name(quant::QuantMode::kDynamic);
  for (const auto& l : skipped) out[l] = "float";
  return out;
}

ir::Graph candidate_graph(const quant::PTQ& ptq, const std::vector<std::string>& skipped,
                          const std::vector<std::string>& weight_only, const std::vector<std::string>& dynamic) {
  quant::LayerModes modes = ptq.leaf_layer_modes();  // a branch's layers one by one
  for (const auto& l : weight_only) modes[l] = quant::QuantMode::kWeightOnly;
  for (const auto& l : dynamic) modes[l] = quant::QuantMode::kDynamic;
  for (const auto& l : skipped) modes.erase(l);
  return ptq.convert_layers(modes);
}

std::vector<std::string> equivalent_skip_tensors(const quant::PTQ& ptq, const std::vector<std::string>& layers) {
  const ir::Graph& g = ptq.float_graph();
  std::set<std::string> skip(layers.begin(), layers.end());
  std::map<std::string, const ir::Node*> by_name;
  for (const auto& n : g.nodes) by_name[n.name] = &n;
  // Which quantized layers touch each tensor.
  std::map<std::string, std::set<std::string>> touching;
  for (const auto& l : ptq.layers()) {
    const ir::Node* n = by_name.at(l.name);
    for (const auto& v : n->inputs) touching[v].insert(l.name);
    for (const auto& v : n->outputs) touching[v].insert(l.name);
  }
  std::vector<std::string> tensors;
  for (const auto& name : layers) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return {};
    std::string pick;
    std::vector<std::string> options = it->second->outputs;
    options.insert(options.end(), it->second->inputs.begin(), it->second->inputs.end());
    for (const auto& v : options) {
      if (v.empty()) continue;
      const auto& who = touching[v];
      if (std::all_of(who.begin(), who.end(), [&](const std::string& l) { return skip.count(l) != 0; })) {
        pick = v;
        break;
      }
    }
    if (pick.empty()) return {};
    tensors.push_back(pick);
  }
  // Check it against the config's own rule, so the printed command cannot drift from it.
  quant::QuantConfig cfg = ptq.config();
  for (const auto& t : tensors) cfg.skip_tensor_list.push_back(t);
  for (const auto& l : ptq.layers())
    if ((cfg.spec_for(*by_name.at(l.name)) == nullptr) != (skip.count(l.name) != 0)) return {};
  return tensors;
}

nlohmann::json TargetSearchResult::to_json() const {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : candidates)
    cands.push_back({{"skipped", c.skipped}, {"weight_only", c.weight_only}, {"dynamic", c.dynamic},
                     {"metric", c.metric}, {"meets", c.meets}, {"model_bytes", c.model_bytes}, {"stage", c.stage}});
  nlohmann::json j{{"target", target},
                   {"metric", metric},
                   {"higher_is_better", higher_is_better},
                   {"fp32_metric", fp32_metric},
                   {"fp32_model_bytes", fp32_model_bytes},
                   {"met", met},
                   {"model", model_path},
                   {"candidates", cands},
                   {"skip_tensor_list", skip_tensor_list},
                   {"fallback_mode", fallback_mode},
                   {"layer_modes", layer_modes}};
  if (!candidates.empty()) {
    j["best"] = best;
    j["skipped"] = candidates[best].skipped;
    j["weight_only"] = candidates[best].weight_only;
    j["dynamic"] = candidates[best].dynamic;
    j["best_metric"] = candidates[best].metric;
    j["int8_metric"] = candidates.front().metric;
  }
  return j;
}

nlohmann::json TargetSearchResult::timing_json() const {
  nlohmann::json latencies = nlohmann::json::array();
  for (const auto& c : candidates) latencies.push_back(c.latency_ms);
  return {{"fp32_latency_ms", fp32_latency_ms}, {"candidate_latency_ms", latencies}};
}

std::string TargetSearchResult::table() const {
  std::ostringstream os;
  os << "# target " << metric << (higher_is_better ? " >= " : " <= ") << target << "; fp32 " << fp32_metric << ", "
     << fp32_model_bytes << " bytes (latencies: target_search_timing.json)\n";
  // Weight-only or dynamic fallback: two more columns, the layers in that mode.
  const bool mixing = fallback_mode != fallback_mode_name(FallbackMode::kFloat);
  const bool dynamic = fallback_mode == fallback_mode_name(FallbackMode::kDynamic);
  const std::string partial = dynamic ? "dynamic" : "weight_only";
  os << "#\tstage\tskipped\tmetric\tmeets\tmodel_bytes\tskipped_layers"
     << (mixing ? "\t" + partial + "\t" + partial + "_layers" : "") << "\n";
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    os << i << (i == best ? "*" : "") << '\t' << c.stage << '\t' << c.skipped.size() << '\t' << std::fixed
       << std::setprecision(6) << c.metric << '\t' << (c.meets ? "yes" : "no") << '\t'
       << c.model_bytes << '\t' << (c.skipped.empty() ? "-" : join(c.skipped, ","));
    const std::vector<std::string>& in_partial = dynamic ? c.dynamic : c.weight_only;
    if (mixing) os << '\t' << in_partial.size() << '\t' << (in_partial.empty() ? "-" : join(in_partial, ","));
    os << '\n';
  }
  return os.str();
}

namespace {

// How the search scores models: the built-in metric on a data set, or a user's evaluation.
struct CandidateScorer {
  std::string metric;
  bool higher_is_better = true;
  // Metric and latency (0 when not measured) of the FP32 model, and of a QDQ candidate.
  std::function<std::pair<double, double>()> fp32;
  std::function<std::pair<double, double>(const ir::Graph& qdq, size_t skipped)> candidate;
};

TargetSearchResult search_with(const quant::PTQ& ptq, const SensitivityReport& ranking, const CandidateScorer& scorer,
                               const TargetSearchOptions& options) {
  namespace fs = std::filesystem;
  SQ_CHECK(std::isfinite(options.target), ErrorKind::kInvalidArgument, "--target-metric must be a finite number");
  std::error_code ec;
  fs::create_directories(options.save_dir, ec);
  SQ_CHECK(fs::is_directory(options.save_dir), ErrorKind::kIo, "cannot create save_dir '" + options.save_dir + "'");
  TargetSearchResult r;
  r.target = options.target;
  r.metric = scorer.metric;
  r.higher_is_better = scorer.higher_is_better;
  r.model_path = (fs::path(options.save_dir) / options.model_name).string();
  auto meets = [&](double m) { return r.higher_is_better ? m >= r.target : m <= r.target; };
  auto better = [&](double a, double b) { return r.higher_is_better ? a > b : a < b; };
  std::tie(r.fp32_metric, r.fp32_latency_ms) = scorer.fp32();
  r.fp32_model_bytes = ir::serialize_onnx(ptq.float_graph()).size();

  r.fallback_mode = fallback_mode_name(options.fallback);

  std::vector<std::string> order;
  for (const auto& l : ranking.ranked) order.push_back(l.name);
  // The fallback mode between static and float ("partial": weight-only or dynamic) and the layers
  // it can take: static in the analysis' own modes, with a constant weight (dynamic: in a form
  // PTQ::dynamic_applies).
  std::set<std::string> partial_able;
  if (options.fallback != FallbackMode::kFloat)
    for (const quant::Layer* l : ptq.all_layers())
      if (l->mode == quant::QuantMode::kStatic && !l->weight.empty() &&
          (options.fallback != FallbackMode::kDynamic || ptq.dynamic_applies(*l)))
        partial_able.insert(l->name);
  // (float layers, partial layers) -> candidate index
  std::map<std::pair<std::set<std::string>, std::set<std::string>>, size_t> done;
  // Distributed: every evaluation is sharded over the ranks (evaluate()), so they all take the same
  // path through the search; rank 0 alone writes.
  auto save_outputs = [&] {
    if (!distributed::is_root()) return;
    write_file_atomic((fs::path(options.save_dir) / "target_candidates.txt").string(), r.table());
    write_file_atomic((fs::path(options.save_dir) / "target_search.json").string(), r.to_json().dump(2) + "\n");
    write_file_atomic((fs::path(options.save_dir) / "target_search_timing.json").string(),
                      r.timing_json().dump(2) + "\n");
  };
  // Layers change mode only toward float (static -> partial -> float); a demotion lists the
  // layers in ranking order.
  struct Demotion {
    std::vector<std::string> skipped, partial;
  };
  auto evaluate = [&](Demotion d, const std::string& stage) -> const TargetCandidate& {
    auto key = std::pair(std::set<std::string>(d.skipped.begin(), d.skipped.end()),
                         std::set<std::string>(d.partial.begin(), d.partial.end()));
    if (auto it = done.find(key); it != done.end()) return r.candidates[it->second];
    TargetCandidate c;
    c.skipped = std::move(d.skipped);
    (options.fallback == FallbackMode::kDynamic ? c.dynamic : c.weight_only) = std::move(d.partial);
    ir::Graph g = candidate_graph(ptq, c.skipped, c.weight_only, c.dynamic);
    c.stage = stage;
    std::tie(c.metric, c.latency_ms) = scorer.candidate(g, c.skipped.size());
    c.meets = meets(c.metric);
    const std::string bytes = ir::serialize_onnx(g);
    c.model_bytes = bytes.size();
    r.candidates.push_back(c);
    done[key] = r.candidates.size() - 1;
    // Best: meets the target with the fewest float layers, then the fewest partial ones (then
    // the better metric); while nothing meets it, the best metric.
    const size_t idx = r.candidates.size() - 1;
    bool is_best = idx == 0;
    if (!is_best) {
      const TargetCandidate& b = r.candidates[r.best];
      const auto cost = [](const TargetCandidate& x) { return std::pair(x.skipped.size(), x.weight_only.size() + x.dynamic.size()); };
      if (c.meets != b.meets) is_best = c.meets;
      else if (c.meets) is_best = cost(c) < cost(b) || (cost(c) == cost(b) && better(c.metric, b.metric));
      else is_best = better(c.metric, b.metric);
    }
    if (is_best) {
      r.best = idx;
      r.met = c.meets;
      r.layer_modes = c.layer_modes(ptq);
      if (distributed::is_root()) ir::save_onnx(g, r.model_path);
    }
    save_outputs();
    return r.candidates[idx];
  };
  // The k most damaging layers demoted: to the partial mode where `partial_first` and they can be,
  // else to float.
  auto prefix = [&](size_t k, bool partial_first) {
    Demotion d;
    for (size_t i = 0; i < k; ++i)
      (partial_first && partial_able.count(order[i]) ? d.partial : d.skipped).push_back(order[i]);
    return d;
  };
  auto budget_left = [&] { return r.candidates.size() < options.max_evaluations; };
  // Grows then bisects the demoted prefix; refine: single-layer rankings ignore interactions, so
  // each demoted layer, least damaging first, goes back to its own mode if the target can afford
  // it, else (a float one) to the partial mode if that can. Returns whether the target was met.
  const size_t n = order.size();
  auto search = [&](bool partial_first) {
    size_t lo = 0, hi = 0;  // prefix lengths: lo fails, hi meets (0 = none found yet)
    bool found = false;
    for (size_t k = 1; budget_left(); k = std::min(n, k * 2)) {
      if (evaluate(prefix(k, partial_first), "prefix").meets) {
        hi = k;
        found = true;
        break;
      }
      lo = k;
      if (k == n) break;
    }
    while (found && hi - lo > 1 && budget_left()) {
      const size_t mid = lo + (hi - lo) / 2;
      if (evaluate(prefix(mid, partial_first), "bisect").meets) hi = mid;
      else lo = mid;
    }
    if (!found) return false;
    Demotion best = prefix(hi, partial_first);
    for (size_t i = hi; i-- > 0 && budget_left();) {
      const std::string& layer = order[i];
      auto without = [&](Demotion d) {
        std::erase(d.skipped, layer);
        std::erase(d.partial, layer);
        return d;
      };
      Demotion trial = without(best);
      if (evaluate(trial, "refine").meets) {
        best = trial;
        continue;
      }
      const bool is_float = std::find(best.skipped.begin(), best.skipped.end(), layer) != best.skipped.end();
      if (!is_float || !partial_able.count(layer) || !budget_left()) continue;
      trial = without(best);
      trial.partial.push_back(layer);
      std::sort(trial.partial.begin(), trial.partial.end(), [&](const std::string& a, const std::string& b) {
        return std::find(order.begin(), order.end(), a) < std::find(order.begin(), order.end(), b);
      });
      if (evaluate(trial, "refine").meets) best = trial;
    }
    return true;
  };

  if (!evaluate({}, "int8").meets) {
    // Weight-only or dynamic fallback: those layers first; float ones only when they cannot meet the target.
    const bool partial_first = !partial_able.empty();
    if (!search(partial_first) && partial_first) search(false);
  }
  r.skip_tensor_list = equivalent_skip_tensors(ptq, r.candidates[r.best].skipped);
  save_outputs();
  return r;
}

}  // namespace

TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking, const data::Dataset& data,
                                 const Metric& metric, const TargetSearchOptions& options) {
  runtime::SessionOptions so;
  so.num_threads = options.num_threads;
  // Outputs after a selection are compared at the values chosen from (as analyze_ptq ranks them);
  // the saved model keeps them.
  const std::vector<std::string> selection_inputs =
      metric.needs_reference() ? quant::selection_inputs(ptq.float_graph()) : std::vector<std::string>{};
  auto evaluated = [&](const ir::Graph& g) {
    return selection_inputs.empty() ? g : quant::join_measured_values(g, selection_inputs);
  };
  runtime::Session fp32(evaluated(ptq.float_graph()), so);
  data::BatchLoader loader(data, options.batch_size);
  SQ_CHECK(loader.num_batches() > 0, ErrorKind::kInvalidData, "evaluation data set '" + data.name() + "' is empty");
  const std::map<std::string, Tensor> timing_batch =
      loader.batch(0).feeds(data::main_input_name(fp32.input_names(), data));
  EvalOptions eo;
  eo.batch_size = options.batch_size;
  eo.reference = &fp32;
  CandidateScorer scorer;
  scorer.metric = metric.name();
  scorer.higher_is_better = metric.higher_is_better();
  scorer.fp32 = [&] {
    auto m = metric.clone_empty();
    eo.progress_label = "target fp32";
    const double value = evaluate(fp32, data, *m, eo).value;
    return std::pair(value, median_latency_ms(fp32, timing_batch, options.latency_runs));
  };
  // Candidates run with slimquant's integer execution: the model users deploy.
  scorer.candidate = [&](const ir::Graph& qdq, size_t skipped) {
    runtime::Session int8 = quant::make_int8_session(evaluated(qdq), so);
    auto m = metric.clone_empty();
    eo.progress_label = "target skip " + std::to_string(skipped);
    const double value = evaluate(int8, data, *m, eo).value;
    return std::pair(value, median_latency_ms(int8, timing_batch, options.latency_runs));
  };
  return search_with(ptq, ranking, scorer, options);
}

TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking, const UserMetric& metric,
                                 const TargetSearchOptions& options) {
  SQ_CHECK(static_cast<bool>(metric.evaluate), ErrorKind::kInvalidArgument, "the user metric has no evaluate function");
  CandidateScorer scorer;
  scorer.metric = metric.name;
  scorer.higher_is_better = metric.higher_is_better;
  // No data here to time a batch with: latencies stay 0 (target_search_timing.json).
  scorer.fp32 = [&] { return std::pair(metric.evaluate(ptq.float_graph()), 0.0); };
  scorer.candidate = [&](const ir::Graph& qdq, size_t) { return std::pair(metric.evaluate(qdq), 0.0); };
  return search_with(ptq, ranking, scorer, options);
}

TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking,
                                 const std::function<double(runtime::Session&)>& eval_function, bool higher_is_better,
                                 const TargetSearchOptions& options, const std::map<std::string, Tensor>* timing_feeds) {
  SQ_CHECK(static_cast<bool>(eval_function), ErrorKind::kInvalidArgument, "eval_function is empty");
  runtime::SessionOptions so;
  so.num_threads = options.num_threads;
  runtime::Session fp32(ptq.float_graph(), so);
  CandidateScorer scorer;
  scorer.metric = "eval_function";
  scorer.higher_is_better = higher_is_better;
  auto latency = [&](runtime::Session& s) { return timing_feeds ? median_latency_ms(s, *timing_feeds, options.latency_runs) : 0.0; };
  scorer.fp32 = [&] { return std::pair(eval_function(fp32), latency(fp32)); };
  scorer.candidate = [&](const ir::Graph& qdq, size_t) {
    runtime::Session int8 = quant::make_int8_session(qdq, so);
    return std::pair(eval_function(int8), latency(int8));
  };
  return search_with(ptq, ranking, scorer, options);
}

}  // namespace slimquant::analysis
