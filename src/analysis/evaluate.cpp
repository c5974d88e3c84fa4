#include "slimquant/analysis/evaluate.h"

#include <cstring>

#include "slimquant/core/distributed.h"
#include "slimquant/core/npy.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"

namespace slimquant::analysis {

namespace {

// A tensor as a length-prefixed .npy (length 0: no tensor), for collecting outputs across ranks.
void append_tensor(std::string& out, const Tensor& t) {
  const std::vector<std::byte> npy = t.defined() ? encode_npy(t) : std::vector<std::byte>();
  const uint64_t n = npy.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(npy.data()), npy.size());
}

Tensor read_tensor(const std::string& in, size_t& pos) {
  uint64_t n = 0;
  SQ_CHECK(pos + sizeof n <= in.size(), ErrorKind::kInternal, "evaluate: truncated outputs from another rank");
  std::memcpy(&n, in.data() + pos, sizeof n);
  pos += sizeof n;
  SQ_CHECK(pos + n <= in.size(), ErrorKind::kInternal, "evaluate: truncated outputs from another rank");
  Tensor t = n ? parse_npy(in.data() + pos, n, "outputs from another rank") : Tensor();
  pos += n;
  return t;
}

}  // namespace

EvalResult evaluate(runtime::Session& session, const data::Dataset& dataset, Metric& metric,
                    const EvalOptions& options) {
  SQ_CHECK(!metric.needs_labels() || dataset.has_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs labels, but data set '" + dataset.name() +
               "' has none (use a label-free metric: cosine, sqnr, top1_agreement)");
  SQ_CHECK(!metric.needs_text_labels() || dataset.has_text_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs text labels, but data set '" + dataset.name() +
               "' has none (npy:DIR takes them from labels.txt, one line per sample)");
  SQ_CHECK(!metric.needs_reference() || options.reference, ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' compares against the FP32 model, which was not given");
  SQ_CHECK(dataset.size() > 0, ErrorKind::kInvalidData, "data set '" + dataset.name() + "' is empty");
  const std::string input = data::main_input_name(session.input_names(), dataset);
  const std::string output = session.outputs().at(0).name;
  data::BatchLoader loader(dataset, options.batch_size);
  metric.reset();
  auto run_batch = [&](const data::Batch& batch, Tensor& out, Tensor& ref) {
    out = session.run(batch.feeds(input)).at(output);
    if (metric.needs_reference()) {
      runtime::Session& r = *options.reference;
      ref = r.run(batch.feeds(data::main_input_name(r.input_names(), dataset))).at(r.outputs().at(0).name);
    }
  };

  if (distributed::size() == 1) {
    Progress progress(options.progress_label, dataset.size());
    for (const data::Batch& batch : loader) {
      Tensor out, ref;
      run_batch(batch, out, ref);
      metric.update(out, {batch.labels, batch.texts}, ref);
      progress.advance(batch.size());
    }
    progress.finish();
    return {metric.value(), metric.samples(), progress.elapsed_seconds()};
  }

  // Distributed: each rank runs one contiguous block of batches; the outputs (small: the model's
  // first output) go to every rank, which scores them in batch order, so the metric, whatever its
  // state, is exactly the one-process one on every rank.
  const distributed::Range mine = distributed::block_of(loader.num_batches());
  Progress progress(options.progress_label, mine.end - mine.begin, "batches");
  std::string outputs;
  for (size_t b = mine.begin; b < mine.end; ++b) {
    Tensor out, ref;
    run_batch(loader.batch(b), out, ref);
    append_tensor(outputs, out);
    append_tensor(outputs, ref);
    progress.advance();
  }
  progress.finish();
  std::string all;
  for (const std::string& part : distributed::gather(outputs)) all += part;
  all = distributed::broadcast(all);
  size_t pos = 0;
  for (size_t b = 0; b < loader.num_batches(); ++b) {
    const size_t first = b * loader.batch_size(), n = std::min(loader.batch_size(), dataset.size() - first);
    std::vector<int64_t> labels;
    std::vector<std::string> texts;
    for (size_t i = first; i < first + n; ++i) {
      if (dataset.has_labels()) labels.push_back(dataset.label(i));
      if (dataset.has_text_labels()) texts.push_back(dataset.text_label(i));
    }
    const Tensor out = read_tensor(all, pos), ref = read_tensor(all, pos);
    metric.update(out, {labels, texts}, ref);
  }
  return {metric.value(), metric.samples(), progress.elapsed_seconds()};
}

}  // namespace slimquant::analysis
