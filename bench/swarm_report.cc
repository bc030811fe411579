#include "bench/swarm_report.h"

#include <grpcpp/create_channel.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"

namespace fedlearn {

void Tally::Print(absl::string_view what) const {
  for (const auto& [key, count] : counts) {
    std::printf("%s: %s x%" PRId64 " (e.g. \"%s\")\n",
                std::string(what).c_str(), key.c_str(), count,
                examples.at(key).c_str());
  }
}

int PrintStatus(const std::string& coordinator) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::Coordinator::NewStub(grpc::CreateCustomChannel(
      coordinator, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::GetStatusRequest request;
  request.set_history_size(10000);
  request.set_client_page_size(1);
  v1::GetStatusResponse status;
  if (grpc::Status s = stub->GetStatus(&context, request, &status); !s.ok()) {
    std::printf("status: %s\n", s.error_message().c_str());
    return 1;
  }
  std::map<std::string, int> outcomes;
  int64_t previous = 0, out_of_order = 0;
  for (const v1::RoundRecord& r : status.history()) {
    ++outcomes[absl::StrCat(r.evaluation() ? "evaluation " : "training ",
                            r.outcome())];
    if (!r.evaluation()) {
      // A round is recorded once closed, or once per abandoned attempt.
      if (r.round() != previous && r.round() != previous + 1) ++out_of_order;
      previous = r.round();
    }
  }
  std::string counted;
  for (const auto& [outcome, count] : outcomes) {
    absl::StrAppend(&counted, " ", absl::StrReplaceAll(outcome, {{" ", "_"}}),
                    "=", count);
  }
  std::printf("status phase=%s round=%" PRId64 " history_total=%" PRId64
              " clients_joined=%d rounds_out_of_order=%" PRId64 "%s\n",
              v1::Phase_Name(status.phase()).c_str(), status.round(),
              status.history_total(), status.client_counts().joined(),
              out_of_order, counted.c_str());
  return 0;
}

IdleFigures Idle(int n, int pid, int64_t rss_before_kb, absl::Duration window,
                 absl::Duration renewal) {
  IdleFigures idle;
  idle.rss_before_kb = rss_before_kb;
  // The first quarter lets the last polls settle before CPU is counted.
  const absl::Time start = absl::Now();
  absl::SleepFor(window / 4);
  const double cpu0 = pid > 0 ? CpuSeconds(pid) : 0;
  const absl::Time cpu_from = absl::Now();
  // Once every client has renewed its poll, the coordinator's resources every
  // 10 s, against minutes: idling must not grow the coordinator. With
  // --max_wait=2s a quarter of an hour renews every poll hundreds of times.
  const absl::Time end = start + window;
  const absl::Time renewed = start + renewal;
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    absl::SleepFor(std::min(absl::Seconds(10), end - now));
    now = absl::Now();
    if (pid <= 0 || now < renewed) continue;
    idle.samples.push_back(
        ReadResources(pid, absl::ToDoubleMinutes(now - renewed)));
  }
  if (pid <= 0) return idle;
  idle.cpu =
      (CpuSeconds(pid) - cpu0) / absl::ToDoubleSeconds(absl::Now() - cpu_from);
  idle.rss_kb = RssKb(pid);
  std::printf(
      "coordinator RSS: %.1f MiB before joins, %.1f MiB with every client "
      "idle (%.1f KiB per client)\n",
      idle.rss_before_kb / 1024.0, idle.rss_kb / 1024.0, idle.KbPerClient(n));
  std::printf("coordinator CPU while every client idles: %.1f%% of a core\n",
              idle.cpu * 100);
  // Three samples at least: 30 s past the first renewals.
  if (idle.samples.size() >= 3) {
    const ResourceSlopes slopes = SlopesFrom(idle.samples, 0);
    std::printf(
        "coordinator while idle after the first poll renewals (%zu samples "
        "over %.1f min): RSS %.1f to %.1f MiB, slope %+.1f KiB, fds %+.3f, "
        "threads %+.3f per minute\n",
        slopes.samples, idle.samples.back().at,
        idle.samples.front().rss_kb / 1024.0,
        idle.samples.back().rss_kb / 1024.0, slopes.rss_kb, slopes.fds,
        slopes.threads);
  }
  return idle;
}

RoundMedians PrintRounds(const std::map<int64_t, RoundSeen>& rounds) {
  std::printf("%-6s %9s %12s %12s %12s %9s %9s\n", "round", "downloads",
              "fan-out s", "close->next s", "round s", "accepted", "rejected");
  std::vector<double> fanouts, overheads, closes;
  for (auto it = rounds.begin(); it != rounds.end(); ++it) {
    const RoundSeen& r = it->second;
    auto next = std::next(it);
    const double fanout = absl::ToDoubleSeconds(r.last_download - r.first_task);
    double close_next = -1, round_s = -1;
    if (next != rounds.end()) {
      close_next =
          absl::ToDoubleSeconds(next->second.first_task - r.last_push_sent);
      round_s = absl::ToDoubleSeconds(next->second.first_task - r.first_task);
      overheads.push_back(round_s);
      closes.push_back(close_next);
    }
    fanouts.push_back(fanout);
    std::printf("%-6" PRId64 " %9d %12.3f %12.3f %12.3f %9d %9d\n", it->first,
                r.downloads, fanout, close_next, round_s, r.accepted,
                r.rejected);
  }
  return {Of(fanouts).p50, Of(closes).p50, Of(overheads).p50};
}

void PrintRoundSamples(const std::vector<ResourceSample>& samples) {
  // The sampler can miss a round that lasts under its 20 ms: the first round
  // sampled at or past each multiple of 50.
  std::string every_50;
  int64_t mark = 50;
  for (const ResourceSample& x : samples) {
    const auto round = static_cast<int64_t>(x.at);
    if (round < mark) continue;
    absl::StrAppendFormat(&every_50, " %d:%.1f", round, x.rss_kb / 1024.0);
    mark = (round / 50 + 1) * 50;
  }
  std::printf("coordinator RSS (MiB) by round:%s\n", every_50.c_str());
  const ResourceSample& first = samples.front();
  const ResourceSample& last = samples.back();
  std::printf("coordinator at round %.0f: RSS %.1f MiB, %" PRId64
              " fds, %" PRId64 " threads; at round %.0f: RSS %.1f MiB, %" PRId64
              " fds, %" PRId64 " threads\n",
              first.at, first.rss_kb / 1024.0, first.fds, first.threads,
              last.at, last.rss_kb / 1024.0, last.fds, last.threads);
  const ResourceSlopes slopes = SlopesFrom(samples, 50);
  const double rss_mib = slopes.rss_kb / 1024.0;
  std::printf(
      "slope from round 50 (%zu rounds sampled): RSS %+.3f MiB, fds %+.3f, "
      "threads %+.3f per 100 rounds\n",
      slopes.samples, 100 * rss_mib, 100 * slopes.fds, 100 * slopes.threads);
  std::printf(
      "soak_slopes rss_mib_per_100=%.3f fds_per_100=%.3f "
      "threads_per_100=%.3f\n",
      100 * rss_mib, 100 * slopes.fds, 100 * slopes.threads);
}

}  // namespace fedlearn
