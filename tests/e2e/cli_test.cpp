// The command line as users meet it: good paths produce the documented JSON, bad inputs produce
// a specific message and a non-zero exit code.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

using namespace slimquant;
using test::run_cli;

namespace {

using test::last_json_line;

const std::string kModel = test::fixture_model("resnet_small");

TEST(Cli, InfoListsInputsOutputsAndOps) {
  auto r = run_cli("info " + kModel + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["inputs"][0]["name"], "input");
  EXPECT_EQ(j["outputs"][0]["name"], "logits");
  EXPECT_GT(j["op_counts"]["Conv"].get<int>(), 0);
  EXPECT_GT(j["parameters"].get<int64_t>(), 100000);
}

TEST(Cli, RunWritesOutputNpy) {
  test::TempDir tmp("cli_run");
  auto r = run_cli("run " + kModel + " --input input=" + test::source_path("tests/fixtures/models/resnet_small.input.npy") +
                   " --output-dir " + tmp.path("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Tensor out = read_npy(tmp.path("out/logits.npy"));
  EXPECT_EQ(out.shape(), (Shape{8, 10}));
}

// The kernel choices timed at a first run are kept on disk (SLIMQUANT_TUNING_CACHE), and the next
// process reads them instead of timing again: its file is unchanged and its outputs are the same.
TEST(Cli, KernelChoicesTimedOnceAreReusedByTheNextProcess) {
  test::TempDir tmp("cli_choices");
  const std::string cache = tmp.path("cache/choices.tsv");
  const std::string cmd = "run " + kModel + " --input input=" +
                          test::source_path("tests/fixtures/models/resnet_small.input.npy") + " --output-dir ";
  const std::string env = "SLIMQUANT_TUNING_CACHE=" + cache;
  auto first = run_cli(cmd + tmp.path("first"), env);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::ifstream in(cache);
  std::string machine, line;
  ASSERT_TRUE(std::getline(in, machine)) << "no choice file written";
  EXPECT_NE(machine.find("oneDNN"), std::string::npos) << machine;
  size_t entries = 0;
  while (std::getline(in, line)) entries += line.find('\t') != std::string::npos;
  EXPECT_GT(entries, 0u) << "the convolutions' choices";
  const auto written = std::filesystem::last_write_time(cache);
  auto second = run_cli(cmd + tmp.path("second"), env);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(std::filesystem::last_write_time(cache), written) << "the second run timed again";
  const Tensor a = read_npy(tmp.path("first/logits.npy")), b = read_npy(tmp.path("second/logits.npy"));
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(Cli, EvalJsonLastLine) {
  auto r = run_cli("eval " + kModel + " --dataset fashion-mnist:test --limit 200 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["samples"], 200);
  EXPECT_GT(j["top1"].get<double>(), 0.8);
}

TEST(Cli, BenchJsonLastLine) {
  auto r = run_cli("bench " + kModel + " --shape 1x1x28x28 --runs 5 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = last_json_line(r.output);
  EXPECT_EQ(j["runs"], 5);
  EXPECT_GT(j["median_ms"].get<double>(), 0);
  EXPECT_LE(j["min_ms"].get<double>(), j["median_ms"].get<double>());
}

TEST(CliBadInput, TruncatedModel) {
  test::TempDir tmp("trunc");
  std::ifstream in(kModel, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(tmp.path("t.onnx"), std::ios::binary).write(bytes.data(), 5000);
  auto r = run_cli("info " + tmp.path("t.onnx"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("not a valid ONNX model"), std::string::npos) << r.output;
}

TEST(CliBadInput, BufferCacheSizeThatIsNotANumberIsNamed) {
  // 512 images of 28x28: the first buffer of 1 MiB or more reads the setting.
  const auto r = run_cli("bench " + std::string(kModel) + " --shape 512x1x28x28 --runs 1 --warmup 0",
                         "SLIMQUANT_BUFFER_CACHE_MB=lots");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SLIMQUANT_BUFFER_CACHE_MB='lots' is not a number of megabytes"), std::string::npos)
      << r.output;
  EXPECT_EQ(run_cli("bench " + std::string(kModel) + " --shape 512x1x28x28 --runs 1 --warmup 0",
                    "SLIMQUANT_BUFFER_CACHE_MB=64").exit_code, 0);
}

TEST(CliBadInput, NotAnOnnxFile) {
  test::TempDir tmp("text");
  std::ofstream(tmp.path("x.onnx")) << "this is plain text, not a model\n";
  auto r = run_cli("eval " + tmp.path("x.onnx") + " --dataset fashion-mnist:test --limit 10");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("x.onnx"), std::string::npos) << r.output;
}

// A Paddle inference model (seed 000/002's model_dir) is refused with exit 4 (unsupported) and the
// paddle2onnx command for it, by every command and in every form: the files themselves, a folder
// holding them, a folder plus model_filename.
TEST(CliBadInput, PaddleModelIsRefusedWithThePaddle2OnnxCommand) {
  test::TempDir tmp("paddle");
  std::filesystem::create_directories(tmp.path("infer"));
  std::filesystem::create_directories(tmp.path("old"));
  std::ofstream(tmp.path("infer/inference.pdmodel")) << "paddle program";
  std::ofstream(tmp.path("infer/inference.pdiparams")) << "paddle weights";
  std::ofstream(tmp.path("old/__model__")) << "paddle program";
  const std::string calib = " fashion-mnist:train --limit 32 --no-eval -o " + tmp.path("q.onnx");
  struct Case {
    std::string command, words;
  };
  const std::string named = "--model_dir " + tmp.path("infer") + " --model_filename inference.pdmodel "
                            "--params_filename inference.pdiparams --save_file model.onnx";
  const std::vector<Case> cases = {
      {"info " + tmp.path("infer/inference.pdmodel"), named},
      {"info " + tmp.path("infer/inference.pdiparams"), named},
      {"quantize " + tmp.path("infer") + calib, named},
      {"eval " + tmp.path("infer") + " fashion-mnist:test --limit 8", named},
      {"analyze " + tmp.path("infer") + " fashion-mnist:test --limit 8 --save-dir " + tmp.path("a"), named},
      {"info " + tmp.path("old"), "paddle2onnx --model_dir " + tmp.path("old") + " --save_file model.onnx"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.command);
    EXPECT_EQ(r.exit_code, 4) << c.command << "\n" << r.output;
    EXPECT_NE(r.output.find("is a PaddlePaddle model"), std::string::npos) << c.command << "\n" << r.output;
    EXPECT_NE(r.output.find(c.words), std::string::npos) << c.command << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.path("q.onnx")));
  // A folder holding an .onnx file next to Paddle files is an ONNX model folder.
  std::filesystem::copy_file(kModel, tmp.path("infer/model.onnx"));
  auto ok = run_cli("info " + tmp.path("infer"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST(CliBadInput, MissingModelFile) {
  auto r = run_cli("info /nonexistent/model.onnx");
  EXPECT_EQ(r.exit_code, 7) << r.output;
}

TEST(CliBadInput, UnsupportedOpIsNamedWithItsNode) {
  test::TempDir tmp("unsup");
  ir::Graph g = ir::load_onnx(kModel);
  g.nodes.back().op_type = "NotARealOp";
  g.nodes.back().name = "the_last_node";
  std::ofstream(tmp.path("u.onnx"), std::ios::binary) << ir::serialize_onnx(g);
  auto r = run_cli("bench " + tmp.path("u.onnx") + " --shape 1x1x28x28 --runs 1");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("NotARealOp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the_last_node"), std::string::npos) << r.output;
}

TEST(CliBadInput, WrongInputName) {
  test::TempDir tmp("name");
  auto r = run_cli("run " + kModel + " --input pixels=" +
                   test::source_path("tests/fixtures/models/resnet_small.input.npy") + " --output-dir " + tmp.path());
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("'pixels'"), std::string::npos) << r.output;
}

TEST(CliBadInput, WrongInputShape) {
  test::TempDir tmp("shape");
  write_npy(tmp.path("x.npy"), Tensor(DType::kFloat32, {1, 3, 32, 32}));
  auto r = run_cli("run " + kModel + " --input input=" + tmp.path("x.npy") + " --output-dir " + tmp.path("o"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("[1x3x32x32]"), std::string::npos) << r.output;
}

TEST(CliBadInput, NpyOfWrongDtype) {
  test::TempDir tmp("dtype");
  write_npy(tmp.path("x.npy"), Tensor(DType::kInt32, {1, 1, 28, 28}));
  auto r = run_cli("run " + kModel + " --input input=" + tmp.path("x.npy") + " --output-dir " + tmp.path("o"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("int32"), std::string::npos) << r.output;
}

TEST(CliBadInput, MissingDatasetDirectory) {
  auto r = run_cli("eval " + kModel + " --dataset fashion-mnist:test", "SLIMQUANT_FASHION_MNIST_DIR=/nonexistent/fmnist");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/fmnist"), std::string::npos) << r.output;
  auto r2 = run_cli("eval " + kModel + " --dataset npy:/nonexistent/npydir");
  EXPECT_EQ(r2.exit_code, 7) << r2.output;
}

TEST(CliBadInput, UnwritableOutputDirectory) {
  auto r = run_cli("run " + kModel + " --input input=" + test::source_path("tests/fixtures/models/resnet_small.input.npy") +
                   " --output-dir /proc/forbidden");
  EXPECT_EQ(r.exit_code, 7) << r.output;
}

}  // namespace
