#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fedlearn {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
      upper_bounds_.begin();
  ++counts_[bucket];
  ++count_;
  sum_ += value;
}

namespace {

// Shortest text that reads back as the same double; Prometheus' spellings of
// the special values.
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

// A label value: backslash, double quote and line feed escaped.
std::string LabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Exposition {
 public:
  // Starts a metric family.
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  }
  // One sample; `labels` is empty or `key="value",...` already escaped.
  void Sample(absl::string_view name, absl::string_view labels, double value) {
    absl::StrAppend(&out_, name, labels.empty() ? "" : "{", labels,
                    labels.empty() ? "" : "}", " ", Number(value), "\n");
  }
  void Single(absl::string_view name, absl::string_view type,
              absl::string_view help, double value) {
    Family(name, type, help);
    Sample(name, "", value);
  }
  void Histogram(absl::string_view name, absl::string_view help,
                 const fedlearn::Histogram& h) {
    Family(name, "histogram", help);
    uint64_t cumulative = 0;
    const std::string bucket = absl::StrCat(name, "_bucket");
    for (size_t i = 0; i < h.upper_bounds().size(); ++i) {
      cumulative += h.counts()[i];
      Sample(bucket, absl::StrCat("le=\"", Number(h.upper_bounds()[i]), "\""),
             static_cast<double>(cumulative));
    }
    Sample(bucket, "le=\"+Inf\"", static_cast<double>(h.count()));
    Sample(absl::StrCat(name, "_sum"), "", h.sum());
    Sample(absl::StrCat(name, "_count"), "", static_cast<double>(h.count()));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// The last closed training round, if any.
const v1::RoundRecord* LastTrainingRound(const v1::GetStatusResponse& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    const v1::RoundRecord& r = status.history(i);
    if (!r.evaluation() && r.outcome() != "abandoned") return &r;
  }
  return nullptr;
}

const v1::RoundRecord* LastValidatedRound(const v1::GetStatusResponse& status) {
  for (int i = status.history_size() - 1; i >= 0; --i) {
    const v1::RoundRecord& r = status.history(i);
    if (!r.evaluation() && r.outcome() != "abandoned" &&
        r.metrics().has_validation()) {
      return &r;
    }
  }
  return nullptr;
}

}  // namespace

std::string RenderPrometheus(const v1::GetStatusResponse& status,
                             const RunCounters& counters,
                             const TransferStats& transfers) {
  Exposition e;
  e.Family("fedlearn_info", "gauge",
           "Constant 1, labelled with the run's id and model.");
  e.Sample("fedlearn_info",
           absl::StrCat("run_id=\"", LabelValue(status.run_id()), "\",model=\"",
                        LabelValue(status.model().name()), "\""),
           1);
  e.Single("fedlearn_model_parameters", "gauge",
           "Parameters of the global model.",
           static_cast<double>(status.model().num_parameters()));

  e.Family("fedlearn_phase", "gauge",
           "1 for the run's current phase, 0 for the others.");
  for (v1::Phase phase : {v1::PHASE_WAITING_FOR_CLIENTS, v1::PHASE_TRAINING,
                          v1::PHASE_EVALUATING, v1::PHASE_DONE}) {
    std::string name = absl::AsciiStrToLower(v1::Phase_Name(phase));
    name.erase(0, std::string("phase_").size());
    e.Sample("fedlearn_phase", absl::StrCat("phase=\"", name, "\""),
             status.phase() == phase ? 1 : 0);
  }
  e.Single("fedlearn_round", "gauge",
           "The training round being (or last) trained.",
           static_cast<double>(status.round()));
  e.Single("fedlearn_rounds_completed_total", "counter",
           "Training rounds closed with enough updates.",
           static_cast<double>(counters.rounds_completed));
  e.Single("fedlearn_rounds_abandoned_total", "counter",
           "Training round attempts abandoned below quorum at their deadline.",
           static_cast<double>(counters.rounds_abandoned));

  e.Single("fedlearn_clients_joined_total", "counter",
           "Clients that joined the run.",
           static_cast<double>(status.client_counts().joined()));
  e.Family("fedlearn_clients", "gauge", "Joined clients by state.");
  const v1::ClientCounts& counts = status.client_counts();
  for (const auto& [state, n] :
       std::initializer_list<std::pair<const char*, int32_t>>{
           {"ready", counts.ready()},
           {"training", counts.training()},
           {"evaluating", counts.evaluating()},
           {"gone", counts.gone()}}) {
    e.Sample("fedlearn_clients", absl::StrCat("state=\"", state, "\""),
             static_cast<double>(n));
  }
  const v1::RoundRecord& open = status.current_round();
  e.Single("fedlearn_round_selected_clients", "gauge",
           "Clients selected for the open round or evaluation (0: none open).",
           open.selected());
  e.Single("fedlearn_round_responded_clients", "gauge",
           "Selected clients whose update or report the open round accepted.",
           open.responded());

  e.Single("fedlearn_updates_accepted_total", "counter",
           "Updates folded into an aggregate.",
           static_cast<double>(counters.updates_accepted));
  e.Family("fedlearn_updates_rejected_total", "counter",
           "Pushed updates turned away, by reason.");
  const v1::RejectionCounts& r = counters.updates_rejected;
  for (const auto& [reason, n] :
       std::initializer_list<std::pair<const char*, int64_t>>{
           {"stale_round", r.stale_round()},
           {"duplicate", r.duplicate()},
           {"not_selected", r.not_selected()},
           {"invalid", r.invalid()},
           {"too_large", r.too_large()},
           {"incomplete", r.incomplete()},
           {"too_slow", r.too_slow()}}) {
    e.Sample("fedlearn_updates_rejected_total",
             absl::StrCat("reason=\"", reason, "\""), static_cast<double>(n));
  }
  e.Single("fedlearn_evaluations_accepted_total", "counter",
           "Evaluation reports accepted.",
           static_cast<double>(counters.evaluations_accepted));
  e.Single("fedlearn_evaluations_abandoned_total", "counter",
           "Evaluation attempts abandoned below quorum at their deadline.",
           static_cast<double>(counters.evaluations_abandoned));
  e.Single("fedlearn_received_bytes_total", "counter",
           "Bytes of accepted model updates received.",
           static_cast<double>(status.bytes_received()));
  e.Single("fedlearn_sent_bytes_total", "counter",
           "Bytes of model weights sent in tasks.",
           static_cast<double>(status.bytes_sent()));

  e.Single("fedlearn_downloads", "gauge",
           "Weights being written to clients (TRAIN and EVALUATE tasks).",
           static_cast<double>(transfers.downloads));
  e.Single("fedlearn_download_versions", "gauge",
           "Distinct model versions the downloads being written hold.",
           static_cast<double>(transfers.download_versions));
  e.Single("fedlearn_download_version_bytes", "gauge",
           "Bytes of weights those versions hold, one snapshot each.",
           static_cast<double>(transfers.download_version_bytes));
  e.Family("fedlearn_downloads_cut_off_total", "counter",
           "Downloads ended before their weights were all sent: stalled for "
           "--stall_timeout, or the run moved past their task.");
  e.Sample("fedlearn_downloads_cut_off_total", "reason=\"stalled\"",
           static_cast<double>(transfers.downloads_stalled));
  e.Sample("fedlearn_downloads_cut_off_total", "reason=\"moved_on\"",
           static_cast<double>(transfers.downloads_moved_on));
  e.Single("fedlearn_receive_buffers", "gauge",
           "Model-sized buffers updates are received into "
           "(--max_concurrent_updates).",
           static_cast<double>(transfers.receive_buffers));
  e.Single("fedlearn_receive_buffers_in_use", "gauge",
           "Receive buffers held by uploads.",
           static_cast<double>(transfers.receive_buffers_in_use));
  e.Single("fedlearn_uploads_waiting", "gauge",
           "Uploads waiting for a receive buffer (not read until one frees).",
           static_cast<double>(transfers.uploads_waiting));

  e.Histogram("fedlearn_round_duration_seconds",
              "Wall time from a training round's start to its close.",
              counters.round_duration);
  e.Histogram("fedlearn_aggregation_duration_seconds",
              "Time to fold one accepted update into the round's aggregate.",
              counters.aggregation_latency);

  if (const v1::RoundRecord* last = LastTrainingRound(status)) {
    e.Single("fedlearn_train_loss", "gauge",
             "Aggregated train loss of the last closed round.",
             last->metrics().train_loss());
    e.Single("fedlearn_train_accuracy_ratio", "gauge",
             "Aggregated train accuracy of the last closed round.",
             last->metrics().train_accuracy());
  }
  if (const v1::RoundRecord* last = LastValidatedRound(status)) {
    e.Single("fedlearn_validation_loss", "gauge",
             "Aggregated validation loss of the last round that validated.",
             last->metrics().validation_loss());
    e.Single("fedlearn_validation_accuracy_ratio", "gauge",
             "Aggregated validation accuracy of the last round that validated.",
             last->metrics().validation_accuracy());
  }
  if (status.has_privacy()) {
    const v1::PrivacyStatus& p = status.privacy();
    e.Single("fedlearn_dp_epsilon", "gauge",
             "Central DP: epsilon spent by the models released so far, at "
             "fedlearn_dp_delta.",
             p.epsilon());
    e.Single("fedlearn_dp_delta", "gauge",
             "Central DP: the delta epsilon is reported at (--dp_delta).",
             p.delta());
    e.Single("fedlearn_dp_max_epsilon", "gauge",
             "Central DP: the budget training stops within (0: none).",
             p.max_epsilon());
    e.Single("fedlearn_dp_rounds_total", "counter",
             "Central DP: rounds charged to the privacy budget.",
             static_cast<double>(p.rounds()));
  }
  if (status.has_final_evaluation()) {
    e.Single("fedlearn_test_loss", "gauge",
             "Final test loss of the evaluation phase.",
             status.final_evaluation().test_loss());
    e.Single("fedlearn_test_accuracy_ratio", "gauge",
             "Final test accuracy of the evaluation phase.",
             status.final_evaluation().test_accuracy());
  }
  return e.Take();
}

std::string RenderHistoryCsv(const v1::GetStatusResponse& status) {
  std::string out =
      "round,attempt,kind,outcome,selected,responded,dropped,rejected,"
      "train_loss,train_accuracy,validation_loss,validation_accuracy,"
      "test_loss,test_accuracy,num_examples,duration_seconds,"
      "relative_improvement,bytes_received,bytes_sent,dp_epsilon\r\n";
  for (const v1::RoundRecord& r : status.history()) {
    const v1::RejectionCounts& x = r.rejected();
    const int rejected = x.stale_round() + x.duplicate() + x.not_selected() +
                         x.invalid() + x.too_large() + x.incomplete() +
                         x.too_slow();
    const v1::RoundMetrics& m = r.metrics();
    const bool closed = r.outcome() != "abandoned";
    const bool train = closed && !r.evaluation();
    const bool validated = train && m.has_validation();
    const bool test = closed && r.evaluation();
    auto cell = [](bool present, double v) {
      return present ? Number(v) : std::string();
    };
    // Outcomes are fixed words; no field needs quoting.
    absl::StrAppend(
        &out, r.round(), ",", r.attempt(), ",",
        r.evaluation() ? "evaluation" : "training", ",", r.outcome(), ",",
        r.selected(), ",", r.responded(), ",", r.dropped(), ",", rejected, ",",
        cell(train, m.train_loss()), ",", cell(train, m.train_accuracy()), ",",
        cell(validated, m.validation_loss()), ",",
        cell(validated, m.validation_accuracy()), ",",
        cell(test, m.train_loss()), ",", cell(test, m.train_accuracy()), ",",
        m.num_examples(), ",", Number(r.duration_seconds()), ",",
        cell(train && r.round() > 1, r.relative_improvement()), ",",
        r.bytes_received(), ",", r.bytes_sent(), ",",
        cell(train && r.dp_noise_multiplier() > 0, r.dp_epsilon()), "\r\n");
  }
  return out;
}

}  // namespace fedlearn
