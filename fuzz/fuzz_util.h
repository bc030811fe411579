#ifndef FEDLEARN_FUZZ_FUZZ_UTIL_H_
#define FEDLEARN_FUZZ_FUZZ_UTIL_H_

// What the fuzz targets share: a small model, a byte reader that cuts the
// fuzzer's input into length-prefixed pieces, and a scratch file for the
// readers that take a path.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model_spec.h"
#include "google/protobuf/stubs/logging.h"
#include "server/history.h"
#include "server/state_store.h"

namespace fedlearn::fuzz {

// Protobuf logs every string field with invalid UTF-8 it parses; mutated inputs
// are full of them, and the log would cost more than the parse.
inline const bool kProtobufQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

// 26 floats in four tensors: big enough for every path of the codecs, small
// enough for a million executions a minute.
inline const ModelSpec& TinySpec() {
  static const ModelSpec* spec = [] {
    absl::StatusOr<ModelSpec> s =
        MakeModelSpec("tiny", {{"a.weight", {3, 5}, Init::kGlorotUniform, 5, 3},
                               {"a.bias", {3}, Init::kZeros},
                               {"b.weight", {2, 3}, Init::kGlorotUniform, 3, 2},
                               {"b.bias", {2}, Init::kZeros}});
    if (!s.ok()) std::abort();
    return new ModelSpec(*std::move(s));
  }();
  return *spec;
}

// A run of TinySpec() saved at round 2 with FedAdam's two slots: what the
// state fuzzer's directory holds and its seed names.
inline SavedRun TinyRun() {
  const ModelSpec& spec = TinySpec();
  SavedRun run;
  run.state.set_run_id("fuzz");
  run.state.set_round(3);
  run.state.set_model_round(2);
  run.state.set_mode("rounds");
  run.state.set_strategy("fedadam");
  run.weights =
      std::make_shared<const std::vector<float>>(spec.num_parameters, 0.5f);
  run.optimizer.steps = 2;
  for (const char* slot : {"m", "v"}) {
    run.optimizer.slots.emplace_back(
        slot,
        std::make_shared<const std::vector<float>>(spec.num_parameters, 0.25f));
  }
  // Two closed rounds, which a save puts in the run's history file.
  History history;
  for (int64_t round = 1; round <= 2; ++round) {
    v1::RoundRecord record;
    record.set_round(round);
    record.set_attempt(1);
    record.set_selected(2);
    record.set_responded(2);
    record.set_outcome("all");
    for (const char* id : {"fuzz-client-a", "fuzz-client-b"}) {
      record.add_selected_clients(id);
      record.add_accepted_clients(id);
    }
    history.Append(std::move(record));
  }
  run.records = history.Latest(history.total());
  return run;
}

// Reads the fuzzer's bytes front to back.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  bool empty() const { return size_ == 0; }
  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return static_cast<uint8_t>(*data_++);
  }
  // A piece of at most 65535 bytes, its length in the next two bytes (little
  // endian); shorter when the input ends first.
  absl::string_view Piece() {
    size_t n = Byte();
    n |= static_cast<size_t>(Byte()) << 8;
    return Take(n);
  }
  absl::string_view Rest() { return Take(size_); }

 private:
  absl::string_view Take(size_t n) {
    if (n > size_) n = size_;
    absl::string_view out(data_, n);
    data_ += n;
    size_ -= n;
    return out;
  }
  const char* data_;
  size_t size_;
};

// A directory of this process's own, on tmpfs when there is one.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::string base = "/dev/shm";
    if (FILE* probe = std::fopen("/dev/shm/.fedlearn-fuzz-probe", "w")) {
      std::fclose(probe);
      std::remove("/dev/shm/.fedlearn-fuzz-probe");
    } else {
      base = "/tmp";
    }
    std::string templ = absl::StrCat(base, "/fedlearn-fuzz-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    return new std::string(templ);
  }();
  return *dir;
}

// Writes `contents` to ScratchDir()/name and returns the path.
inline std::string WriteScratch(const std::string& name,
                                absl::string_view contents) {
  const std::string path = absl::StrCat(ScratchDir(), "/", name);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!contents.empty() &&
      std::fwrite(contents.data(), 1, contents.size(), f) != contents.size()) {
    std::abort();
  }
  std::fclose(f);
  return path;
}

}  // namespace fedlearn::fuzz

#endif  // FEDLEARN_FUZZ_FUZZ_UTIL_H_
