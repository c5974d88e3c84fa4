#include "slimquant/analysis/hist_plot.h"

#include <cairo-pdf.h>
#include <cairo.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numbers>
#include <tuple>

#include "slimquant/core/error.h"

namespace slimquant::analysis {

namespace {

// lo == hi (constant data): a range around the value, so the single bar has a width and the axis
// has ticks. Half a unit of the value's magnitude (or 0.5 around zero).
std::pair<double, double> widen(double lo, double hi) {
  if (hi > lo) return {lo, hi};
  const double h = lo != 0.0 ? std::abs(lo) * 0.5 : 0.5;
  return {lo - h, hi + h};
}

void check_range(double lo, double hi, const std::string& what) {
  SQ_CHECK(std::isfinite(lo) && std::isfinite(hi), ErrorKind::kInvalidArgument,
           what + ": range bounds must be finite (got " + format_number(lo) + ", " + format_number(hi) + ")");
  SQ_CHECK(lo <= hi, ErrorKind::kInvalidArgument,
           what + ": range lower bound " + format_number(lo) + " is above the upper bound " + format_number(hi));
  SQ_CHECK(std::isfinite(hi - lo), ErrorKind::kInvalidArgument,
           what + ": range [" + format_number(lo) + ", " + format_number(hi) + "] is too wide for double precision");
}

}  // namespace

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return "0";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// HistogramAccumulator

HistogramAccumulator::HistogramAccumulator(double lo, double hi, size_t bins) {
  SQ_CHECK(bins > 0, ErrorKind::kInvalidArgument, "histogram: the number of bins must be at least 1");
  check_range(lo, hi, "histogram");
  std::tie(lo_, hi_) = widen(lo, hi);
  inv_width_ = static_cast<double>(bins) / (hi_ - lo_);
  counts_.assign(bins, 0);
}

void HistogramAccumulator::add(std::span<const float> v) {
  const size_t last = counts_.size() - 1;
  // Moments of this chunk in two passes (its mean, then squared deviations from it), merged into
  // the running ones with Chan's formula: stable without a per-value division.
  uint64_t n = 0;
  double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = -mn;
  for (float f : v) {
    if (!std::isfinite(f)) {
      ++nonfinite_;
      continue;
    }
    const double x = f;
    size_t bin;
    if (x < lo_) {
      ++below_;
      bin = 0;
    } else if (x > hi_) {
      ++above_;
      bin = last;
    } else {
      bin = std::min(static_cast<size_t>((x - lo_) * inv_width_), last);  // x == hi: last bin
    }
    ++counts_[bin];
    ++n;
    sum += x;
    mn = std::min(mn, x);
    mx = std::max(mx, x);
  }
  if (n == 0) return;
  const double mean = sum / static_cast<double>(n);
  double m2 = 0;
  for (float f : v)
    if (std::isfinite(f)) m2 += (f - mean) * (f - mean);
  if (total_ == 0) {
    min_ = mn, max_ = mx, mean_ = mean, m2_ = m2;
  } else {
    const double na = static_cast<double>(total_), nb = static_cast<double>(n), nt = na + nb;
    const double d = mean - mean_;
    mean_ += d * nb / nt;
    m2_ += m2 + d * d * na * nb / nt;
    min_ = std::min(min_, mn);
    max_ = std::max(max_, mx);
  }
  total_ += n;
}

double HistogramAccumulator::stddev() const {
  return total_ ? std::sqrt(std::max(0.0, m2_ / static_cast<double>(total_))) : 0.0;
}

double HistogramAccumulator::fraction_outside(double a, double b) const {
  if (total_ == 0) return 0.0;
  const double width = 1.0 / inv_width_;
  auto inside_fraction = [&](size_t i) {
    const double l = lo_ + static_cast<double>(i) * width, r = l + width;
    return std::clamp((std::min(r, b) - std::max(l, a)) / width, 0.0, 1.0);
  };
  double outside = 0;
  for (size_t i = 0; i < counts_.size(); ++i) outside += static_cast<double>(counts_[i]) * (1.0 - inside_fraction(i));
  // Clamped values sit in the end bins but lie beyond lo/hi: wholly outside when a > lo (b < hi),
  // not in the proportion the loop gave their bin.
  if (a > lo_) outside += static_cast<double>(below_) * inside_fraction(0);
  if (b < hi_) outside += static_cast<double>(above_) * inside_fraction(counts_.size() - 1);
  return std::min(1.0, outside / static_cast<double>(total_));
}

HistogramPlot HistogramAccumulator::plot(std::string title, std::string subtitle) const {
  HistogramPlot p;
  p.title = std::move(title);
  p.subtitle = std::move(subtitle);
  p.lo = lo_;
  p.hi = hi_;
  p.counts.assign(counts_.begin(), counts_.end());
  p.facts.push_back({"values", std::to_string(total_)});
  if (total_) {
    p.facts.push_back({"min", format_number(min_)});
    p.facts.push_back({"max", format_number(max_)});
    p.facts.push_back({"mean", format_number(mean())});
    p.facts.push_back({"std", format_number(stddev())});
  }
  if (below_) p.facts.push_back({"below range (in first bin)", std::to_string(below_)});
  if (above_) p.facts.push_back({"above range (in last bin)", std::to_string(above_)});
  if (nonfinite_) p.facts.push_back({"NaN/Inf (not counted)", std::to_string(nonfinite_)});
  return p;
}

HistogramPlot make_histogram(std::span<const float> values, size_t bins, std::string title, std::string subtitle) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (float f : values)
    if (std::isfinite(f)) lo = std::min(lo, static_cast<double>(f)), hi = std::max(hi, static_cast<double>(f));
  if (lo > hi) lo = hi = 0.0;  // no finite values: an empty histogram around 0
  HistogramAccumulator acc(lo, hi, bins);
  acc.add(values);
  return acc.plot(std::move(title), std::move(subtitle));
}

// ---------------------------------------------------------------------------------------------
// PDF pages

namespace {

// A4 landscape in points.
constexpr double kPageW = 842, kPageH = 595;
// Plot frame; the facts block sits to its right.
constexpr double kLeft = 85, kRight = 600, kTop = 105, kBottom = 505;
constexpr double kFactsX = 625, kFactsW = kPageW - kFactsX - 25;

struct Color {
  double r, g, b;
};
constexpr Color kBar{0.25, 0.45, 0.70}, kThreshold{0.80, 0.10, 0.10}, kText{0.1, 0.1, 0.1}, kGrid{0.85, 0.85, 0.85};

void set_color(cairo_t* cr, Color c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

// Draws `s` with its anchor at x (align 0 = left, 0.5 = centre, 1 = right) and baseline y; the
// font shrinks (down to 5 pt) when the text is wider than max_w.
void text(cairo_t* cr, const std::string& s, double x, double y, double size, double align = 0, bool bold = false,
          double max_w = 0) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  if (max_w > 0 && e.x_advance > max_w) {
    cairo_set_font_size(cr, std::max(5.0, size * max_w / e.x_advance));
    cairo_text_extents(cr, s.c_str(), &e);
  }
  cairo_move_to(cr, x - align * e.x_advance, y);
  cairo_show_text(cr, s.c_str());
}

// Ticks at 1, 2 or 5 times a power of ten, about `target` of them in [a, b].
std::vector<double> nice_ticks(double a, double b, int target) {
  const double raw = (b - a) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(a / step) * step; v <= b + step * 1e-9; v += step)
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string count_label(double v) {
  if (v >= 1 && v < 1e6 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
  return format_number(v);
}

void check_plot(const HistogramPlot& p, size_t index) {
  const std::string what = "histogram page " + std::to_string(index + 1) + " ('" + p.title + "')";
  check_range(p.lo, p.hi, what);
  for (double c : p.counts)
    SQ_CHECK(std::isfinite(c) && c >= 0, ErrorKind::kInvalidArgument,
             what + ": counts must be finite and non-negative (got " + format_number(c) + ")");
  for (const auto& [label, v] : p.thresholds)
    SQ_CHECK(std::isfinite(v), ErrorKind::kInvalidArgument, what + ": threshold '" + label + "' is not finite");
}

void draw_page(cairo_t* cr, const HistogramPlot& p) {
  set_color(cr, kText);
  text(cr, p.title, 40, 45, 18, 0, true, kPageW - 80);
  text(cr, p.subtitle, 40, 68, 12, 0, false, kPageW - 80);

  // Value axis: the histogram range, widened to show every threshold line.
  const auto range = widen(p.lo, p.hi);
  const double lo = range.first, hi = range.second;
  double xa = lo, xb = hi;
  for (const auto& t : p.thresholds) xa = std::min(xa, t.second), xb = std::max(xb, t.second);
  const double pad = (xb - xa) * 0.02;
  xa -= pad, xb += pad;
  auto px = [&](double v) { return kLeft + (v - xa) / (xb - xa) * (kRight - kLeft); };

  // Count axis.
  double cmax = 0, cmin_pos = std::numeric_limits<double>::infinity();
  for (double c : p.counts) {
    cmax = std::max(cmax, c);
    if (c > 0) cmin_pos = std::min(cmin_pos, c);
  }
  const bool empty = cmax <= 0;
  const bool log_axis = p.log_counts && !empty;
  // Log: the floor sits at half the smallest non-zero count, so a bin holding one value still
  // shows as a bar; the top leaves a little headroom.
  const double ya = log_axis ? std::log10(cmin_pos / 2) : 0.0;
  const double yb = log_axis ? std::log10(cmax) + 0.1 * std::max(1.0, std::log10(cmax) - ya) : (empty ? 1.0 : cmax * 1.05);
  auto py = [&](double c) {
    const double v = log_axis ? std::log10(std::max(c, cmin_pos / 2)) : c;
    return kBottom - (v - ya) / (yb - ya) * (kBottom - kTop);
  };

  // Grid and ticks.
  cairo_set_line_width(cr, 0.5);
  std::vector<double> yticks;
  if (log_axis) {
    for (int k = static_cast<int>(std::ceil(ya)); k <= static_cast<int>(std::floor(yb)); ++k) yticks.push_back(std::pow(10.0, k));
  } else {
    yticks = nice_ticks(0, yb, 5);
  }
  for (double t : yticks) {
    const double y = py(t);
    set_color(cr, kGrid);
    cairo_move_to(cr, kLeft, y);
    cairo_line_to(cr, kRight, y);
    cairo_stroke(cr);
    set_color(cr, kText);
    text(cr, count_label(t), kLeft - 6, y + 3.5, 9, 1);
  }
  for (double t : nice_ticks(xa, xb, 7)) {
    const double x = px(t);
    set_color(cr, kText);
    cairo_move_to(cr, x, kBottom);
    cairo_line_to(cr, x, kBottom + 4);
    cairo_stroke(cr);
    text(cr, format_number(t), x, kBottom + 15, 9, 0.5);
  }
  set_color(cr, kText);
  text(cr, "value", (kLeft + kRight) / 2, kBottom + 32, 10, 0.5);
  cairo_save(cr);
  cairo_move_to(cr, 0, 0);
  cairo_translate(cr, kLeft - 48, (kTop + kBottom) / 2);
  cairo_rotate(cr, -std::numbers::pi / 2);
  text(cr, log_axis ? "count (log scale)" : "count", 0, 0, 10, 0.5);
  cairo_restore(cr);

  // Bars.
  const size_t n = p.counts.size();
  if (n > 0 && !empty) {
    set_color(cr, kBar);
    const double w = (hi - lo) / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      if (p.counts[i] <= 0) continue;
      const double x0 = px(lo + static_cast<double>(i) * w), x1 = px(lo + static_cast<double>(i + 1) * w);
      const double y = py(p.counts[i]);
      // At least a hairline wide, so a bin of 2048 on a 500 pt axis still renders.
      cairo_rectangle(cr, x0, y, std::max(x1 - x0, 0.3), kBottom - y);
    }
    cairo_fill(cr);
  } else {
    set_color(cr, kText);
    text(cr, "no values to plot (all counts are zero)", (kLeft + kRight) / 2, (kTop + kBottom) / 2, 12, 0.5);
  }

  // Frame.
  set_color(cr, kText);
  cairo_set_line_width(cr, 0.8);
  cairo_rectangle(cr, kLeft, kTop, kRight - kLeft, kBottom - kTop);
  cairo_stroke(cr);

  // Threshold lines, labelled with their values; labels step down so neighbours do not collide.
  for (size_t i = 0; i < p.thresholds.size(); ++i) {
    const auto& [label, v] = p.thresholds[i];
    const double x = px(v);
    set_color(cr, kThreshold);
    cairo_set_line_width(cr, 1.2);
    const double dash[] = {5.0, 3.0};
    cairo_set_dash(cr, dash, 2, 0);
    cairo_move_to(cr, x, kTop);
    cairo_line_to(cr, x, kBottom);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    const std::string s = label + " = " + format_number(v);
    const double y = kTop + 14 + 13 * static_cast<double>(i % 4);
    const bool right_half = x > (kLeft + kRight) / 2;
    text(cr, s, right_half ? x - 4 : x + 4, y, 9, right_half ? 1.0 : 0.0, true);
  }

  // Facts block.
  set_color(cr, kText);
  text(cr, "facts", kFactsX, kTop + 4, 12, 0, true);
  double y = kTop + 24;
  auto fact = [&](const std::string& k, const std::string& v) {
    if (y > kPageH - 30) return;  // more facts than the page holds: the rest is dropped
    text(cr, k, kFactsX, y, 9, 0, true, kFactsW);
    text(cr, v, kFactsX + 8, y + 12, 10, 0, false, kFactsW - 8);
    y += 28;
  };
  for (const auto& [k, v] : p.facts) fact(k, v);
  fact("histogram", std::to_string(n) + " bins over [" + format_number(lo) + ", " + format_number(hi) + "]");
}

}  // namespace

void write_histogram_pdf(const std::string& path, const std::vector<HistogramPlot>& plots) {
  for (size_t i = 0; i < plots.size(); ++i) check_plot(plots[i], i);
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  SQ_CHECK(fs::is_directory(dir, ec), ErrorKind::kIo,
           "cannot write histogram PDF '" + path + "': directory '" + dir.string() + "' does not exist");
  SQ_CHECK(!fs::is_directory(target, ec), ErrorKind::kIo,
           "cannot write histogram PDF '" + path + "': it is a directory");
  // Temporary name in the same directory so the final rename is atomic.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());

  cairo_surface_t* surface = cairo_pdf_surface_create(tmp.c_str(), kPageW, kPageH);
  auto fail_io = [&](const std::string& why) {
    cairo_surface_destroy(surface);
    fs::remove(tmp, ec);
    fail(ErrorKind::kIo, "cannot write histogram PDF '" + path + "': " + why);
  };
  if (cairo_surface_status(surface) != CAIRO_STATUS_SUCCESS)
    fail_io(cairo_status_to_string(cairo_surface_status(surface)));
  cairo_pdf_surface_set_metadata(surface, CAIRO_PDF_METADATA_CREATOR, "slimquant");
  cairo_pdf_surface_set_metadata(surface, CAIRO_PDF_METADATA_TITLE, target.filename().c_str());
  // No creation date (cairo stamps the current time unless told otherwise): the same analysis
  // writes the same bytes. cairo drops a date shorter than a year.
  cairo_pdf_surface_set_metadata(surface, CAIRO_PDF_METADATA_CREATE_DATE, "");
  cairo_t* cr = cairo_create(surface);
  if (plots.empty()) {
    set_color(cr, kText);
    text(cr, "no histograms to plot", 40, 45, 18, 0, true);
    text(cr, "the analysis selected no layers for this report", 40, 68, 12);
    cairo_show_page(cr);
  }
  for (const auto& p : plots) {
    draw_page(cr, p);
    cairo_show_page(cr);
  }
  const cairo_status_t draw_status = cairo_status(cr);
  cairo_destroy(cr);
  cairo_surface_finish(surface);  // writes the file; write errors show up in the surface status
  const cairo_status_t st = draw_status != CAIRO_STATUS_SUCCESS ? draw_status : cairo_surface_status(surface);
  if (st != CAIRO_STATUS_SUCCESS) fail_io(cairo_status_to_string(st));
  cairo_surface_destroy(surface);
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail(ErrorKind::kIo, "cannot write histogram PDF '" + path + "': rename failed");
  }
}

}  // namespace slimquant::analysis
