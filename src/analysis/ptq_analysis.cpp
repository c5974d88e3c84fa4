#include "slimquant/analysis/ptq_analysis.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "slimquant/analysis/checkpoint.h"
#include "slimquant/core/distributed.h"
#include "analysis/layer_stages.h"
#include "analysis/model_sweep.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::analysis {

namespace {

bool tensors_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.raw() == b.raw()) return true;
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool attrs_equal(const ir::AttributeValue& a, const ir::AttributeValue& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Tensor>) return tensors_equal(x, std::get<Tensor>(b));
        else return x == std::get<T>(b);
      },
      a);
}

bool nodes_equal(const ir::Node& a, const ir::Node& b) {
  if (a.op_type != b.op_type || a.domain != b.domain || a.inputs != b.inputs || a.outputs != b.outputs) return false;
  if (a.attrs.size() != b.attrs.size()) return false;
  for (const auto& [k, v] : a.attrs) {
    auto it = b.attrs.find(k);
    if (it == b.attrs.end() || !attrs_equal(v, it->second)) return false;
  }
  return true;
}

void ensure_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SQ_CHECK(std::filesystem::is_directory(dir), ErrorKind::kIo,
           "cannot create save_dir '" + dir + "'" + (ec ? ": " + ec.message() : std::string()));
}

// Fault injection for the scale-out test (docs/scale-out.md): SLIMQUANT_FAULT_KILL_RANK_AFTER_BATCH=R:N
// makes rank R kill itself once the checkpoint holds N batches, so the test kills a rank midway
// deterministically instead of racing the analysis with an external kill.
void kill_rank_if_asked(size_t batches_checkpointed) {
  static const std::pair<long, long> asked = [] {
    const char* v = std::getenv("SLIMQUANT_FAULT_KILL_RANK_AFTER_BATCH");
    long rank = -1, batch = -1;
    if (v == nullptr || std::sscanf(v, "%ld:%ld", &rank, &batch) != 2) return std::pair<long, long>(-1, -1);
    return std::pair<long, long>(rank, batch);
  }();
  if (asked.first < 0 || static_cast<long>(batches_checkpointed) != asked.second) return;
  distributed::barrier();  // rank 0 has written the checkpoint before any rank passes
  if (distributed::rank() == asked.first) std::raise(SIGKILL);
}

// The nodes the streamed sweep's base run computes as early as it can: those computing values some
// layer's model reads `long_wait` or more nodes (in the base's order) after the rest of what it
// reads, with what they need that is not computed by then, when that is a few nodes (fewer than
// long_wait; waits are taken from the last one back). A U-Net's side outputs, placed after the
// last decoder by the exporter, held every decoder layer's model back to the end of the base run;
// a long branch that only meets the other at the end stays where it is (moving it would hold the
// other branch's layers back instead).
std::vector<bool> late_feed_producers(const ir::Graph& base, const std::vector<const std::vector<std::string>*>& feeds,
                                      int long_wait) {
  std::unordered_map<std::string, int> step;
  for (size_t i = 0; i < base.nodes.size(); ++i)
    for (const auto& o : base.nodes[i].outputs) step[o] = static_cast<int>(i);
  auto step_of = [&](const std::string& v) {
    const auto it = step.find(v);
    return it == step.end() ? -1 : it->second;
  };
  std::vector<bool> early(base.nodes.size(), false);
  for (const std::vector<std::string>* list : feeds) {
    std::vector<int> at;
    for (const auto& f : *list) at.push_back(step_of(f));
    std::sort(at.begin(), at.end());
    // From the last wait back: what the values after a long wait need beyond what exists by then.
    for (size_t k = at.size(); k-- > 1;) {
      if (at[k] - at[k - 1] < long_wait) continue;
      const int ready = at[k - 1];
      std::set<int> needed;
      std::vector<int> pending(at.begin() + static_cast<std::ptrdiff_t>(k), at.end());
      while (!pending.empty() && static_cast<int>(needed.size()) < long_wait) {
        const int i = pending.back();
        pending.pop_back();
        if (i <= ready || !needed.insert(i).second) continue;
        for (const auto& in : base.nodes[static_cast<size_t>(i)].inputs)
          if (!in.empty()) pending.push_back(step_of(in));
      }
      if (static_cast<int>(needed.size()) >= long_wait) break;
      for (int i : needed) early[static_cast<size_t>(i)] = true;
    }
  }
  return early;
}

std::string checkpoint_path(const PtqAnalysisOptions& o) {
  return o.checkpoint_name.empty() ? std::string() : (std::filesystem::path(o.save_dir) / o.checkpoint_name).string();
}

}  // namespace

void prepare_for_sweep(ir::Graph& g) {
  runtime::FoldOptions fold;
  // A constant weight's DequantizeLinear computes the same floats every batch: fold it once, which
  // also lets the convolution prepack its weights.
  fold.keep_dequantize_linear = false;
  runtime::optimize_graph(g, fold);
  // The base run shows the layers' models their values as it computes them: a size computed from
  // the input only just before its Resize at the end would hold every waiting layer back.
  ir::hoist_shape_computations(g);
}

std::vector<std::string> boundary_values(const ir::Graph& base, const ir::Graph& v) {
  std::unordered_map<std::string, const ir::Node*> base_producer;
  for (const auto& n : base.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) base_producer[o] = &n;
  std::unordered_set<std::string> same, constant, base_inputs;
  for (const auto& in : base.inputs) base_inputs.insert(in.name);
  for (const auto& in : v.inputs)
    if (base_inputs.count(in.name)) same.insert(in.name);
  for (const auto& [name, t] : v.initializers) constant.insert(name);
  auto same_initializer = [&](const std::string& name) {
    const Tensor* b = base.initializer(name);
    return b && tensors_equal(*b, *v.initializer(name));
  };
  std::vector<std::string> boundary;
  std::unordered_set<std::string> in_boundary;
  auto add = [&](const std::string& name) {
    if (same.count(name) && !constant.count(name) && in_boundary.insert(name).second) boundary.push_back(name);
  };
  for (const auto& n : v.nodes) {
    bool all_const = !n.inputs.empty();
    for (const auto& in : n.inputs)
      if (!in.empty() && !constant.count(in)) all_const = false;
    if (all_const)
      for (const auto& o : n.outputs) constant.insert(o);
    bool is_same = false;
    if (!n.outputs.empty()) {
      auto it = base_producer.find(n.outputs[0]);
      is_same = it != base_producer.end() && nodes_equal(*it->second, n);
    }
    for (const auto& in : n.inputs) {
      if (!is_same || in.empty()) break;
      is_same = v.is_initializer(in) ? same_initializer(in) : same.count(in) != 0;
    }
    if (is_same) {
      for (const auto& o : n.outputs) same.insert(o);
    } else {
      for (const auto& in : n.inputs)
        if (!in.empty()) add(in);
    }
  }
  for (const auto& o : v.outputs) add(o.name);
  return boundary;
}

SweepResult sweep_layers(const ir::Graph& base, const std::vector<LayerVariant>& variants, const data::Dataset& data,
                         const Metric& metric, const ir::Graph* reference, const SweepOptions& options) {
  SQ_CHECK(!metric.needs_labels() || data.has_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs labels, but data set '" + data.name() +
               "' has none (use a label-free metric: cosine, sqnr, top1_agreement)");
  SQ_CHECK(!metric.needs_text_labels() || data.has_text_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs text labels, but data set '" + data.name() +
               "' has none (npy:DIR takes them from labels.txt, one line per sample)");
  SQ_CHECK(data.size() > 0, ErrorKind::kInvalidData, "evaluation data set '" + data.name() + "' is empty");
  SQ_CHECK(options.batch_size > 0, ErrorKind::kInvalidArgument, "batch size must be at least 1");
  runtime::SessionOptions so;
  so.num_threads = options.num_threads;
  ir::Graph b = base;
  prepare_for_sweep(b);
  // One buffer pool for the base run and every layer's run. A layer's model runs while the base run
  // is paused between two of its nodes (the streamed batches below), and a pool hands out only the
  // buffers nobody holds: the layer's run takes what the base run has let go, and the base run then
  // takes the layer's buffers back. Two pools held both runs' peaks at once.
  runtime::SessionOptions shared_pool_options = so;
  shared_pool_options.buffer_pool = runtime::make_shared_buffer_pool();
  auto base_holder = std::make_unique<runtime::Session>(std::move(b), shared_pool_options);
  const std::string input = data::main_input_name(base_holder->input_names(), data);
  const std::vector<std::string> graph_inputs = base_holder->input_names();
  const std::string output = base_holder->outputs().at(0).name;

  struct Runner {
    size_t variant;  // index into variants
    std::unique_ptr<runtime::Session> session;
    std::vector<std::string> feeds;
    std::unordered_set<std::string> feed_set;
    std::string output;
    std::unique_ptr<LayerStages> stages;  // the streamed batches run the model in stages
  };
  // Distributed: the variants are dealt to the ranks round-robin (neighbouring layers cost about
  // the same, so every rank gets a similar mix of long and short suffixes); each rank runs the
  // base graph's prefix itself and only its own variants. Dealing starts at rank 1: rank 0 also
  // runs the whole base graph for the base metric, so it gets the last (cheapest) share.
  const size_t ranks = static_cast<size_t>(distributed::size()), my_rank = static_cast<size_t>(distributed::rank());
  std::vector<Runner> runners;
  // The base graph's own output: for the base metric (rank 0 scores it; the others receive the
  // result) and as the reference of fidelity metrics in the PTQ analysis. Without it a rank's base
  // run stops at the deepest value its layers read.
  const bool own_reference = metric.needs_reference() && !reference;
  const bool score_base = my_rank == 0;
  std::set<std::string> wanted_set;
  if (score_base || own_reference) wanted_set.insert(output);
  // The per-layer sessions run one after another: one set of buffers between them, not one each
  // (measured: 6.1 GB peak for MobileNetV2 at 224x224, batch 16, without).
  const runtime::SessionOptions& runner_options = shared_pool_options;
  for (size_t vi = (my_rank + ranks - 1) % ranks; vi < variants.size(); vi += ranks) {
    ir::Graph g = variants[vi].graph;
    prepare_for_sweep(g);
    Runner r;
    r.variant = vi;
    r.session = std::make_unique<runtime::Session>(std::move(g), runner_options);
    r.feeds = boundary_values(base_holder->graph(), r.session->graph());
    r.feed_set.insert(r.feeds.begin(), r.feeds.end());
    r.output = r.session->outputs().at(0).name;
    r.stages = std::make_unique<LayerStages>(r.session->graph(), r.feeds, r.output);
    for (const auto& f : r.feeds)
      if (std::find(graph_inputs.begin(), graph_inputs.end(), f) == graph_inputs.end()) wanted_set.insert(f);
    runners.push_back(std::move(r));
  }
  // A layer's model waits (holding what it read, or what its early stages computed) for its last
  // value: one the base run computes long after the others, it computes as early as it can.
  const int kLongWait = std::max<int>(16, static_cast<int>(base_holder->graph().nodes.size() / 16));
  {
    std::vector<const std::vector<std::string>*> feed_lists;
    for (const auto& r : runners) feed_lists.push_back(&r.feeds);
    const std::vector<bool> early = late_feed_producers(base_holder->graph(), feed_lists, kLongWait);
    ir::Graph reordered = base_holder->graph();
    if (std::find(early.begin(), early.end(), true) != early.end() && ir::schedule_early(reordered, early) > 0)
      base_holder = std::make_unique<runtime::Session>(std::move(reordered), shared_pool_options);
  }
  runtime::Session& base_session = *base_holder;
  std::vector<std::string> wanted(wanted_set.begin(), wanted_set.end());
  // For the streamed batches (below): which runners read each value, and the values to observe.
  std::map<std::string, std::vector<size_t>> readers;  // value -> indices into runners
  for (size_t ri = 0; ri < runners.size(); ++ri)
    for (const auto& f : runners[ri].feeds) readers[f].push_back(ri);
  std::vector<std::string> observed;
  for (const auto& [name, users] : readers)
    if (std::find(graph_inputs.begin(), graph_inputs.end(), name) == graph_inputs.end()) observed.push_back(name);
  // When the streamed base run shows a value: its producer's place in the base graph's order (the
  // order the run follows), -1 for a graph input.
  std::unordered_map<std::string, int> producer_step;
  for (size_t i = 0; i < base_session.graph().nodes.size(); ++i)
    for (const auto& o : base_session.graph().nodes[i].outputs) producer_step[o] = static_cast<int>(i);
  auto arrival_step = [&](const std::string& v) {
    const auto it = producer_step.find(v);
    return it == producer_step.end() ? -1 : it->second;
  };
  std::unique_ptr<runtime::Session> ref_session;
  if (reference && metric.needs_reference()) ref_session = std::make_unique<runtime::Session>(*reference, so);

  auto base_metric = metric.clone_empty();
  std::vector<std::unique_ptr<Metric>> metrics;
  for (size_t i = 0; i < variants.size(); ++i) metrics.push_back(metric.clone_empty());

  // A model that declares a fixed batch B is fed batches of at most B: a larger batch would run in
  // parts whose boundary values are joined for the layers' models, and a value with no batch axis
  // (a detector's anchor grid, computed per image) joins as a stack those models cannot split.
  size_t batch_size = options.batch_size;
  if (const ir::Dim batch = runtime::batch_dimension(base.inputs); batch.known() && batch.value > 0)
    batch_size = std::min(batch_size, static_cast<size_t>(batch.value));
  data::BatchLoader loader(data, batch_size);
  const size_t total = loader.num_batches();
  size_t start = 0;
  std::optional<Checkpoint> checkpoint;
  if (!options.checkpoint_path.empty()) {
    nlohmann::json fp = options.fingerprint.is_object() ? options.fingerprint : nlohmann::json::object();
    fp["metric"] = metric.name();
    fp["data"] = data.name();
    fp["samples"] = data.size();
    fp["batch_size"] = batch_size;
    nlohmann::json names = nlohmann::json::array();
    for (const auto& v : variants) names.push_back(v.layer);
    fp["layers_hash"] = hash_hex(names.dump());
    checkpoint.emplace(options.checkpoint_path, fp);
    // Without resume the checkpoint is simply overwritten; with it, a foreign one is refused.
    // Distributed: rank 0 reads it and hands it to the others (any number of ranks resumes it:
    // it holds every layer's state whoever computed it).
    nlohmann::json state = options.resume && distributed::is_root() ? checkpoint->load() : nlohmann::json();
    state = nlohmann::json::parse(distributed::broadcast(state.dump()));
    if (!state.is_null()) {
      start = state.at("batches_done").get<size_t>();
      SQ_CHECK(start <= total && state.at("layers").size() == variants.size(), ErrorKind::kInvalidData,
               "checkpoint '" + options.checkpoint_path + "' is inconsistent; delete it to start over");
      base_metric->load_state(state.at("base"));
      for (size_t i = 0; i < variants.size(); ++i) metrics[i]->load_state(state.at("layers")[i]);
    }
  }

  SweepResult result;
  result.batches = total;
  result.batches_resumed = start;
  // Counted in model runs (the base model's and each layer's, per batch), not batches: at high
  // resolution one batch of a few images takes minutes.
  const size_t runs_per_batch = runners.size() + 1;
  Progress progress(options.progress_label, (total - start) * runs_per_batch, "model runs");
  // A rank with no layer (more ranks than layers) only takes part in the collectives.
  const bool idle = runners.empty() && !score_base;
  for (size_t bi = start; bi < total; ++bi) {
    progress.set_note(std::to_string(variants.size()) + " layers, batch " + std::to_string(bi + 1) + "/" +
                      std::to_string(total));
    if (!idle) {
      data::Batch batch = loader.batch(bi);
      const std::map<std::string, Tensor> feeds = batch.feeds(input);
      // `earlier`: what the runner's earlier stages computed for this one; `let_go`: feeds they
      // consumed (streamed batches only).
      auto run_variant = [&](Runner& r, const std::map<std::string, Tensor>& values, const Tensor& ref,
                             const std::map<std::string, Tensor>& earlier = {},
                             const std::set<std::string>& let_go = {}) {
        std::map<std::string, Tensor> runner_feeds = earlier;
        for (const auto& f : r.feeds)
          if (!let_go.count(f)) runner_feeds[f] = values.at(f);
        runtime::RunOptions vo;
        vo.outputs = {r.output};
        Tensor out = r.session->run(runner_feeds, vo).at(r.output);
        metrics[r.variant]->update(out, {batch.labels, batch.texts}, ref);
        // After the last batch a layer's model is done: its plans (primitives, packed weights)
        // go, rather than every layer's staying until the sweep ends.
        if (bi + 1 == total) r.session->release_plans();
        progress.advance();
      };
      // The reference first: the reference model's output, or the base model's own from a run of
      // its own (one base run more per batch, about 1 / layers of the sweep), which also teaches the
      // session a batch size it has not run yet. That run observes the same values as the streamed
      // one below without a hook: the same plan, so the same output to the bit (a plan that lets the
      // boundary values fuse away rounds differently, and a QDQ model's rounding then flips).
      Tensor ref, base_out;
      if (metric.needs_reference() && ref_session) {
        ref = ref_session->run(batch.feeds(data::main_input_name(ref_session->input_names(), data)))
                  .at(ref_session->outputs().at(0).name);
      }
      if (own_reference || !base_session.runs_whole(feeds)) {
        runtime::RunOptions ro;
        ro.outputs = {output};
        ro.observe = observed;
        ro.observed_plain = true;
        base_out = base_session.run(feeds, ro).at(output);
        if (own_reference) ref = base_out;
      }
      if (base_session.runs_whole(feeds)) {
        // Streamed: each layer's model runs as soon as the base run has produced the values it reads
        // (inside the base run's value hook), and those values are let go once their last reader
        // has run. Holding every layer's boundary values until the base run ends took 7.26 GB for
        // one 1024x1024 image of a 119-convolution U-Net, four times one FP32 inference.
        std::map<std::string, Tensor> held;
        std::vector<size_t> missing(runners.size());
        for (size_t ri = 0; ri < runners.size(); ++ri) missing[ri] = runners[ri].feeds.size();
        std::map<std::string, size_t> readers_left;
        for (const auto& [name, users] : readers) readers_left[name] = users.size();
        std::vector<bool> done(runners.size(), false);
        // Per runner: values its earlier stages computed for its later ones, and the feeds no stage
        // of it reads any more (their claim on `held` is gone).
        std::vector<std::map<std::string, Tensor>> staged(runners.size());
        std::vector<std::set<std::string>> let_go(runners.size());
        for (auto& r : runners) r.stages->reset();
        auto at_hand = [&](size_t ri) {
          return [&, ri](const std::string& v) {
            return staged[ri].count(v) != 0 ||
                   (runners[ri].feed_set.count(v) && !let_go[ri].count(v) && held.count(v));
          };
        };
        // At each switch between the paused base run and the layers' runs: kernel scratch and idle
        // pool buffers stay at their largest, so one side's would sit under the other's values.
        auto give_back_idle_memory = [&] {
          runtime::release_scratch_buffers();
          runtime::release_idle_buffers(*shared_pool_options.buffer_pool);
        };
        auto let_go_of = [&](size_t ri, const std::string& f) {
          if (let_go[ri].insert(f).second && --readers_left[f] == 0) held.erase(f);
        };
        auto run_ready = [&](const std::vector<size_t>& ready) {
          if (ready.empty()) return;
          give_back_idle_memory();
          for (size_t ri : ready) {
            run_variant(runners[ri], held, ref, staged[ri], let_go[ri]);
            done[ri] = true;
            staged[ri].clear();
            for (const auto& f : runners[ri].feeds) let_go_of(ri, f);
          }
          give_back_idle_memory();
        };
        // A runner whose next value comes long after the one that just arrived (the base run's
        // nodes in between: kLongWait or more) runs what it can already, when that lets go of a
        // value it holds (see LayerStages: a decoder layer's model then keeps its side map, not its
        // full-resolution inputs, until the base run's last side output). A short wait is not worth
        // a stage's plan.
        auto arrival_gap = [&](size_t ri, const std::string& arrived) {
          int next = std::numeric_limits<int>::max();
          for (const auto& f : runners[ri].feeds)
            if (!held.count(f) && !let_go[ri].count(f)) next = std::min(next, arrival_step(f));
          return next == std::numeric_limits<int>::max() ? 0 : next - arrival_step(arrived);
        };
        auto run_early_stage = [&](size_t ri, const std::string& name) {
          Runner& r = runners[ri];
          if (arrival_gap(ri, name) < kLongWait) return;
          const auto available = at_hand(ri);
          const std::optional<LayerStages::Stage> stage = r.stages->next(available);
          if (!stage || stage->final || stage->released.empty()) return;
          const ir::Graph& g = r.session->graph();
          for (const auto& o : stage->outputs)
            if (g.sequence_values.count(o) || g.optional_values.count(o)) return;
          std::map<std::string, Tensor> stage_feeds;
          for (const auto& v : stage->inputs) stage_feeds[v] = staged[ri].count(v) ? staged[ri].at(v) : held.at(v);
          runtime::RunOptions so_stage;
          so_stage.outputs = stage->outputs;
          give_back_idle_memory();
          std::map<std::string, Tensor> out = r.session->run(stage_feeds, so_stage);
          stage_feeds.clear();
          r.stages->commit(*stage);
          for (auto& [computed, value] : out) staged[ri][computed] = std::move(value);
          for (const auto& v : stage->released)
            if (!staged[ri].erase(v)) let_go_of(ri, v);
          ++result.early_stages;
          give_back_idle_memory();
        };
        auto arrive = [&](const std::string& name, const Tensor& value) {
          const auto it = readers.find(name);
          if (it == readers.end() || held.count(name)) return;
          // The buffer stays the value's while a handle is held: pools reuse only buffers nobody
          // else holds, and kernels overwrite an input in place only when nobody else holds it.
          held[name] = value;
          std::vector<size_t> ready;
          for (size_t ri : it->second)
            if (--missing[ri] == 0) ready.push_back(ri);
            else run_early_stage(ri, name);
          run_ready(ready);
        };
        runtime::RunOptions ro;
        ro.outputs = {output};
        ro.observe = observed;
        // The held values are the run's own buffers, not plain copies beside blocked originals
        // (those copies were 25% of the peak on a U-Net whose skip values wait for many layers).
        ro.observed_plain = true;
        ro.on_value = arrive;
        std::map<std::string, Tensor> result = base_session.run(feeds, ro);
        if (!base_out.defined()) base_out = result.at(output);
        // A layer whose values the hook did not show (a sequence): from a plain run of the base.
        std::vector<size_t> left;
        std::set<std::string> left_feeds;
        for (size_t ri = 0; ri < runners.size(); ++ri)
          if (!done[ri]) {
            left.push_back(ri);
            for (const auto& f : runners[ri].feeds)
              if (!held.count(f) && !let_go[ri].count(f)) left_feeds.insert(f);
          }
        if (!left.empty()) {
          runtime::RunOptions lo;
          for (const auto& f : left_feeds)
            if (feeds.count(f)) held[f] = feeds.at(f);
            else lo.outputs.push_back(f);
          if (!lo.outputs.empty())
            for (auto& [name, value] : base_session.run(feeds, lo)) held[name] = std::move(value);
          for (size_t ri : left) run_variant(runners[ri], held, ref, staged[ri], let_go[ri]);
        }
        if (score_base) base_metric->update(base_out, {batch.labels, batch.texts}, ref);
        progress.advance();
      } else {
        // A batch the base model runs in parts: the hook would see each part's values apart, so the
        // layers' boundary values are taken whole from the run's outputs.
        runtime::RunOptions ro;
        ro.outputs = wanted;
        std::map<std::string, Tensor> values =
            wanted.empty() ? std::map<std::string, Tensor>() : base_session.run(feeds, ro);
        values.insert(feeds.begin(), feeds.end());
        if (!base_out.defined()) base_out = values.at(output);
        if (score_base) base_metric->update(base_out, {batch.labels, batch.texts}, ref);
        progress.advance();
        for (Runner& r : runners) run_variant(r, values, ref);
      }
    } else {
      progress.advance(runs_per_batch);
    }
    // Rank 0 collects the other ranks' layer states: after every batch when checkpointing (the
    // checkpoint always holds every layer at the same batch), else once at the end.
    if (ranks > 1 && (checkpoint || bi + 1 == total)) {
      nlohmann::json mine = nlohmann::json::object();
      for (const Runner& r : runners) mine[std::to_string(r.variant)] = metrics[r.variant]->state();
      const std::vector<std::string> all = distributed::gather(mine.dump());
      for (size_t from = 1; from < all.size(); ++from) {
        const nlohmann::json theirs = nlohmann::json::parse(all[from]);
        for (const auto& [index, layer_state] : theirs.items()) metrics.at(std::stoul(index))->load_state(layer_state);
      }
    }
    if (checkpoint && distributed::is_root()) {
      nlohmann::json layers = nlohmann::json::array();
      for (const auto& m : metrics) layers.push_back(m->state());
      checkpoint->save({{"batches_done", bi + 1}, {"batches_total", total}, {"base", base_metric->state()},
                        {"layers", layers}});
    }
    if (checkpoint && ranks > 1) kill_rank_if_asked(bi + 1);
  }
  progress.finish();
  if (ranks > 1) {  // every rank returns the whole result (a resumed, complete checkpoint included)
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& m : metrics) layers.push_back(m->state());
    const nlohmann::json all = nlohmann::json::parse(
        distributed::broadcast(nlohmann::json{{"base", base_metric->state()}, {"layers", layers}}.dump()));
    base_metric->load_state(all.at("base"));
    for (size_t i = 0; i < metrics.size(); ++i) metrics[i]->load_state(all.at("layers")[i]);
  }
  result.seconds = progress.elapsed_seconds();
  result.base_metric = base_metric->value();
  result.samples = base_metric->samples();
  for (const auto& m : metrics) result.layer_metric.push_back(m->value());
  return result;
}

SensitivityReport rank_layers(const std::string& kind, const std::vector<LayerVariant>& variants, const SweepResult& sweep,
                              const Metric& metric, double baseline) {
  SensitivityReport r;
  r.kind = kind;
  r.metric = metric.name();
  r.higher_is_better = metric.higher_is_better();
  r.baseline = baseline;
  r.samples = sweep.samples;
  r.seconds = sweep.seconds;
  r.batches_resumed = sweep.batches_resumed;
  for (size_t i = 0; i < variants.size(); ++i) {
    LayerSensitivity l;
    l.name = variants[i].layer;
    l.op_type = variants[i].op_type;
    l.metric = sweep.layer_metric.at(i);
    const double better = r.higher_is_better ? l.metric - baseline : baseline - l.metric;
    // PTQ: quantizing the layer made it worse by -better; QAT: removing its quantization gained `better`.
    l.delta = (kind == "qat" ? better : -better) + 0.0;  // + 0.0: no "-0" in reports
    if (std::isnan(l.delta)) l.delta = std::numeric_limits<double>::infinity();  // NaN outputs: most damaging
    l.index = i;
    r.ranked.push_back(std::move(l));
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(),
                   [](const LayerSensitivity& a, const LayerSensitivity& b) { return a.delta > b.delta; });
  return r;
}

nlohmann::json SensitivityReport::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& l = ranked[i];
    layers.push_back({{"rank", i + 1}, {"name", l.name}, {"op_type", l.op_type}, {"metric", l.metric},
                      {kind == "qat" ? "gain" : "loss", l.delta}, {"index", l.index}});
  }
  nlohmann::json j{{"kind", kind},
                   {"metric", metric},
                   {"higher_is_better", higher_is_better},
                   {kind == "qat" ? "qat_metric" : "fp32_metric", baseline},
                   {"samples", samples},
                   {"batches_resumed", batches_resumed},
                   {"layers", layers}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

nlohmann::json SensitivityReport::timing_json() const {
  nlohmann::json j{{"seconds", seconds}};
  for (const auto& [k, v] : timings.items()) j[k] = v;
  return j;
}

std::string SensitivityReport::to_text() const {
  std::ostringstream os;
  os << std::setprecision(6) << std::fixed;
  // The header names the metric: a ranking file read on its own says what its numbers are.
  const bool qat = kind == "qat";
  os << "# " << kind << " analysis, metric " << metric << " (" << (higher_is_better ? "higher" : "lower")
     << " is better), " << (qat ? "qat " : "fp32 ") << baseline << "; columns: name, op_type, metric with only this layer "
     << (qat ? "de-quantized" : "quantized") << '\n';
  for (const auto& l : ranked) os << l.name << '\t' << l.op_type << '\t' << l.metric << '\n';
  return os.str();
}

void write_report(const SensitivityReport& report, const std::string& save_dir) {
  if (!distributed::is_root()) return;  // one report per job
  ensure_dir(save_dir);
  write_file_atomic((std::filesystem::path(save_dir) / "analysis.txt").string(), report.to_text());
  write_file_atomic((std::filesystem::path(save_dir) / "analysis.json").string(), report.to_json().dump(2) + "\n");
  write_file_atomic((std::filesystem::path(save_dir) / "analysis_timing.json").string(),
                    report.timing_json().dump(2) + "\n");
}


// One model per layer, those inside If branches one by one (a branch's model differs from FP32 at
// its If, which the sweep then runs from its inputs).
std::vector<LayerVariant> ptq_variants(const quant::PTQ& ptq) {
  std::vector<LayerVariant> out;
  for (const quant::Layer* layer : ptq.all_layers()) {
    ir::Graph g = ptq.convert(std::set<std::string>{layer->name});
    prepare_for_sweep(g);
    out.push_back({layer->name, layer->op_type, std::move(g)});
  }
  return out;
}

nlohmann::json ptq_fingerprint(const quant::PTQ& ptq) {
  std::ostringstream scales;
  scales << std::setprecision(9);
  for (const auto& t : ptq.observed_tensors()) {
    if (ptq.activation_observer(t).observed_count() == 0) continue;
    QuantParam p = ptq.activation_params(t);
    scales << t << ':' << static_cast<int>(p.dtype);
    for (size_t i = 0; i < p.scale.size(); ++i) scales << ',' << p.scale[i] << '/' << p.zero_point[i];
    scales << ';';
  }
  return {{"kind", "ptq"},
          {"model", hash_hex(ir::serialize_onnx(ptq.float_graph()))},
          {"config", ptq.config().fingerprint()},
          {"scales", hash_hex(scales.str())}};
}

SensitivityReport analyze_ptq(const quant::PTQ& ptq, const data::Dataset& data, const Metric& metric,
                              const PtqAnalysisOptions& options) {
  ensure_dir(options.save_dir);
  std::vector<LayerVariant> variants = ptq_variants(ptq);
  SQ_CHECK(!variants.empty(), ErrorKind::kInvalidArgument,
           "the model has no quantizable layer (quantizable_op_type: check the op types)");
  // A detector's outputs follow its selection (NMS, top-k): FP32 and each layer's model keep other
  // boxes, and other numbers of them. A metric against FP32 compares the values chosen from (and
  // the logits of an output of ArgMax classes).
  ir::Graph base = ptq.float_graph();
  const std::vector<std::string> selection_inputs =
      metric.needs_reference() ? quant::selection_inputs(base) : std::vector<std::string>{};
  if (!selection_inputs.empty()) {
    base = quant::join_measured_values(std::move(base), selection_inputs);
    for (auto& v : variants) v.graph = quant::join_measured_values(std::move(v.graph), selection_inputs);
  }
  SweepOptions so;
  so.batch_size = options.batch_size;
  so.checkpoint_path = checkpoint_path(options);
  so.fingerprint = ptq_fingerprint(ptq);
  for (const auto& [k, v] : options.fingerprint_extra.items()) so.fingerprint[k] = v;
  so.num_threads = options.num_threads;
  so.progress_label = "analyze";
  SweepResult sweep = sweep_layers(base, variants, data, metric, nullptr, so);
  SensitivityReport report = rank_layers("ptq", variants, sweep, metric, sweep.base_metric);
  report.extra["layers_total"] = variants.size();
  if (!selection_inputs.empty()) report.extra["outputs_measured_at"] = selection_inputs;
  report.extra["data"] = data.name();
  report.extra["batch_size"] = options.batch_size;
  report.extra["quant_config"] = ptq.config().fingerprint();
  write_report(report, options.save_dir);
  return report;
}

namespace {

// A finished checkpoint of a user evaluation would otherwise be reused without a single call: the
// fingerprint can name a command, not what an opaque eval_function computes, so another function
// (or data) into the same save_dir silently returned the old ranking. One model is evaluated again
// (the base, else the first layer's) and must give the stored metric. An unfinished checkpoint
// resumes without this check: "fix the eval_function and rerun" continues where it stopped.
void check_same_evaluation(const std::function<ir::Graph()>& build_base, const std::vector<ModelSweepLayer>& layers,
                           const std::function<double(const ir::Graph& model, bool is_base)>& evaluate,
                           const nlohmann::json& state, const SweepOptions& options) {
  const bool qat = options.progress_label == "analyze-qat";
  std::string which;
  double stored = 0, now = 0;
  if (build_base) {
    which = qat ? "the quantized model" : "the FP32 model";
    stored = state["base"].get<double>();
    now = evaluate(build_base(), true);
  } else {
    which = "layer '" + layers.front().name + "'";
    stored = state["done"][layers.front().name].get<double>();
    now = evaluate(layers.front().build(), false);
  }
  if (std::abs(now - stored) <= 1e-6 * std::max({1.0, std::abs(now), std::abs(stored)})) return;
  const std::filesystem::path path(options.checkpoint_path);
  std::ostringstream os;
  os << std::setprecision(10) << "save_dir '" << path.parent_path().string()
     << "' holds a finished analysis made with another evaluation: its checkpoint '" << path.string() << "' has "
     << stored << " for " << which << ", the evaluation now gives " << now
     << ". Its results are not reused: delete '" << path.string()
     << "' (or the save_dir) to start over, or choose another save_dir";
  fail(ErrorKind::kInvalidArgument, os.str());
}

}  // namespace

SweepResult sweep_models(const std::function<ir::Graph()>& build_base, const std::vector<ModelSweepLayer>& layers,
                         const std::function<double(const ir::Graph& model, bool is_base)>& evaluate,
                         const SweepOptions& options) {
  std::optional<Checkpoint> checkpoint;
  nlohmann::json state{{"base", nullptr}, {"done", nlohmann::json::object()}};
  if (!options.checkpoint_path.empty()) {
    checkpoint.emplace(options.checkpoint_path, options.fingerprint);
    if (options.resume) {
      nlohmann::json saved = checkpoint->load();
      if (!saved.is_null()) state = saved;
    }
  }
  SQ_CHECK(state.contains("base") && state.contains("done") && state["done"].is_object(), ErrorKind::kInvalidData,
           "checkpoint '" + options.checkpoint_path + "' does not hold a model-by-model analysis");
  auto save = [&] {
    if (checkpoint) checkpoint->save(state);
  };
  const bool finished = (!build_base || !state["base"].is_null()) &&
                        std::all_of(layers.begin(), layers.end(),
                                    [&](const ModelSweepLayer& l) { return state["done"].contains(l.name); });
  if (finished && !state["done"].empty()) check_same_evaluation(build_base, layers, evaluate, state, options);
  Progress progress(options.progress_label, layers.size() + (build_base ? 1 : 0), "models");
  SweepResult sweep;
  sweep.batches_resumed = state["done"].size();
  if (build_base) {
    if (state["base"].is_null()) {
      state["base"] = evaluate(build_base(), true);
      save();
    }
    sweep.base_metric = state["base"].get<double>();
    progress.advance();
  }
  for (const auto& layer : layers) {
    if (!state["done"].contains(layer.name)) {
      state["done"][layer.name] = evaluate(layer.build(), false);
      save();
    }
    sweep.layer_metric.push_back(state["done"][layer.name].get<double>());
    progress.advance();
  }
  progress.finish();
  sweep.seconds = progress.elapsed_seconds();
  sweep.batches = layers.size();
  return sweep;
}

std::unique_ptr<Metric> direction_only_metric(const std::string& name, bool higher_is_better) {
  struct Direction : Metric {
    Direction(std::string n, bool h) : name_(std::move(n)), h_(h) {}
    std::string name() const override { return name_; }
    void update(const Tensor&, const BatchLabels&, const Tensor&) override {}
    double value() const override { return 0; }
    size_t samples() const override { return 0; }
    void reset() override {}
    bool higher_is_better() const override { return h_; }
    std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<Direction>(name_, h_); }
    std::string name_;
    bool h_;
  };
  return std::make_unique<Direction>(name, higher_is_better);
}

namespace {

// Both user-evaluation forms of the PTQ analysis: `evaluate(model, is_fp32)`.
SensitivityReport analyze_ptq_models(const quant::PTQ& ptq, const std::string& metric_name, bool higher_is_better,
                                     const std::function<double(const ir::Graph&, bool)>& evaluate,
                                     const PtqAnalysisOptions& options) {
  ensure_dir(options.save_dir);
  const std::vector<const quant::Layer*> layers = ptq.all_layers();
  SQ_CHECK(!layers.empty(), ErrorKind::kInvalidArgument,
           "the model has no quantizable layer (quantizable_op_type: check the op types)");
  SweepOptions so;
  so.checkpoint_path = checkpoint_path(options);
  so.fingerprint = ptq_fingerprint(ptq);
  so.fingerprint["metric"] = metric_name;
  for (const auto& [k, v] : options.fingerprint_extra.items()) so.fingerprint[k] = v;
  so.progress_label = "analyze";
  std::vector<ModelSweepLayer> sweep_layers;
  std::vector<LayerVariant> variants;
  for (const quant::Layer* layer : layers) {
    sweep_layers.push_back({layer->name, layer->op_type, [&ptq, name = layer->name] { return ptq.convert(std::set<std::string>{name}); }});
    variants.push_back({layer->name, layer->op_type, ir::Graph()});
  }
  SweepResult sweep = sweep_models([&ptq] { return ptq.float_graph(); }, sweep_layers, evaluate, so);
  SensitivityReport report =
      rank_layers("ptq", variants, sweep, *direction_only_metric(metric_name, higher_is_better), sweep.base_metric);
  report.extra["layers_total"] = layers.size();
  write_report(report, options.save_dir);
  return report;
}

}  // namespace

SensitivityReport analyze_ptq(const quant::PTQ& ptq, const std::function<double(runtime::Session&)>& eval_function,
                              bool higher_is_better, const PtqAnalysisOptions& options) {
  SQ_CHECK(static_cast<bool>(eval_function), ErrorKind::kInvalidArgument, "eval_function is empty");
  return analyze_ptq_models(
      ptq, "eval_function", higher_is_better,
      [&](const ir::Graph& model, bool is_fp32) {
        ir::Graph g = model;
        if (!is_fp32) prepare_for_sweep(g);  // weight DequantizeLinear folded, as the built-in metrics run it
        runtime::Session session(std::move(g));
        return eval_function(session);
      },
      options);
}

SensitivityReport analyze_ptq(const quant::PTQ& ptq, const UserMetric& metric, const PtqAnalysisOptions& options) {
  SQ_CHECK(static_cast<bool>(metric.evaluate), ErrorKind::kInvalidArgument, "the user metric has no evaluate function");
  return analyze_ptq_models(
      ptq, metric.name, metric.higher_is_better, [&](const ir::Graph& model, bool) { return metric.evaluate(model); },
      options);
}

}  // namespace slimquant::analysis
