// The coordinator's state directory: what is saved comes back bit for bit,
// damage is reported naming the file, and a coordinator restarted on the
// directory resumes the run (real gRPC, scripted clients).

#include "server/state_store.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/history.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;
using testing::Header;
using testing::kWait;
using testing::NextTask;
using testing::ScopedTempDir;
using testing::SmallRun;

ModelSpec Mlp() { return *LookupModel("mlp_2nn"); }

SavedRun SomeRun(int64_t model_round, float value) {
  SavedRun run;
  run.state.set_run_id("abc123");
  run.state.set_phase(v1::PHASE_TRAINING);
  run.state.set_round(model_round + 1);
  run.state.set_model_round(model_round);
  for (int64_t r = 1; r <= model_round; ++r) {
    v1::RoundRecord* record = run.state.add_history();
    record->set_round(r);
    record->set_outcome("all");
  }
  run.state.set_has_previous_train_loss(true);
  run.state.set_previous_train_loss(0.5);
  run.state.set_sampler("some sampler state");
  auto weights = std::vector<float>(Mlp().num_parameters, value);
  weights[7] = -0.0f;  // bit patterns, not just values, must survive
  run.weights = std::make_shared<const std::vector<float>>(std::move(weights));
  return run;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(StateStoreTest, EmptyDirectoryHoldsNoRun) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string() + "/new/state");
  ASSERT_TRUE(store.ok()) << store.status();
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_value());
}

TEST(StateStoreTest, MissingDirectoriesAreMadeAndABadPathNamesTheFlag) {
  ScopedTempDir dir;
  const std::string nested = dir.path().string() + "/a/b/state/";
  ASSERT_TRUE(StateStore::Open(nested).ok());
  EXPECT_TRUE(std::filesystem::is_directory(nested));
  // Under a regular file no directory can be made.
  const std::string file = dir.path().string() + "/file";
  { std::ofstream(file) << "x"; }
  auto refused = StateStore::Open(file + "/state");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--state_dir: cannot create " + file + "/state"));
}

TEST(StateStoreTest, SavedRunComesBackBitForBit) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE(store.ok());
  const SavedRun saved = SomeRun(2, 0.25f);
  ASSERT_TRUE((*store)->Save(Mlp(), saved).ok());
  EXPECT_THAT(Files(dir.path().string()),
              ::testing::ElementsAre("lock", "model-000002.safetensors",
                                     "state.binpb"));

  store->reset();  // releases the directory
  auto reopened = StateStore::Open(dir.path().string());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto loaded = (*reopened)->Load(Mlp());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  const SavedRun& run = **loaded;
  EXPECT_EQ(run.state.run_id(), "abc123");
  EXPECT_EQ(run.state.round(), 3);
  EXPECT_EQ(run.state.history_size(), 2);
  EXPECT_EQ(run.state.sampler(), "some sampler state");
  EXPECT_EQ(run.state.model(), "mlp_2nn");
  ASSERT_EQ(run.weights->size(), saved.weights->size());
  EXPECT_EQ(std::memcmp(run.weights->data(), saved.weights->data(),
                        saved.weights->size() * sizeof(float)),
            0);
}

// The coordinator hands the save its history as kept (History::Record): the
// file holds them after the state's own records, client ids included, and
// reads back as one history; their count is the history's length when a
// racing save decides which is newer.
TEST(StateStoreTest, KeptRecordsAreSavedAfterTheStatesOwn) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE(store.ok());
  SavedRun saved = SomeRun(2, 0.25f);
  History history;
  std::vector<v1::RoundRecord> kept;
  for (int64_t r = 3; r <= 5; ++r) {
    v1::RoundRecord record;
    record.set_round(r);
    record.set_outcome("quorum");
    record.set_duration_seconds(0.5 * static_cast<double>(r));
    for (int c = 0; c < 10 * r; ++c) {
      record.add_selected_clients(absl::StrCat("client-", c));
    }
    record.add_accepted_clients("client-1");
    history.Append(record);
    kept.push_back(std::move(record));
  }
  saved.records = history.Latest(10);
  ASSERT_TRUE((*store)->Save(Mlp(), saved).ok());

  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  const v1::CoordinatorState& state = (**loaded).state;
  ASSERT_EQ(state.history_size(), 5);
  EXPECT_EQ(state.history(0).round(), 1);
  EXPECT_EQ(state.history(1).round(), 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        state.history(2 + i), kept[i]))
        << state.history(2 + i).DebugString();
  }
  EXPECT_EQ(state.run_id(), "abc123");
  EXPECT_EQ(state.sampler(), "some sampler state");

  // Four records in all is older than the five saved: skipped.
  SavedRun older = SomeRun(3, 0.5f);
  older.records = history.Latest(1);
  ASSERT_TRUE((*store)->Save(Mlp(), older).ok());
  EXPECT_EQ((**(*store)->Load(Mlp())).state.history_size(), 5);
}

TEST(StateStoreTest, KeepsOnlyTheModelTheStateNamesAndNeverGoesBack) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(1, 0.1f)).ok());
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(3, 0.3f)).ok());
  // A save that lost a race with a newer one is skipped.
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(2, 0.2f)).ok());
  EXPECT_THAT(Files(dir.path().string()),
              ::testing::ElementsAre("lock", "model-000003.safetensors",
                                     "state.binpb"));
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((**loaded).state.model_round(), 3);
  EXPECT_EQ((*(**loaded).weights)[0], 0.3f);
}

TEST(StateStoreTest, OneCoordinatorAtATimePerDirectory) {
  ScopedTempDir dir;
  auto first = StateStore::Open(dir.path().string());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StateStore::Open(dir.path().string());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another coordinator"));
  first->reset();
  EXPECT_TRUE(StateStore::Open(dir.path().string()).ok());
}

TEST(StateStoreTest, TemporaryFilesOfAKilledWriterAreRemoved) {
  ScopedTempDir dir;
  {
    auto store = StateStore::Open(dir.path().string());
    ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(1, 0.1f)).ok());
  }
  const std::string leftover =
      dir.path().string() + "/model-000002.safetensors.tmp.4242.0";
  std::ofstream(leftover) << "half a model";
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE(std::filesystem::exists(leftover));
  auto loaded = (*store)->Load(Mlp());  // the saved run is untouched
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((**loaded).state.model_round(), 1);
}

TEST(StateStoreTest, AnotherModelIsRefused) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(1, 0.1f)).ok());
  auto loaded = (*store)->Load(*LookupModel("mnist_cnn"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("--model=mlp_2nn"));
}

TEST(StateStoreTest, DamagedFilesAreErrorsNamingThem) {
  ScopedTempDir dir;
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(1, 0.1f)).ok());
  const std::string model = dir.path().string() + "/model-000001.safetensors";
  std::filesystem::resize_file(model, std::filesystem::file_size(model) - 4);
  auto truncated = (*store)->Load(Mlp());
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr(model));

  std::ofstream(dir.path().string() + "/state.binpb", std::ios::trunc)
      << "\xff\xff";
  auto garbage = (*store)->Load(Mlp());
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(garbage.status().message(), HasSubstr("state.binpb"));
}

TEST(StateStoreTest, AModelLeftByAnotherRunIsNotTrusted) {
  ScopedTempDir dir;
  {
    auto other = StateStore::Open(dir.path().string());
    SavedRun run = SomeRun(1, 0.9f);
    run.state.set_run_id("other");
    ASSERT_TRUE((*other)->Save(Mlp(), run).ok());
  }
  // A new run in the same directory rewrites round 1's model as its own.
  auto store = StateStore::Open(dir.path().string());
  ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(1, 0.1f)).ok());
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*(**loaded).weights)[0], 0.1f);
}

// A run with no records of its own in the state, as the coordinator saves
// it: every record is one of `history`'s, rounds 1 to history.total().
SavedRun RunWithHistory(const History& history, const std::string& run_id) {
  SavedRun run = SomeRun(0, 0.25f);
  run.state.set_run_id(run_id);
  run.state.set_round(static_cast<int64_t>(history.total()) + 1);
  run.records = history.Latest(history.total());
  return run;
}

v1::RoundRecord RoundOf(int64_t round, int clients) {
  v1::RoundRecord record;
  record.set_round(round);
  record.set_outcome("all");
  for (int c = 0; c < clients; ++c) {
    record.add_selected_clients(absl::StrCat("client-", round, "-", c));
  }
  return record;
}

std::vector<int64_t> Rounds(const v1::CoordinatorState& state) {
  std::vector<int64_t> rounds;
  for (const v1::RoundRecord& r : state.history()) rounds.push_back(r.round());
  return rounds;
}

std::vector<int64_t> OneTo(int64_t n) {
  std::vector<int64_t> rounds;
  for (int64_t r = 1; r <= n; ++r) rounds.push_back(r);
  return rounds;
}

// A save writes the records new since the last one and leaves the ones
// written alone: the state file stays the same size however long the run, and
// the history file only grows, its bytes kept.
TEST(StateStoreTest, SavesAppendOnlyTheRecordsNewSinceTheLast) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  auto store = StateStore::Open(root);
  ASSERT_TRUE(store.ok());
  History history;
  for (int64_t r = 1; r <= 3; ++r) history.Append(RoundOf(r, 10));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());
  const std::string file = root + "/history-abc123-1.binpb";
  EXPECT_THAT(Files(root), ::testing::ElementsAre(
                               "history-abc123-1.binpb", "lock",
                               "model-000000.safetensors", "state.binpb"));
  const std::string first = testing::ReadBytes(file);
  const auto state_size = std::filesystem::file_size(root + "/state.binpb");

  for (int64_t r = 4; r <= 500; ++r) history.Append(RoundOf(r, 10));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());
  const std::string second = testing::ReadBytes(file);
  ASSERT_GT(second.size(), first.size());
  EXPECT_EQ(second.substr(0, first.size()), first);
  // Only the counts in the state grew (their varints: a few bytes).
  EXPECT_LE(std::filesystem::file_size(root + "/state.binpb"), state_size + 4);

  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  const v1::CoordinatorState& state = (**loaded).state;
  EXPECT_EQ(Rounds(state), OneTo(500));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      state.history(499), RoundOf(500, 10)));
  // The file is history elements and nothing else: it parses as a state
  // holding just the records.
  v1::CoordinatorState parsed;
  ASSERT_TRUE(parsed.ParseFromString(second));
  EXPECT_EQ(parsed.history_size(), 500);
  EXPECT_EQ(parsed.run_id(), "");
}

// A coordinator passes only the records after those its last save wrote
// (SavedRun::records_from), so that what it takes under its lock does not
// grow with the run: the file goes on from them. Records that start past the
// file's end are refused, and nothing is written.
TEST(StateStoreTest, ASaveOfTheNewRecordsOnlyContinuesTheFileAndAGapIsRefused) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  auto store = StateStore::Open(root);
  ASSERT_TRUE(store.ok());
  History history;
  for (int64_t r = 1; r <= 3; ++r) history.Append(RoundOf(r, 2));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());

  for (int64_t r = 4; r <= 6; ++r) history.Append(RoundOf(r, 2));
  SavedRun newest = RunWithHistory(history, "abc123");
  newest.records = history.Latest(3);
  newest.records_from = 3;
  ASSERT_TRUE((*store)->Save(Mlp(), newest).ok());
  // Passed again, or with a record the file holds already: nothing doubles.
  newest.records = history.Latest(4);
  newest.records_from = 2;
  ASSERT_TRUE((*store)->Save(Mlp(), newest).ok());

  const std::string state_before = testing::ReadBytes(root + "/state.binpb");
  const std::string history_before =
      testing::ReadBytes(root + "/history-abc123-1.binpb");
  for (int64_t r = 7; r <= 9; ++r) history.Append(RoundOf(r, 2));
  SavedRun gap = RunWithHistory(history, "abc123");
  gap.records = history.Latest(2);  // 8 and 9: 7 is missing
  gap.records_from = 7;
  const absl::Status refused = (*store)->Save(Mlp(), gap);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("records from 7 on"));
  EXPECT_THAT(refused.message(), HasSubstr("holds 6"));
  EXPECT_EQ(testing::ReadBytes(root + "/state.binpb"), state_before);
  EXPECT_EQ(testing::ReadBytes(root + "/history-abc123-1.binpb"),
            history_before);

  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(6));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      (**loaded).state.history(5), RoundOf(6, 2)));
}

// A crash after the history file grew but before the state named its new
// length leaves records the state does not name: they are ignored, and the
// next save writes over them.
TEST(StateStoreTest, RecordsACrashLeftUnnamedAreIgnoredAndOverwritten) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  const std::string file = root + "/history-abc123-1.binpb";
  History history;
  for (int64_t r = 1; r <= 3; ++r) history.Append(RoundOf(r, 5));
  {
    auto store = StateStore::Open(root);
    ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());
  }
  const std::string clean = testing::ReadBytes(file);
  // Half of an append: a record's tag and length and a few of its bytes.
  testing::WriteBytes(file, clean + clean.substr(0, 9));

  auto store = StateStore::Open(root);
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(3));
  // The resumed run goes on in the same file.
  history.Append(RoundOf(4, 5));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());
  v1::CoordinatorState parsed;
  ASSERT_TRUE(parsed.ParseFromString(testing::ReadBytes(file)));
  EXPECT_EQ(Rounds(parsed), OneTo(4)) << "the cut-off bytes are gone";
  loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(4));
}

TEST(StateStoreTest, AMissingShortOrDamagedHistoryFileIsDataLoss) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  const std::string file = root + "/history-abc123-1.binpb";
  auto store = StateStore::Open(root);
  History history;
  for (int64_t r = 1; r <= 3; ++r) history.Append(RoundOf(r, 5));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(history, "abc123")).ok());
  const std::string clean = testing::ReadBytes(file);
  auto expect_data_loss = [&](const std::string& why) {
    auto loaded = (*store)->Load(Mlp());
    ASSERT_FALSE(loaded.ok()) << why;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << why;
    EXPECT_THAT(loaded.status().message(), HasSubstr(file)) << why;
    EXPECT_THAT(loaded.status().message(), HasSubstr(why));
  };
  testing::WriteBytes(file, clean.substr(0, clean.size() - 1));
  expect_data_loss("truncated");
  std::filesystem::remove(file);
  expect_data_loss("missing");
  // The first record's tag turned into run_id's: not a record any more.
  std::string other = clean;
  other[0] =
      static_cast<char>((v1::CoordinatorState::kRunIdFieldNumber << 3) | 2);
  testing::WriteBytes(file, other);
  expect_data_loss("not a history of records only");
  testing::WriteBytes(file, clean);
  EXPECT_TRUE((*store)->Load(Mlp()).ok());
}

// A new run in the directory, or a save that does not continue the records
// written, starts a new history file: never one the state on disk names.
// Files no state names are removed once the new state is written.
TEST(StateStoreTest, AnotherRunOrAnotherHistoryStartsANewFile) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  auto store = StateStore::Open(root);
  History first;
  for (int64_t r = 1; r <= 3; ++r) first.Append(RoundOf(r, 5));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(first, "abc123")).ok());

  History other;
  for (int64_t r = 1; r <= 4; ++r) other.Append(RoundOf(r, 7));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(other, "other")).ok());
  EXPECT_THAT(Files(root), ::testing::ElementsAre(
                               "history-other-1.binpb", "lock",
                               "model-000000.safetensors", "state.binpb"));
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((**loaded).state.run_id(), "other");
  EXPECT_EQ((**loaded).state.history(3).selected_clients_size(), 7);

  // The same run, its records now in the state itself: no history file.
  SavedRun inline_run = RunWithHistory(History(), "other");
  for (int64_t r = 1; r <= 5; ++r)
    *inline_run.state.add_history() = RoundOf(r, 7);
  ASSERT_TRUE((*store)->Save(Mlp(), inline_run).ok());
  EXPECT_THAT(Files(root),
              ::testing::ElementsAre("lock", "model-000000.safetensors",
                                     "state.binpb"));
  // Then kept records again: a new generation, not the file of before.
  other.Append(RoundOf(5, 7));
  other.Append(RoundOf(6, 7));
  ASSERT_TRUE((*store)->Save(Mlp(), RunWithHistory(other, "other")).ok());
  EXPECT_THAT(Files(root), ::testing::ElementsAre(
                               "history-other-2.binpb", "lock",
                               "model-000000.safetensors", "state.binpb"));
  loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(6));
}

// A directory written before the history file existed (format version 1: the
// whole history in the state) is read, and its run goes on in a history file.
TEST(StateStoreTest, AVersionOneStateIsReadAndGoesOnInAHistoryFile) {
  ScopedTempDir dir;
  const std::string root = dir.path().string();
  {
    auto store = StateStore::Open(root);
    ASSERT_TRUE((*store)->Save(Mlp(), SomeRun(2, 0.25f)).ok());
  }
  v1::CoordinatorState old;
  ASSERT_TRUE(old.ParseFromString(testing::ReadBytes(root + "/state.binpb")));
  old.set_format_version(1);
  testing::WriteBytes(root + "/state.binpb", old.SerializeAsString());

  auto store = StateStore::Open(root);
  auto loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(2));
  // The coordinator keeps the loaded records and passes them all on.
  History history;
  for (const v1::RoundRecord& r : (**loaded).state.history()) history.Append(r);
  history.Append(RoundOf(3, 5));
  SavedRun next = RunWithHistory(history, "abc123");
  next.state.set_model_round(2);
  next.weights = (**loaded).weights;
  ASSERT_TRUE((*store)->Save(Mlp(), next).ok());
  loaded = (*store)->Load(Mlp());
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ(Rounds((**loaded).state), OneTo(3));
  EXPECT_EQ((**loaded).state.format_version(), StateStore::kFormatVersion);
  EXPECT_EQ((**loaded).state.history_file(), "history-abc123-1.binpb");

  old.set_format_version(StateStore::kFormatVersion + 1);
  testing::WriteBytes(root + "/state.binpb", old.SerializeAsString());
  auto newer = (*store)->Load(Mlp());
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Three fresh clients join `server` and train rounds `first` to `last`, each
// pushing 0.01 x round everywhere; each checks it was sent the global model.
std::vector<std::unique_ptr<CoordinatorClient>> Train(CoordinatorServer& server,
                                                      int64_t first,
                                                      int64_t last) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.port()),
                                     grpc::InsecureChannelCredentials());
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<CoordinatorClient>(channel));
    EXPECT_TRUE(clients.back()->Join(v1::JoinRequest()).ok());
  }
  for (int64_t round = first; round <= last; ++round) {
    for (auto& c : clients) {
      // Compared before the push: the round may close with it.
      const Weights global = server.controller().global_weights();
      EXPECT_EQ(testing::TrainConstant(*c, round, 0.01f * round).weights,
                *global);
    }
  }
  return clients;
}

class ResumeTest : public ::testing::Test {
 protected:
  std::unique_ptr<CoordinatorServer> Start(
      int history_in_memory = static_cast<int>(History::kDefaultMaxRecords)) {
    CoordinatorOptions options = SmallRun();
    options.max_rounds = 4;
    options.history_in_memory = history_in_memory;
    options.state_dir = dir_.path().string();
    auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  ScopedTempDir dir_;
};

TEST_F(ResumeTest, RestartedCoordinatorGoesOnFromTheLastRound) {
  std::vector<float> weights_after_2;
  v1::GetStatusResponse before;
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    Train(*server, 1, 2);
    weights_after_2 = *server->controller().global_weights();
    before = server->controller().GetStatus();
  }  // shut down: as far as the directory knows, it may as well have crashed

  auto server = Start();
  ASSERT_NE(server, nullptr);
  v1::GetStatusResponse resumed = server->controller().GetStatus();
  EXPECT_EQ(resumed.run_id(), before.run_id());
  EXPECT_EQ(resumed.phase(), v1::PHASE_WAITING_FOR_CLIENTS);
  EXPECT_EQ(resumed.round(), 3);
  EXPECT_EQ(resumed.clients_size(), 0);  // clients join the new process
  ASSERT_EQ(resumed.history_size(), 2);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
      resumed.history(1), before.history(1)));
  EXPECT_EQ(resumed.bytes_received(), before.bytes_received());
  EXPECT_EQ(*server->controller().global_weights(), weights_after_2);

  // New clients carry on with rounds 3 and 4 from the saved model, then the
  // evaluation closes the run.
  Train(*server, 3, 4);
  ASSERT_TRUE(server->controller().AwaitPhase(v1::PHASE_EVALUATING, kWait));
  EXPECT_EQ(server->controller().GetStatus().history_size(), 4);
}

// --history_in_memory bounds the records kept in memory, not those saved:
// the history file has every one, a resumed run reads them all (and replays
// them, as its privacy ledger must), and keeps the newest once it has saved.
TEST_F(ResumeTest, RecordsLetGoOfInMemoryAreAllSavedAndResumed) {
  {
    auto server = Start(/*history_in_memory=*/1);
    ASSERT_NE(server, nullptr);
    Train(*server, 1, 3);
    const v1::GetStatusResponse status = server->controller().GetStatus();
    EXPECT_EQ(status.history_total(), 3);
    ASSERT_EQ(status.history_size(), 1);
    EXPECT_EQ(status.history(0).round(), 3);
  }
  auto store = StateStore::Open(dir_.path().string());
  ASSERT_TRUE(store.ok());
  auto saved = (*store)->Load(Mlp());
  ASSERT_TRUE(saved.ok() && saved->has_value()) << saved.status();
  EXPECT_EQ(Rounds((**saved).state), OneTo(3));
  store->reset();

  auto server = Start(/*history_in_memory=*/1);
  ASSERT_NE(server, nullptr);
  // The history file holds them: the resumed run keeps one at once, not
  // every record until its first save (a resumed DONE run never saves).
  const v1::GetStatusResponse resumed = server->controller().GetStatus();
  EXPECT_EQ(resumed.history_total(), 3);
  EXPECT_EQ(resumed.history_size(), 1);
  Train(*server, 4, 4);
  ASSERT_TRUE(server->controller().AwaitPhase(v1::PHASE_EVALUATING, kWait));
  const v1::GetStatusResponse status = server->controller().GetStatus();
  EXPECT_EQ(status.history_total(), 4);
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).round(), 4);
  server.reset();
  store = StateStore::Open(dir_.path().string());
  ASSERT_TRUE(store.ok());
  saved = (*store)->Load(Mlp());
  ASSERT_TRUE(saved.ok() && saved->has_value()) << saved.status();
  EXPECT_EQ(Rounds((**saved).state), OneTo(4));
}

// Attempts of a round abandoned before a restart keep their numbers: the
// next attempt after it is numbered after them, so no two records share a
// round and an attempt.
TEST_F(ResumeTest, AttemptsAreNumberedOnAcrossARestart) {
  CoordinatorOptions options = SmallRun();
  options.state_dir = dir_.path().string();
  options.round_timeout = absl::Milliseconds(300);
  auto abandon = [&](int64_t records) {
    auto server = CoordinatorServer::Start(options, "127.0.0.1:0");
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return std::vector<v1::RoundRecord>();
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                            grpc::InsecureChannelCredentials());
    std::vector<std::unique_ptr<CoordinatorClient>> clients;
    for (int i = 0; i < 3; ++i) {  // joined, selected, never pushing
      clients.push_back(std::make_unique<CoordinatorClient>(channel));
      EXPECT_TRUE(clients.back()->Join(v1::JoinRequest()).ok());
    }
    EXPECT_TRUE((*server)->controller().AwaitHistory(records, kWait));
    const v1::GetStatusResponse status = (*server)->controller().GetStatus();
    return std::vector<v1::RoundRecord>(status.history().begin(),
                                        status.history().end());
  };
  const std::vector<v1::RoundRecord> first = abandon(2);
  ASSERT_GE(first.size(), 2u);
  const int before = first.back().attempt();
  const std::vector<v1::RoundRecord> resumed = abandon(first.size() + 1);
  ASSERT_GE(resumed.size(), first.size() + 1);
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].round(), 1);
    EXPECT_EQ(resumed[i].outcome(), "abandoned");
    EXPECT_EQ(resumed[i].attempt(), static_cast<int>(i) + 1) << i;
  }
  EXPECT_GT(resumed[first.size()].attempt(), before);
}

TEST_F(ResumeTest, ARunResumesOnlyInItsOwnMode) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    Train(*server, 1, 1);
  }
  CoordinatorOptions options = SmallRun();
  options.state_dir = dir_.path().string();
  options.mode = Mode::kAsync;  // rounds would count updates from here on
  auto async = CoordinatorServer::Start(options, "127.0.0.1:0");
  EXPECT_EQ(async.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(async.status().message(),
              ::testing::HasSubstr("holds a run in rounds mode, not async"));
  auto server = Start();  // in its own mode it resumes
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->controller().GetStatus().round(), 2);
}

// A FedAdam run killed after round 2 and resumed makes the same models bit
// for bit as one run straight through: its optimizer's m and v are part of the
// run. The clients push the same deltas in both runs, so only lost optimizer
// state could make the models differ.
TEST(ResumeStrategyTest, ResumedFedAdamRunMatchesTheUninterruptedOne) {
  ScopedTempDir dir;
  auto options_for = [&dir](const std::string& name) {
    CoordinatorOptions options = SmallRun();
    options.max_rounds = 4;
    options.state_dir = (dir.path() / name).string();
    options.strategy = "fedadam";
    options.strategy_config.set_server_learning_rate(0.1);
    return options;
  };
  auto whole = CoordinatorServer::Start(options_for("whole"), "127.0.0.1:0");
  ASSERT_TRUE(whole.ok()) << whole.status();
  Train(**whole, 1, 4);
  const std::vector<float> straight = *(*whole)->controller().global_weights();
  {
    auto first = CoordinatorServer::Start(options_for("split"), "127.0.0.1:0");
    ASSERT_TRUE(first.ok()) << first.status();
    Train(**first, 1, 2);
  }
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "split" /
                                      "optimizer-000002.safetensors"));
  // Another strategy cannot take the run over.
  CoordinatorOptions fedavg = options_for("split");
  fedavg.strategy = "fedavg";
  fedavg.strategy_config.Clear();
  auto refused = CoordinatorServer::Start(fedavg, "127.0.0.1:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("holds a run of strategy fedadam, not fedavg"));
  // Nor can the same strategy with other knobs: m and v were made with these.
  CoordinatorOptions other_rate = options_for("split");
  other_rate.strategy_config.set_server_learning_rate(0.2);
  refused = CoordinatorServer::Start(other_rate, "127.0.0.1:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("with {server_learning_rate: 0.1 "));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("not {server_learning_rate: 0.2 "));
  // Knobs left to their defaults are the defaults written out: the same.
  CoordinatorOptions spelled_out = options_for("split");
  spelled_out.strategy_config.set_beta_1(0.9);
  auto resumed = CoordinatorServer::Start(spelled_out, "127.0.0.1:0");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  Train(**resumed, 3, 4);
  EXPECT_EQ(*(*resumed)->controller().global_weights(), straight);
}

// Runs rounds first..last on `server` with clients named n0..n3 (2 sampled
// per round) that join now; returns the names sampled for each round.
std::vector<std::vector<std::string>> SampledRounds(CoordinatorServer& server,
                                                    int64_t first,
                                                    int64_t last) {
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server.port()),
                                     grpc::InsecureChannelCredentials());
  std::map<std::string, std::unique_ptr<CoordinatorClient>> by_id;
  std::map<std::string, std::string> name_of;
  for (int i = 0; i < 4; ++i) {
    auto client = std::make_unique<CoordinatorClient>(channel);
    v1::JoinRequest join;
    join.set_display_name(absl::StrCat("n", i));
    EXPECT_TRUE(client->Join(join).ok());
    name_of[client->client_id()] = join.display_name();
    by_id[client->client_id()] = std::move(client);
  }
  std::vector<std::vector<std::string>> sampled;
  for (int64_t round = first; round <= last; ++round) {
    EXPECT_TRUE(server.controller().AwaitPhase(v1::PHASE_TRAINING, kWait));
    const v1::RoundRecord open =
        server.controller()
            .GetStatus(ClientPage(), nullptr, kDefaultHistory,
                       /*client_ids=*/true)
            .current_round();
    EXPECT_EQ(open.round(), round);
    std::vector<std::string> names;
    for (const std::string& id : open.selected_clients()) {
      names.push_back(name_of[id]);
      testing::TrainConstant(*by_id[id], round, 0.01f);
    }
    sampled.push_back(names);
  }
  return sampled;
}

TEST(ResumeSamplingTest, ResumedRunSamplesAsTheUninterruptedOne) {
  CoordinatorOptions options = SmallRun();
  options.max_rounds = 4;
  options.min_clients = 4;
  options.clients_per_round = 2;
  ScopedTempDir dir;
  options.state_dir = (dir.path() / "whole").string();
  auto whole = CoordinatorServer::Start(options, "127.0.0.1:0");
  ASSERT_TRUE(whole.ok()) << whole.status();
  const auto expected = SampledRounds(**whole, 1, 3);

  options.state_dir = (dir.path() / "cut").string();
  {
    auto first = CoordinatorServer::Start(options, "127.0.0.1:0");
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(
        SampledRounds(**first, 1, 2),
        (std::vector<std::vector<std::string>>{expected[0], expected[1]}));
  }
  auto second = CoordinatorServer::Start(options, "127.0.0.1:0");
  ASSERT_TRUE(second.ok()) << second.status();
  // New client ids, same names: round 3 samples the same two clients.
  EXPECT_EQ(SampledRounds(**second, 3, 3)[0], expected[2]);
}

// A run resumed in its evaluation phase waits, as a round does, for
// --min_clients ready clients before it opens an attempt: else the first
// client to join again would evaluate alone, and its one partition's accuracy
// would be reported as the run's.
TEST_F(ResumeTest, AResumedEvaluationWaitsForMinClients) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    Train(*server, 1, 4);
    ASSERT_TRUE(server->controller().AwaitPhase(v1::PHASE_EVALUATING, kWait));
  }
  auto server = Start();
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(server->controller().phase(), v1::PHASE_EVALUATING);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials());
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<CoordinatorClient>(channel));
    ASSERT_TRUE(clients.back()->Join(v1::JoinRequest()).ok());
    if (i == 2) break;
    // One and two ready of --min_clients=3: told to wait.
    auto wait = clients.back()->RequestUpdate(absl::Milliseconds(50));
    ASSERT_TRUE(wait.ok()) << wait.status();
    EXPECT_EQ(wait->task.type(), v1::TASK_TYPE_WAIT) << "with " << i + 1;
  }
  for (auto& c : clients) testing::Evaluate(*c, 0.5, 0.75, 20);
  ASSERT_TRUE(server->controller().AwaitPhase(v1::PHASE_DONE, kWait));
  const v1::GetStatusResponse status = server->controller().GetStatus();
  EXPECT_EQ(status.final_evaluation().num_clients(), 3);
  EXPECT_EQ(status.final_evaluation().num_examples(), 60);
}

// A status reply carries the newest records that fit in a message: a run
// whose records list thousands of clients (here a resumed one, 100 rounds of
// 1,000 selected clients, 1.2 MB of ids) answers GetStatus with client ids
// instead of failing at send (RESOURCE_EXHAUSTED: larger than the 1 MiB a
// reply may be).
TEST_F(ResumeTest, AStatusCarriesTheNewestRecordsThatFitInAReply) {
  {
    SavedRun run = SomeRun(/*model_round=*/100, 0.25f);
    for (v1::RoundRecord& record : *run.state.mutable_history()) {
      for (int c = 0; c < 1000; ++c) {
        record.add_selected_clients(absl::StrCat("client-", 1000 + c));
      }
    }
    auto store = StateStore::Open(dir_.path().string());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Save(Mlp(), run).ok());
  }
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                          grpc::InsecureChannelCredentials()));
  for (const bool ids : {true, false}) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_history_size(10000);
    request.set_client_ids(ids);
    v1::GetStatusResponse status;
    const grpc::Status s = stub->GetStatus(&context, request, &status);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(status.history_total(), 100);
    EXPECT_LE(status.ByteSizeLong(), size_t{1} << 20);
    ASSERT_GT(status.history_size(), 0);
    EXPECT_EQ(status.history(status.history_size() - 1).round(), 100);
    if (ids) {
      // 12 bytes an id: about 42 records of 12 KB in 512 KiB.
      EXPECT_GT(status.history_size(), 30);
      EXPECT_LT(status.history_size(), 50);
      EXPECT_EQ(status.history(0).selected_clients_size(), 1000);
    } else {
      EXPECT_EQ(status.history_size(), 100);
    }
  }
}

TEST_F(ResumeTest, FinishedRunStaysDone) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    auto clients = Train(*server, 1, 4);
    for (auto& c : clients) testing::Evaluate(*c, 0.5, 0.75, 20);
    ASSERT_TRUE(server->controller().AwaitPhase(v1::PHASE_DONE, kWait));
  }
  auto server = Start();
  ASSERT_NE(server, nullptr);
  const v1::GetStatusResponse status = server->controller().GetStatus();
  EXPECT_EQ(status.phase(), v1::PHASE_DONE);
  EXPECT_EQ(status.round(), 4);
  EXPECT_EQ(status.history_size(), 5);
  EXPECT_DOUBLE_EQ(status.final_evaluation().test_accuracy(), 0.75);
  EXPECT_EQ(status.stop_reason(), "max_rounds");
}

}  // namespace
}  // namespace fedlearn
