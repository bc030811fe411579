// The safetensors reader (--model=PATH.safetensors, the state directory's
// models): any bytes as a file. It must never crash or read out of bounds; a
// file it accepts as a model is read again against that model's own spec, to
// the same values bit for bit.

#include <cstdlib>
#include <cstring>

#include "common/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  const std::string path = fuzz::WriteScratch(
      "model.safetensors",
      absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<SafetensorsModel> model = ReadSafetensorsModel(path);
  if (!model.ok()) return 0;
  if (model->values.size() != static_cast<size_t>(model->spec.num_parameters))
    std::abort();
  absl::StatusOr<std::vector<float>> again = ReadSafetensors(path, model->spec);
  if (!again.ok() || again->size() != model->values.size() ||
      std::memcmp(again->data(), model->values.data(),
                  again->size() * sizeof(float)) != 0) {
    std::abort();
  }
  return 0;
}
