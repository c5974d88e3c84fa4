// Fuzz target: an image list ("images:LIST" data sets): the list text, then opening the data set
// (which decodes the first image) and loading up to a few samples. The folder holds two small valid
// images, "gray.pgm" and "color.ppm", that lists may name; an optional second part of the input
// (after fuzz::kPartSeparator) is written as "fuzz.img", so image decoding and its size limits
// are fuzzed too.
#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "slimquant/data/dataset.h"

namespace {

// Binary netpbm: a header and raw 8-bit samples, decoded by OpenCV without any codec library.
std::string netpbm(char kind, int channels, int width, int height) {
  std::string bytes = std::string("P") + kind + "\n" + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
  for (int i = 0; i < width * height * channels; ++i) bytes.push_back(static_cast<char>(i * 37 % 256));
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slimquant;
  const auto [list, image] = fuzz::split_parts(data, size);
  fuzz::clear_scratch_dir();
  const auto& dir = fuzz::scratch_dir();
  fuzz::write_file(dir / "gray.pgm", netpbm('5', 1, 6, 4));
  fuzz::write_file(dir / "color.ppm", netpbm('6', 3, 6, 4));
  if (image) fuzz::write_file(dir / "fuzz.img", *image);
  fuzz::write_file(dir / "list.txt", list);

  fuzz::expect_clean_errors([&] {
    data::DataOptions options;
    options.spec = "images:" + (dir / "list.txt").string();
    const auto dataset = data::open_dataset(options);
    std::vector<float> sample(static_cast<size_t>(dataset->sample_numel()));
    for (size_t i = 0; i < std::min<size_t>(dataset->size(), 4); ++i) {
      dataset->load(i, sample.data());
      if (dataset->has_labels()) (void)dataset->label(i);
    }
  });
  return 0;
}
