#ifndef FEDLEARN_COMMON_SAFETENSORS_H_
#define FEDLEARN_COMMON_SAFETENSORS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_spec.h"

namespace fedlearn {

// A model's parameters as a safetensors file
// (https://github.com/huggingface/safetensors), so numpy and PyTorch users can
// read them without this code:
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object, padded with spaces so the data starts 8-byte
//   aligned:
//             {"__metadata__": {"key": "value", ...},
//              "conv1.weight": {"dtype": "F32", "shape": [32, 1, 3, 3],
//                               "data_offsets": [0, 1152]}, ...}
//   the data  every tensor's float32 values, little-endian, in the spec's
//   order, so the
//             data section is the flat parameter vector as it is; data_offsets
//             count from the start of this section.

// Writes `values` (spec.num_parameters floats in the spec's order) to `path`
// with the string pairs of `metadata` in "__metadata__". Atomic: the bytes go
// to a temporary file in the same directory, which is fsync'ed and renamed over
// `path`, and the directory is fsync'ed too, so after a crash `path` holds the
// old model or the new one, whole. INVALID_ARGUMENT if values.size() differs
// from spec.num_parameters; an errno-derived status naming the file if writing
// fails (nothing is left behind then).
absl::Status WriteSafetensors(
    const std::string& path, const ModelSpec& spec,
    absl::Span<const float> values,
    const std::map<std::string, std::string>& metadata = {});

// Everything of such a file before its data: the 8-byte length and the
// header. The file is this followed by the spec.num_parameters floats, which
// lets a server stream a model without copying it (GET /api/model.safetensors).
std::string SafetensorsPrefix(
    const ModelSpec& spec,
    const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file holding exactly the tensors of `spec` and returns
// their values as one flat vector in the spec's order (the file's tensors may
// be in any order). When `metadata` is not null it receives the "__metadata__"
// pairs. Errors, each naming the file (and the tensor, where there is one):
//   NOT_FOUND        the file does not exist (other I/O failures: errno-derived
//   codes); DATA_LOSS        the file is truncated: shorter than its 8-byte
//   length prefix, than
//                    the header length says, or than a tensor's data_offsets
//                    reach;
//   INVALID_ARGUMENT anything else malformed or not matching `spec`: a header
//   length
//                    over 100 MB or too short, a header that is not a JSON
//                    object of the expected form (strict JSON; duplicate keys
//                    rejected), a tensor of the spec missing, a tensor not in
//                    the spec, a dtype other than "F32", a shape other than the
//                    spec's, data_offsets that do not span exactly the tensor's
//                    bytes, tensors that overlap or leave gaps, or bytes after
//                    the last tensor.
absl::StatusOr<std::vector<float>> ReadSafetensors(
    const std::string& path, const ModelSpec& spec,
    std::map<std::string, std::string>* metadata = nullptr);

// A model defined by a safetensors file (--model=PATH.safetensors): the file's
// tensors, in the order of their data, make the spec, and their values the
// initial weights. The spec's name is the file's "model" metadata (what
// fedlearn writes into the models it saves) or else the file's stem.
struct SafetensorsModel {
  ModelSpec spec;
  std::vector<float> values;
  std::map<std::string, std::string> metadata;
};

// Reads such a file. Errors as ReadSafetensors, each naming the file and the
// tensor, plus INVALID_ARGUMENT for a tensor whose dtype is not F32, a
// dimension of 0, or a file with no tensor.
absl::StatusOr<SafetensorsModel> ReadSafetensorsModel(const std::string& path);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_SAFETENSORS_H_
