// The IDX reader the agents load their data with (MNIST's own format,
// optionally gzipped): any pair of files. It must never crash or allocate
// without bound; a pair it accepts holds one label per image, each below
// the class count.
//
// Input: the images file as a length-prefixed piece (fuzz_util.h), then the
// labels file. An accepted pair's pixels are exactly its images.

#include <cstdlib>

#include "client/idx.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  fuzz::Bytes in(data, size);
  const std::string images = fuzz::WriteScratch("images-idx3", in.Piece());
  const std::string labels = fuzz::WriteScratch("labels-idx1", in.Rest());
  absl::StatusOr<Dataset> loaded = LoadIdx(images, labels);
  if (!loaded.ok()) return 0;
  if (loaded->pixels.size() !=
      static_cast<size_t>(loaded->size() * loaded->pixels_per_image())) {
    std::abort();
  }
  for (uint8_t label : loaded->labels) {
    if (label >= 10) std::abort();
  }
  return 0;
}
