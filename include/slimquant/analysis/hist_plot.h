#pragma once
// Histogram pages for the PTQ analysis reports (best/worst weight and activation PDFs): a streaming
// equal-width histogram that never keeps the values, and a cairo writer that puts one plot per
// page of a vector PDF (title, axes with tick labels, bars, labelled threshold lines, facts block).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace slimquant::analysis {

struct HistogramPlot {
  std::string title;     // layer name + op type
  std::string subtitle;  // what is plotted, e.g. "weight conv1.weight [32,16,3,3]" / "input activation x (calibration data)"
  double lo = 0, hi = 0; // range covered by counts (equal-width bins)
  std::vector<double> counts;
  std::vector<std::pair<std::string, double>> thresholds;  // labelled vertical lines, e.g. {"clip -", -t}, {"clip +", t}
  std::vector<std::pair<std::string, std::string>> facts;   // key numbers printed on the page
  // Count axis: logarithmic by default, because activations are heavy-tailed: on a linear axis
  // the few values near (and beyond) the clipping threshold, which are what the page is for, draw
  // as nothing next to the peak at zero. Linear suits near-Gaussian weights when counts are close.
  bool log_counts = true;
};

// Streaming equal-width histogram over a fixed range (values outside are clamped into the end
// bins, and counted separately). Bin i covers [lo + i*w, lo + (i+1)*w); the last bin also holds hi.
// NaN/Inf are skipped and counted in nonfinite(). Exact min/max/mean/std of the finite values are
// kept alongside (they go into the page's facts).
class HistogramAccumulator {
 public:
  // Throws kInvalidArgument for bins == 0, non-finite bounds or lo > hi. lo == hi (a constant
  // tensor) is widened to a small range around the value so the bar has somewhere to stand.
  HistogramAccumulator(double lo, double hi, size_t bins);
  void add(std::span<const float> v);
  // The plot with facts "values", "min", "max", "mean", "std" (and the clamped / non-finite counts
  // when there are any); the caller adds thresholds and its own facts.
  HistogramPlot plot(std::string title, std::string subtitle) const;

  double lo() const { return lo_; }
  double hi() const { return hi_; }
  size_t bins() const { return counts_.size(); }
  const std::vector<uint64_t>& counts() const { return counts_; }  // clamped values included
  uint64_t total() const { return total_; }                        // finite values added
  uint64_t below() const { return below_; }                        // < lo, counted in bin 0
  uint64_t above() const { return above_; }                        // > hi, counted in the last bin
  uint64_t nonfinite() const { return nonfinite_; }
  double min() const { return min_; }  // of the finite values (0 when none)
  double max() const { return max_; }
  double mean() const { return total_ ? mean_ : 0.0; }
  double stddev() const;  // population standard deviation
  // Fraction of the finite values outside [a, b], at bin resolution (a bin cut by a or b counts
  // in proportion); values clamped into the end bins count as outside when a/b lie inside the
  // range. For "% clipped" facts when the values themselves are gone.
  double fraction_outside(double a, double b) const;

 private:
  double lo_, hi_, inv_width_;
  std::vector<uint64_t> counts_;
  uint64_t total_ = 0, below_ = 0, above_ = 0, nonfinite_ = 0;
  double min_ = 0, max_ = 0, mean_ = 0, m2_ = 0;  // m2_: sum of squared deviations from mean_
};

// Range = data min..max (finite values); constant data gets the same widened range as above.
HistogramPlot make_histogram(std::span<const float> values, size_t bins, std::string title, std::string subtitle);

// One page per plot, vector PDF via cairo, written atomically (temporary file in the same
// directory, then rename). Throws kIo if the path is unwritable, kInvalidArgument for a plot with
// non-finite or reversed bounds or negative/non-finite counts. An empty `plots` still writes a
// valid one-page PDF that says there is nothing to plot (a PDF cannot have zero pages, and a file
// that is missing reads like a crash).
void write_histogram_pdf(const std::string& path, const std::vector<HistogramPlot>& plots);

// Short number for labels and facts: "%.4g"-style, "-0" printed as "0".
std::string format_number(double v);

}  // namespace slimquant::analysis
