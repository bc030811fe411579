#ifndef FEDLEARN_SERVER_COORDINATOR_SERVICE_H_
#define FEDLEARN_SERVER_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/metrics.h"
#include "server/run_controller.h"
#include "server/staging_pool.h"

namespace fedlearn {

// The gRPC face of the coordinator (callback API): authenticates each call from
// its `authorization` metadata, turns wire messages into RunController calls
// and absl::Status into grpc::Status. RequestUpdate and PushGradient are one
// reactor per stream; no lock is held while a reactor starts a write or
// finishes. Thread-safe; `controller` must outlive it.
// A watchdog thread keeps slow and stalled clients from holding anyone else up
// (StagingPool, TaskWriter).
// RequestUpdate and PushGradient are raw methods (grpc::ByteBuffer in and
// out), for the bytes they move: RequestUpdate's chunk messages go out as the
// bytes serialized once per model version, which every stream of that version
// references instead of serializing its own copy; PushGradient reads each
// chunk's payload where gRPC received it (ReadChunkInPlace) instead of having
// protobuf copy it out first. GetStatus is an async method, answered on a
// queue and thread of its own (StatusQueue), not behind the streams'
// callbacks.
// (A method gRPC serves through a callback keeps its handler when marked
// async, so the service is composed method by method rather than from
// CallbackService.)
class CoordinatorService final
    : public v1::Coordinator::WithCallbackMethod_Join<
          v1::Coordinator::WithRawCallbackMethod_RequestUpdate<
              v1::Coordinator::WithRawCallbackMethod_PushGradient<
                  v1::Coordinator::WithCallbackMethod_ReportEval<
                      v1::Coordinator::WithCallbackMethod_Heartbeat<
                          v1::Coordinator::WithAsyncMethod_GetStatus<
                              v1::Coordinator::Service>>>>>> {
 public:
  explicit CoordinatorService(RunController* controller);
  ~CoordinatorService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  // `request` is a serialized v1::RequestUpdateRequest; each message written
  // is a serialized v1::TaskMessage.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RequestUpdate(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  // Each message read is a serialized v1::PushGradientRequest; `response`
  // gets a serialized v1::PushGradientResponse.
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushGradient(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportEval(
      grpc::CallbackServerContext* context,
      const v1::ReportEvalRequest* request,
      v1::ReportEvalResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;

  // The receive buffers: how many are held and how many pushes wait.
  const StagingPool& staging() const { return staging_; }
  // What downloads and uploads hold now, and the downloads cut off so far
  // (/metrics). Scans the downloads being written, under their lock.
  TransferStats transfers() const;

 private:
  class TaskWriter;
  class UpdateReader;

  // Authorizes the call for `client_id` from its metadata.
  absl::Status Authorize(grpc::CallbackServerContext* context,
                         absl::string_view client_id);

  // Downloads being written, when each last made progress, and when the
  // watchdog first saw it retired (Task::retire).
  struct Download {
    absl::Time progress;
    absl::Time retired_seen = absl::InfiniteFuture();
  };
  void Watch(TaskWriter* writer, absl::Time now);
  // False when it was not watched (the watchdog cut it off first).
  bool Unwatch(TaskWriter* writer);
  // Every 100 ms: takes staging buffers back from stalled or trickling
  // uploads (StagingPool::Reclaim), and cuts off downloads that moved nothing
  // for --stall_timeout, or were retired and did not reach their next chunk
  // within a second.
  void WatchdogLoop();

  // A model version's weights as the chunk messages every download of it
  // sends: encoded, checksummed and serialized once, each message three
  // reference-counted slices that every stream writing that version hands to
  // gRPC without copying: the chunk's fields (about 60 bytes), its data, which
  // is the snapshot's own memory (SerializeChunkAround), and its checksums.
  // So an encoding costs about 100 bytes a chunk beyond the snapshot.
  struct EncodedWeights {
    Weights weights;
    // Each a serialized v1::TaskMessage, in slices.
    std::vector<std::vector<grpc::Slice>> chunks;
    int64_t payload_bytes = 0;
  };
  // `weights` encoded. The encoding last asked for is kept (with the snapshot
  // it holds): the first stream of a version
  // encodes it and the others wait for that on encoded_mu_, whose only job
  // it is.
  std::shared_ptr<const EncodedWeights> Encode(const Weights& weights);

  RunController* const controller_;
  absl::Mutex encoded_mu_;
  std::shared_ptr<const EncodedWeights> encoded_ ABSL_GUARDED_BY(encoded_mu_);
  StagingPool staging_;
  mutable absl::Mutex downloads_mu_;
  absl::flat_hash_map<TaskWriter*, Download> downloads_
      ABSL_GUARDED_BY(downloads_mu_);
  // Downloads cut off since the start (TransferStats).
  std::atomic<int64_t> downloads_stalled_{0};
  std::atomic<int64_t> downloads_moved_on_{0};
  absl::Notification stop_;
  std::thread watchdog_;  // last: started once the rest is built
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_COORDINATOR_SERVICE_H_
