// The checks every push header and evaluation report meets before anything
// counts: CheckUpdateHeader, and EvaluationPhase::Report on an open attempt.
// Neither may crash; an accepted header has the properties the history and
// the convergence test rely on; a rejected report changes nothing and an
// accepted one cannot be accepted twice.
//
// Input: one byte choosing the message (even: an UpdateHeader, odd: a
// ReportEvalRequest), then the serialized message.

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "fedlearn/v1/coordinator.pb.h"
#include "fuzz/fuzz_util.h"
#include "server/evaluation_phase.h"
#include "server/run_controller.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  fuzz::Bytes in(data, size);
  const bool report = in.Byte() & 1;
  const absl::string_view bytes = in.Rest();
  if (!report) {
    v1::UpdateHeader header;
    if (!header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
      return 0;
    if (CheckUpdateHeader(header).ok()) {
      if (header.num_examples() <= 0 || !std::isfinite(header.train_loss()) ||
          !(header.train_accuracy() >= 0 && header.train_accuracy() <= 1)) {
        std::abort();
      }
    }
    return 0;
  }
  v1::ReportEvalRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return 0;
  EvaluationPhase phase(/*tolerance=*/0.3, absl::Minutes(1));
  const Weights weights = std::make_shared<const std::vector<float>>(4, 0.f);
  phase.Open(/*round=*/3, {"client-1", "client-2", "client-3"}, weights,
             absl::UnixEpoch());
  const int before = phase.cohort()->answered();
  absl::StatusOr<absl::string_view> first = phase.Report(request);
  if (!first.ok()) {
    if (phase.cohort()->answered() != before) std::abort();
    return 0;
  }
  if (phase.cohort()->answered() != before + 1) std::abort();
  if (!(request.num_examples() > 0 && std::isfinite(request.test_loss())))
    std::abort();
  if (phase.Report(request).status().code() !=
      absl::StatusCode::kAlreadyExists) {
    std::abort();
  }
  return 0;
}
