#include "server/state_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace fedlearn {
namespace {

constexpr char kStateFile[] = "state.binpb";

// A history file's element: field `history` of CoordinatorState,
// length-delimited (wire type 2).
constexpr uint32_t kHistoryTag =
    (v1::CoordinatorState::kHistoryFieldNumber << 3) | 2;

// Records [from, end) of `records`, each as an element of a CoordinatorState's
// history (its tag, length and wire form): bytes that parse as a
// CoordinatorState holding those records, and that may follow others of their
// kind (a repeated field's elements may come anywhere in a message).
std::string EncodeRecords(const std::vector<History::Record>& records,
                          size_t from) {
  using google::protobuf::io::CodedOutputStream;
  constexpr uint32_t kTag = kHistoryTag;
  size_t size = 0;
  for (size_t i = from; i < records.size(); ++i) {
    const size_t n = records[i].wire().size();
    size += CodedOutputStream::VarintSize32(kTag) +
            CodedOutputStream::VarintSize32(static_cast<uint32_t>(n)) + n;
  }
  std::string bytes;
  bytes.reserve(size);
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    CodedOutputStream out(&stream);
    for (size_t i = from; i < records.size(); ++i) {
      const absl::string_view wire = records[i].wire();
      out.WriteTag(kTag);
      out.WriteVarint32(static_cast<uint32_t>(wire.size()));
      out.WriteRaw(wire.data(), static_cast<int>(wire.size()));
    }
  }
  return bytes;
}

// A run's history files: history-<run id>-<generation>.binpb.
std::string HistoryFileName(absl::string_view run_id, int64_t generation) {
  return absl::StrCat("history-", run_id, "-", generation, ".binpb");
}

// The generation of `name` if it is a history file of `run_id`.
std::optional<int64_t> HistoryGeneration(absl::string_view name,
                                         absl::string_view run_id) {
  const std::string prefix = absl::StrCat("history-", run_id, "-");
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, ".binpb") ||
      name.find('/') != name.npos) {
    return std::nullopt;
  }
  name.remove_prefix(prefix.size());
  name.remove_suffix(std::string_view(".binpb").size());
  int64_t generation = 0;
  if (name.empty() || name.find_first_not_of("0123456789") != name.npos ||
      !absl::SimpleAtoi(name, &generation) || generation < 1) {
    return std::nullopt;
  }
  return generation;
}

std::string ModelFileName(int64_t round) {
  return absl::StrFormat("model-%06d.safetensors", round);
}

std::string OptimizerFileName(int64_t round) {
  return absl::StrFormat("optimizer-%06d.safetensors", round);
}

// The tensors of an optimizer file: "SLOT/NAME" for each slot and model
// tensor, slot by slot.
absl::StatusOr<ModelSpec> OptimizerSpec(const ModelSpec& model,
                                        const std::vector<std::string>& slots) {
  std::vector<TensorDecl> decls;
  for (const std::string& slot : slots) {
    for (const TensorSpec& t : model.tensors) {
      decls.push_back({absl::StrCat(slot, "/", t.name), t.shape, Init::kZeros});
    }
  }
  return MakeModelSpec(absl::StrCat(model.name, " optimizer"),
                       std::move(decls));
}

// Removes the files named PREFIX*SUFFIX in `dir` other than `keep`.
void RemoveOthers(const std::string& dir, absl::string_view prefix,
                  absl::string_view suffix, const std::string& keep) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix) && absl::EndsWith(name, suffix) &&
        name != keep) {
      std::filesystem::remove(entry.path(), error);
    }
  }
}

// Appends to `state`'s history the records of the history file it names in
// Reads a varint at `*at` of `bytes`, moving `*at` past it; false if none
// fits there.
bool ReadVarint(absl::string_view bytes, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *at < bytes.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(bytes[(*at)++]);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The records of a history file's `bytes` (EncodeRecords' form), appended to
// `out` one by one: protobuf parses no message over 2 GiB, and a long run's
// history file may grow past that. False if the bytes are anything else.
bool DecodeRecords(absl::string_view bytes,
                   google::protobuf::RepeatedPtrField<v1::RoundRecord>* out) {
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t tag = 0, size = 0;
    if (!ReadVarint(bytes, &at, &tag) || tag != kHistoryTag ||
        !ReadVarint(bytes, &at, &size) || size > bytes.size() - at ||
        size > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return false;
    }
    if (!out->Add()->ParseFromArray(bytes.data() + at,
                                    static_cast<int>(size))) {
      return false;
    }
    at += size;
  }
  return true;
}

// `dir` (read from `state_path`), and returns the file's generation; nullopt
// when it names none. DATA_LOSS or INVALID_ARGUMENT, naming the file, when
// the file is missing, shorter than the state says or damaged.
absl::StatusOr<std::optional<int64_t>> LoadHistoryFile(
    const std::string& dir, const std::string& state_path,
    v1::CoordinatorState* state) {
  if (state->history_file().empty()) {
    if (state->history_bytes() != 0 || state->history_records() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          state_path, ": names ", state->history_records(), " records in ",
          state->history_bytes(), " bytes of no history file"));
    }
    return std::nullopt;
  }
  const std::optional<int64_t> generation =
      HistoryGeneration(state->history_file(), state->run_id());
  if (!generation.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(state_path, ": history file \"", state->history_file(),
                     "\" is not one of run \"", state->run_id(), "\""));
  }
  const int64_t size = state->history_bytes();
  if (size < 0 || state->history_records() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        state_path, ": names ", state->history_records(), " records in ", size,
        " bytes of ", state->history_file()));
  }
  const std::string path = absl::StrCat(dir, "/", state->history_file());
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::DataLossError(absl::StrCat(path, ": missing; ", state_path,
                                            " names ", size, " bytes of it"));
  }
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(bytes->size()) < size) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes->size(),
                                            " bytes, ", state_path, " names ",
                                            size, " (truncated?)"));
  }
  google::protobuf::RepeatedPtrField<v1::RoundRecord> records;
  if (!DecodeRecords(absl::string_view(*bytes).substr(0, size), &records)) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a history of records only (damaged?) in its first ", size,
        " bytes"));
  }
  if (records.size() != state->history_records()) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", records.size(), " records in its first ", size, " bytes, ",
        state_path, " names ", state->history_records()));
  }
  state->mutable_history()->Reserve(state->history_size() + records.size());
  for (v1::RoundRecord& record : records) state->add_history()->Swap(&record);
  return generation;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(std::string dir) {
  std::error_code error;
  // The directories about to be made, deepest first: each one's entry in its
  // parent is fsynced once it exists, so that a crash after the first save
  // cannot lose the directory that save went into.
  std::vector<std::filesystem::path> missing;
  std::filesystem::path level =
      std::filesystem::absolute(dir, error).lexically_normal();
  if (!level.has_filename()) level = level.parent_path();
  while (!error && level.has_relative_path() &&
         !std::filesystem::exists(level, error)) {
    missing.push_back(level);
    level = level.parent_path();
  }
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::ErrnoToStatus(
        error.value(), absl::StrCat("--state_dir: cannot create ", dir));
  }
  for (const std::filesystem::path& made : missing) {
    if (absl::Status s = SyncDirectory(made.string()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--state_dir: ", s.message()));
    }
  }
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir: ", dir, " is not a directory"));
  }
  // Two coordinators on one directory would delete each other's models.
  const std::string lock_path = absl::StrCat(dir, "/lock");
  absl::StatusOr<int> fd = LockFileExclusively(lock_path);
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state_dir: ", dir,
                       " is in use by another coordinator (", lock_path, ")"));
    }
    return absl::Status(fd.status().code(),
                        absl::StrCat("--state_dir: ", fd.status().message()));
  }
  ScopedFd lock(*fd);
  // Ours alone now: temporary files are what a killed writer left behind.
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().filename().string().find(".tmp.") != std::string::npos) {
      std::filesystem::remove(entry.path(), error);
    }
  }
  return std::unique_ptr<StateStore>(
      new StateStore(std::move(dir), lock.Release()));
}

absl::StatusOr<std::optional<SavedRun>> StateStore::Load(
    const ModelSpec& spec) {
  const std::string path = absl::StrCat(dir_, "/", kStateFile);
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (absl::IsNotFound(bytes.status())) return std::nullopt;
  if (!bytes.ok()) return bytes.status();
  SavedRun run;
  if (!run.state.ParseFromString(*bytes)) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a CoordinatorState (damaged?)"));
  }
  const v1::CoordinatorState& state = run.state;
  if (state.format_version() < kOldestFormatVersion ||
      state.format_version() > kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format version ", state.format_version(),
                     "; this coordinator reads versions ", kOldestFormatVersion,
                     " to ", kFormatVersion));
  }
  if (state.model() != spec.name) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the saved run trains ", state.model(), ", not ", spec.name,
        " (use --model=", state.model(), " or another --state_dir)"));
  }
  if (state.model_file() != ModelFileName(state.model_round())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model file \"", state.model_file(),
                     "\" is not the one of round ", state.model_round()));
  }
  std::map<std::string, std::string> metadata;
  FEDLEARN_ASSIGN_OR_RETURN(
      std::vector<float> weights,
      ReadSafetensors(absl::StrCat(dir_, "/", state.model_file()), spec,
                      &metadata));
  if (metadata["run_id"] != state.run_id()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, "/", state.model_file(), ": written by run \"",
        metadata["run_id"], "\", the state is run \"", state.run_id(), "\""));
  }
  run.weights = std::make_shared<const std::vector<float>>(std::move(weights));
  run.optimizer.steps = state.optimizer_steps();
  if (state.optimizer_slots_size() > 0) {
    const std::vector<std::string> slots(state.optimizer_slots().begin(),
                                         state.optimizer_slots().end());
    if (state.optimizer_file() != OptimizerFileName(state.model_round())) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": optimizer file \"", state.optimizer_file(),
                       "\" is not the one of round ", state.model_round()));
    }
    FEDLEARN_ASSIGN_OR_RETURN(ModelSpec optimizer_spec,
                              OptimizerSpec(spec, slots));
    const std::string optimizer_path =
        absl::StrCat(dir_, "/", state.optimizer_file());
    std::map<std::string, std::string> optimizer_metadata;
    FEDLEARN_ASSIGN_OR_RETURN(
        std::vector<float> values,
        ReadSafetensors(optimizer_path, optimizer_spec, &optimizer_metadata));
    if (optimizer_metadata["run_id"] != state.run_id()) {
      return absl::InvalidArgumentError(absl::StrCat(
          optimizer_path, ": written by run \"", optimizer_metadata["run_id"],
          "\", the state is run \"", state.run_id(), "\""));
    }
    const size_t n = static_cast<size_t>(spec.num_parameters);
    for (size_t i = 0; i < slots.size(); ++i) {
      run.optimizer.slots.emplace_back(
          slots[i], std::make_shared<const std::vector<float>>(
                        values.begin() + i * n, values.begin() + (i + 1) * n));
    }
  }
  const int inline_records = state.history_size();
  FEDLEARN_ASSIGN_OR_RETURN(std::optional<int64_t> generation,
                            LoadHistoryFile(dir_, path, &run.state));
  absl::MutexLock lock(&mu_);
  SwitchRunLocked(state.run_id());
  // The next save continues this history file, unless the state held
  // records of its own: the caller passes those among its records then.
  history_generation_ = std::max(history_generation_, generation.value_or(0));
  if (generation.has_value() && inline_records == 0) {
    history_file_ = state.history_file();
    history_records_ = state.history_records();
    history_bytes_ = state.history_bytes();
    run.records_on_disk = history_records_;
  } else {
    history_file_.clear();
    history_records_ = 0;
    history_bytes_ = 0;
  }
  return run;
}

void StateStore::SwitchRunLocked(const std::string& run_id) {
  if (run_id == run_) return;
  run_ = run_id;
  saved_history_ = -1;
  written_model_round_ = -1;
  written_optimizer_round_ = -1;
  history_file_.clear();
  history_generation_ = 0;
  history_records_ = 0;
  history_bytes_ = 0;
}

absl::Status StateStore::Save(const ModelSpec& spec, const SavedRun& run) {
  absl::MutexLock lock(&mu_);
  const v1::CoordinatorState& state = run.state;
  SwitchRunLocked(state.run_id());
  const int64_t records =
      run.records_from + static_cast<int64_t>(run.records.size());
  const int64_t history_size = state.history_size() + records;
  if (history_size < saved_history_) return absl::OkStatus();
  // A save that does not continue the records written (fewer of them; a
  // resumed state that held records of its own, which the caller now passes
  // among `records`) starts a new file rather than rewrite one a state on
  // disk names; it must pass them all.
  const int64_t continues_from =
      records < history_records_ ? 0 : history_records_;
  if (run.records_from > continues_from) {
    return absl::FailedPreconditionError(absl::StrCat(
        "saving run ", state.run_id(), ": its records from ", run.records_from,
        " on were passed, and the history file holds ", continues_from,
        " of them"));
  }
  const std::string model_file = ModelFileName(state.model_round());
  const std::string model_path = absl::StrCat(dir_, "/", model_file);
  // The model changes once a round; a file left by another process (or run)
  // is never trusted.
  if (state.model_round() != written_model_round_) {
    FEDLEARN_RETURN_IF_ERROR(
        WriteSafetensors(model_path, spec, *run.weights,
                         {{"run_id", state.run_id()},
                          {"model", spec.name},
                          {"round", absl::StrCat(state.model_round())}}));
    written_model_round_ = state.model_round();
  }
  v1::CoordinatorState to_write = state;
  to_write.set_format_version(kFormatVersion);
  to_write.set_model(spec.name);
  to_write.set_model_file(model_file);
  to_write.set_optimizer_steps(run.optimizer.steps);
  to_write.clear_optimizer_slots();
  to_write.clear_optimizer_file();
  std::string optimizer_file;
  if (!run.optimizer.slots.empty()) {
    // Written with its model, before the state that names them both.
    optimizer_file = OptimizerFileName(state.model_round());
    std::vector<std::string> slots;
    for (const auto& [slot, vector] : run.optimizer.slots) {
      slots.push_back(slot);
      *to_write.add_optimizer_slots() = slot;
    }
    if (state.model_round() != written_optimizer_round_) {
      FEDLEARN_ASSIGN_OR_RETURN(ModelSpec optimizer_spec,
                                OptimizerSpec(spec, slots));
      // The file is its header then each slot's values, written from the
      // slots as they are: no model-sized copy (Adam keeps two).
      const std::string prefix = SafetensorsPrefix(
          optimizer_spec, {{"run_id", state.run_id()},
                           {"strategy", state.strategy()},
                           {"round", absl::StrCat(state.model_round())}});
      std::vector<absl::string_view> parts = {prefix};
      for (const auto& [slot, vector] : run.optimizer.slots) {
        if (static_cast<int64_t>(vector->size()) != spec.num_parameters) {
          return absl::InvalidArgumentError(absl::StrCat(
              "saving the optimizer's ", slot, ": model ", spec.name, " has ",
              spec.num_parameters, " parameters, the slot ", vector->size()));
        }
        parts.emplace_back(reinterpret_cast<const char*>(vector->data()),
                           vector->size() * sizeof(float));
      }
      FEDLEARN_RETURN_IF_ERROR(
          WriteFileAtomically(absl::StrCat(dir_, "/", optimizer_file), parts));
      written_optimizer_round_ = state.model_round();
    }
    to_write.set_optimizer_file(optimizer_file);
  }
  // The history file: the records it does not hold yet, appended (and
  // synced) before the state that names them.
  if (continues_from == 0 && history_records_ != 0) {
    history_file_.clear();
    history_records_ = 0;
    history_bytes_ = 0;
  }
  if (records > history_records_) {
    if (history_file_.empty()) {
      history_file_ = HistoryFileName(state.run_id(), ++history_generation_);
    }
    const std::string appended = EncodeRecords(
        run.records, static_cast<size_t>(history_records_ - run.records_from));
    FEDLEARN_RETURN_IF_ERROR(WriteFileAt(absl::StrCat(dir_, "/", history_file_),
                                         history_bytes_, appended));
    history_records_ = records;
    history_bytes_ += static_cast<int64_t>(appended.size());
  }
  to_write.set_history_file(history_file_);
  to_write.set_history_bytes(history_bytes_);
  to_write.set_history_records(history_records_);
  const std::string bytes = to_write.SerializeAsString();
  const absl::string_view parts[] = {bytes};
  FEDLEARN_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(dir_, "/", kStateFile), parts));
  saved_history_ = history_size;
  // Older files are no longer named by the state: remove them.
  RemoveOthers(dir_, "model-", ".safetensors", model_file);
  RemoveOthers(dir_, "optimizer-", ".safetensors", optimizer_file);
  RemoveOthers(dir_, "history-", ".binpb", history_file_);
  return absl::OkStatus();
}

}  // namespace fedlearn
