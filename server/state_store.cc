#include "server/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
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

// `state`'s wire form followed by each of `records` as an element of its
// history: a repeated field's elements may come anywhere in a message, so the
// file parses as `state` with the records appended to its history.
std::string WithRecords(const v1::CoordinatorState& state,
                        const std::vector<History::Record>& records) {
  using google::protobuf::io::CodedOutputStream;
  // Field `history`, length-delimited (wire type 2).
  constexpr uint32_t kTag =
      (v1::CoordinatorState::kHistoryFieldNumber << 3) | 2;
  size_t size = state.ByteSizeLong();
  for (const History::Record& record : records) {
    const size_t n = record.wire().size();
    size += CodedOutputStream::VarintSize32(kTag) +
            CodedOutputStream::VarintSize32(static_cast<uint32_t>(n)) + n;
  }
  std::string bytes;
  bytes.reserve(size);
  state.AppendToString(&bytes);
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    CodedOutputStream out(&stream);
    for (const History::Record& record : records) {
      const absl::string_view wire = record.wire();
      out.WriteTag(kTag);
      out.WriteVarint32(static_cast<uint32_t>(wire.size()));
      out.WriteRaw(wire.data(), static_cast<int>(wire.size()));
    }
  }
  return bytes;
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

// Removes the files named PREFIX-*.safetensors in `dir` other than `keep`.
void RemoveOthers(const std::string& dir, absl::string_view prefix,
                  const std::string& keep) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix) &&
        absl::EndsWith(name, ".safetensors") && name != keep) {
      std::filesystem::remove(entry.path(), error);
    }
  }
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
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("--state_dir: cannot open ", lock_path));
  }
  ScopedFd lock(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state_dir: ", dir,
                       " is in use by another coordinator (", lock_path, ")"));
    }
    return absl::ErrnoToStatus(
        errno, absl::StrCat("--state_dir: cannot lock ", lock_path));
  }
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
    const ModelSpec& spec) const {
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
  if (state.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format version ", state.format_version(),
                     "; this coordinator reads version ", kFormatVersion));
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
  return run;
}

absl::Status StateStore::Save(const ModelSpec& spec, const SavedRun& run) {
  absl::MutexLock lock(&mu_);
  const v1::CoordinatorState& state = run.state;
  const int64_t history_size =
      state.history_size() + static_cast<int64_t>(run.records.size());
  if (history_size < saved_history_) return absl::OkStatus();
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
  const std::string bytes = WithRecords(to_write, run.records);
  const absl::string_view parts[] = {bytes};
  FEDLEARN_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(dir_, "/", kStateFile), parts));
  saved_history_ = history_size;
  // Older files are no longer named by the state: remove them.
  RemoveOthers(dir_, "model-", model_file);
  RemoveOthers(dir_, "optimizer-", optimizer_file);
  return absl::OkStatus();
}

}  // namespace fedlearn
