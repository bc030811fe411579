#ifndef FEDLEARN_SERVER_CLIENT_MANAGER_H_
#define FEDLEARN_SERVER_CLIENT_MANAGER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace fedlearn {

// What the coordinator knows of one client.
// The liveness fields (last_seen, active_polls, hung_up, replaced_by) change
// only through ClientManager, which keeps its ready and alive counts with them.
struct Client {
  std::string id;    // "client-N", N its place in the join order
  size_t index = 0;  // N - 1
  std::string token;
  std::string display_name;
  absl::Time last_seen;  // its last call, heartbeat or poll
  int active_polls = 0;  // long polls held open right now
  // Its last poll was cancelled by the client (a process that died hangs up
  // its poll) and it has not called since: not ready, whatever last_seen says.
  bool hung_up = false;
  // It joined again (JoinRequest.previous_client_id) as `replaced_by`: gone
  // for good; until it is forgotten, its calls are told who replaced it.
  std::string replaced_by;
  bool told_done = false;
  // It can evaluate (JoinRequest.no_evaluation unset): only such clients are
  // sent EVALUATE.
  bool evaluates = true;
  // Progress from its heartbeats.
  int64_t batches_done = 0;
  int64_t batches_total = 0;
  // Its accepted updates: how many, and the latest one's L2 norm and round.
  int rounds_contributed = 0;
  double last_update_norm = 0;
  int64_t last_update_round = 0;
};

// The clients of a run (Flower's ClientManager): join, session tokens,
// liveness and seeded sampling. A client is
//   alive  while it holds a poll open or was heard from within
//          `client_timeout` (what status shows; gone otherwise), and
//   ready  (what rounds sample and wait for) while it holds a poll open, or
//          was heard from within `ready_window` and has not hung up its last
//          poll since: a client asking for work is demonstrably there, one
//          that missed its heartbeats or whose poll was cut off by its own
//          side (a killed process) is not counted on, though it may still be
//          alive for a while.
// A client retired by its own re-join (Retire) is neither, at once.
//
// Counting and listing the ready or alive clients costs what changed, not the
// number of clients: the clients holding a poll are a set, and those that do
// not are kept ordered by last_seen in two indexes (one for ready, one for
// alive) from which a query first drops the entries that aged out of their
// window; an entry comes back when its client is seen again. So the timer's
// tick, a poll, or an async version asks "how many are ready" in
// O(log n) amortised, and a round's sampling lists only the ready. Queries
// are expected at non-decreasing times (the controller asks with the clock's
// now under its lock); asked at an earlier time after a later one, a count
// misses the clients dropped meanwhile until they are seen again.
//
// Forgetting. A client gone (or retired) for `forget_after` is dropped by
// Forget: status no longer lists it, and its later calls fail NOT_FOUND
// ("unknown client; join again"), on which agents join again. Ids are never
// reused (the join order goes on counting), so the history still names it
// unambiguously. What joins and leaves therefore costs memory only for
// `forget_after`: at most (clients joining per second) x (client_timeout +
// forget_after) records, whatever the run's length.
//
// Memory: one Client with its strings, two hash-index entries and at most
// four set entries per remembered client, about 570 bytes in all (README,
// "Forgotten"). Not thread-safe: the run controller calls it under its lock;
// nothing here blocks or calls out.
class ClientManager {
 public:
  struct Options {
    int max_clients = 10000;
    absl::Duration client_timeout = absl::Seconds(20);
    uint64_t seed = 1;  // of the sampler
    // Two heartbeat intervals by default: a client training heartbeats once
    // per interval, so it stays ready; one that missed two is not sampled.
    absl::Duration ready_window = absl::Seconds(10);
    // A client not heard from for this long is forgotten by Forget
    // (absl::InfiniteDuration(): never). At least client_timeout.
    absl::Duration forget_after = absl::InfiniteDuration();
  };
  explicit ClientManager(Options options);

  // Registers a new client seen at `now`. The pointer (as every Client* this
  // returns) is valid until Forget drops the client. RESOURCE_EXHAUSTED when
  // max_clients are alive already (gone and retired clients do not count, so a
  // long run with churn is never locked out), unless it is `replacing` an alive
  // one (Retirable: a restarted agent naming its old identity). `evaluates`:
  // Client::evaluates.
  absl::StatusOr<const Client*> Register(absl::string_view display_name,
                                         absl::Time now,
                                         const Client* replacing = nullptr,
                                         bool evaluates = true);

  // The client Retire would retire: `previous_id` when `token` is its session
  // token and it is not retired already; nullptr otherwise.
  const Client* Retirable(absl::string_view previous_id,
                          absl::string_view token) const;

  // Checks that `token` is `client_id`'s session token and notes the client as
  // seen at `now`. UNAUTHENTICATED for a missing or unknown token, NOT_FOUND
  // for an unknown client, PERMISSION_DENIED for another client's token.
  absl::Status Authorize(absl::string_view client_id, absl::string_view token,
                         absl::Time now);

  // Retires `previous_id` in favour of `successor` when `token` is its
  // session token and it is not retired already; returns whether it did. Its
  // later calls fail NOT_FOUND, naming the successor.
  bool Retire(absl::string_view previous_id, absl::string_view token,
              const Client& successor);

  // The client, or NOT_FOUND ("unknown client ...").
  absl::StatusOr<Client*> Get(absl::string_view client_id);
  // The client, or null.
  const Client* Find(absl::string_view client_id) const;
  // The client whose session token is `token`, or null.
  const Client* FindByToken(absl::string_view token) const;

  // Notes a call from `client` (a heartbeat, a report) at `now`.
  void Seen(Client* client, absl::Time now);

  bool IsAlive(const Client& client, absl::Time now) const;
  int CountAlive(absl::Time now) const;
  bool IsReady(const Client& client, absl::Time now) const;
  // Ids of the clients ready at `now`, in join order, and how many that is.
  std::vector<std::string> Ready(absl::Time now) const;
  int CountReady(absl::Time now) const;

  // `n` of `candidates` (ids of joined clients), drawn without replacement
  // from the seeded sampler: a partial Fisher-Yates shuffle over the
  // candidates ordered by display name, then id, so that for one seed the same
  // named clients give the same sample whatever order they joined in.
  std::vector<std::string> Sample(std::vector<std::string> candidates, int n);

  // A long poll of `client` starts; is answered at `now` (a client waiting on
  // us was alive all along); or is cancelled by the client, which hung up (a
  // client that meant to stay polls again at once).
  void PollStarted(Client* client);
  void PollAnswered(Client* client, absl::Time now);
  void PollCancelled(Client* client);

  // The sampler's state, to save with the run and restore on resume, so that a
  // resumed run samples as the uninterrupted one would have.
  std::string SamplerState() const;
  absl::Status RestoreSampler(const std::string& state);

  // Drops the clients last heard from `forget_after` or longer before `now`
  // and not holding a poll (gone or retired ones: forget_after is at least
  // client_timeout), oldest first; returns their ids, for the parts that keep
  // something about a client to let go of it too. Amortised O(log n) per
  // client dropped; a client is dropped once.
  std::vector<std::string> Forget(absl::Time now);

  // The clients remembered, by their index (join order).
  using ByIndex = absl::btree_map<size_t, std::unique_ptr<Client>>;
  const ByIndex& clients() const { return clients_; }
  // Every client that joined the run, forgotten ones included (in a resumed
  // run, those of the runs before it too).
  size_t joined() const { return next_index_; }
  // A resumed run: `joined` clients joined before the save it resumes from,
  // so the next one is numbered after them and an id names one client in the
  // whole run's history. Call before the first Join.
  void ResumeNumbering(size_t joined) {
    next_index_ = std::max(next_index_, joined);
  }

 private:
  // Clients not holding a poll, by when they were last seen.
  using ByTime = absl::btree_set<std::pair<absl::Time, size_t>>;  // index
  absl::Duration ready_window() const {
    return std::min(options_.ready_window, options_.client_timeout);
  }
  // Takes `client` out of the indexes before its liveness fields change, and
  // puts it back in by them afterwards.
  void Unindex(Client* client);
  void Index(Client* client);
  // Drops the entries older than `window` before `now`.
  static void Prune(ByTime* set, absl::Time now, absl::Duration window);

  const Options options_;
  size_t next_index_ = 0;
  ByIndex clients_;
  // Every remembered client not holding a poll (gone, retired and hung-up
  // ones included): what Forget drops from, oldest first.
  ByTime idle_all_;
  absl::flat_hash_set<size_t> polling_;  // active_polls > 0, not retired
  // Not polling, not retired, and (idle_ready_) not hung up: entries may be
  // older than their window until the next query prunes them (mutable: pruning
  // changes no answer, only how fast the next one comes).
  mutable ByTime idle_ready_;
  mutable ByTime idle_alive_;
  absl::flat_hash_map<std::string, Client*> by_id_;
  absl::flat_hash_map<std::string, Client*> by_token_;
  std::mt19937_64 sampler_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_CLIENT_MANAGER_H_
