#include "slimquant/analysis/analysis_plots.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <set>
#include <span>
#include <sstream>

#include "slimquant/analysis/hist_plot.h"
#include "slimquant/runtime/session.h"

namespace slimquant::analysis {

std::vector<std::string> write_analysis_histograms(const quant::PTQ& ptq, const SensitivityReport& report,
                                                   const CalibrationBatches& for_each_batch, size_t n,
                                                   const std::string& save_dir) {
  std::map<std::string, const quant::Layer*> by_name;
  for (const quant::Layer* l : ptq.all_layers()) by_name[l->name] = l;
  const ir::Graph& g = ptq.float_graph();
  // The n worst / best layers that have the thing plotted (attention MatMuls have no constant
  // weight), in the model's own graph (a layer inside an If branch has its values there).
  auto pick = [&](bool worst_first, bool weights) {
    std::vector<const LayerSensitivity*> out;
    for (size_t k = 0; k < report.ranked.size() && out.size() < n; ++k) {
      const auto& l = report.ranked[worst_first ? k : report.ranked.size() - 1 - k];
      const auto it = by_name.find(l.name);
      if (it == by_name.end()) continue;
      const quant::Layer& layer = *it->second;
      const bool outside = std::any_of(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& node) { return node.name == layer.name; });
      if (outside && (weights ? !layer.weight.empty() : !layer.activations.empty())) out.push_back(&l);
    }
    return out;
  };
  const auto worst_w = pick(true, true), worst_a = pick(true, false), best_w = pick(false, true), best_a = pick(false, false);

  // Activation histograms over the calibration data: one pass for the range, one to count.
  std::set<std::string> tensors;
  for (const auto* group : {&worst_a, &best_a})
    for (const auto* l : *group) tensors.insert(by_name.at(l->name)->activations[0]);
  std::map<std::string, std::pair<float, float>> range;
  std::map<std::string, HistogramAccumulator> hist;
  std::map<std::string, std::pair<size_t, size_t>> clipped;  // outside the clip range / total
  if (!tensors.empty()) {
    runtime::Session s(ptq.float_graph());
    // Each value is counted as the run produces it (observed, not requested): requested, all of
    // them stayed alive to the end of the run, 20 full-resolution activations at once at 1024x1024.
    runtime::RunOptions ro;
    ro.observe.assign(tensors.begin(), tensors.end());
    ro.outputs_needed = false;
    int pass = 0;
    ro.on_value = [&](const std::string& t, const Tensor& v) {
      if (!tensors.count(t)) return;
      std::span<const float> x(v.data<float>(), static_cast<size_t>(v.numel()));
      if (pass == 0) {
        auto [mn, mx] = std::minmax_element(x.begin(), x.end());
        auto& r = range.try_emplace(t, *mn, *mx).first->second;
        r.first = std::min(r.first, *mn), r.second = std::max(r.second, *mx);
      } else {
        hist.at(t).add(x);
        const quant::ClipRange cr = ptq.activation_observer(t).range();
        auto& c = clipped[t];
        for (float f : x) c.first += f < cr.lo || f > cr.hi;
        c.second += x.size();
      }
    };
    for (; pass < 2; ++pass) {
      for_each_batch([&](const std::map<std::string, Tensor>& feeds) { s.run(feeds, ro); });
      if (pass == 0)
        for (const auto& t : tensors) {
          auto r = range.at(t);
          if (r.second <= r.first) r.second = r.first + 1e-6f;
          hist.emplace(t, HistogramAccumulator(r.first, r.second, 256));
        }
    }
  }
  auto fmt = [](double v) {
    std::ostringstream os;
    os << std::setprecision(6) << v;
    return os.str();
  };
  auto weight_page = [&](const LayerSensitivity& ls) -> std::optional<HistogramPlot> {
    const quant::Layer& l = *by_name.at(ls.name);
    if (l.weight.empty()) return std::nullopt;
    const Tensor& w = *ptq.float_graph().initializer(l.weight);
    std::span<const float> x(w.data<float>(), static_cast<size_t>(w.numel()));
    auto plot = make_histogram(x, 256, l.name + " (" + l.op_type + ")",
                                         "weight " + l.weight + " " + shape_str(w.shape()) + ", FP32");
    QuantParam p = ptq.weight_params(l);
    auto [mn, mx] = std::minmax_element(p.scale.begin(), p.scale.end());
    plot.thresholds.push_back({"clip - (widest channel)", -127.0 * *mx});
    plot.thresholds.push_back({"clip + (widest channel)", 127.0 * *mx});
    if (p.scale.size() > 1 && *mn != *mx) {
      plot.thresholds.push_back({"clip - (narrowest channel)", -127.0 * *mn});
      plot.thresholds.push_back({"clip + (narrowest channel)", 127.0 * *mn});
    }
    plot.facts = {{"rank", std::to_string(&ls - report.ranked.data() + 1) + " of " + std::to_string(report.ranked.size())},
                  {report.metric + " (only this layer INT8)", fmt(ls.metric)},
                  {"loss vs FP32", fmt(ls.delta)},
                  {"weight observer", l.weight_observer},
                  {"channels", std::to_string(p.scale.size())},
                  {"scale min / max", fmt(*mn) + " / " + fmt(*mx)}};
    return plot;
  };
  auto act_page = [&](const LayerSensitivity& ls) -> std::optional<HistogramPlot> {
    const quant::Layer& l = *by_name.at(ls.name);
    if (l.activations.empty()) return std::nullopt;
    const std::string& t = l.activations[0];
    auto plot = hist.at(t).plot(l.name + " (" + l.op_type + ")", "input activation " + t + " (calibration data)");
    const quant::ClipRange cr = ptq.activation_observer(t).range();
    const QuantParam p = ptq.activation_params(t);
    plot.thresholds = {{"clip -", cr.lo}, {"clip +", cr.hi}};
    const auto& c = clipped.at(t);
    plot.facts = {{"rank", std::to_string(&ls - report.ranked.data() + 1) + " of " + std::to_string(report.ranked.size())},
                  {report.metric + " (only this layer INT8)", fmt(ls.metric)},
                  {"loss vs FP32", fmt(ls.delta)},
                  {"data min / max", fmt(range.at(t).first) + " / " + fmt(range.at(t).second)},
                  {"clip range", fmt(cr.lo) + " .. " + fmt(cr.hi)},
                  {"scale / zero point", fmt(p.scale.at(0)) + " / " + std::to_string(p.zero_point.at(0))},
                  {"values clipped", fmt(c.second ? 100.0 * static_cast<double>(c.first) / c.second : 0) + " %"}};
    if (l.activations.size() > 1) plot.facts.push_back({"note", "first of " + std::to_string(l.activations.size()) + " activation inputs"});
    return plot;
  };
  std::vector<std::string> written;
  auto write = [&](const std::string& file, const std::vector<const LayerSensitivity*>& group, bool weights) {
    std::vector<HistogramPlot> pages;
    for (const auto* l : group)
      if (auto p = weights ? weight_page(*l) : act_page(*l)) pages.push_back(std::move(*p));
    const std::string path = (std::filesystem::path(save_dir) / file).string();
    write_histogram_pdf(path, pages);
    written.push_back(path);
  };
  write("best_weight_hist_result.pdf", best_w, true);
  write("best_act_hist_result.pdf", best_a, false);
  write("worst_weight_hist_result.pdf", worst_w, true);
  write("worst_act_hist_result.pdf", worst_a, false);
  return written;
}


}  // namespace slimquant::analysis
