#include "slimquant/analysis/evaluate.h"

#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"

namespace slimquant::analysis {

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
  Progress progress(options.progress_label, dataset.size());
  metric.reset();
  for (const data::Batch& batch : loader) {
    Tensor out = session.run(batch.feeds(input)).at(output);
    Tensor ref;
    if (metric.needs_reference()) {
      runtime::Session& r = *options.reference;
      ref = r.run(batch.feeds(data::main_input_name(r.input_names(), dataset))).at(r.outputs().at(0).name);
    }
    metric.update(out, {batch.labels, batch.texts}, ref);
    progress.advance(batch.size());
  }
  progress.finish();
  return {metric.value(), metric.samples(), progress.elapsed_seconds()};
}

}  // namespace slimquant::analysis
