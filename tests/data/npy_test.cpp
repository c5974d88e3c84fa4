// .npy / .npz I/O: round trips for every dtype, byte-exact agreement with files numpy wrote, and
// the error for each kind of bad file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "slimquant/core/npy.h"

namespace slimquant {
namespace {

namespace fs = std::filesystem;

// Files numpy 1.24 wrote (np.lib.format.write_array / np.savez / np.savez_compressed), verbatim.
// Made with: a = np.arange(6, dtype='<i2').reshape(2, 3), written with version=(1,0)/(2,0)/(3,0);
// a float32 Fortran-order [2,3]; np.zeros(3, '<f2'); np.array(2.5); np.array([True, False, True]);
// np.savez[_compressed](x=[[1.5,-2],[0.25,8]] float32, labels=[3,7] int64).
// 140 bytes
const std::string kNumpyV1(
    "\x93NUMPY\x01\x00v\x00{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }      "
    "                                                    \x0a\x00\x00\x01\x00\x02\x00\x03\x00"
    "\x04\x00\x05\x00"
    , 140);
// 140 bytes
const std::string kNumpyV2(
    "\x93NUMPY\x02\x00t\x00\x00\x00{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3),"
    " }                                                        \x0a\x00\x00\x01\x00\x02\x00\x03"
    "\x00\x04\x00\x05\x00"
    , 140);
// 140 bytes
const std::string kNumpyV3(
    "\x93NUMPY\x03\x00t\x00\x00\x00{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3),"
    " }                                                        \x0a\x00\x00\x01\x00\x02\x00\x03"
    "\x00\x04\x00\x05\x00"
    , 140);
// 152 bytes
const std::string kNumpyFortran(
    "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }       "
    "                                                    \x0a\x00\x00\x00\x00\x00\x00@@\x00\x00"
    "\x80?\x00\x00\x80@\x00\x00\x00@\x00\x00\xa0@"
    , 152);
// 134 bytes
const std::string kNumpyF16(
    "\x93NUMPY\x01\x00v\x00{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }        "
    "                                                    \x0a\x00\x00\x00\x00\x00\x00"
    , 134);
// 136 bytes
const std::string kNumpyScalar(
    "\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (), }          "
    "                                                    \x0a\x00\x00\x00\x00\x00\x00\x04@"
    , 136);
// 131 bytes
const std::string kNumpyBool(
    "\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }        "
    "                                                    \x0a\x01\x00\x01"
    , 131);
// 532 bytes
const std::string kNpzStored(
    "PK\x03\x04\x14\x00\x00\x00\x00\x00\x00\x00!\x00\x37\xe4\x42I\x90\x00\x00\x00\x90\x00\x00"
    "\x00\x05\x00\x14\x00x.npy\x01\x00\x10\x00\x90\x00\x00\x00\x00\x00\x00\x00\x90\x00\x00\x00"
    "\x00\x00\x00\x00\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape':"
    " (2, 2), }                                                          \x0a\x00\x00\xc0?\x00"
    "\x00\x00\xc0\x00\x00\x80>\x00\x00\x00\x41PK\x03\x04\x14\x00\x00\x00\x00\x00\x00\x00!\x00"
    "\x0b\xd7\x5c&\x90\x00\x00\x00\x90\x00\x00\x00\x0a\x00\x14\x00labels.npy\x01\x00\x10\x00"
    "\x90\x00\x00\x00\x00\x00\x00\x00\x90\x00\x00\x00\x00\x00\x00\x00\x93NUMPY\x01\x00v\x00{"
    "'descr': '<i8', 'fortran_order': False, 'shape': (2,), }                               "
    "                             \x0a\x03\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00\x00"
    "\x00\x00PK\x01\x02\x14\x03\x14\x00\x00\x00\x00\x00\x00\x00!\x00\x37\xe4\x42I\x90\x00\x00"
    "\x00\x90\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x01\x00\x00\x00"
    "\x00x.npyPK\x01\x02\x14\x03\x14\x00\x00\x00\x00\x00\x00\x00!\x00\x0b\xd7\x5c&\x90\x00\x00"
    "\x00\x90\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x01\xc7\x00\x00"
    "\x00labels.npyPK\x05\x06\x00\x00\x00\x00\x02\x00\x02\x00k\x00\x00\x00\x93\x01\x00\x00\x00"
    "\x00"
    , 532);
// 402 bytes
const std::string kNpzCompressed(
    "PK\x03\x04\x14\x00\x00\x00\x08\x00\x00\x00!\x00\x37\xe4\x42IT\x00\x00\x00\x90\x00\x00\x00"
    "\x05\x00\x14\x00x.npy\x01\x00\x10\x00\x90\x00\x00\x00\x00\x00\x00\x00T\x00\x00\x00\x00\x00"
    "\x00\x00\x9b\xec\x17\xea\x1b\x10\xc9\xc8P\xc6P\xad\x9e\x92Z\x9c\x5c\xa4n\xa5\xa0n\x93\x66"
    "\xa2\xae\xa3\xa0\x9e\x96_TR\x94\x98\x17\x9f_\x94\x92\x0a\x12wK\xcc)N\x05\x8a\x17g$\x16\xa4"
    "\x02\xf9\x1a\x46:\x0a\x46\x9a:\x0a\xb5\x0a\x64\x03.\x06\x86\x03\xf6\x0c@\x82\x81\xa1\xc1"
    "\x0eH;\x02\x00PK\x03\x04\x14\x00\x00\x00\x08\x00\x00\x00!\x00\x0b\xd7\x5c&J\x00\x00\x00"
    "\x90\x00\x00\x00\x0a\x00\x14\x00labels.npy\x01\x00\x10\x00\x90\x00\x00\x00\x00\x00\x00\x00"
    "J\x00\x00\x00\x00\x00\x00\x00\x9b\xec\x17\xea\x1b\x10\xc9\xc8P\xc6P\xad\x9e\x92Z\x9c\x5c"
    "\xa4n\xa5\xa0n\x93i\xa1\xae\xa3\xa0\x9e\x96_TR\x94\x98\x17\x9f_\x94\x92\x0a\x12wK\xcc)N"
    "\x05\x8a\x17g$\x16\xa4\x02\xf9\x1a\x46:\x9a:\x0a\xb5\x0a\x14\x00.f\x06\x08`\x87\xd2\x00"
    "PK\x01\x02\x14\x03\x14\x00\x00\x00\x08\x00\x00\x00!\x00\x37\xe4\x42IT\x00\x00\x00\x90\x00"
    "\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x01\x00\x00\x00\x00x.npyPK"
    "\x01\x02\x14\x03\x14\x00\x00\x00\x08\x00\x00\x00!\x00\x0b\xd7\x5c&J\x00\x00\x00\x90\x00"
    "\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x80\x01\x8b\x00\x00\x00labels."
    "npyPK\x05\x06\x00\x00\x00\x00\x02\x00\x02\x00k\x00\x00\x00\x11\x01\x00\x00\x00\x00"
    , 402);

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("slimquant_npy_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  }
  // The error `f` throws; fails the test if it throws none.
  template <typename F>
  static Error error_of(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "expected an Error";
    return Error(ErrorKind::kInternal, "");
  }

  fs::path dir_;
};

template <typename T>
Tensor extremes(Shape shape) {
  Tensor t(dtype_of<T>, std::move(shape));
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      p[i] = i % 3 == 1;
    } else {
      // Cycle through lowest, highest, zero and a small value so every byte position matters.
      const T vals[] = {std::numeric_limits<T>::lowest(), std::numeric_limits<T>::max(), T(0), T(7)};
      p[i] = vals[i % 4];
    }
  }
  return t;
}

TEST_F(NpyTest, RoundTripsEveryDtypeAndRank) {
  const std::vector<Shape> shapes = {{2, 3}, {5}, {}, {0, 4}, {2, 1, 3, 2}};
  int files = 0;
#define SQ_ROUND_TRIP(name, ctype, onnx_id, str)                                              \
  for (const Shape& s : shapes) {                                                             \
    const Tensor t = extremes<ctype>(s);                                                      \
    const std::string p = path(std::string(str) + "_" + std::to_string(files++) + ".npy");    \
    write_npy(p, t);                                                                          \
    const Tensor r = read_npy(p);                                                             \
    ASSERT_EQ(r.dtype(), DType::name) << str;                                                 \
    ASSERT_EQ(r.shape(), s) << str;                                                           \
    ASSERT_EQ(0, std::memcmp(r.raw(), t.raw(), t.nbytes())) << str << " " << shape_str(s);    \
    const NpyHeader h = read_npy_header(p);                                                   \
    EXPECT_EQ(h.data_offset % 64, 0u);                                                        \
    EXPECT_EQ(fs::file_size(p), h.data_offset + t.nbytes());                                  \
  }
  SQ_DTYPES(SQ_ROUND_TRIP)
#undef SQ_ROUND_TRIP
  EXPECT_EQ(files, 11 * 5);
  // Atomic write leaves no temporaries behind.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().extension(), ".npy") << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, files);
}

TEST_F(NpyTest, WriterProducesNumpysExactBytes) {
  const Tensor a = Tensor::from_vector<int16_t>({2, 3}, {0, 1, 2, 3, 4, 5});
  const std::vector<std::byte> bytes = encode_npy(a);
  ASSERT_EQ(bytes.size(), kNumpyV1.size());
  EXPECT_EQ(0, std::memcmp(bytes.data(), kNumpyV1.data(), bytes.size()));
  write_npy(path("a.npy"), a);
  std::ifstream in(path("a.npy"), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, kNumpyV1);
  // Scalars and bools too.
  const std::vector<std::byte> s = encode_npy(Tensor::scalar<double>(2.5));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(s.data()), s.size()), kNumpyScalar);
  const std::vector<std::byte> b = encode_npy(Tensor::from_vector<bool>({3}, {true, false, true}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), b.size()), kNumpyBool);
}

TEST_F(NpyTest, ReadsNumpyHeaderVersions1To3) {
  for (const std::string* bytes : {&kNumpyV1, &kNumpyV2, &kNumpyV3}) {
    const Tensor t = read_npy(write_bytes("v.npy", *bytes));
    ASSERT_EQ(t.dtype(), DType::kInt16);
    ASSERT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.to_int64_vector(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
    const Tensor m = parse_npy(bytes->data(), bytes->size(), "mem");
    EXPECT_EQ(m.to_int64_vector(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  }
  const NpyHeader h2 = read_npy_header(write_bytes("v2.npy", kNumpyV2));
  EXPECT_EQ(h2.data_offset, 128u);
  const Tensor s = read_npy(write_bytes("s.npy", kNumpyScalar));
  ASSERT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.data<double>()[0], 2.5);
  const Tensor b = read_npy(write_bytes("b.npy", kNumpyBool));
  ASSERT_EQ(b.dtype(), DType::kBool);
  EXPECT_EQ(b.to_int64_vector(), (std::vector<int64_t>{1, 0, 1}));
}

// numpy.save of an object array: a pickle follows the header. It is refused by its dtype; nothing
// is unpickled (the payload here would run a shell command if it were).
TEST_F(NpyTest, ObjectArraysAreRefusedNeverUnpickled) {
  std::string header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }";
  header.resize(117, ' ');
  header += '\n';
  const std::string pickle = "cos\nsystem\n(S'touch " + (dir_ / "pwned").string() + "'\ntR.";
  const std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + std::string("\x76\x00", 2) + header + pickle;
  const Error e = error_of([&] { read_npy(write_bytes("object.npy", bytes)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("unsupported dtype '|O'"), std::string::npos) << e.what();
  EXPECT_FALSE(fs::exists(dir_ / "pwned"));
}

TEST_F(NpyTest, HugeHeaderSwitchesToVersion2) {
  // 30000 unit dimensions make a header longer than version 1.0's 16-bit length allows.
  const Tensor t = Tensor::from_vector<float>(Shape(30000, 1), {4.25f});
  write_npy(path("big.npy"), t);
  std::ifstream in(path("big.npy"), std::ios::binary);
  char pre[8];
  in.read(pre, 8);
  EXPECT_EQ(pre[6], 2);
  const Tensor r = read_npy(path("big.npy"));
  EXPECT_EQ(r.rank(), 30000u);
  EXPECT_EQ(r.data<float>()[0], 4.25f);
}

TEST_F(NpyTest, ReadsNpzStoredAndCompressed) {
  for (const std::string* bytes : {&kNpzStored, &kNpzCompressed}) {
    const auto arrays = read_npz(write_bytes("a.npz", *bytes));
    ASSERT_EQ(arrays.size(), 2u);
    EXPECT_EQ(arrays[0].first, "x");
    EXPECT_EQ(arrays[0].second.shape(), (Shape{2, 2}));
    EXPECT_EQ(arrays[0].second.to_float_vector(), (std::vector<float>{1.5f, -2.f, 0.25f, 8.f}));
    EXPECT_EQ(arrays[1].first, "labels");
    EXPECT_EQ(arrays[1].second.dtype(), DType::kInt64);
    EXPECT_EQ(arrays[1].second.to_int64_vector(), (std::vector<int64_t>{3, 7}));
  }
  // A flipped data byte fails the CRC check.
  std::string corrupt = kNpzStored;
  corrupt[190] ^= 0x01;  // inside x.npy's float data (bytes 183..198)
  const Error e = error_of([&] { read_npz(write_bytes("bad.npz", corrupt)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
}

// Sizes in the zip directory are checked before they are believed (found by fuzz_npy): a member
// claiming 4 GiB inflated from 84 bytes is refused before anything is allocated, and directory
// entries sharing one member (which would multiply what a small file inflates to) are refused.
TEST_F(NpyTest, RejectsNpzDirectoriesThatLie) {
  auto put_le32 = [](std::string& bytes, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(v >> (8 * i));
  };
  constexpr size_t kCompressedDirectory = 0x111, kStoredDirectory = 0x193;  // from the records
  std::string inflated = kNpzCompressed;
  put_le32(inflated, kCompressedDirectory + 24, 0xFFFFFFF0u);  // x.npy's uncompressed size
  Error e = error_of([&] { read_npz(write_bytes("big.npz", inflated)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("member x.npy claims 4294967280 bytes inflated from 84, more than deflate "
                                       "can produce"), std::string::npos) << e.what();

  // labels.npy's directory entry pointed at x.npy's data (CRC and sizes too, so that it would
  // read as a second copy of x).
  std::string shared = kNpzStored;
  const size_t second = kStoredDirectory + 46 + 5;
  shared.replace(second + 16, 12, shared.substr(kStoredDirectory + 16, 12));
  shared.replace(second + 42, 4, shared.substr(kStoredDirectory + 42, 4));
  e = error_of([&] { read_npz(write_bytes("shared.npz", shared)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("member labels.npy overlaps the member before it"), std::string::npos)
      << e.what();
}

TEST_F(NpyTest, MissingFileIsAnIoError) {
  const Error e = error_of([&] { read_npy(path("nope.npy")); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()), path("nope.npy") + ": cannot open: No such file or directory");
}

TEST_F(NpyTest, RejectsFortranOrder) {
  const std::string p = write_bytes("x.npy", kNumpyFortran);
  const Error e = error_of([&] { read_npy(p); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), p + ": fortran_order arrays are not supported");
}

TEST_F(NpyTest, RejectsTruncatedData) {
  // A float32 [784] array cut off after 100 values (plus two stray bytes).
  const Tensor full(DType::kFloat32, {784});
  const std::vector<std::byte> bytes = encode_npy(full);
  const size_t header = bytes.size() - 784 * 4;
  const std::string cut(reinterpret_cast<const char*>(bytes.data()), header + 100 * 4 + 2);
  const std::string p = write_bytes("x.npy", cut);
  for (int reader = 0; reader < 3; ++reader) {
    const Error e = error_of([&] {
      if (reader == 0) read_npy(p);
      else if (reader == 1) read_npy_header(p);
      else parse_npy(cut.data(), cut.size(), p);
    });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
    EXPECT_EQ(std::string(e.what()), p + ": truncated: header says 784 float32 values, file holds 100");
  }
}

// float16 arrays are read as float32 values (numpy's own file: three zeros).
TEST_F(NpyTest, ReadsFloat16AsFloat32) {
  const Tensor t = read_npy(write_bytes("h.npy", kNumpyF16));
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{0.f, 0.f, 0.f}));
  Tensor values = Tensor::from_vector<float>({4}, {1.f, -2.5f, 65504.f, 1.f / 3});
  write_npy_float16(path("w.npy"), values);
  EXPECT_TRUE(read_npy_header(path("w.npy")).stored_float16);
  EXPECT_EQ(read_npy(path("w.npy")).to_float_vector(),
            (std::vector<float>{1.f, -2.5f, 65504.f, round_to_16bit_float(1.f / 3, kOnnxFloat16)}));
}

TEST_F(NpyTest, RejectsUnsupportedDtypesAndGarbage) {
  std::string complex = kNumpyF16;
  complex.replace(complex.find("<f2"), 3, "<c8");
  const std::string p = write_bytes("c.npy", complex);
  Error e = error_of([&] { read_npy(p); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), p + ": unsupported dtype '<c8'");

  std::string big_endian = kNumpyV1;
  big_endian.replace(big_endian.find("<i2"), 3, ">i2");
  e = error_of([&] { read_npy(write_bytes("be.npy", big_endian)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("big-endian dtype '>i2' is not supported"), std::string::npos);

  e = error_of([&] { read_npy(write_bytes("g.npy", "PK\x03\x04 this is a zip")); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_EQ(std::string(e.what()), path("g.npy") + ": not a .npy file (no \\x93NUMPY magic)");

  std::string no_shape = kNumpyV1;
  no_shape.replace(no_shape.find("'shape'"), 7, "'shapf'");
  e = error_of([&] { read_npy(write_bytes("k.npy", no_shape)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_NE(std::string(e.what()).find("unexpected header key 'shapf'"), std::string::npos) << e.what();
}

TEST_F(NpyTest, WriteFailsCleanlyIntoMissingDirectory) {
  const std::string p = path("no/such/dir/a.npy");
  const Error e = error_of([&] { write_npy(p, Tensor::scalar<float>(1.f)); });
  EXPECT_EQ(e.kind(), ErrorKind::kIo);
  EXPECT_EQ(std::string(e.what()), "cannot write '" + p + "': No such file or directory");
}

TEST_F(NpyTest, OverwriteReplacesContents) {
  write_npy(path("a.npy"), Tensor::from_vector<float>({3}, {1.f, 2.f, 3.f}));
  write_npy(path("a.npy"), Tensor::from_vector<int64_t>({1}, {42}));
  const Tensor t = read_npy(path("a.npy"));
  EXPECT_EQ(t.dtype(), DType::kInt64);
  EXPECT_EQ(t.to_int64_vector(), std::vector<int64_t>{42});
}

}  // namespace
}  // namespace slimquant
