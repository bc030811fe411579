#ifndef FEDLEARN_CLIENT_IDX_H_
#define FEDLEARN_CLIENT_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace fedlearn {

// A labelled image data set held in memory: one byte per pixel, one byte per
// label. A plain value; the loader fills it and callers own it.
struct Dataset {
  int64_t rows = 0;  // image height
  int64_t cols = 0;  // image width
  // size() * rows * cols bytes, row-major: pixel (r, c) of example i is at
  // (i * rows + r) * cols + c. 0 is background; 255 is full ink.
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;  // one per example, each < num_classes

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t pixels_per_image() const { return rows * cols; }
  // The first of example i's rows * cols pixels.
  const uint8_t* image(int64_t i) const {
    return pixels.data() + i * pixels_per_image();
  }
};

// The largest IDX file (after decompression) the loader accepts: room for
// every MNIST-family set (EMNIST ByClass's training images are 638 MB) while
// bounding what a corrupt or malicious .gz can make us allocate.
inline constexpr int64_t kMaxIdxBytes = int64_t{1} << 30;

// Reads an IDX image file (magic 0x00000803: unsigned bytes, dimensions
// N x rows x cols) and the matching IDX label file (magic 0x00000801: N
// unsigned bytes), the format MNIST and Fashion-MNIST are distributed in.
// Either file may be gzip-compressed; that is detected from its first two
// bytes (1f 8b), not from its name.
//
// Errors, each with a message naming the offending file:
//   NOT_FOUND        a file does not exist;
//   PERMISSION_DENIED and other errno-derived codes for other I/O failures;
//   INVALID_ARGUMENT anything wrong with the contents: a wrong magic number or
//                    number of dimensions, an element type other than
//                    unsigned byte, a file shorter than its header says
//                    (truncation is INVALID_ARGUMENT throughout, never
//                    DATA_LOSS), trailing bytes after the data, corrupt or
//                    truncated gzip data, zero rows or columns, more than
//                    kMaxIdxBytes, image and label counts that differ, or a
//                    label >= num_classes (the message gives its index).
absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes = 10);

// Loads one split from a directory laid out like the MNIST and Fashion-MNIST
// distributions: train-images-idx3-ubyte and train-labels-idx1-ubyte when
// `train`, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte otherwise, each
// either as is or with a ".gz" suffix (the uncompressed name wins when both
// exist). NOT_FOUND naming the missing file when neither form exists;
// otherwise as LoadIdx.
absl::StatusOr<Dataset> LoadMnistDir(const std::string& dir, bool train,
                                     int num_classes = 10);

// The examples of `data` at `indices` (each < data.size()), in that order: a
// client's partition as a dataset of its own.
Dataset Subset(const Dataset& data, absl::Span<const int64_t> indices);

// Mean and (population) standard deviation of the pixels of `data` scaled to
// [0, 1] (byte / 255), over every pixel of every example: what a trainer
// standardises its inputs with. {0, 1} for an empty dataset; std is at least
// 1e-6, so dividing by it is safe even for a constant dataset.
struct PixelStats {
  float mean = 0.0f;
  float std = 1.0f;
};
PixelStats ComputePixelStats(const Dataset& data);

// Writes `data` as an uncompressed IDX image file and label file, replacing
// any existing files. INVALID_ARGUMENT if the dataset is inconsistent
// (pixels.size() != size() * rows * cols, a non-positive or over-2^31
// dimension); an errno-derived status naming the file if writing fails.
absl::Status WriteIdx(const std::string& images_path,
                      const std::string& labels_path, const Dataset& data);

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_IDX_H_
