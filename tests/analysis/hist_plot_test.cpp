#include "slimquant/analysis/hist_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <opencv2/imgcodecs.hpp>
#include <random>

#include "slimquant/core/error.h"
#include "test_util.h"

using namespace slimquant;
using analysis::HistogramAccumulator;
using test::pdf_pages;
using analysis::HistogramPlot;

namespace {

std::string run(const std::string& cmd, int* exit_code) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  if (!pipe) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

template <typename F>
ErrorKind kind_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;  // did not throw: never the kind a test expects here
}

TEST(HistogramAccumulator, KnownValuesFallIntoKnownBinsAndClampingIsCounted) {
  HistogramAccumulator h(0.0, 10.0, 10);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> a = {0.f, 0.5f, 1.f, 2.5f, -1.f};
  const std::vector<float> b = {9.99f, 10.f, -3.f, 11.f, std::nanf(""), inf};
  h.add(a);
  h.add(b);  // two chunks: the moments are merged
  const std::vector<uint64_t> expected = {4, 1, 1, 0, 0, 0, 0, 0, 0, 3};
  EXPECT_EQ(h.counts(), expected);
  EXPECT_EQ(h.below(), 2u);  // -1, -3 in bin 0
  EXPECT_EQ(h.above(), 1u);  // 11 in bin 9; 10 == hi is inside the last bin
  EXPECT_EQ(h.nonfinite(), 2u);
  EXPECT_EQ(h.total(), 9u);
  const std::vector<double> finite = {0, 0.5, 1, 2.5, -1, 9.99f, 10, -3, 11};
  double mean = 0, var = 0;
  for (double v : finite) mean += v / 9;
  for (double v : finite) var += (v - mean) * (v - mean) / 9;
  EXPECT_NEAR(h.mean(), mean, 1e-12);
  EXPECT_NEAR(h.stddev(), std::sqrt(var), 1e-12);
  EXPECT_EQ(h.min(), -3.0);
  EXPECT_EQ(h.max(), 11.0);

  HistogramPlot p = h.plot("conv1 (Conv)", "weight conv1.weight");
  EXPECT_EQ(p.lo, 0.0);
  EXPECT_EQ(p.hi, 10.0);
  EXPECT_EQ(p.counts, (std::vector<double>{4, 1, 1, 0, 0, 0, 0, 0, 0, 3}));
  auto fact = [&](const std::string& k) {
    for (const auto& [key, v] : p.facts)
      if (key == k) return v;
    return std::string("missing");
  };
  EXPECT_EQ(fact("values"), "9");
  EXPECT_EQ(fact("min"), "-3");
  EXPECT_EQ(fact("max"), "11");
  EXPECT_EQ(fact("below range (in first bin)"), "2");
  EXPECT_EQ(fact("above range (in last bin)"), "1");
  EXPECT_EQ(fact("NaN/Inf (not counted)"), "2");
}

TEST(HistogramAccumulator, FractionOutsideAtBinResolution) {
  HistogramAccumulator h(0.0, 10.0, 10);
  std::vector<float> centres;
  for (int i = 0; i < 10; ++i) centres.push_back(static_cast<float>(i) + 0.5f);
  h.add(centres);
  EXPECT_DOUBLE_EQ(h.fraction_outside(2, 8), 0.4);
  EXPECT_DOUBLE_EQ(h.fraction_outside(2.5, 8), 0.45);  // bin 2 half inside
  EXPECT_DOUBLE_EQ(h.fraction_outside(0, 10), 0.0);
  const std::vector<float> low = {-5.f};
  h.add(low);  // clamped into bin 0: outside [0.5, 10] entirely, the real 0.5 half
  EXPECT_DOUBLE_EQ(h.fraction_outside(0.5, 10), 1.5 / 11);
}

TEST(HistogramAccumulator, MakeHistogramUsesDataRangeAndHandlesDegenerateData) {
  const std::vector<float> v = {-2.f, 0.f, 1.f, 3.f};
  HistogramPlot p = analysis::make_histogram(v, 5, "t", "s");
  EXPECT_EQ(p.lo, -2.0);
  EXPECT_EQ(p.hi, 3.0);
  EXPECT_EQ(p.counts, (std::vector<double>{1, 0, 1, 1, 1}));

  const std::vector<float> constant = {4.f, 4.f, 4.f};
  p = analysis::make_histogram(constant, 4, "t", "s");
  EXPECT_EQ(p.lo, 2.0);  // widened by half the value on each side
  EXPECT_EQ(p.hi, 6.0);
  EXPECT_EQ(p.counts, (std::vector<double>{0, 0, 3, 0}));

  p = analysis::make_histogram(std::span<const float>(), 8, "t", "s");
  EXPECT_EQ(p.lo, -0.5);
  EXPECT_EQ(p.hi, 0.5);
  EXPECT_EQ(p.counts, std::vector<double>(8, 0.0));

  EXPECT_EQ(kind_of([] { HistogramAccumulator(0, 1, 0); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { HistogramAccumulator(1, 0, 4); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { HistogramAccumulator(std::nan(""), 1, 4); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { HistogramAccumulator(-1e308, 1e308, 4); }), ErrorKind::kInvalidArgument);  // width overflows
}

// Three pages: a heavy-tailed activation (log counts, two thresholds, 2048 bins), a weight on a
// linear axis, and an all-zero histogram.
std::vector<HistogramPlot> sample_plots() {
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(2.0f);
  std::vector<float> act(20000);
  for (auto& x : act) x = heavy(rng);
  HistogramAccumulator acc(-8, 8, 2048);
  acc.add(act);
  HistogramPlot a = acc.plot("/layer1/conv1 (Conv)", "input activation /stem/relu_out (calibration data)");
  a.thresholds = {{"clip -", -4.2}, {"clip +", 4.2}};
  a.facts.push_back({"scale", analysis::format_number(4.2 / 127)});
  a.facts.push_back({"zero point", "0"});
  a.facts.push_back({"clipped", analysis::format_number(100 * acc.fraction_outside(-4.2, 4.2)) + " %"});

  std::normal_distribution<float> normal(0.f, 0.05f);
  std::vector<float> w(4608);
  for (auto& x : w) x = normal(rng);
  HistogramPlot b = analysis::make_histogram(w, 128, "/fc/Gemm (Gemm)", "weight fc.weight [10,64]");
  b.log_counts = false;
  b.thresholds = {{"max |w| channel threshold", 0.17}};

  HistogramPlot c;
  c.title = "all zero";
  c.subtitle = "nothing counted";
  c.lo = c.hi = 0;
  c.counts.assign(16, 0.0);
  return {a, b, c};
}

TEST(HistogramPdf, OnePagePerPlotAndEveryPageRenders) {
  test::TempDir tmp("histpdf");
  const std::string pdf = tmp.path("worst_act_hist_result.pdf");
  analysis::write_histogram_pdf(pdf, sample_plots());
  EXPECT_EQ(pdf_pages(pdf), 3);
  // No temporary file is left next to the result.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);

  int rc = -1;
  const std::string out = run("pdftoppm -r 30 -png '" + pdf + "' '" + tmp.path("page") + "'", &rc);
  ASSERT_EQ(rc, 0) << out;
  // Blue bar pixels inside the plot frame (85..600 x 105..505 pt at 30/72 px per pt).
  const double k = 30.0 / 72.0;
  std::vector<int> bar_pixels;
  for (int page = 1; page <= 3; ++page) {
    const std::string png = tmp.path("page-" + std::to_string(page) + ".png");
    ASSERT_TRUE(std::filesystem::exists(png)) << png;
    EXPECT_GT(std::filesystem::file_size(png), 0u);
    cv::Mat img = cv::imread(png, cv::IMREAD_COLOR);
    ASSERT_FALSE(img.empty()) << png;
    EXPECT_GT(img.cols, img.rows);  // landscape
    int blue = 0;
    for (int y = static_cast<int>(105 * k) + 2; y < static_cast<int>(505 * k) - 1; ++y)
      for (int x = static_cast<int>(85 * k) + 2; x < static_cast<int>(600 * k) - 1; ++x) {
        const cv::Vec3b p = img.at<cv::Vec3b>(y, x);  // BGR
        if (p[0] > p[2] + 40 && p[0] < 235) ++blue;
      }
    bar_pixels.push_back(blue);
  }
  EXPECT_GT(bar_pixels[0], 100);  // heavy-tailed activation
  EXPECT_GT(bar_pixels[1], 100);  // weight
  EXPECT_EQ(bar_pixels[2], 0);    // all-zero histogram: axes and a note, no bars
}

TEST(HistogramPdf, NoPlotsStillGivesAValidOnePageFile) {
  test::TempDir tmp("histpdf_empty");
  const std::string pdf = tmp.path("best_weight_hist_result.pdf");
  analysis::write_histogram_pdf(pdf, {});
  EXPECT_EQ(pdf_pages(pdf), 1);
}

TEST(HistogramPdf, UnwritablePathIsAnIoErrorAndLeavesTheOldFile) {
  test::TempDir tmp("histpdf_io");
  const auto plots = sample_plots();
  EXPECT_EQ(kind_of([&] { analysis::write_histogram_pdf(tmp.path("missing/dir/x.pdf"), plots); }), ErrorKind::kIo);
  EXPECT_EQ(kind_of([&] { analysis::write_histogram_pdf(tmp.path(), plots); }), ErrorKind::kIo);  // a directory
  std::ofstream(tmp.path("file")) << "x";
  EXPECT_EQ(kind_of([&] { analysis::write_histogram_pdf(tmp.path("file/x.pdf"), plots); }), ErrorKind::kIo);

  // A failed write never replaces an existing report.
  const std::string pdf = tmp.path("r.pdf");
  analysis::write_histogram_pdf(pdf, {plots[1]});
  const auto size = std::filesystem::file_size(pdf);
  auto bad = plots;
  bad[0].lo = std::nan("");
  EXPECT_EQ(kind_of([&] { analysis::write_histogram_pdf(pdf, bad); }), ErrorKind::kInvalidArgument);
  bad = plots;
  bad[1].counts[3] = -1;
  EXPECT_EQ(kind_of([&] { analysis::write_histogram_pdf(pdf, bad); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::filesystem::file_size(pdf), size);
  EXPECT_EQ(pdf_pages(pdf), 1);
}

}  // namespace
