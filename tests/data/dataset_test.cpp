// Data sets: Fashion-MNIST (Debian's files and synthetic IDX files), image lists (PNGs written
// here with OpenCV), .npy directories, preprocessing numbers, batching, and every bad-input error.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "data/opencv.h"
#include "slimquant/core/npy.h"
#include "slimquant/data/batch.h"
#include "slimquant/data/dataset.h"
#include "slimquant/data/idx.h"

namespace slimquant::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDebianFashionMnist = "/usr/share/datasets/fashion-mnist";

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an Error";
  return Error(ErrorKind::kInternal, "");
}

bool contains(const Error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("slimquant_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(path(name), std::ios::binary) << text;
  }

  fs::path dir_;
};

// ---------------------------------------------------------------- Fashion-MNIST (Debian's files)

class FashionMnistTest : public DataTest {
 protected:
  void SetUp() override {
    DataTest::SetUp();
    if (!fs::is_directory(kDebianFashionMnist))
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
};

TEST_F(FashionMnistTest, TestSplitHasKnownSizeLabelsAndPixels) {
  ScopedEnv env("SLIMQUANT_FASHION_MNIST_DIR", "");  // the default location
  auto ds = open_dataset({.spec = "fashion-mnist"});
  EXPECT_EQ(ds->name(), "fashion-mnist");
  ASSERT_EQ(ds->size(), 10000u);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 28, 28}));
  ASSERT_TRUE(ds->has_labels());
  // The first ten labels of t10k-labels-idx1-ubyte (class 9 = ankle boot).
  const int64_t first_labels[] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(ds->label(i), first_labels[i]) << i;

  const Tensor s = ds->sample(0);
  const float* p = s.data<float>();
  double sum = 0;
  float max = 0;
  for (int i = 0; i < 784; ++i) {
    sum += p[i];
    max = std::max(max, p[i]);
  }
  // Image 0's uint8 pixels sum to 33456, peak at 255, pixel (14,14) is 110 and (10,10) is 0.
  EXPECT_NEAR(sum, 33456.0 / 255.0, 1e-3);
  EXPECT_EQ(max, 1.0f);
  EXPECT_FLOAT_EQ(p[14 * 28 + 14], 110.f / 255.f);
  EXPECT_EQ(p[10 * 28 + 10], 0.f);

  // Every pixel of a later image equals the IDX byte / 255.
  const Tensor raw = read_idx(std::string(kDebianFashionMnist) + "/t10k-images-idx3-ubyte.gz");
  ASSERT_EQ(raw.shape(), (Shape{10000, 28, 28}));
  const Tensor last = ds->sample(9999);
  for (int i = 0; i < 784; ++i)
    ASSERT_EQ(last.data<float>()[i], raw.data<uint8_t>()[9999 * 784 + i] * (1.f / 255.f)) << i;
}

TEST_F(FashionMnistTest, TrainSplitLimitAndSplitNames) {
  auto train = open_dataset({.spec = "fashion-mnist:train"});
  EXPECT_EQ(train->size(), 60000u);
  const int64_t first_labels[] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(train->label(i), first_labels[i]) << i;
  const Tensor s = train->sample(0);
  double sum = 0;
  for (float v : s.values<float>()) sum += v;
  EXPECT_NEAR(sum, 76247.0 / 255.0, 1e-3);
  EXPECT_FLOAT_EQ(s.data<float>()[14 * 28 + 14], 217.f / 255.f);

  auto test = open_dataset({.spec = "fashion-mnist:test", .limit = 100});
  EXPECT_EQ(test->size(), 100u);
  const Error e = error_of([&] { test->sample(100); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::string(e.what()),
            "sample index 100 out of range for data set 'fashion-mnist:test' (100 samples)");
}

TEST_F(FashionMnistTest, MeanStdResizeAndChannels) {
  auto ds = open_dataset({.spec = "fashion-mnist", .mean = {0.5f}, .stddev = {0.25f}});
  const Tensor s = ds->sample(0);
  EXPECT_FLOAT_EQ(s.data<float>()[14 * 28 + 14], (110.f / 255.f - 0.5f) / 0.25f);
  EXPECT_FLOAT_EQ(s.data<float>()[0], -2.f);

  // Shrinking by 2 averages 2x2 blocks (area interpolation).
  const Tensor raw = read_idx(std::string(kDebianFashionMnist) + "/t10k-images-idx3-ubyte.gz");
  const uint8_t* px = raw.data<uint8_t>();
  auto small = open_dataset({.spec = "fashion-mnist", .resize = ImageSize{14, 14}});
  EXPECT_EQ(small->sample_shape(), (Shape{1, 14, 14}));
  const Tensor r = small->sample(0);
  for (int y = 0; y < 14; ++y)
    for (int x = 0; x < 14; ++x) {
      const int sum = px[(2 * y) * 28 + 2 * x] + px[(2 * y) * 28 + 2 * x + 1] +
                      px[(2 * y + 1) * 28 + 2 * x] + px[(2 * y + 1) * 28 + 2 * x + 1];
      ASSERT_NEAR(r.data<float>()[y * 14 + x], sum / 4.f / 255.f, 1e-6) << y << "," << x;
    }

  // channels=3 replicates the gray plane, then per-channel mean/std apply.
  auto rgb = open_dataset({.spec = "fashion-mnist",
                           .mean = {0.f, 0.5f, 1.f},
                           .stddev = {1.f, 2.f, 4.f},
                           .channels = 3});
  EXPECT_EQ(rgb->sample_shape(), (Shape{3, 28, 28}));
  const Tensor c = rgb->sample(0);
  const float v = 110.f / 255.f;
  const int at = 14 * 28 + 14;
  EXPECT_FLOAT_EQ(c.data<float>()[at], v);
  EXPECT_FLOAT_EQ(c.data<float>()[784 + at], (v - 0.5f) / 2.f);
  EXPECT_FLOAT_EQ(c.data<float>()[2 * 784 + at], (v - 1.f) / 4.f);
}

// ---------------------------------------------------------------- Fashion-MNIST (synthetic IDX)

std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int k = 3; k >= 0; --k) out += static_cast<char>((d >> (8 * k)) & 0xFF);
  return out + data;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST_F(DataTest, FashionMnistFromOverrideDirectoryRawAndGzipped) {
  // Three 2x3 images: pixel value = 10*image + position; images uncompressed, labels gzipped.
  std::string pixels;
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 6; ++k) pixels += static_cast<char>(10 * i + k);
  write_text("fm/t10k-images-idx3-ubyte", idx_bytes(0x08, {3, 2, 3}, pixels));
  write_gz(path("fm/t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {3}, std::string("\x04\x00\x02", 3)));
  ScopedEnv env("SLIMQUANT_FASHION_MNIST_DIR", path("fm"));
  EXPECT_EQ(fashion_mnist_dir(), path("fm"));

  auto ds = open_dataset({.spec = "fashion-mnist:test"});
  ASSERT_EQ(ds->size(), 3u);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(ds->label(0), 4);
  EXPECT_EQ(ds->label(1), 0);
  EXPECT_EQ(ds->label(2), 2);
  const Tensor s = ds->sample(2);
  for (int k = 0; k < 6; ++k) EXPECT_FLOAT_EQ(s.data<float>()[k], (20 + k) / 255.f);

  // Missing train files in an existing directory.
  Error e = error_of([&] { open_dataset({.spec = "fashion-mnist:train"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()),
            "Fashion-MNIST file " + path("fm") + "/train-images-idx3-ubyte.gz not found");

  // Label count disagreeing with the image count.
  write_gz(path("fm/t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {2}, std::string("\x04\x00", 2)));
  e = error_of([&] { open_dataset({.spec = "fashion-mnist"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), "Fashion-MNIST t10k split: 3 images but 2 labels");

  // Bad magic number.
  write_gz(path("fm/t10k-labels-idx1-ubyte.gz"), "\x01\x02\x08\x01garbage");
  e = error_of([&] { open_dataset({.spec = "fashion-mnist"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()),
            path("fm/t10k-labels-idx1-ubyte.gz") + ": not an IDX file (bad magic number)");

  // Truncated image data.
  write_gz(path("fm/t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {3}, std::string("\x04\x00\x02", 3)));
  write_text("fm/t10k-images-idx3-ubyte", idx_bytes(0x08, {3, 2, 3}, pixels.substr(0, 17)));
  e = error_of([&] { open_dataset({.spec = "fashion-mnist"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), path("fm/t10k-images-idx3-ubyte") +
                                       ": header says 18 uint8 values (shape [3x2x3]), file holds "
                                       "17 data bytes");
}

TEST_F(DataTest, FashionMnistMissingDirectory) {
  ScopedEnv env("SLIMQUANT_FASHION_MNIST_DIR", path("absent"));
  const Error e = error_of([&] { open_dataset({.spec = "fashion-mnist"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()),
            "Fashion-MNIST not found at " + path("absent") +
                " (install Debian's dataset-fashion-mnist or set SLIMQUANT_FASHION_MNIST_DIR)");
}

TEST_F(DataTest, ReadIdxBigEndianTypes) {
  // int16 [2] = {-2, 258} and float32 [1] = {1.5}, big-endian as IDX stores them.
  write_text("a.idx", idx_bytes(0x0B, {2}, std::string("\xff\xfe\x01\x02", 4)));
  EXPECT_EQ(read_idx(path("a.idx")).to_int64_vector(), (std::vector<int64_t>{-2, 258}));
  write_text("b.idx", idx_bytes(0x0D, {1}, std::string("\x3f\xc0\x00\x00", 4)));
  EXPECT_EQ(read_idx(path("b.idx")).to_float_vector(), std::vector<float>{1.5f});
}

// ---------------------------------------------------------------- images:LIST

class ImageListTest : public DataTest {
 protected:
  void SetUp() override {
    DataTest::SetUp();
    // a.png: 4x4 colour with B = 10+y*4+x, G = 100+y*4+x, R = 200+y*4+x (OpenCV writes BGR).
    cv::Mat a(4, 4, CV_8UC3);
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x)
        a.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uint8_t>(10 + y * 4 + x),
                                          static_cast<uint8_t>(100 + y * 4 + x),
                                          static_cast<uint8_t>(200 + y * 4 + x));
    fs::create_directories(dir_ / "sub");
    ASSERT_TRUE(cv::imwrite(path("a.png"), a));
    // sub/b.png: 4x4 uniform colour (B, G, R) = (30, 60, 90).
    ASSERT_TRUE(cv::imwrite(path("sub/b.png"), cv::Mat(4, 4, CV_8UC3, cv::Scalar(30, 60, 90))));
    // c.png: 8x8 grayscale, value 7*x.
    cv::Mat c(8, 8, CV_8UC1);
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x) c.at<uint8_t>(y, x) = static_cast<uint8_t>(7 * x);
    ASSERT_TRUE(cv::imwrite(path("c.png"), c));
  }
  static float at(const Tensor& t, int c, int y, int x) {
    const int64_t h = t.dim(1), w = t.dim(2);
    return t.data<float>()[(c * h + y) * w + x];
  }
};

TEST_F(ImageListTest, DecodesRgbChwWithLabels) {
  write_text("list.txt", "a.png 3\n\n  sub/b.png\t1  \r\n");
  auto ds = open_dataset({.spec = "images:" + path("list.txt")});
  ASSERT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->sample_shape(), (Shape{3, 4, 4}));
  ASSERT_TRUE(ds->has_labels());
  EXPECT_EQ(ds->label(0), 3);
  EXPECT_EQ(ds->label(1), 1);
  const Tensor s = ds->sample(0);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      EXPECT_FLOAT_EQ(at(s, 0, y, x), (200 + y * 4 + x) / 255.f);  // R
      EXPECT_FLOAT_EQ(at(s, 1, y, x), (100 + y * 4 + x) / 255.f);  // G
      EXPECT_FLOAT_EQ(at(s, 2, y, x), (10 + y * 4 + x) / 255.f);   // B
    }
  const Tensor b = ds->sample(1);
  EXPECT_FLOAT_EQ(at(b, 0, 3, 3), 90 / 255.f);
  EXPECT_FLOAT_EQ(at(b, 2, 0, 0), 30 / 255.f);
}

TEST_F(ImageListTest, BgrOrderAndPerChannelMeanStd) {
  write_text("list.txt", "a.png\nsub/b.png\n");
  auto ds = open_dataset({.spec = "images:" + path("list.txt"),
                          .mean = {0.485f, 0.456f, 0.406f},
                          .stddev = {0.229f, 0.224f, 0.225f},
                          .channel_order = ChannelOrder::kBgr});
  EXPECT_FALSE(ds->has_labels());
  const Tensor s = ds->sample(0);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      // BGR order: channel 0 is blue, and mean[0]/stddev[0] apply to it.
      EXPECT_NEAR(at(s, 0, y, x), ((10 + y * 4 + x) / 255.f - 0.485f) / 0.229f, 1e-5);
      EXPECT_NEAR(at(s, 1, y, x), ((100 + y * 4 + x) / 255.f - 0.456f) / 0.224f, 1e-5);
      EXPECT_NEAR(at(s, 2, y, x), ((200 + y * 4 + x) / 255.f - 0.406f) / 0.225f, 1e-5);
    }
  const Error e = error_of([&] { ds->label(0); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
}

TEST_F(ImageListTest, ResizeShrinksByAreaAndEnlargesBilinearly) {
  write_text("list.txt", "a.png\nc.png\n");
  auto ds = open_dataset({.spec = "images:" + path("list.txt"),
                          .resize = ImageSize{2, 2},
                          .channels = 3});
  EXPECT_EQ(ds->sample_shape(), (Shape{3, 2, 2}));
  const Tensor s = ds->sample(0);
  // Each output pixel averages a 2x2 block: R at (0,0) = mean(200, 201, 204, 205) = 202.5.
  EXPECT_NEAR(at(s, 0, 0, 0), 202.5f / 255.f, 1e-6);
  EXPECT_NEAR(at(s, 0, 1, 1), 212.5f / 255.f, 1e-6);
  EXPECT_NEAR(at(s, 2, 0, 1), 14.5f / 255.f, 1e-6);
  // c.png (8x8 gray, 7*x) -> 2x2 averages 4x4 blocks: columns 0..3 -> 10.5, 4..7 -> 38.5; the gray
  // value is replicated into all three channels.
  const Tensor c = ds->sample(1);
  for (int ch = 0; ch < 3; ++ch) {
    EXPECT_NEAR(at(c, ch, 0, 0), 10.5f / 255.f, 1e-6);
    EXPECT_NEAR(at(c, ch, 1, 1), 38.5f / 255.f, 1e-6);
  }

  // Enlarging a uniform image keeps it uniform; shape follows the resize (height x width).
  write_text("one.txt", "sub/b.png\n");
  auto big = open_dataset({.spec = "images:" + path("one.txt"), .resize = ImageSize{6, 10}});
  EXPECT_EQ(big->sample_shape(), (Shape{3, 6, 10}));
  const Tensor u = big->sample(0);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 10; ++x) EXPECT_NEAR(at(u, 0, y, x), 90 / 255.f, 1e-6);
}

TEST_F(ImageListTest, GrayscaleStaysSingleChannelUnlessAsked) {
  write_text("list.txt", "c.png 0\n");
  auto ds = open_dataset({.spec = "images:" + path("list.txt")});
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 8, 8}));
  EXPECT_FLOAT_EQ(at(ds->sample(0), 0, 5, 3), 21 / 255.f);
  // channels=1 turns colour into luminance: uniform (B,G,R)=(30,60,90) ->
  // 0.299*90 + 0.587*60 + 0.114*30 = 65.55, rounded to 66 by cvtColor (the same for every
  // file format, unlike the decoders' own gray conversions).
  write_text("b.txt", "sub/b.png\n");
  auto gray = open_dataset({.spec = "images:" + path("b.txt"), .channels = 1});
  EXPECT_EQ(gray->sample_shape(), (Shape{1, 4, 4}));
  EXPECT_FLOAT_EQ(at(gray->sample(0), 0, 2, 2), 66 / 255.f);
}

TEST_F(ImageListTest, AbsolutePathsAndLimit) {
  write_text("list.txt", path("a.png") + " 5\nsub/b.png 6\nc.png 7\n");
  auto ds = open_dataset({.spec = "images:" + path("list.txt"), .limit = 2});
  EXPECT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->label(0), 5);
}

TEST_F(ImageListTest, Errors) {
  auto err = [&](const std::string& list_text, DataOptions o = {}) {
    write_text("list.txt", list_text);
    o.spec = "images:" + path("list.txt");
    return error_of([&] {
      auto ds = open_dataset(o);
      for (size_t i = 0; i < ds->size(); ++i) ds->sample(i);
    });
  };
  const std::string list = path("list.txt");

  Error e = error_of([&] { open_dataset({.spec = "images:" + path("none.txt")}); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()), "image list " + path("none.txt") + " not found");

  e = err("a.png\nmissing.png\n");
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()), list + ":2: image 'missing.png' not found (looked at " +
                                       path("missing.png") + ")");

  e = err("a.png 1\nsub/b.png\n");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()),
            list + ":2: 'sub/b.png' has no label but line 1 has one (labels are all-or-none)");

  e = err("\n\n");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), "data set 'images:" + list + "' is empty");

  write_text("junk.png", "this is not a PNG");
  e = err("a.png\njunk.png\n");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()),
            list + ":2: cannot decode image 'junk.png' (" + path("junk.png") + ")");

  // Different sizes need a resize.
  cv::imwrite(path("d.png"), cv::Mat(5, 4, CV_8UC3, cv::Scalar(1, 2, 3)));
  e = err("a.png\nd.png\n");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()),
            list + ":2: image 'd.png' is 5x4 but the first image is 4x4 (images of different sizes "
                   "need a resize, e.g. --resize 4x4)");

  // Grayscale after colour without a channel count.
  e = err("a.png\nc.png\n", {.resize = ImageSize{4, 4}});
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(e, list + ":2: image 'c.png' has 1 channel(s) but the first image has 3")) << e.what();

  // mean with the wrong number of values.
  e = err("a.png\n", {.mean = {0.5f, 0.5f}});
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::string(e.what()), "mean has 2 values but data set 'images:" + list +
                                       "' has 3 channels (give 1 or 3 values)");

  e = err("a.png\n", {.stddev = {0.f}});
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e, "stddev for channel 0 of data set 'images:" + list +
                              "' must be positive and finite")) << e.what();
}

// A header that asks for a huge image is refused before OpenCV allocates it (found by
// fuzz_image_list: a 30 B netpbm file claiming 30000x30000 took 2.7 GB), in each format whose
// header is read: PNG (with a valid IHDR checksum), JPEG, BMP and netpbm.
TEST_F(ImageListTest, HeadersAskingForHugeImagesAreRefusedBeforeDecoding) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                       static_cast<char>(v)};
  };
  auto le32 = [](uint32_t v) {
    return std::string{static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 24)};
  };
  const std::string ihdr = "IHDR" + be32(30000) + be32(30000) + std::string("\x08\x02\x00\x00\x00", 5);
  const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + ihdr +
                          be32(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(ihdr.data()), ihdr.size())));
  const std::string jpeg = std::string("\xFF\xD8\xFF\xE0\x00\x04\x00\x00\xFF\xC0\x00\x11\x08", 13) +
                           std::string("\x75\x30\x75\x30\x03", 5) + std::string(15, '\0');
  const std::string bmp = "BM" + std::string(16, '\0') + le32(30000) + le32(static_cast<uint32_t>(-30000)) +
                          std::string(28, '\0');
  for (const auto& [name, bytes] : {std::pair<std::string, std::string>{"big.png", png},
                                    {"big.jpg", jpeg},
                                    {"big.bmp", bmp},
                                    {"big.ppm", "P6\n# comment\n30000 30000\n255\n\x01\x02\x03"}}) {
    write_text(name, bytes);
    write_text("list.txt", name + " 1\n");
    const Error e = error_of([&] { open_dataset({.spec = "images:" + path("list.txt")}); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData) << name;
    EXPECT_NE(std::string(e.what()).find(path("list.txt") + ":1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(name + "' declares 30000x30000 pixels, more than the limit"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- npy:DIR

TEST_F(DataTest, NpyBatchedFileWithLabels) {
  fs::create_directories(dir_ / "n");
  // [5, 2, 3, 3] float32 with value = sample*100 + position.
  Tensor x(DType::kFloat32, {5, 2, 3, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>((i / 18) * 100 + i % 18);
  write_npy(path("n/calib.npy"), x);
  write_npy(path("n/labels.npy"), Tensor::from_vector<int32_t>({5}, {4, 3, 2, 1, 0}));

  auto ds = open_dataset({.spec = "npy:" + path("n")});
  ASSERT_EQ(ds->size(), 5u);
  EXPECT_EQ(ds->sample_shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(ds->label(1), 3);
  const Tensor s = ds->sample(3);
  for (int k = 0; k < 18; ++k) EXPECT_EQ(s.data<float>()[k], 300.f + k);  // as-is, no /255

  auto norm = open_dataset({.spec = "npy:" + path("n"), .mean = {1.f, 2.f}, .stddev = {2.f, 4.f}, .limit = 2});
  EXPECT_EQ(norm->size(), 2u);
  const Tensor t = norm->sample(1);
  EXPECT_FLOAT_EQ(t.data<float>()[0], (100.f - 1.f) / 2.f);
  EXPECT_FLOAT_EQ(t.data<float>()[9], (109.f - 2.f) / 4.f);

  // Resize applies per plane: 3x3 -> 6x6 of a channel keeps its range; shape follows.
  auto big = open_dataset({.spec = "npy:" + path("n"), .resize = ImageSize{6, 6}});
  EXPECT_EQ(big->sample_shape(), (Shape{2, 6, 6}));
  const Tensor b = big->sample(0);
  EXPECT_FLOAT_EQ(b.data<float>()[0], 0.f);          // corner stays the corner value
  EXPECT_FLOAT_EQ(b.data<float>()[36 + 35], 17.f);   // last pixel of channel 1

  // channels must agree with npy data.
  const Error e = error_of([&] { open_dataset({.spec = "npy:" + path("n"), .channels = 3}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
}

TEST_F(DataTest, NpyBatchedUint8IsScaledAndOtherIntsAreNot) {
  fs::create_directories(dir_ / "u");
  write_npy(path("u/x.npy"), Tensor::from_vector<uint8_t>({2, 1, 2, 1}, {0, 255, 51, 102}));
  auto ds = open_dataset({.spec = "npy:" + path("u")});
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 2, 1}));
  EXPECT_FALSE(ds->has_labels());
  const Tensor u1 = ds->sample(1);
  EXPECT_FLOAT_EQ(u1.data<float>()[0], 0.2f);
  EXPECT_FLOAT_EQ(u1.data<float>()[1], 0.4f);
  fs::create_directories(dir_ / "i");
  write_npy(path("i/x.npy"), Tensor::from_vector<int64_t>({2, 2}, {-3, 1000, 7, 8}));
  EXPECT_EQ(open_dataset({.spec = "npy:" + path("i")})->sample(0).to_float_vector(),
            (std::vector<float>{-3.f, 1000.f}));
}

// Samples for an integer model input (a text model's token ids, raw uint8 images) are fed as that
// type, exactly as stored (uint8 not scaled); a value that is no whole number in range is refused.
TEST_F(DataTest, NpySamplesFeedIntegerInputsAsStored) {
  fs::create_directories(dir_ / "ids");
  write_npy(path("ids/x.npy"), Tensor::from_vector<int64_t>({3, 2}, {101, 2054, 7, 16777216, 0, 999}));
  auto ids = open_dataset({.spec = "npy:" + path("ids"), .sample_dtype = DType::kInt64});
  const Tensor fed = BatchLoader(*ids, 3).batch(0).feeds("input_ids").at("input_ids");
  ASSERT_EQ(fed.dtype(), DType::kInt64);
  EXPECT_EQ(fed.to_int64_vector(), (std::vector<int64_t>{101, 2054, 7, 16777216, 0, 999}));
  fs::create_directories(dir_ / "raw");
  write_npy(path("raw/x.npy"), Tensor::from_vector<uint8_t>({2, 2}, {0, 255, 51, 7}));
  auto raw = open_dataset({.spec = "npy:" + path("raw"), .sample_dtype = DType::kUInt8});
  const Tensor pixels = BatchLoader(*raw, 2).batch(0).feeds("image").at("image");
  ASSERT_EQ(pixels.dtype(), DType::kUInt8);
  EXPECT_EQ(pixels.to_int64_vector(), (std::vector<int64_t>{0, 255, 51, 7}));
  EXPECT_EQ(BatchLoader(*raw, 2).batch(0).inputs.dtype(), DType::kFloat32) << "loaded as float32 as before";

  fs::create_directories(dir_ / "frac");
  write_npy(path("frac/x.npy"), Tensor::from_vector<float>({2, 2}, {1.f, 2.f, 3.5f, 4.f}));
  auto frac = open_dataset({.spec = "npy:" + path("frac"), .sample_dtype = DType::kInt32});
  Error e = error_of([&] { BatchLoader(*frac, 2).batch(0); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("sample 1 holds 3.500000 for a model input of int32"), std::string::npos)
      << e.what();
  write_npy(path("frac/x.npy"), Tensor::from_vector<float>({1, 2}, {1.f, 300.f}));
  auto narrow = open_dataset({.spec = "npy:" + path("frac"), .sample_dtype = DType::kInt8});
  e = error_of([&] { BatchLoader(*narrow, 1).batch(0); });
  EXPECT_NE(std::string(e.what()).find("sample 0 holds 300.000000 for a model input of int8"), std::string::npos)
      << e.what();
  e = error_of([&] { open_dataset({.spec = "npy:" + path("frac"), .sample_dtype = DType::kBool}); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
}

TEST_F(DataTest, NpyPerSampleFilesSortedByName) {
  fs::create_directories(dir_ / "p");
  write_npy(path("p/b.npy"), Tensor::from_vector<double>({1, 2}, {2.0, 2.5}));
  write_npy(path("p/a.npy"), Tensor::from_vector<double>({1, 2}, {1.0, 1.5}));
  write_npy(path("p/c.npy"), Tensor::from_vector<float>({1, 2}, {3.0f, 3.5f}));
  write_npy(path("p/labels.npy"), Tensor::from_vector<float>({3}, {0.f, 1.f, 2.f}));
  write_text("p/readme.txt", "ignored");
  auto ds = open_dataset({.spec = "npy:" + path("p")});
  ASSERT_EQ(ds->size(), 3u);
  EXPECT_EQ(ds->sample_shape(), (Shape{1, 2}));
  EXPECT_EQ(ds->sample(0).to_float_vector(), (std::vector<float>{1.f, 1.5f}));
  EXPECT_EQ(ds->sample(2).to_float_vector(), (std::vector<float>{3.f, 3.5f}));
  EXPECT_EQ(ds->label(2), 2);
}

TEST_F(DataTest, NpyErrors) {
  auto open = [&](const std::string& sub) {
    return error_of([&] {
      auto ds = open_dataset({.spec = "npy:" + path(sub)});
      for (size_t i = 0; i < ds->size(); ++i) ds->sample(i);
    });
  };
  Error e = open("absent");
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()), "npy directory " + path("absent") + " not found");

  fs::create_directories(dir_ / "empty");
  write_npy(path("empty/labels.npy"), Tensor::from_vector<int64_t>({1}, {0}));
  e = open("empty");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), "data set 'npy:" + path("empty") + "' is empty");

  fs::create_directories(dir_ / "zero");
  write_npy(path("zero/x.npy"), Tensor(DType::kFloat32, {0, 3}));
  e = open("zero");
  EXPECT_EQ(std::string(e.what()), "data set 'npy:" + path("zero") + "' is empty");

  // NaN in sample 3 of a batched file, Inf in a per-sample file.
  fs::create_directories(dir_ / "nan");
  Tensor x(DType::kFloat32, {5, 4});
  x.data<float>()[3 * 4 + 2] = std::nanf("");
  write_npy(path("nan/x.npy"), x);
  e = open("nan");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), "npy:" + path("nan") + ": sample 3 (" + path("nan/x.npy") +
                                       " sample 3) holds NaN at element 2");
  fs::create_directories(dir_ / "inf");
  write_npy(path("inf/a.npy"), Tensor::from_vector<float>({2}, {1.f, 2.f}));
  write_npy(path("inf/b.npy"), Tensor::from_vector<double>({2}, {1e300, 2.0}));  // overflows float
  e = open("inf");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()),
            "npy:" + path("inf") + ": sample 1 (" + path("inf/b.npy") + ") holds Inf at element 0");

  fs::create_directories(dir_ / "shapes");
  write_npy(path("shapes/a.npy"), Tensor(DType::kFloat32, {3, 5}));
  write_npy(path("shapes/b.npy"), Tensor(DType::kFloat32, {3, 4}));
  e = open("shapes");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), path("shapes/b.npy") + ": shape [3x4] differs from " +
                                       path("shapes/a.npy") +
                                       "'s [3x5] (per-sample files must all have one shape)");

  fs::create_directories(dir_ / "labels");
  write_npy(path("labels/x.npy"), Tensor(DType::kFloat32, {4, 2}));
  write_npy(path("labels/labels.npy"), Tensor(DType::kInt64, {3}));
  e = open("labels");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), path("labels/labels.npy") + ": holds 3 labels for 4 samples");
  write_npy(path("labels/labels.npy"), Tensor::from_vector<float>({4}, {0.f, 1.5f, 2.f, 3.f}));
  e = open("labels");
  EXPECT_EQ(std::string(e.what()), path("labels/labels.npy") + ": label 1 is 1.500000, not an integer");

  fs::create_directories(dir_ / "fortran");
  write_text("fortran/x.npy", std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                                  "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }" +
                                  std::string(59, ' ') + "\n" + std::string(24, '\0'));
  e = open("fortran");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), path("fortran/x.npy") + ": fortran_order arrays are not supported");
}

// ---------------------------------------------------------------- specs and flag parsing

TEST(DataSpecTest, RejectsUnknownSpecsAndOptions) {
  Error e = error_of([] { open_dataset({.spec = "mnist"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::string(e.what()),
            "unknown data set 'mnist' (expected fashion-mnist, fashion-mnist:train, "
            "fashion-mnist:test, images:LIST_FILE or npy:DIR)");
  e = error_of([] { open_dataset({.spec = "fashion-mnist:val"}); });
  EXPECT_EQ(std::string(e.what()),
            "data set 'fashion-mnist:val': unknown Fashion-MNIST split 'val' (expected train or test)");
  e = error_of([] { open_dataset({.spec = "npy:"}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  e = error_of([] { open_dataset({.spec = "fashion-mnist", .channels = 2}); });
  EXPECT_EQ(std::string(e.what()), "channels must be 0 (as stored), 1 or 3 (got 2)");
}

TEST(DataSpecTest, ParsesFlagValues) {
  EXPECT_EQ(parse_float_list("0.485,0.456,0.406", "--mean"),
            (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(parse_float_list(" [0.5, -1e-3] ", "--std"), (std::vector<float>{0.5f, -1e-3f}));
  EXPECT_EQ(parse_float_list("255", "--std"), std::vector<float>{255.f});
  Error e = error_of([] { parse_float_list("0.5,abc", "--mean"); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(std::string(e.what()), "--mean '0.5,abc': 'abc' is not a finite number");
  e = error_of([] { parse_float_list("1,,2", "--mean"); });
  EXPECT_EQ(std::string(e.what()), "--mean '1,,2': '' is not a finite number");
  e = error_of([] { parse_float_list("", "--mean"); });
  EXPECT_EQ(std::string(e.what()), "--mean '': expected comma-separated numbers");

  EXPECT_EQ(parse_image_size("224x224", "--resize"), (ImageSize{224, 224}));
  EXPECT_EQ(parse_image_size("32X48", "--resize"), (ImageSize{32, 48}));
  EXPECT_EQ(parse_image_size("28", "--resize"), (ImageSize{28, 28}));
  e = error_of([] { parse_image_size("0x5", "--resize"); });
  EXPECT_EQ(std::string(e.what()), "--resize '0x5': sizes must be between 1 and 1048576");
  e = error_of([] { parse_image_size("axb", "--resize"); });
  EXPECT_EQ(std::string(e.what()), "--resize 'axb': 'a' is not an integer");

  EXPECT_EQ(parse_channel_order("RGB", "--channel-order"), ChannelOrder::kRgb);
  EXPECT_EQ(parse_channel_order("bgr", "--channel-order"), ChannelOrder::kBgr);
  e = error_of([] { parse_channel_order("rbg", "--channel-order"); });
  EXPECT_EQ(std::string(e.what()), "--channel-order 'rbg': expected rgb or bgr");
  EXPECT_STREQ(channel_order_name(ChannelOrder::kBgr), "bgr");
}

// ---------------------------------------------------------------- batching

TEST_F(DataTest, BatchLoaderStacksSamplesAndLabels) {
  fs::create_directories(dir_ / "b");
  Tensor x(DType::kFloat32, {5, 2, 2});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i);
  write_npy(path("b/x.npy"), x);
  write_npy(path("b/labels.npy"), Tensor::from_vector<uint8_t>({5}, {9, 8, 7, 6, 5}));
  auto ds = open_dataset({.spec = "npy:" + path("b")});

  BatchLoader loader(*ds, 2);
  ASSERT_EQ(loader.num_batches(), 3u);
  const Batch last = loader.batch(2);
  EXPECT_EQ(last.inputs.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(last.first_index, 4u);
  EXPECT_EQ(last.labels, std::vector<int64_t>{5});
  EXPECT_EQ(last.inputs.to_float_vector(), (std::vector<float>{16, 17, 18, 19}));

  size_t seen = 0, batches = 0;
  for (const Batch& b : loader) {
    EXPECT_EQ(b.first_index, seen);
    for (size_t k = 0; k < b.size(); ++k) {
      EXPECT_EQ(b.labels[k], 9 - static_cast<int64_t>(seen + k));
      EXPECT_EQ(b.inputs.data<float>()[k * 4], static_cast<float>((seen + k) * 4));
    }
    seen += b.size();
    ++batches;
  }
  EXPECT_EQ(seen, 5u);
  EXPECT_EQ(batches, 3u);

  Batch b;
  int n = 0;
  while (loader.next(b)) ++n;
  EXPECT_EQ(n, 3);
  loader.reset();
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 2, 2}));

  EXPECT_EQ(error_of([&] { BatchLoader(*ds, 0); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_of([&] { loader.batch(3); }).kind(), ErrorKind::kInvalidArgument);
}

TEST_F(DataTest, BatchLoaderReportsTheFirstBadSample) {
  fs::create_directories(dir_ / "bad");
  Tensor x(DType::kFloat32, {8, 3});
  x.data<float>()[5 * 3] = INFINITY;
  x.data<float>()[6 * 3 + 1] = NAN;
  write_npy(path("bad/x.npy"), x);
  auto ds = open_dataset({.spec = "npy:" + path("bad")});
  BatchLoader loader(*ds, 8);
  const Error e = error_of([&] { loader.batch(0); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(e, ": sample 5 (")) << e.what();
  EXPECT_TRUE(contains(e, "holds Inf at element 0")) << e.what();
}


// ---------------------------------------------------------------- side inputs (multi-input models)

TEST_F(DataTest, SideInputsPerSampleBroadcastAndOneSample) {
  fs::create_directories(dir_ / "n");
  Tensor x(DType::kFloat32, {3, 1, 2, 2});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i);
  write_npy(path("n/images.npy"), x);
  // im_shape: one row per sample, int64 kept as such; scale_factor: one row for all ([1, 2]);
  // offset: one sample without a batch dimension (model rank 2, array rank 1).
  write_npy(path("im_shape.npy"), Tensor::from_vector<int64_t>({3, 2}, {10, 11, 20, 21, 30, 31}));
  write_npy(path("scale_factor.npy"), Tensor::from_vector<float>({1, 2}, {0.5f, 0.25f}));
  write_npy(path("offset.npy"), Tensor::from_vector<float>({2}, {7.f, 8.f}));

  DataOptions o{.spec = "npy:" + path("n")};
  o.side_inputs = {{"im_shape", path("im_shape.npy"), 2},
                   {"scale_factor", path("scale_factor.npy"), 2},
                   {"offset", path("offset.npy"), 2}};
  auto ds = open_dataset(o);
  ASSERT_EQ(ds->side_inputs().size(), 3u);
  EXPECT_EQ(ds->side_inputs()[0].dtype, DType::kInt64);
  EXPECT_EQ(ds->side_inputs()[0].sample_shape, (Shape{2}));
  EXPECT_EQ(ds->side_inputs()[1].sample_shape, (Shape{2}));
  EXPECT_EQ(ds->side_inputs()[2].sample_shape, (Shape{2}));

  BatchLoader loader(*ds, 2);
  const Batch b = loader.batch(1);  // sample 2 alone
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b.side_inputs.at("im_shape").shape(), (Shape{1, 2}));
  EXPECT_EQ(b.side_inputs.at("im_shape").data<int64_t>()[0], 30);
  EXPECT_EQ(b.side_inputs.at("im_shape").data<int64_t>()[1], 31);
  const Batch a = loader.batch(0);
  ASSERT_EQ(a.side_inputs.at("scale_factor").shape(), (Shape{2, 2}));
  EXPECT_EQ(a.side_inputs.at("scale_factor").to_float_vector(), (std::vector<float>{0.5f, 0.25f, 0.5f, 0.25f}));
  EXPECT_EQ(a.side_inputs.at("offset").to_float_vector(), (std::vector<float>{7.f, 8.f, 7.f, 8.f}));
  EXPECT_EQ(a.side_inputs.at("im_shape").to_int64_vector(), (std::vector<int64_t>{10, 11, 20, 21}));

  const auto feeds = a.feeds("image");
  ASSERT_EQ(feeds.size(), 4u);
  EXPECT_EQ(feeds.at("image").shape(), (Shape{2, 1, 2, 2}));
  EXPECT_EQ(main_input_name({"image", "im_shape", "scale_factor", "offset"}, *ds), "image");
  EXPECT_EQ(main_input_name({"im_shape", "scale_factor", "offset", "image"}, *ds), "image");

  // A limit keeps the first rows of a per-sample array.
  o.limit = 2;
  EXPECT_EQ(open_dataset(o)->size(), 2u);
}

// A recurrent state [layers, batch, hidden]: its rows lie along axis 1, and batches stack its
// samples there; one row for all ([2, 1, H]) and one sample ([2, H]) are repeated there.
TEST_F(DataTest, SideInputsOnTheBatchAxisOfARecurrentState) {
  fs::create_directories(dir_ / "n");
  write_npy(path("n/x.npy"), Tensor(DType::kFloat32, {3, 4}));
  Tensor per_sample(DType::kFloat32, {2, 3, 2});  // value = 100 * layer + 10 * sample + unit
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t h = 0; h < 2; ++h) per_sample.data<float>()[(l * 3 + n) * 2 + h] = static_cast<float>(100 * l + 10 * n + h);
  write_npy(path("state.npy"), per_sample);
  write_npy(path("one_row.npy"), Tensor::from_vector<float>({2, 1, 2}, {1, 2, 3, 4}));
  write_npy(path("one_sample.npy"), Tensor::from_vector<float>({2, 2}, {5, 6, 7, 8}));

  DataOptions o{.spec = "npy:" + path("n")};
  o.side_inputs = {{"state", path("state.npy"), 3, -1, false, 1},
                   {"h0", path("one_row.npy"), 3, -1, false, 1},
                   {"c0", path("one_sample.npy"), 3, -1, false, 1}};
  auto ds = open_dataset(o);
  for (const SideInput& side : ds->side_inputs()) {
    EXPECT_EQ(side.sample_shape, (Shape{2, 2})) << side.name;
    EXPECT_EQ(side.batch_axis, 1u) << side.name;
  }
  BatchLoader loader(*ds, 2);
  const Batch b = loader.batch(0);
  ASSERT_EQ(b.side_inputs.at("state").shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(b.side_inputs.at("state").to_float_vector(), (std::vector<float>{0, 1, 10, 11, 100, 101, 110, 111}));
  EXPECT_EQ(b.side_inputs.at("h0").to_float_vector(), (std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(b.side_inputs.at("c0").to_float_vector(), (std::vector<float>{5, 6, 5, 6, 7, 8, 7, 8}));
  const Batch last = loader.batch(1);  // sample 2 alone
  EXPECT_EQ(last.side_inputs.at("state").shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(last.side_inputs.at("state").to_float_vector(), (std::vector<float>{20, 21, 120, 121}));
}

TEST_F(DataTest, SideInputErrorsNameTheInput) {
  fs::create_directories(dir_ / "n");
  write_npy(path("n/images.npy"), Tensor(DType::kFloat32, {3, 4}));
  write_npy(path("two_rows.npy"), Tensor(DType::kFloat32, {2, 2}));
  Tensor nan(DType::kFloat32, {1, 2});
  nan.data<float>()[1] = std::nanf("");
  write_npy(path("nan.npy"), nan);
  write_npy(path("rank3.npy"), Tensor(DType::kFloat32, {3, 1, 2}));
  const std::string spec = "npy:" + path("n");

  auto open_with = [&](std::vector<SideInputSpec> sides) {
    DataOptions o{.spec = spec};
    o.side_inputs = std::move(sides);
    return open_dataset(o);
  };
  Error e = error_of([&] { open_with({{"scale", path("two_rows.npy"), 2}}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(e, "side input 'scale'") && contains(e, "2 rows for the 3 samples")) << e.what();
  // An input whose first axis the model fixes at 2 and whose shape shows no other batch axis
  // (model_first_dim set): rows along that axis are not samples.
  write_npy(path("state.npy"), Tensor(DType::kFloat32, {2, 1, 4}));
  e = error_of([&] { open_with({{"state", path("state.npy"), 3, 2}}); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_TRUE(contains(e, "side input 'state'") && contains(e, "fixes that input's first axis at 2") &&
              contains(e, "so that axis is not its batch"))
      << e.what();
  // With its batch axis known, the rows are counted there.
  e = error_of([&] { open_with({{"state", path("state.npy"), 3, -1, false, 2}}); });
  EXPECT_TRUE(contains(e, "has 4 rows along its batch axis 2 for the 3 samples")) << e.what();
  e = error_of([&] { open_with({{"scale", path("nan.npy"), 2}}); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(e, "NaN at element 1")) << e.what();
  e = error_of([&] { open_with({{"scale", path("rank3.npy"), 2}}); });
  EXPECT_TRUE(contains(e, "rank 2")) << e.what();
  e = error_of([&] { open_with({{"scale", path("missing.npy"), 2}}); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  write_npy(path("ok.npy"), Tensor(DType::kFloat32, {1, 2}));
  e = error_of([&] { open_with({{"scale", path("ok.npy"), 2}, {"scale", path("ok.npy"), 2}}); });
  EXPECT_TRUE(contains(e, "given twice")) << e.what();

  // Which input the samples feed: exactly one must be left over.
  auto ds = open_with({{"scale", path("rank3.npy"), 0}});
  e = error_of([&] { main_input_name({"image", "im_shape"}, *ds); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e, "'scale' is not an input of the model")) << e.what();
  e = error_of([&] { main_input_name({"image", "scale", "im_shape"}, *ds); });
  EXPECT_TRUE(contains(e, "--side-input") && contains(e, "'im_shape'")) << e.what();
  e = error_of([&] { main_input_name({"scale"}, *ds); });
  EXPECT_TRUE(contains(e, "every model input")) << e.what();
  auto plain = open_dataset({.spec = spec});
  e = error_of([&] { main_input_name({"image", "im_shape"}, *plain); });
  EXPECT_TRUE(contains(e, "has 2 inputs ('image', 'im_shape')")) << e.what();

  EXPECT_EQ(parse_side_input("a=b.npy", "--side-input").path, "b.npy");
  e = error_of([&] { parse_side_input("a.npy", "--side-input"); });
  EXPECT_TRUE(contains(e, "--side-input 'a.npy': expected NAME=FILE.npy")) << e.what();
}

}  // namespace
}  // namespace slimquant::data
