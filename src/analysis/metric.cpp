#include "slimquant/analysis/metric.h"

#include <algorithm>
#include <cmath>

#include "slimquant/analysis/ctc.h"

namespace slimquant::analysis {

namespace {

// Rows of a [n, ...] float output as n vectors of length numel/n.
int64_t row_length(const Tensor& t) { return t.rank() == 0 || t.dim(0) == 0 ? 0 : t.numel() / t.dim(0); }

Tensor as_float(const Tensor& t) { return t.dtype() == DType::kFloat32 ? t : t.cast(DType::kFloat32); }

const std::vector<std::string>& no_texts() {
  static const std::vector<std::string> empty;
  return empty;
}

class TopK : public Metric {
 public:
  explicit TopK(int k) : k_(k) {}
  std::string name() const override { return "top" + std::to_string(k_); }
  bool needs_labels() const override { return true; }
  void update(const Tensor& outputs, const BatchLabels& batch_labels, const Tensor&) override {
    const std::vector<int64_t>& labels = batch_labels.classes;
    Tensor out = as_float(outputs);
    const int64_t n = out.rank() ? out.dim(0) : 0, c = row_length(out);
    SQ_CHECK(static_cast<int64_t>(labels.size()) == n, ErrorKind::kInvalidData,
             name() + ": " + std::to_string(n) + " outputs but " + std::to_string(labels.size()) + " labels");
    const float* p = out.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float* row = p + i * c;
      const int64_t y = labels[i];
      SQ_CHECK(y >= 0 && y < c, ErrorKind::kInvalidData,
               "label " + std::to_string(y) + " is out of range for a model with " + std::to_string(c) + " outputs");
      // Rank of the true class: how many classes score strictly higher.
      int64_t higher = 0;
      for (int64_t j = 0; j < c; ++j) higher += row[j] > row[y];
      correct_ += higher < k_;
    }
    seen_ += static_cast<size_t>(n);
  }
  double value() const override { return seen_ ? static_cast<double>(correct_) / seen_ : 0.0; }
  size_t samples() const override { return seen_; }
  void reset() override { correct_ = seen_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<TopK>(k_); }
  nlohmann::json state() const override { return {{"correct", correct_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    correct_ = s.at("correct").get<size_t>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  int k_;
  size_t correct_ = 0, seen_ = 0;
};

class Cosine : public Metric {
 public:
  std::string name() const override { return "cosine"; }
  bool needs_reference() const override { return true; }
  bool higher_is_better() const override { return false; }
  void update(const Tensor& outputs, const BatchLabels&, const Tensor& reference) override {
    Tensor a = as_float(outputs), b = as_float(reference);
    SQ_CHECK(a.shape() == b.shape(), ErrorKind::kInvalidArgument, "cosine: output and reference shapes differ");
    const int64_t n = a.rank() ? a.dim(0) : 0, c = row_length(a);
    for (int64_t i = 0; i < n; ++i) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t j = 0; j < c; ++j) {
        double x = a.data<float>()[i * c + j], y = b.data<float>()[i * c + j];
        dot += x * y, na += x * x, nb += y * y;
      }
      sum_ += (na == 0 || nb == 0) ? (na == nb ? 0.0 : 1.0) : 1.0 - dot / std::sqrt(na * nb);
    }
    seen_ += static_cast<size_t>(n);
  }
  double value() const override { return seen_ ? sum_ / seen_ : 0.0; }
  size_t samples() const override { return seen_; }
  void reset() override { sum_ = 0, seen_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<Cosine>(); }
  nlohmann::json state() const override { return {{"sum", sum_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    sum_ = s.at("sum").get<double>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  double sum_ = 0;
  size_t seen_ = 0;
};

class Sqnr : public Metric {
 public:
  std::string name() const override { return "sqnr"; }
  bool needs_reference() const override { return true; }
  void update(const Tensor& outputs, const BatchLabels&, const Tensor& reference) override {
    Tensor a = as_float(outputs), b = as_float(reference);
    SQ_CHECK(a.shape() == b.shape(), ErrorKind::kInvalidArgument, "sqnr: output and reference shapes differ");
    for (int64_t i = 0; i < a.numel(); ++i) {
      double x = a.data<float>()[i], y = b.data<float>()[i];
      signal_ += y * y;
      noise_ += (x - y) * (x - y);
    }
    seen_ += a.rank() ? static_cast<size_t>(a.dim(0)) : 0;
  }
  // Identical outputs have infinite SQNR; report a large finite number so JSON stays valid.
  double value() const override { return noise_ == 0 ? 200.0 : 10.0 * std::log10(signal_ / noise_); }
  size_t samples() const override { return seen_; }
  void reset() override { signal_ = noise_ = 0, seen_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<Sqnr>(); }
  nlohmann::json state() const override { return {{"signal", signal_}, {"noise", noise_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    signal_ = s.at("signal").get<double>(), noise_ = s.at("noise").get<double>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  double signal_ = 0, noise_ = 0;
  size_t seen_ = 0;
};

class Top1Agreement : public Metric {
 public:
  std::string name() const override { return "top1_agreement"; }
  bool needs_reference() const override { return true; }
  void update(const Tensor& outputs, const BatchLabels&, const Tensor& reference) override {
    Tensor a = as_float(outputs), b = as_float(reference);
    SQ_CHECK(a.shape() == b.shape(), ErrorKind::kInvalidArgument, "top1_agreement: output and reference shapes differ");
    const int64_t n = a.rank() ? a.dim(0) : 0, c = row_length(a);
    for (int64_t i = 0; i < n; ++i) {
      const float* x = a.data<float>() + i * c;
      const float* y = b.data<float>() + i * c;
      agree_ += std::max_element(x, x + c) - x == std::max_element(y, y + c) - y;
    }
    seen_ += static_cast<size_t>(n);
  }
  double value() const override { return seen_ ? static_cast<double>(agree_) / seen_ : 0.0; }
  size_t samples() const override { return seen_; }
  void reset() override { agree_ = seen_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<Top1Agreement>(); }
  nlohmann::json state() const override { return {{"agree", agree_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    agree_ = s.at("agree").get<size_t>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  size_t agree_ = 0, seen_ = 0;
};

// CTC recognition: greedy decoding of [n, T, classes] against text labels, spaces ignored on both
// sides (PaddleOCR's RecMetric with ignore_space=True).
class CtcText : public Metric {
 public:
  enum class Kind { kExact, kChar };
  CtcText(Kind kind, std::shared_ptr<const CtcDecoder> decoder) : kind_(kind), decoder_(std::move(decoder)) {}
  std::string name() const override { return kind_ == Kind::kExact ? "ctc_exact" : "ctc_char"; }
  bool needs_text_labels() const override { return true; }
  void update(const Tensor& outputs, const BatchLabels& labels, const Tensor&) override {
    Tensor out = as_float(outputs);
    SQ_CHECK(out.rank() == 3, ErrorKind::kInvalidArgument,
             name() + ": expected the model output [batch, time steps, classes], got " + shape_str(out.shape()));
    const int64_t n = out.dim(0), steps = out.dim(1), classes = out.dim(2);
    SQ_CHECK(static_cast<int64_t>(labels.texts.size()) == n, ErrorKind::kInvalidData,
             name() + ": " + std::to_string(n) + " outputs but " + std::to_string(labels.texts.size()) + " text labels");
    decoder_->check_classes(classes);
    for (int64_t i = 0; i < n; ++i) {
      const std::string predicted = without_spaces(decoder_->decode(out.data<float>() + i * steps * classes, steps, classes));
      const std::string expected = without_spaces(labels.texts[static_cast<size_t>(i)]);
      correct_ += predicted == expected;
      edit_sum_ += normalized_edit_distance(predicted, expected);
    }
    seen_ += static_cast<size_t>(n);
  }
  double value() const override {
    if (!seen_) return 0.0;
    return kind_ == Kind::kExact ? static_cast<double>(correct_) / seen_ : 1.0 - edit_sum_ / seen_;
  }
  // Both figures come from the same decoding, so each reports the other too.
  std::vector<std::pair<std::string, double>> extra_values() const override {
    CtcText other(kind_ == Kind::kExact ? Kind::kChar : Kind::kExact, decoder_);
    other.correct_ = correct_, other.edit_sum_ = edit_sum_, other.seen_ = seen_;
    return {{other.name(), other.value()}};
  }
  size_t samples() const override { return seen_; }
  void reset() override { correct_ = seen_ = 0, edit_sum_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<CtcText>(kind_, decoder_); }
  nlohmann::json state() const override { return {{"correct", correct_}, {"edit_sum", edit_sum_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    correct_ = s.at("correct").get<size_t>(), edit_sum_ = s.at("edit_sum").get<double>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  Kind kind_;
  std::shared_ptr<const CtcDecoder> decoder_;
  size_t correct_ = 0, seen_ = 0;
  double edit_sum_ = 0;
};

// Detection maps: per sample, IoU of {p > threshold} between the model and the reference; a sample
// where neither has any text pixel counts as 1 (the two agree).
class MaskIou : public Metric {
 public:
  explicit MaskIou(double threshold) : threshold_(threshold) {}
  std::string name() const override { return "mask_iou"; }
  bool needs_reference() const override { return true; }
  void update(const Tensor& outputs, const BatchLabels&, const Tensor& reference) override {
    Tensor a = as_float(outputs), b = as_float(reference);
    SQ_CHECK(a.shape() == b.shape(), ErrorKind::kInvalidArgument,
             "mask_iou: output " + shape_str(a.shape()) + " and reference " + shape_str(b.shape()) + " shapes differ");
    const int64_t n = a.rank() ? a.dim(0) : 0, per = row_length(a);
    // Compared in float, as PaddleOCR's float32 maps are (0.3f itself is not text).
    const float threshold = static_cast<float>(threshold_);
    for (int64_t i = 0; i < n; ++i) {
      const float* x = a.data<float>() + i * per;
      const float* y = b.data<float>() + i * per;
      size_t both = 0, either = 0;
      for (int64_t j = 0; j < per; ++j) {
        const bool p = x[j] > threshold, q = y[j] > threshold;
        both += p && q;
        either += p || q;
      }
      const double iou = either ? static_cast<double>(both) / static_cast<double>(either) : 1.0;
      sum_ += iou;
      min_ = std::min(min_, iou);
    }
    seen_ += static_cast<size_t>(n);
  }
  double value() const override { return seen_ ? sum_ / seen_ : 0.0; }
  std::vector<std::pair<std::string, double>> extra_values() const override {
    return {{"mask_iou_min", seen_ ? min_ : 0.0}};
  }
  size_t samples() const override { return seen_; }
  void reset() override { sum_ = 0, min_ = 1.0, seen_ = 0; }
  std::unique_ptr<Metric> clone_empty() const override { return std::make_unique<MaskIou>(threshold_); }
  nlohmann::json state() const override { return {{"sum", sum_}, {"min", min_}, {"seen", seen_}}; }
  void load_state(const nlohmann::json& s) override {
    sum_ = s.at("sum").get<double>(), min_ = s.at("min").get<double>(), seen_ = s.at("seen").get<size_t>();
  }

 private:
  double threshold_;
  double sum_ = 0, min_ = 1.0;
  size_t seen_ = 0;
};

}  // namespace

BatchLabels::BatchLabels(const std::vector<int64_t>& classes) : BatchLabels(classes, no_texts()) {}
BatchLabels::BatchLabels(const std::vector<int64_t>& classes, const std::vector<std::string>& texts)
    : classes(classes), texts(texts) {}

nlohmann::json Metric::state() const {
  fail(ErrorKind::kUnsupported, "metric '" + name() + "' cannot be checkpointed (it does not implement state())");
}

void Metric::load_state(const nlohmann::json&) {
  fail(ErrorKind::kUnsupported, "metric '" + name() + "' cannot be resumed (it does not implement load_state())");
}

const char* known_metric_names() {
  return "top1, top5, cosine, sqnr, top1_agreement, ctc_exact, ctc_char, mask_iou";
}

std::unique_ptr<Metric> make_metric(const std::string& name, const MetricOptions& options) {
  if (name == "top1") return std::make_unique<TopK>(1);
  if (name == "top5") return std::make_unique<TopK>(5);
  if (name == "cosine") return std::make_unique<Cosine>();
  if (name == "sqnr") return std::make_unique<Sqnr>();
  if (name == "top1_agreement") return std::make_unique<Top1Agreement>();
  if (name == "ctc_exact" || name == "ctc_char") {
    SQ_CHECK(!options.keys_file.empty(), ErrorKind::kInvalidArgument,
             "metric '" + name + "' decodes text and needs the model's key file (--keys FILE, e.g. ppocr_keys_v1.txt)");
    auto decoder = std::make_shared<const CtcDecoder>(read_ctc_keys(options.keys_file));
    return std::make_unique<CtcText>(name == "ctc_exact" ? CtcText::Kind::kExact : CtcText::Kind::kChar, decoder);
  }
  if (name == "mask_iou") return std::make_unique<MaskIou>(options.mask_threshold);
  fail(ErrorKind::kInvalidArgument, "unknown metric '" + name + "' (known: " + known_metric_names() + ")");
}

}  // namespace slimquant::analysis
