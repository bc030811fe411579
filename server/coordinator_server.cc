#include "server/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model_spec.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.pb.h"
#include "server/coordinator_service.h"
#include "server/run_controller.h"
#include "server/state_store.h"
#include "server/status_queue.h"
#include "server/strategy/update_store.h"

namespace fedlearn {
namespace {

constexpr char kServiceName[] = "fedlearn.v1.Coordinator";

// Makes the spill directory of a stored aggregator, removes what a crash may
// have left there (spill files have no name but for an instant after they are
// made; removing a name never disturbs a process holding the file) and checks
// that a spill file can be made, so that a bad directory fails at startup.
absl::Status PrepareSpillDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--aggregation_spill_dir: cannot make ", dir, ": ", error.message()));
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (absl::StartsWith(entry.path().filename().string(),
                         UpdateStore::kSpillPrefix)) {
      std::filesystem::remove(entry.path(), error);
    }
  }
  UpdateStore probe({/*num_parameters=*/1, /*memory_budget=*/0, dir});
  if (absl::Status s = probe.Stage(std::vector<float>{0.0f}).status();
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--aggregation_spill_dir: ", s.message()));
  }
  return absl::OkStatus();
}

// The model to serve and its initial weights: a registry architecture
// initialised from `seed`, or the tensors of a safetensors file.
absl::Status LoadModel(const CoordinatorOptions& options, ModelSpec* spec,
                       std::vector<float>* initial) {
  if (absl::EndsWith(options.model, ".safetensors")) {
    absl::StatusOr<SafetensorsModel> file = ReadSafetensorsModel(options.model);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat("--model: ", file.status().message()));
    }
    *spec = std::move(file->spec);
    *initial = std::move(file->values);
    return absl::OkStatus();
  }
  absl::StatusOr<ModelSpec> known = LookupModel(options.model);
  if (!known.ok()) {
    return absl::Status(
        known.status().code(),
        absl::StrCat("--model: ", known.status().message(),
                     " (or give a PATH.safetensors of float32 tensors)"));
  }
  *spec = *std::move(known);
  initial->assign(static_cast<size_t>(spec->num_parameters), 0.0f);
  InitializeParameters(*spec, options.seed, absl::MakeSpan(*initial));
  return absl::OkStatus();
}

// A saved run resumes only under the privacy it was trained with: its
// released rounds' records say what that was (no noise, or z and, for a fixed
// clip norm, C). FAILED_PRECONDITION naming the flags otherwise.
absl::Status CheckResumedPrivacy(const CoordinatorOptions& options,
                                 const v1::CoordinatorState& state) {
  const DpParams dp = options.Privacy();
  // The settings the run trained with, saved with every state: they cover a
  // round released before its record (a crash between the two), which the
  // resumed run charges with its own z, even when no round is recorded yet.
  if (state.has_dp_noise_multiplier()) {
    const double z = dp.enabled() ? dp.noise_multiplier : 0;
    const double c = dp.enabled() && !dp.adaptive() ? dp.clip_norm : 0;
    if (state.dp_noise_multiplier() != z || state.dp_clip_norm() != c) {
      return absl::FailedPreconditionError(absl::StrCat(
          options.state_dir, " holds a run that trains with ",
          state.dp_noise_multiplier() > 0
              ? absl::StrCat(
                    "--dp_noise_multiplier=", state.dp_noise_multiplier(),
                    state.dp_clip_norm() > 0
                        ? absl::StrCat(" --dp_clip_norm=", state.dp_clip_norm())
                        : std::string(" (adaptive clipping)"))
              : std::string("no central DP"),
          ": resume it with the same privacy settings, or use another "
          "--state_dir"));
    }
  }
  for (const v1::RoundRecord& r : state.history()) {
    if (r.evaluation() || r.outcome() == "abandoned" || r.outcome() == "open") {
      continue;
    }
    const bool same =
        r.dp_noise_multiplier() == dp.noise_multiplier &&
        (!dp.enabled() || dp.adaptive() || r.dp_clip_norm() == dp.clip_norm);
    if (!same) {
      return absl::FailedPreconditionError(absl::StrCat(
          options.state_dir, " holds a run whose round ", r.round(),
          " was released with --dp_noise_multiplier=", r.dp_noise_multiplier(),
          r.dp_noise_multiplier() > 0
              ? absl::StrCat(" --dp_clip_norm=", r.dp_clip_norm())
              : std::string(),
          ": resume it with the same privacy settings, or use another "
          "--state_dir"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options, const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  FEDLEARN_RETURN_IF_ERROR(options.Validate());
  ModelSpec spec;
  std::vector<float> initial;
  FEDLEARN_RETURN_IF_ERROR(LoadModel(options, &spec, &initial));
  std::unique_ptr<StateStore> store;
  std::optional<SavedRun> resume;
  if (!options.state_dir.empty()) {
    FEDLEARN_ASSIGN_OR_RETURN(store, StateStore::Open(options.state_dir));
    FEDLEARN_ASSIGN_OR_RETURN(resume, store->Load(spec));
    const absl::string_view mode = ModeName(options.mode);
    if (resume.has_value()) {
      // Files written before async mode existed hold no mode: rounds.
      const std::string saved = resume->state.mode().empty()
                                    ? std::string(ModeName(Mode::kRounds))
                                    : resume->state.mode();
      if (saved != mode) {
        return absl::FailedPreconditionError(absl::StrCat(
            options.state_dir, " holds a run in ", saved, " mode, not ", mode,
            " (use --mode=", saved, " or another --state_dir)"));
      }
      // Files written before strategies existed: FedAvg.
      const std::string strategy = resume->state.strategy().empty()
                                       ? std::string("fedavg")
                                       : resume->state.strategy();
      if (strategy != options.strategy) {
        return absl::FailedPreconditionError(absl::StrCat(
            options.state_dir, " holds a run of strategy ", strategy, ", not ",
            options.strategy, " (use --strategy=", strategy,
            " or another --state_dir)"));
      }
      FEDLEARN_RETURN_IF_ERROR(CheckResumedPrivacy(options, resume->state));
    }
  }
  FEDLEARN_ASSIGN_OR_RETURN(AggregationBudget budget, options.Budget());
  FEDLEARN_ASSIGN_OR_RETURN(
      Strategy strategy, MakeStrategy(options.strategy, options.strategy_config,
                                      static_cast<size_t>(spec.num_parameters),
                                      budget, options.Privacy()));
  if (resume.has_value() && resume->state.has_strategy_config() &&
      !google::protobuf::util::MessageDifferencer::Equals(
          resume->state.strategy_config(), strategy.config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.state_dir, " holds a run of strategy ", strategy.name,
        " with {", resume->state.strategy_config().ShortDebugString(),
        "}, not {", strategy.config.ShortDebugString(),
        "}: resume it with the same --strategy_config, or use another "
        "--state_dir"));
  }
  FEDLEARN_RETURN_IF_ERROR(
      RunController::CheckStrategy(options, strategy, budget));
  if (strategy.aggregator->bytes_per_update() > 0 &&
      !budget.spill_dir.empty()) {
    FEDLEARN_RETURN_IF_ERROR(PrepareSpillDir(budget.spill_dir));
  }
  if (resume.has_value()) {
    if (absl::Status s = strategy.optimizer->Restore(resume->optimizer);
        !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.state_dir,
                       ": the saved optimizer state does not fit --strategy=",
                       options.strategy, ": ", s.message()));
    }
  }

  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->controller_ = std::make_unique<RunController>(
      options, std::move(spec), std::move(initial), std::move(strategy),
      std::move(store), std::move(resume));
  if (absl::Status saved = server->controller_->SaveResumeCharge();
      !saved.ok()) {
    return absl::Status(
        saved.code(),
        absl::StrCat("--state_dir: the resumed run's privacy charge could not "
                     "be saved: ",
                     saved.message()));
  }
  server->service_ =
      std::make_unique<CoordinatorService>(server->controller_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Server reflection describes what the generated pool holds, and the linker
  // keeps health.proto's generated file (from a static library) only when
  // something refers to it: without this, reflection lists
  // grpc.health.v1.Health but cannot describe it (buf curl's "failed to find
  // service").
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(address, std::move(credentials), &server->port_);
  builder.RegisterService(server->service_.get());
  // A message is a header or one chunk: bound what a peer can make us buffer.
  constexpr int kMaxMessage = static_cast<int>(kMaxChunkBytes + (64 << 10));
  builder.SetMaxReceiveMessageSize(kMaxMessage);
  builder.SetMaxSendMessageSize(kMaxMessage);
  // No BDP probing: it grows each stream's flow-control window to megabytes,
  // and a push waiting for a staging buffer would then park that much in gRPC's
  // buffers, per client. With the default 64 KiB window, memory stays bounded
  // however many clients push.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // What an idle connection keeps, trimmed where it costs nothing we use:
  // no channelz records (nothing here serves them), and no HPACK dynamic
  // tables, so headers travel as literals (a few hundred bytes a call, and a
  // client calls every few seconds at most). Together about 1.3 KiB a client
  // (README, "Many clients").
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_HPACK_TABLE_SIZE_DECODER, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_HPACK_TABLE_SIZE_ENCODER, 0);
  // Without a bound, gRPC keeps each connection's read buffer as large as its
  // biggest reads grew it (an update's: about 150 KiB a client that has
  // pushed); with one, idle connections give theirs back as it fills.
  FEDLEARN_ASSIGN_OR_RETURN(server->grpc_memory_bytes_,
                            options.GrpcMemoryBytes());
  grpc::ResourceQuota quota("fedlearn-coordinator");
  quota.Resize(server->grpc_memory_bytes_);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::ServerCompletionQueue> status_queue =
      builder.AddCompletionQueue();
  server->server_ = builder.BuildAndStart();
  // Made either way: the queue is shut down and drained by it (Shutdown, or
  // its destructor when no server was built).
  server->status_ = std::make_unique<StatusQueue>(server->service_.get(),
                                                  server->controller_.get(),
                                                  std::move(status_queue));
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  server->status_->Start();
  server->server_->GetHealthCheckService()->SetServingStatus(kServiceName,
                                                             true);
  return server;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::ZeroDuration()); }

void CoordinatorServer::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(kServiceName, false);
  controller_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  status_->Stop();
  server_.reset();
  status_.reset();
}

}  // namespace fedlearn
