// analyze / analyze-qat from the command line: resume after SIGKILL, the reproduce command of the
// target search, and bad inputs with their exit codes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "analysis/analysis_test_util.h"

using namespace slimquant;
using test::last_json_line;
using test::file_bytes;
using test::pdf_pages;

namespace {


std::vector<std::string> analyze_args(const std::string& save_dir) {
  return {"--quiet", "analyze", test::fixture_model("resnet_small"), "fashion-mnist:test", "--limit", "1000",
          "--eval-batch-size", "10", "--batch-nums", "4", "--metric", "sqnr", "--num-histogram-plots", "0",
          "--save-dir", save_dir};
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (size_t i = 1; i < args.size(); ++i) s += (i > 1 ? " " : "") + args[i];
  return s;
}

TEST(AnalyzeCli, ResumeAfterSigkillGivesTheSameAnalysisTxt) {
  test::TempDir tmp("resume");
  const std::string killed = tmp.path("killed"), clean = tmp.path("clean");
  const std::string checkpoint = killed + "/analysis_checkpoint.json";
  const auto args = analyze_args(killed);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<char*> argv;
    std::string exe = test::cli_path();
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    setenv("OMP_NUM_THREADS", "1", 1);
    if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  // Kill it once a checkpoint with some, not all, batches done is on disk.
  size_t done_at_kill = 0, total = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, WNOHANG), 0) << "analysis finished before it could be killed";
    if (std::filesystem::exists(checkpoint)) {
      try {
        auto j = nlohmann::json::parse(file_bytes(checkpoint));
        done_at_kill = j["state"]["batches_done"].get<size_t>();
        total = j["state"]["batches_total"].get<size_t>();
      } catch (const std::exception&) {
        FAIL() << "checkpoint is not valid JSON: writes are not atomic";
      }
      if (done_at_kill >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_GT(done_at_kill, 0u);
  ASSERT_LT(done_at_kill, total);
  EXPECT_FALSE(std::filesystem::exists(killed + "/analysis.txt"));

  auto resumed = test::run_cli_single_threaded(joined(args));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed after"), std::string::npos) << resumed.output;
  auto fresh = test::run_cli_single_threaded(joined(analyze_args(clean)));
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_EQ(fresh.output.find("resumed after"), std::string::npos);
  const std::string a = file_bytes(killed + "/analysis.txt"), b = file_bytes(clean + "/analysis.txt");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

TEST(AnalyzeCli, TargetSearchPrintsACommandThatRebuildsTheModel) {
  test::TempDir tmp("target_cli");
  const std::string common = test::fixture_model("resnet_small") + " fashion-mnist:test --limit 256 --batch-size 32 --batch-nums 4 --algo abs_max";
  auto q = test::run_cli_single_threaded("quantize " + common + " --metric sqnr --json -o " + tmp.path("int8.onnx"));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const double int8 = last_json_line(q.output)["int8_sqnr"].get<double>();
  std::ostringstream target;
  target << int8 + 6.0;
  auto r = test::run_cli_single_threaded("analyze " + common + " --metric sqnr --num-histogram-plots 0 --json --save-dir " +
                         tmp.path("out") + " --target-metric " + target.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  ASSERT_TRUE(j.contains("target")) << r.output;
  EXPECT_TRUE(j["target"]["met"].get<bool>()) << r.output;
  std::string cmd = j["target"]["command"].get<std::string>();
  ASSERT_EQ(cmd.rfind("slimquant quantize ", 0), 0u) << cmd;
  EXPECT_NE(cmd.find("--skip-nodes"), std::string::npos) << cmd;
  auto again = test::run_cli_single_threaded(cmd.substr(std::string("slimquant ").size()) + " --no-eval");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const std::string chosen = file_bytes(tmp.path("out/target_model.onnx"));
  EXPECT_FALSE(chosen.empty());
  EXPECT_EQ(chosen, file_bytes(tmp.path("out/target_model_requantized.onnx")));
  if (j["target"].contains("command_skip_tensor_list")) {
    std::string by_tensor = j["target"]["command_skip_tensor_list"].get<std::string>();
    auto t = test::run_cli_single_threaded(by_tensor.substr(std::string("slimquant ").size()) + " --no-eval");
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_EQ(chosen, file_bytes(tmp.path("out/target_model_requantized.onnx"))) << by_tensor;
  }
}

TEST(AnalyzeCli, BadInputsFailWithClearMessages) {
  test::TempDir tmp("analyze_bad");
  const std::string model = test::fixture_model("resnet_small");
  auto missing = test::run_cli_single_threaded("analyze " + model + " npy:" + tmp.path("no_such_dir") + " --save-dir " + tmp.path("o1"));
  EXPECT_EQ(missing.exit_code, 7) << missing.output;
  EXPECT_NE(missing.output.find("no_such_dir"), std::string::npos) << missing.output;

  auto metric = test::run_cli_single_threaded("analyze " + model + " fashion-mnist:test --limit 64 --metric f1 --save-dir " + tmp.path("o2"));
  EXPECT_EQ(metric.exit_code, 5) << metric.output;
  EXPECT_NE(metric.output.find("unknown metric 'f1'"), std::string::npos) << metric.output;

  std::ofstream(tmp.path("a_file")) << "x";
  auto unwritable = test::run_cli_single_threaded("analyze " + model + " fashion-mnist:test --limit 64 --save-dir " + tmp.path("a_file/sub"));
  EXPECT_EQ(unwritable.exit_code, 7) << unwritable.output;
  EXPECT_NE(unwritable.output.find("save-dir"), std::string::npos) << unwritable.output;

  auto no_model = test::run_cli_single_threaded("analyze " + tmp.path("missing.onnx") + " fashion-mnist:test --limit 64 --save-dir " + tmp.path("o3"));
  EXPECT_EQ(no_model.exit_code, 7) << no_model.output;

  auto qat_no_float = test::run_cli_single_threaded("analyze-qat --quant-model " + model + " fashion-mnist:test --limit 64 --save-dir " + tmp.path("o4"));
  EXPECT_EQ(qat_no_float.exit_code, 5) << qat_no_float.output;
  EXPECT_NE(qat_no_float.output.find("--float-model"), std::string::npos) << qat_no_float.output;

  auto qat_float = test::run_cli_single_threaded("analyze-qat --quant-model " + model + " --float-model " + model +
                                 " fashion-mnist:test --limit 64 --save-dir " + tmp.path("o5"));
  EXPECT_EQ(qat_float.exit_code, 5) << qat_float.output;
  EXPECT_NE(qat_float.output.find("no quantized layer"), std::string::npos) << qat_float.output;
}

TEST(AnalyzeCli, HistogramPdfsAndStatistics) {
  if (std::system("command -v pdfinfo >/dev/null && command -v pdftoppm >/dev/null") != 0)
    GTEST_SKIP() << "poppler-utils not installed";
  test::TempDir tmp("analyze_pdf");
  // vit_small: its attention MatMuls have no constant weight, yet every weight PDF gets 3 pages.
  auto r = test::run_cli_single_threaded("analyze " + test::fixture_model("vit_small") + " fashion-mnist:test --limit 128 --batch-nums 2 "
               "--metric cosine --num-histogram-plots 3 --statistics --save-dir " + tmp.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Cosine distances of single layers are ~1e-5: the ranking must show them, not 0.0000.
  EXPECT_NE(r.output.find("1. "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("cosine distance 0.0000  loss"), std::string::npos) << r.output;
  for (const std::string f : {"best_weight_hist_result.pdf", "best_act_hist_result.pdf", "worst_weight_hist_result.pdf",
                              "worst_act_hist_result.pdf"}) {
    EXPECT_EQ(pdf_pages(tmp.path(f)), 3) << f;
    EXPECT_EQ(std::system(("pdftoppm -r 20 -png '" + tmp.path(f) + "' '" + tmp.path("page") + "' >/dev/null 2>&1").c_str()), 0) << f;
  }
  std::ifstream csv(tmp.path("statistics.csv"));
  size_t lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 1u + 18u);  // header + one row per layer
}

TEST(AnalyzeCli, HistogramPlotCountComesFromTheFlagThenTheConfigThenTheDefault) {
  if (std::system("command -v pdfinfo >/dev/null") != 0) GTEST_SKIP() << "poppler-utils not installed";
  test::TempDir tmp("analyze_plot_count");
  std::ofstream(tmp.path("a.yaml")) << "num_histogram_plots: 2\n";
  const std::string base = "analyze " + test::fixture_model("resnet_small") +
                           " fashion-mnist:test --limit 64 --batch-nums 1 --metric sqnr --config " + tmp.path("a.yaml");
  auto from_config = test::run_cli_single_threaded(base + " --save-dir " + tmp.path("c"));
  ASSERT_EQ(from_config.exit_code, 0) << from_config.output;
  EXPECT_EQ(pdf_pages(tmp.path("c/best_weight_hist_result.pdf")), 2);
  auto from_flag = test::run_cli_single_threaded(base + " --num-histogram-plots 1 --save-dir " + tmp.path("f"));
  ASSERT_EQ(from_flag.exit_code, 0) << from_flag.output;
  EXPECT_EQ(pdf_pages(tmp.path("f/best_weight_hist_result.pdf")), 1);
}

TEST(AnalyzeCli, QatFromYamlWithResume) {
  test::TempDir tmp("qat_cli");
  const std::string model = test::fixture_model("resnet_small");
  auto q = test::run_cli_single_threaded("quantize " + model + " fashion-mnist:test --limit 128 --batch-nums 2 --no-eval -o " + tmp.path("q.onnx"));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  std::ofstream(tmp.path("qat.yaml")) << "quant_model_dir: " << tmp.path("q.onnx") << "\nfloat_model_dir: " << model
                                      << "\nquantizable_op_type: [conv2d, mul]\nqat_metric: None\nsave_dir: "
                                      << tmp.path("out") << "\nresume: true\nmetric: top1\n";
  auto r = test::run_cli_single_threaded("analyze-qat fashion-mnist:test --limit 128 --json --config " + tmp.path("qat.yaml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["kind"], "qat");
  EXPECT_FALSE(j["qat_metric_given"].get<bool>());
  const std::string first = file_bytes(tmp.path("out/analysis.txt"));
  auto again = test::run_cli_single_threaded("analyze-qat fashion-mnist:test --limit 128 --config " + tmp.path("qat.yaml"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("resumed after"), std::string::npos) << again.output;
  EXPECT_EQ(first, file_bytes(tmp.path("out/analysis.txt")));
}

}  // namespace
