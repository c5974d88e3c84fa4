// slimquant_latency MODEL SHAPE RUNS [WARMUP]: one thread, RUNS timed Session::run calls on a fixed
// input of SHAPE (after WARMUP untimed ones, 5 by default), QDQ models by integer execution as the
// CLI does.
// Prints one JSON line: median wall ms, and median process CPU ms per run. On a shared machine
// the wall time of a run includes time the process was preempted; its CPU time does not, so the
// CPU-time median is the steadier figure for comparing runtimes (bench/compare_runtimes.js reads
// both; ONNX Runtime gets the same two measurements there).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: slimquant_latency MODEL SHAPE RUNS [WARMUP]   (SHAPE like 32x3x224x224)\n");
    return 2;
  }
  try {
    std::vector<int64_t> shape;
    for (const char* p = argv[2]; *p != '\0';) {
      char* end = nullptr;
      shape.push_back(std::strtoll(p, &end, 10));
      if (end == p || shape.back() <= 0) throw std::runtime_error(std::string("bad shape '") + argv[2] + "'");
      p = *end == 'x' ? end + 1 : end;
    }
    const int runs = std::stoi(argv[3]);
    const int warmup = argc == 5 ? std::stoi(argv[4]) : 5;
    ir::Graph g = ir::load_onnx(argv[1]);
    runtime::SessionOptions options;
    options.num_threads = 1;
    runtime::Session session = quant::has_qdq_nodes(g) ? quant::make_int8_session(g, options)
                                                       : runtime::Session(std::move(g), options);
    Tensor x(DType::kFloat32, shape);
    float* p = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.f;
    const std::map<std::string, Tensor> feeds = {{session.inputs().at(0).name, x}};
    // Then on while the session times its part sizes for this batch (PartChoice).
    for (int i = 0; i < warmup || (session.choosing_part_size() && i < warmup + 4 * runtime::PartChoice::kChoosingRuns); ++i)
      session.run(feeds);
    std::vector<double> wall, cpu;
    for (int i = 0; i < runs; ++i) {
      const double c0 = cpu_ms();
      const auto t0 = std::chrono::steady_clock::now();
      session.run(feeds);
      wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      cpu.push_back(cpu_ms() - c0);
    }
    // Minima too: on a loaded shared machine the fastest run is the least disturbed one.
    std::printf("{\"median_ms\": %.6f, \"cpu_median_ms\": %.6f, \"min_ms\": %.6f, \"cpu_min_ms\": %.6f, \"runs\": %d}\n",
                median(wall), median(cpu), *std::min_element(wall.begin(), wall.end()),
                *std::min_element(cpu.begin(), cpu.end()), runs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slimquant_latency: %s\n", e.what());
    return 1;
  }
  return 0;
}
