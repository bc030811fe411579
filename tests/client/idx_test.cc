#include "client/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Each test writes its files into a directory of its own.
class IdxTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  testing::ScopedTempDir dir_;
};

// Three 2 x 3 images with distinct pixels, labels 0, 9, 4.
Dataset SmallDataset() {
  Dataset d;
  d.rows = 2;
  d.cols = 3;
  for (int i = 0; i < 3 * 2 * 3; ++i) {
    d.pixels.push_back(static_cast<uint8_t>(i * 13 + 1));
  }
  d.labels = {0, 9, 4};
  return d;
}

using testing::ReadBytes;
using testing::WriteBytes;

// gzip-compresses `bytes` into `path` with zlib's gz* API.
void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << path;
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
          static_cast<char>(v >> 8), static_cast<char>(v)};
}

void ExpectSame(const Dataset& got, const Dataset& want) {
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_EQ(got.size(), want.size());
  EXPECT_THAT(got.pixels, ElementsAreArray(want.pixels));
  EXPECT_THAT(got.labels, ElementsAreArray(want.labels));
}

// Expects `status` to have `code` and a message naming `file`.
void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& file, const std::string& detail = "") {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(file));
  if (!detail.empty()) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(detail));
  }
}

TEST_F(IdxTest, WritesTheStandardLayout) {
  const Dataset d = SmallDataset();
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  const std::string images = ReadBytes(Path("img"));
  // Magic, then N, rows, cols big-endian, then the pixels.
  EXPECT_EQ(images.substr(0, 16), std::string("\x00\x00\x08\x03", 4) +
                                      BigEndian(3) + BigEndian(2) +
                                      BigEndian(3));
  EXPECT_EQ(images.size(), 16u + d.pixels.size());
  EXPECT_EQ(static_cast<uint8_t>(images[16]), d.pixels[0]);
  const std::string labels = ReadBytes(Path("lbl"));
  EXPECT_EQ(labels, std::string("\x00\x00\x08\x01", 4) + BigEndian(3) +
                        std::string("\x00\x09\x04", 3));
}

TEST_F(IdxTest, RoundTripsRaw) {
  const Dataset d = SmallDataset();
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  absl::StatusOr<Dataset> got = LoadIdx(Path("img"), Path("lbl"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, d);
  // Example 1's pixels start rows * cols bytes in.
  EXPECT_EQ(got->image(1), got->pixels.data() + 6);
  EXPECT_EQ(got->pixels_per_image(), 6);
}

TEST_F(IdxTest, RoundTripsGzipped) {
  const Dataset d = SmallDataset();
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  WriteGzip(Path("img.gz"), ReadBytes(Path("img")));
  WriteGzip(Path("lbl.gz"), ReadBytes(Path("lbl")));
  ASSERT_EQ(ReadBytes(Path("img.gz")).substr(0, 2), "\x1f\x8b");

  absl::StatusOr<Dataset> got = LoadIdx(Path("img.gz"), Path("lbl.gz"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, d);
  // Mixed, and detection by content rather than by name.
  std::filesystem::rename(Path("img.gz"), Path("images-no-suffix"));
  got = LoadIdx(Path("images-no-suffix"), Path("lbl"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, d);
}

TEST_F(IdxTest, ReadsConcatenatedGzipMembers) {
  const Dataset d = SmallDataset();
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  const std::string images = ReadBytes(Path("img"));
  WriteGzip(Path("a.gz"), images.substr(0, 10));
  WriteGzip(Path("b.gz"), images.substr(10));
  WriteBytes(Path("img.gz"), ReadBytes(Path("a.gz")) + ReadBytes(Path("b.gz")));
  absl::StatusOr<Dataset> got = LoadIdx(Path("img.gz"), Path("lbl"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, d);
}

TEST_F(IdxTest, ReadsLargerGzippedImages) {
  // Big enough that the decompressor's output buffer has to grow.
  Dataset d;
  d.rows = 28;
  d.cols = 28;
  for (int i = 0; i < 500; ++i) {
    d.labels.push_back(static_cast<uint8_t>(i % 10));
    for (int p = 0; p < 28 * 28; ++p) {
      d.pixels.push_back(
          static_cast<uint8_t>((p * 7 + i) % 256 < 40 ? 255 : 0));
    }
  }
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  WriteGzip(Path("img.gz"), ReadBytes(Path("img")));
  absl::StatusOr<Dataset> got = LoadIdx(Path("img.gz"), Path("lbl"));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, d);
}

TEST_F(IdxTest, AcceptsAnEmptyDataset) {
  Dataset d;
  d.rows = 28;
  d.cols = 28;
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  absl::StatusOr<Dataset> got = LoadIdx(Path("img"), Path("lbl"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 0);
  EXPECT_EQ(got->rows, 28);
}

TEST_F(IdxTest, MissingFilesAreNotFound) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  ExpectError(LoadIdx(Path("nope"), Path("lbl")).status(),
              absl::StatusCode::kNotFound, Path("nope"));
  ExpectError(LoadIdx(Path("img"), Path("nope2")).status(),
              absl::StatusCode::kNotFound, Path("nope2"));
}

TEST_F(IdxTest, TruncatedFilesAreInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  const std::string images = ReadBytes(Path("img"));
  const std::string labels = ReadBytes(Path("lbl"));
  // Cut inside the data, inside the header, inside the magic, and empty.
  for (const size_t keep :
       {images.size() - 1, size_t{16}, size_t{10}, size_t{3}, size_t{0}}) {
    SCOPED_TRACE(keep);
    WriteBytes(Path("cut"), images.substr(0, keep));
    ExpectError(LoadIdx(Path("cut"), Path("lbl")).status(),
                absl::StatusCode::kInvalidArgument, Path("cut"), "truncated");
  }
  WriteBytes(Path("cut"), labels.substr(0, labels.size() - 1));
  ExpectError(LoadIdx(Path("img"), Path("cut")).status(),
              absl::StatusCode::kInvalidArgument, Path("cut"), "truncated");
}

TEST_F(IdxTest, TruncatedGzipIsInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  WriteGzip(Path("img.gz"), ReadBytes(Path("img")));
  const std::string gz = ReadBytes(Path("img.gz"));
  // Without the 8-byte trailer (CRC and size): the deflate data is whole but
  // the gzip member is not.
  WriteBytes(Path("cut.gz"), gz.substr(0, gz.size() - 8));
  ExpectError(LoadIdx(Path("cut.gz"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("cut.gz"), "truncated");
  WriteBytes(Path("cut.gz"), gz.substr(0, 12));
  ExpectError(LoadIdx(Path("cut.gz"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("cut.gz"), "truncated");
}

TEST_F(IdxTest, CorruptGzipIsInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  WriteGzip(Path("img.gz"), ReadBytes(Path("img")));
  std::string gz = ReadBytes(Path("img.gz"));
  gz[gz.size() - 6] ^= 0x55;  // inside the CRC-32 of the trailer
  WriteBytes(Path("bad.gz"), gz);
  ExpectError(LoadIdx(Path("bad.gz"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("bad.gz"), "gzip");
}

TEST_F(IdxTest, TrailingBytesAreInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  WriteBytes(Path("long"), ReadBytes(Path("img")) + "x");
  ExpectError(LoadIdx(Path("long"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("long"), "trailing");
}

TEST_F(IdxTest, WrongMagicIsInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  // Labels where images belong and the other way round.
  ExpectError(LoadIdx(Path("lbl"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("lbl"), "0x00000803");
  ExpectError(LoadIdx(Path("img"), Path("img")).status(),
              absl::StatusCode::kInvalidArgument, Path("img"), "0x00000801");
  // Not IDX at all.
  WriteBytes(Path("text"), "hello, world: not an idx file");
  ExpectError(LoadIdx(Path("text"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("text"), "magic");
  ExpectError(LoadIdx(Path("img"), Path("text")).status(),
              absl::StatusCode::kInvalidArgument, Path("text"), "magic");
}

TEST_F(IdxTest, WrongElementTypeIsInvalid) {
  // Three 1 x 1 float32 images.
  WriteBytes(Path("float"), std::string("\x00\x00\x0d\x03", 4) + BigEndian(3) +
                                BigEndian(1) + BigEndian(1) +
                                std::string(12, '\0'));
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  ExpectError(LoadIdx(Path("float"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("float"), "float32");
  // int32 labels.
  WriteBytes(Path("int"), std::string("\x00\x00\x0c\x01", 4) + BigEndian(3) +
                              std::string(12, '\0'));
  ExpectError(LoadIdx(Path("img"), Path("int")).status(),
              absl::StatusCode::kInvalidArgument, Path("int"), "int32");
}

TEST_F(IdxTest, ZeroSizedImagesAreInvalid) {
  WriteBytes(Path("flat"), std::string("\x00\x00\x08\x03", 4) + BigEndian(3) +
                               BigEndian(0) + BigEndian(28));
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  ExpectError(LoadIdx(Path("flat"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("flat"));
}

TEST_F(IdxTest, HugeDimensionsAreTruncationNotOverflow) {
  // 2^32-1 cubed overflows 64 bits; the loader must report truncation.
  WriteBytes(Path("huge"), std::string("\x00\x00\x08\x03", 4) +
                               BigEndian(0xffffffff) + BigEndian(0xffffffff) +
                               BigEndian(0xffffffff) + "abc");
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  ExpectError(LoadIdx(Path("huge"), Path("lbl")).status(),
              absl::StatusCode::kInvalidArgument, Path("huge"), "truncated");
}

TEST_F(IdxTest, CountMismatchIsInvalid) {
  Dataset d = SmallDataset();
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), d).ok());
  d.labels.pop_back();
  d.pixels.resize(2 * 6);
  ASSERT_TRUE(WriteIdx(Path("img2"), Path("lbl2"), d).ok());
  const absl::Status status = LoadIdx(Path("img"), Path("lbl2")).status();
  ExpectError(status, absl::StatusCode::kInvalidArgument, Path("img"),
              "3 images");
  ExpectError(status, absl::StatusCode::kInvalidArgument, Path("lbl2"),
              "2 labels");
}

TEST_F(IdxTest, LabelOutOfRangeIsInvalid) {
  ASSERT_TRUE(WriteIdx(Path("img"), Path("lbl"), SmallDataset()).ok());
  // Labels 0, 9, 4: fine with 10 classes, not with 9 or 4.
  EXPECT_TRUE(LoadIdx(Path("img"), Path("lbl"), 10).ok());
  ExpectError(LoadIdx(Path("img"), Path("lbl"), 9).status(),
              absl::StatusCode::kInvalidArgument, Path("lbl"),
              "label 9 of example 1");
  ExpectError(LoadIdx(Path("img"), Path("lbl"), 4).status(),
              absl::StatusCode::kInvalidArgument, Path("lbl"), "label 9");
  ExpectError(LoadIdx(Path("img"), Path("lbl"), 0).status(),
              absl::StatusCode::kInvalidArgument, Path("lbl"), "num_classes");
}

TEST_F(IdxTest, WriteRejectsInconsistentDatasets) {
  Dataset d = SmallDataset();
  d.pixels.pop_back();
  ExpectError(WriteIdx(Path("img"), Path("lbl"), d),
              absl::StatusCode::kInvalidArgument, Path("img"));
  d = SmallDataset();
  d.rows = 0;
  ExpectError(WriteIdx(Path("img"), Path("lbl"), d),
              absl::StatusCode::kInvalidArgument, Path("img"));
}

TEST_F(IdxTest, WriteToAMissingDirectoryFails) {
  ExpectError(
      WriteIdx(Path("no/such/img"), Path("no/such/lbl"), SmallDataset()),
      absl::StatusCode::kNotFound, Path("no/such/img"));
}

TEST_F(IdxTest, LoadsMnistDirectoryLayouts) {
  const Dataset train = SmallDataset();
  Dataset test = SmallDataset();
  test.labels = {1, 2, 3};
  ASSERT_TRUE(WriteIdx(Path("train-images-idx3-ubyte"),
                       Path("train-labels-idx1-ubyte"), train)
                  .ok());
  // The test split gzipped, as the Fashion-MNIST distribution ships it.
  ASSERT_TRUE(WriteIdx(Path("t"), Path("l"), test).ok());
  WriteGzip(Path("t10k-images-idx3-ubyte.gz"), ReadBytes(Path("t")));
  WriteGzip(Path("t10k-labels-idx1-ubyte.gz"), ReadBytes(Path("l")));

  absl::StatusOr<Dataset> got =
      LoadMnistDir(dir_.path().string(), /*train=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, train);
  got = LoadMnistDir(dir_.path().string(), /*train=*/false);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, test);

  std::filesystem::remove(Path("t10k-labels-idx1-ubyte.gz"));
  ExpectError(LoadMnistDir(dir_.path().string(), /*train=*/false).status(),
              absl::StatusCode::kNotFound, Path("t10k-labels-idx1-ubyte"));
  ExpectError(LoadMnistDir(Path("empty"), /*train=*/true).status(),
              absl::StatusCode::kNotFound, "train-images-idx3-ubyte");
}

TEST(PixelStatsTest, MeanAndStdOfScaledPixels) {
  Dataset data;
  data.rows = 1;
  data.cols = 2;
  data.pixels = {0, 255, 0, 255};  // half 0.0, half 1.0
  data.labels = {0, 1};
  PixelStats stats = ComputePixelStats(data);
  EXPECT_FLOAT_EQ(stats.mean, 0.5f);
  EXPECT_FLOAT_EQ(stats.std, 0.5f);

  data.pixels = {51, 51, 51, 51};  // constant: std is clamped, not 0
  stats = ComputePixelStats(data);
  EXPECT_FLOAT_EQ(stats.mean, 0.2f);
  EXPECT_GT(stats.std, 0.0f);

  stats = ComputePixelStats(Dataset());
  EXPECT_EQ(stats.mean, 0.0f);
  EXPECT_EQ(stats.std, 1.0f);
}

// The real data, when scripts/fetch-data.sh has prepared it.
TEST(IdxDataTest, LoadsFetchedMnist) {
  const std::string dir = std::string(FEDLEARN_SOURCE_DIR) + "/data/mnist";
  if (!std::filesystem::exists(dir)) {
    GTEST_SKIP() << dir << " is absent: run scripts/fetch-data.sh to test it";
  }
  for (const bool train : {true, false}) {
    SCOPED_TRACE(train ? "train" : "t10k");
    absl::StatusOr<Dataset> data = LoadMnistDir(dir, train);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->size(), train ? 8000 : 2000);
    EXPECT_EQ(data->rows, 28);
    EXPECT_EQ(data->cols, 28);
    std::array<int, 10> histogram = {};
    for (const uint8_t label : data->labels) ++histogram[label];
    for (int c = 0; c < 10; ++c) EXPECT_GT(histogram[c], 0) << "class " << c;
    // Real digits: mostly background, some full ink.
    int64_t zeros = 0, full = 0;
    for (const uint8_t p : data->pixels) {
      zeros += p == 0;
      full += p == 255;
    }
    EXPECT_GT(zeros, static_cast<int64_t>(data->pixels.size()) / 2);
    EXPECT_GT(full, 0);
  }
}

TEST(IdxDataTest, LoadsFetchedFashionMnist) {
  const std::string dir =
      std::string(FEDLEARN_SOURCE_DIR) + "/data/fashion-mnist";
  if (!std::filesystem::exists(dir)) {
    GTEST_SKIP() << dir << " is absent: run scripts/fetch-data.sh to test it";
  }
  for (const bool train : {true, false}) {
    SCOPED_TRACE(train ? "train" : "t10k");
    absl::StatusOr<Dataset> data = LoadMnistDir(dir, train);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->size(), train ? 60000 : 10000);
    EXPECT_EQ(data->rows, 28);
    EXPECT_EQ(data->cols, 28);
    // Fashion-MNIST is exactly balanced.
    std::array<int, 10> histogram = {};
    for (const uint8_t label : data->labels) ++histogram[label];
    for (int c = 0; c < 10; ++c) {
      EXPECT_EQ(histogram[c], train ? 6000 : 1000) << "class " << c;
    }
  }
}

}  // namespace
}  // namespace fedlearn
