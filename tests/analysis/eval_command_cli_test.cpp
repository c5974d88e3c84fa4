// User-supplied evaluation from the command line (--eval-command, --eval-key, --metric-direction) in
// analyze, analyze-qat, the target search and quantize; and the command-line hygiene around it
// (no default data set, PaddleSlim's underscore flag names, plain progress lines, analysis.txt's header).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "analysis/analysis_test_util.h"
#include "slimquant/analysis/user_metric.h"
#include "slimquant/core/error.h"

using namespace slimquant;
using test::last_json_line;
using test::file_bytes;

namespace {

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(file_bytes(path)); }


// The PTQ analysis of resnet_small on 32 test images, calibrated on them.
std::string analyze_base(const std::string& save_dir) {
  return "analyze " + test::fixture_model("resnet_small") +
         " fashion-mnist:test --limit 32 --batch-size 16 --batch-nums 2 --num-histogram-plots 0 --save-dir " + save_dir;
}

// `slimquant eval` of the candidate on the same images: the built-in metric, computed by a program.
std::string eval_command_for(const std::string& metric) {
  return test::cli_path() + " eval --simulate {model} fashion-mnist:test --limit 32 --json --threads 1 --metric " +
         metric + " --reference " + test::fixture_model("resnet_small");
}

// A shell script printing the model file's size in bytes: a metric that is fast, exact and differs
// between candidates (a layer kept in float keeps its float weights).
std::string write_size_script(const test::TempDir& tmp) {
  const std::string path = tmp.path("size.sh");
  std::ofstream(path) << "#!/bin/sh\nstat -c %s \"$1\"\n";
  return "sh " + path + " {model}";
}

TEST(EvalCommandCli, RankingMatchesTheBuiltInMetricComputedByAProgram) {
  test::TempDir tmp("eval_command_rank");
  // sqnr: higher is better (the default direction); cosine distance: lower is better.
  for (const std::string metric : {"sqnr", "cosine"}) {
    const std::string builtin = tmp.path(metric + "_builtin"), by_command = tmp.path(metric + "_command");
    auto a = test::run_cli_single_threaded(analyze_base(builtin) + " --metric " + metric);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    auto b = test::run_cli_single_threaded(analyze_base(by_command) + " --eval-command '" + eval_command_for(metric) + "' --eval-key " + metric +
                 (metric == "cosine" ? " --metric-direction lower" : ""));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    const auto ja = read_json(builtin + "/analysis.json"), jb = read_json(by_command + "/analysis.json");
    EXPECT_EQ(jb["metric"], metric);
    EXPECT_EQ(jb["higher_is_better"], metric == "sqnr");
    ASSERT_EQ(ja["layers"].size(), 17u);
    ASSERT_EQ(jb["layers"].size(), ja["layers"].size());
    std::map<std::string, double> builtin_metric;
    for (const auto& l : ja["layers"]) builtin_metric[l["name"]] = l["metric"].get<double>();
    // The sweep reuses the FP32 prefix where the program runs whole models: the float inputs of a
    // quantized layer can differ in the last bit (oneDNN's kernels sum in an ISA-dependent order),
    // which moves an activation lying on a rounding boundary to the next code. Measured on an AVX2
    // AMD EPYC: SQNR up to 0.006 dB apart, cosine distances (about 1e-7) up to 0.1% apart.
    auto tolerance = [&](double x) { return metric == "sqnr" ? 0.02 : 0.01 * std::abs(x) + 1e-11; };
    for (size_t i = 0; i < ja["layers"].size(); ++i) {
      const auto &la = ja["layers"][i], &lb = jb["layers"][i];
      const double x = la["metric"].get<double>();
      EXPECT_NEAR(builtin_metric.at(lb["name"]), lb["metric"].get<double>(), tolerance(x)) << metric << " " << lb["name"];
      // Same layer at each rank, except between layers whose metrics tie within that rounding.
      if (lb["name"] != la["name"]) {
        EXPECT_NEAR(builtin_metric.at(lb["name"]), x, tolerance(x)) << metric << " rank " << i + 1 << ": " << la["name"]
                                                                    << " vs " << lb["name"];
      }
    }
    // analysis.txt names the metric and its direction in its header.
    const std::string header = file_bytes(by_command + "/analysis.txt").substr(0, 64);
    EXPECT_EQ(header.rfind("# ptq analysis, metric " + metric + " (" + (metric == "sqnr" ? "higher" : "lower"), 0), 0u)
        << header;
  }
}

TEST(EvalCommandCli, AFailingCommandIsAClearErrorAndFinishedLayersStay) {
  test::TempDir tmp("eval_command_fail");
  // Fails with exit code 3 on its 5th run only (FP32 + 3 layers done before it).
  const std::string script = tmp.path("flaky.sh"), counter = tmp.path("runs");
  std::ofstream(script) << "#!/bin/sh\nn=$(cat " << counter << " 2>/dev/null || echo 0)\nn=$((n + 1))\necho $n > "
                        << counter << "\nif [ $n -eq 5 ]; then echo 'out of GPU memory' >&2; exit 3; fi\n"
                        << "echo '{\"mAP\": 0.5, \"runs\": '$n'}'\n";
  const std::string args = analyze_base(tmp.path("out")) + " --eval-command 'sh " + script + " {model}' --eval-key mAP";
  auto failed = test::run_cli_single_threaded(args);
  EXPECT_EQ(failed.exit_code, 5) << failed.output;
  EXPECT_NE(failed.output.find("--eval-command 'sh " + script + " {model}' failed with exit code 3"), std::string::npos)
      << failed.output;
  EXPECT_NE(failed.output.find("out of GPU memory"), std::string::npos) << failed.output;  // its stderr passes through
  const auto checkpoint = read_json(tmp.path("out/analysis_checkpoint.json"));
  EXPECT_EQ(checkpoint["state"]["done"].size(), 3u) << checkpoint.dump();

  auto resumed = test::run_cli_single_threaded(args + " --json");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed after 3 layers"), std::string::npos) << resumed.output;
  EXPECT_EQ(file_bytes(counter), "19\n");  // 5 runs, then the 14 layers left: no finished layer ran again
  EXPECT_EQ(last_json_line(resumed.output)["metric"], "mAP");
}

TEST(EvalCommandCli, BadOutputAndBadFlagsAreErrors) {
  test::TempDir tmp("eval_command_bad");
  const std::string base = analyze_base(tmp.path("out"));
  std::ofstream(tmp.path("map.sh")) << "#!/bin/sh\necho '{\"map\": 1}'\n";
  auto no_key = test::run_cli_single_threaded(base + " --eval-command 'sh " + tmp.path("map.sh") + " {model}' --eval-key mAP");
  EXPECT_EQ(no_key.exit_code, 5) << no_key.output;
  EXPECT_NE(no_key.output.find("has no field 'mAP'"), std::string::npos) << no_key.output;
  auto text = test::run_cli_single_threaded(analyze_base(tmp.path("out2")) + " --eval-command 'echo done {model}'");
  EXPECT_EQ(text.exit_code, 5) << text.output;
  EXPECT_NE(text.output.find("neither a finite number nor a JSON object"), std::string::npos) << text.output;
  auto no_placeholder = test::run_cli_single_threaded(analyze_base(tmp.path("out3")) + " --eval-command 'echo 1'");
  EXPECT_EQ(no_placeholder.exit_code, 5) << no_placeholder.output;
  EXPECT_NE(no_placeholder.output.find("has no {model}"), std::string::npos) << no_placeholder.output;
  // Flag combinations that cannot mean anything are command-line errors.
  EXPECT_EQ(test::run_cli_single_threaded(base + " --eval-key mAP").exit_code, 2);
  EXPECT_EQ(test::run_cli_single_threaded(base + " --metric-direction lower").exit_code, 2);
  EXPECT_EQ(test::run_cli_single_threaded(base + " --metric top1 --eval-command 'echo 1 {model}'").exit_code, 2);
  EXPECT_EQ(test::run_cli_single_threaded(base + " --eval-command 'echo 1 {model}' --metric-direction sideways").exit_code, 2);
}

TEST(EvalCommandCli, ParsesNumbersAndJsonObjects) {
  EXPECT_EQ(analysis::parse_metric_output("loading\n0.75\n\n", "metric", "c"), 0.75);
  EXPECT_EQ(analysis::parse_metric_output("{\"metric\": 3, \"x\": 1}\n", "metric", "c"), 3.0);
  EXPECT_EQ(analysis::parse_metric_output("1.0\n{\"mAP\": -2.5e-1}", "mAP", "c"), -0.25);
  EXPECT_THROW(analysis::parse_metric_output("{\"metric\": \"high\"}", "metric", "c"), Error);
  EXPECT_THROW(analysis::parse_metric_output("0.5 points", "metric", "c"), Error);
  EXPECT_THROW(analysis::parse_metric_output("nan", "metric", "c"), Error);
  EXPECT_THROW(analysis::parse_metric_output("", "metric", "c"), Error);
  EXPECT_EQ(analysis::substitute_model_path("run {model} --out {model}.txt", "/t/it's.onnx"),
            "run '/t/it'\\''s.onnx' --out '/t/it'\\''s.onnx'.txt");
}

TEST(EvalCommandCli, AnalyzeQatTargetSearchAndQuantizeTakeIt) {
  test::TempDir tmp("eval_command_qat");
  const std::string size = write_size_script(tmp), model = test::fixture_model("resnet_small");
  auto q = test::run_cli_single_threaded("quantize " + model + " fashion-mnist:test --limit 32 --batch-size 16 --batch_nums 2 --json -o " + tmp.path("q.onnx") +
               " --eval-command '" + size + "' --eval-key size");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto jq = last_json_line(q.output);
  EXPECT_EQ(jq["calib_batches"], 2);  // --batch_nums: PaddleSlim's spelling of --batch-nums
  // The program scored the model files themselves: the FP32 input and the QDQ output.
  EXPECT_EQ(jq["fp32_size"].get<double>(), static_cast<double>(std::filesystem::file_size(model)));
  EXPECT_EQ(jq["int8_size"].get<double>(), static_cast<double>(std::filesystem::file_size(tmp.path("q.onnx"))));

  // analyze-qat: de-quantizing a layer restores its float weights, so every candidate is larger.
  auto qat = test::run_cli_single_threaded("analyze-qat --quant-model " + tmp.path("q.onnx") + " --float-model " + model + " --save-dir " +
                 tmp.path("qat") + " --eval-command '" + size + "' --metric-direction lower --json");
  ASSERT_EQ(qat.exit_code, 0) << qat.output;
  const auto jqat = read_json(tmp.path("qat/analysis.json"));
  ASSERT_EQ(jqat["layers"].size(), 17u);
  for (const auto& l : jqat["layers"]) {
    EXPECT_GT(l["metric"].get<double>(), jqat["qat_metric"].get<double>()) << l["name"];
    EXPECT_LT(l["gain"].get<double>(), 0) << l["name"];  // larger is worse: a negative gain
  }
  EXPECT_EQ(file_bytes(tmp.path("qat/analysis.txt")).rfind("# qat analysis, metric metric (lower is better), qat ", 0), 0u);

  // Target search: the fewest float layers that make the model at least `target` bytes.
  const double int8_bytes = jq["int8_size"].get<double>(), fp32_bytes = jq["fp32_size"].get<double>();
  const double target = int8_bytes + 0.25 * (fp32_bytes - int8_bytes);
  auto t = test::run_cli_single_threaded(analyze_base(tmp.path("target")) + " --eval-command '" + size + "' --target-metric " +
               std::to_string(static_cast<long long>(target)) + " --json");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const auto jt = last_json_line(t.output)["target"];
  EXPECT_TRUE(jt["met"].get<bool>()) << jt.dump();
  EXPECT_GE(jt["best_metric"].get<double>(), static_cast<long long>(target));
  EXPECT_GT(jt["skipped"].size(), 0u);
  EXPECT_LT(jt["skipped"].size(), 17u);
  // The best model the search saved is the one it measured.
  EXPECT_EQ(jt["best_metric"].get<double>(), static_cast<double>(std::filesystem::file_size(tmp.path("target/target_model.onnx"))));
}

TEST(CliHygiene, AModelWithoutDataIsAnError) {
  test::TempDir tmp("no_data");
  const std::string model = test::fixture_model("resnet_small");
  auto q = test::run_cli_single_threaded("quantize " + model + " -o " + tmp.path("q.onnx"));
  EXPECT_EQ(q.exit_code, 5) << q.output;
  EXPECT_NE(q.output.find("quantize: the calibration needs DATA"), std::string::npos) << q.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.path("q.onnx")));
  auto a = test::run_cli_single_threaded("analyze " + model + " --save-dir " + tmp.path("a"));
  EXPECT_EQ(a.exit_code, 5) << a.output;
  EXPECT_NE(a.output.find("analyze: the calibration needs DATA"), std::string::npos) << a.output;
  auto e = test::run_cli_single_threaded("eval " + model);
  EXPECT_EQ(e.exit_code, 5) << e.output;
  EXPECT_NE(e.output.find("eval needs DATA"), std::string::npos) << e.output;
}

TEST(CliHygiene, UnderscoreFlagNamesAreAliasesOfTheDashedOnes) {
  test::TempDir tmp("underscore");
  auto r = test::run_cli_single_threaded("quantize " + test::fixture_model("resnet_small") +
               " fashion-mnist:test --limit 32 --batch_size 16 --batch_nums=1 --weight_quantize_type abs_max --no-eval --json -o " +
               tmp.path("q.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = last_json_line(r.output);
  EXPECT_EQ(j["calib_batches"], 1);
  EXPECT_NE(r.output.find("abs_max, 8-bit"), std::string::npos) << r.output;
  // Values keep their underscores; unknown names still fail as before.
  EXPECT_EQ(test::run_cli_single_threaded("quantize x.onnx d --no_such_flag -o y.onnx").exit_code, 2);
}

TEST(CliHygiene, PlainProgressWritesWholeLinesForLogs) {
  test::TempDir tmp("plain_progress");
  const std::string cmd = test::cli_path() + " quantize " + test::fixture_model("resnet_small") +
                          " fashion-mnist:test --limit 48 --batch-size 16 --batch-nums 2 --no-eval -o " + tmp.path("q.onnx") +
                          " --progress plain 2>" + tmp.path("stderr.txt") + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string err = file_bytes(tmp.path("stderr.txt"));
  EXPECT_NE(err.find("calibrate 2/2 batches"), std::string::npos) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << err;
  EXPECT_EQ(err.find('\033'), std::string::npos) << err;
  // Not a terminal and no mode: silent, as before.
  const std::string quiet = test::cli_path() + " quantize " + test::fixture_model("resnet_small") +
                            " fashion-mnist:test --limit 32 --batch-size 16 --batch-nums 2 --no-eval -o " + tmp.path("q2.onnx") +
                            " 2>" + tmp.path("stderr2.txt") + " >/dev/null";
  ASSERT_EQ(std::system(quiet.c_str()), 0);
  EXPECT_EQ(file_bytes(tmp.path("stderr2.txt")), "");
}

// analyze counts model runs (the base model's and each layer's, per batch), so that a run of few
// batches at high resolution still shows its rate and time left.
TEST(CliHygiene, AnalyzeProgressCountsModelRuns) {
  test::TempDir tmp("analyze_progress");
  const std::string cmd = test::cli_path() + " analyze " + test::fixture_model("resnet_small") +
                          " fashion-mnist:test --limit 16 --batch-size 16 --batch-nums 1 --eval-batch-size 8 --algo abs_max"
                          " --metric sqnr --num-histogram-plots 0 --save-dir " + tmp.path("out") +
                          " --progress plain 2>" + tmp.path("stderr.txt") + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const size_t layers = read_json(tmp.path("out/analysis.json")).at("layers").size();
  ASSERT_GT(layers, 10u);
  const std::string err = file_bytes(tmp.path("stderr.txt"));
  const std::string done = std::to_string(2 * (layers + 1));  // 2 batches of 8
  EXPECT_NE(err.find("analyze " + done + "/" + done + " model runs"), std::string::npos) << err;
  EXPECT_NE(err.find("batch 2/2"), std::string::npos) << err;
}

}  // namespace
