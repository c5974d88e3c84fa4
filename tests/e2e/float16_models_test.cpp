// Models stored in 16-bit floats (tests/fixtures/make_float16_models.py: a whole-float16 model, a
// float16 model behind a float32 interface, bfloat16 weights behind Casts) run as their float32
// sources do, keep their types and size when saved, quantize, and their exports keep the
// interface and load in ONNX Runtime.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "e2e/onnx_runtime_peer.h"
#include "test_util.h"

using namespace slimquant;

namespace {

struct Form {
  const char* file;    // under tests/fixtures/models/float16
  const char* source;  // the float32 fixture it was made from
  int interface_type;  // stored type of input and output (0: float32)
  int weight_type;     // stored type of the weights
};

const Form kForms[] = {
    {"mobilenetv2_small.float16.onnx", "mobilenetv2_small", kOnnxFloat16, kOnnxFloat16},
    {"vit_small.float16_io32.onnx", "vit_small", 0, kOnnxFloat16},
    {"resnet_small.bfloat16_weights.onnx", "resnet_small", 0, kOnnxBFloat16},
};

std::string form_path(const Form& f) { return test::source_path(std::string("tests/fixtures/models/float16/") + f.file); }

Tensor fixture_input(const Form& f) {
  return read_npy(test::source_path(std::string("tests/fixtures/models/") + f.source + ".input.npy"));
}

Tensor run_logits(ir::Graph g, const Tensor& input) {
  runtime::Session session(std::move(g));
  return session.run({{"input", input}}).at("logits");
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  float worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

std::vector<int64_t> argmax_rows(const Tensor& logits) {
  const std::vector<float> v = logits.to_float_vector();
  const int64_t classes = logits.dim(1);
  std::vector<int64_t> out;
  for (int64_t r = 0; r < logits.dim(0); ++r)
    out.push_back(std::max_element(v.begin() + r * classes, v.begin() + (r + 1) * classes) - (v.begin() + r * classes));
  return out;
}

class Float16Models : public ::testing::TestWithParam<Form> {};

// The weights are read as the 16-bit values they are: the model computes what its float32 source
// computes, within the weights' rounding (float16 keeps 11 significant bits, bfloat16 8).
TEST_P(Float16Models, RunsAsItsFloat32SourceWithinTheStoredRounding) {
  const Form& f = GetParam();
  const ir::Graph g = ir::load_onnx(form_path(f));
  EXPECT_EQ(g.inputs.at(0).dtype, DType::kFloat32);
  EXPECT_EQ(g.outputs.at(0).dtype, DType::kFloat32);
  if (f.interface_type) {
    EXPECT_EQ(g.stored_float_types.at("input"), f.interface_type);
    EXPECT_EQ(g.stored_float_types.at("logits"), f.interface_type);
  } else {
    EXPECT_FALSE(g.stored_float_types.count("input"));
  }
  size_t weights = 0;
  for (const auto& [name, t] : g.initializers) {
    if (t.dtype() != DType::kFloat32 || t.numel() < 16) continue;
    ASSERT_TRUE(g.stored_float_types.count(name)) << name << " lost its stored type";
    EXPECT_EQ(g.stored_float_types.at(name), f.weight_type) << name;
    ++weights;
  }
  EXPECT_GT(weights, 8u);
  // bfloat16 weights are read through Casts in the file: held as plain weights here.
  for (const auto& n : g.nodes) {
    if (n.op_type == "Cast") {
      EXPECT_FALSE(g.is_initializer(n.input(0))) << n.describe() << " reads a weight";
    }
  }

  const Tensor input = fixture_input(f);
  const Tensor ours = run_logits(g, input);
  const Tensor source = run_logits(ir::load_onnx(test::fixture_model(f.source)), input);
  const Tensor pytorch = read_npy(test::source_path(std::string("tests/fixtures/models/") + f.source + ".logits.npy"));
  const float range = std::abs(*std::max_element(pytorch.data<float>(), pytorch.data<float>() + pytorch.numel())) +
                      std::abs(*std::min_element(pytorch.data<float>(), pytorch.data<float>() + pytorch.numel()));
  // float16: about 2^-11 relative per weight; bfloat16 2^-8; summed over a few layers.
  const float tolerance = (f.weight_type == kOnnxBFloat16 ? 0.02f : 0.004f) * range;
  EXPECT_LT(max_abs_diff(ours, source), tolerance);
  EXPECT_GT(max_abs_diff(ours, source), 0.0f) << "the 16-bit weights were not the ones read";
  EXPECT_EQ(argmax_rows(ours), argmax_rows(pytorch));
}

// A 16-bit model compiles to its float32 source's graph (the same ops after the session's passes)
// plus Casts at its interface (rounding a 16-bit input or output, or the float16_io32 form's Cast to
// float writing its output, which shares its input's storage): no conversion is left between. (The
// float16 forms of lraspp and PP-OCR once ran 1.6-4x slower with this same plan: their output's
// rounding Cast converted by soft-float calls; core/float16.h, docs/model_forms.md.)
TEST_P(Float16Models, CompilesToItsSourcesGraphPlusCastsAtTheInterface) {
  const Form& f = GetParam();
  const runtime::Session form(ir::load_onnx(form_path(f)));
  const runtime::Session source(ir::load_onnx(test::fixture_model(f.source)));
  std::map<std::string, int> form_ops, source_ops;
  for (const auto& n : source.graph().nodes) ++source_ops[n.op_type];
  const ir::Graph& g = form.graph();
  for (const auto& n : g.nodes) {
    const bool reads_input =
        std::any_of(g.inputs.begin(), g.inputs.end(), [&](const auto& v) { return v.name == n.input(0); });
    if (n.op_type == "Cast" && (reads_input || g.is_graph_output(n.outputs[0]))) continue;
    EXPECT_FALSE(n.op_type == "Cast" && n.has_attr(ir::kCastRoundsToAttr)) << n.describe() << " rounds inside the graph";
    ++form_ops[n.op_type];
  }
  EXPECT_EQ(form_ops, source_ops);
}

// Saving writes the stored types back: 16-bit weights behind Casts, 16-bit inputs and outputs, so
// the file does not grow; loading it again gives the same graph, without more Casts.
TEST_P(Float16Models, SavedFileKeepsTypesSizeAndValues) {
  const Form& f = GetParam();
  test::TempDir tmp("fp16_save");
  const ir::Graph g = ir::load_onnx(form_path(f));
  ir::save_onnx(g, tmp.path("once.onnx"));
  const ir::Graph once = ir::load_onnx(tmp.path("once.onnx"));
  ir::save_onnx(once, tmp.path("twice.onnx"));
  const ir::Graph twice = ir::load_onnx(tmp.path("twice.onnx"));
  const auto original_size = std::filesystem::file_size(form_path(f));
  // The weights' bytes are the same; a whole-float16 file gains one Cast per weight (about 90 bytes
  // each: 5% of this 0.2 MB model, nothing for a real one).
  EXPECT_LT(std::filesystem::file_size(tmp.path("once.onnx")), original_size + original_size * 6 / 100);
  EXPECT_EQ(std::filesystem::file_size(tmp.path("once.onnx")), std::filesystem::file_size(tmp.path("twice.onnx")));
  EXPECT_EQ(once.stored_float_types, g.stored_float_types);
  EXPECT_EQ(twice.nodes.size(), once.nodes.size());
  EXPECT_EQ(once.nodes.size(), g.nodes.size());
  for (const auto& [name, t] : g.initializers) {
    ASSERT_TRUE(once.is_initializer(name)) << name;
    EXPECT_EQ(max_abs_diff(once.initializers.at(name), t), 0.0f) << name;
  }
  const Tensor input = fixture_input(f);
  EXPECT_EQ(max_abs_diff(run_logits(once, input), run_logits(g, input)), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Forms, Float16Models, ::testing::ValuesIn(kForms),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           name = name.substr(0, name.find(".onnx"));
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

// A Cast to float16 keeps what float16 keeps: rounding to nearest even, overflow to infinity.
TEST(Float16Cast, RoundsAsTheStoredTypeDoes) {
  EXPECT_EQ(round_to_16bit_float(1.0f + 1.0f / 4096, kOnnxFloat16), 1.0f);           // below half an ulp
  EXPECT_EQ(round_to_16bit_float(1.0f + 3.0f / 2048, kOnnxFloat16), 1.0f + 2.0f / 1024);  // tie to even
  EXPECT_TRUE(std::isinf(round_to_16bit_float(70000.0f, kOnnxFloat16)));
  EXPECT_EQ(round_to_16bit_float(65504.0f, kOnnxFloat16), 65504.0f);
  EXPECT_EQ(round_to_16bit_float(1.0f + 1.0f / 256, kOnnxBFloat16), 1.0f);  // tie to even (mantissa 0)
  EXPECT_EQ(round_to_16bit_float(1.0f + 3.0f / 256, kOnnxBFloat16), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(round_to_16bit_float(std::nanf(""), kOnnxBFloat16)));
  EXPECT_EQ(float_from_16bit(0x3C00, kOnnxFloat16), 1.0f);
  EXPECT_EQ(float_from_16bit(0x0001, kOnnxFloat16), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_from_16bit(0x3F80, kOnnxBFloat16), 1.0f);
}

}  // namespace

namespace {

using test::last_json_line;


// The whole-float16 model through the command line: info names the types, run writes float16 and
// equals ONNX Runtime within float16 rounding, quantize exports a smaller file with the same
// interface, which ONNX Runtime 1.20 and the latest load and run as we do.
TEST(Float16Cli, InfoRunQuantizeKeepTheInterfaceAndMatchOnnxRuntime) {
  test::TempDir tmp("fp16_cli");
  const Form& f = kForms[0];
  const std::string model = form_path(f);
  auto info = test::run_cli("info " + model + " --json");
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_EQ(last_json_line(info.output)["inputs"][0]["dtype"], "float16");
  EXPECT_EQ(last_json_line(info.output)["outputs"][0]["dtype"], "float16");

  Tensor input32 = fixture_input(f);
  Tensor input16(DType::kUInt16, input32.shape());
  for (int64_t i = 0; i < input32.numel(); ++i)
    input16.data<uint16_t>()[i] = float_to_16bit(input32.data<float>()[i], kOnnxFloat16);
  const std::string input_path = tmp.path("input16.npy");
  {  // a float16 .npy, as numpy writes it
    write_npy_float16(input_path, widen_float16(input16));
  }
  auto run = test::run_cli("run " + model + " --input input=" + input_path + " --output-dir " + tmp.path("fp"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("logits float16[8x10]"), std::string::npos) << run.output;
  EXPECT_TRUE(read_npy_header(tmp.path("fp/logits.npy")).stored_float16);
  const Tensor ours = read_npy(tmp.path("fp/logits.npy"));

  auto q = test::run_cli("quantize " + model + " --dataset fashion-mnist:train --limit 64 --batch-size 32 "
                         "--eval-dataset fashion-mnist:test -o " + tmp.path("q.onnx") + " --json");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  const auto j = last_json_line(q.output);
  EXPECT_GT(j["int8_top1"].get<double>(), 0.75);
  EXPECT_LE(std::abs(j["int8_top1"].get<double>() - j["fp32_top1"].get<double>()), 0.06);
  EXPECT_LT(std::filesystem::file_size(tmp.path("q.onnx")), std::filesystem::file_size(model));
  auto qinfo = test::run_cli("info " + tmp.path("q.onnx") + " --json");
  ASSERT_EQ(qinfo.exit_code, 0) << qinfo.output;
  EXPECT_EQ(last_json_line(qinfo.output)["inputs"][0]["dtype"], "float16");
  EXPECT_EQ(last_json_line(qinfo.output)["outputs"][0]["dtype"], "float16");
  auto qrun = test::run_cli("run " + tmp.path("q.onnx") + " --input input=" + input_path + " --output-dir " +
                            tmp.path("int8"));
  ASSERT_EQ(qrun.exit_code, 0) << qrun.output;
  const Tensor ours_int8 = read_npy(tmp.path("int8/logits.npy"));
  EXPECT_EQ(argmax_rows(ours_int8), argmax_rows(ours));

  if (!test::have_onnx_runtime()) GTEST_SKIP() << "Node.js / onnxruntime-node not installed";
  const float range = 20.0f;  // the logits span about this much
  for (const char* package : {"onnxruntime-node", "onnxruntime-node-latest"}) {
    const Tensor ort_fp = test::onnx_runtime_logits(package, model, input_path, tmp.path(std::string("ort_fp_") + package));
    EXPECT_LT(max_abs_diff(ort_fp, ours), 0.004f * range) << package;
    const Tensor ort_q = test::onnx_runtime_logits(package, tmp.path("q.onnx"), input_path, tmp.path(std::string("ort_q_") + package));
    EXPECT_EQ(argmax_rows(ort_q), argmax_rows(ours_int8)) << package;
    EXPECT_LT(max_abs_diff(ort_q, ours_int8), 0.05f * range) << package;
  }
}

}  // namespace
