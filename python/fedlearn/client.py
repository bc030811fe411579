"""A federated client for the fedlearn coordinator, in numpy: the protocol, not the model.

    import fedlearn

    def fit(weights, plan):           # a list of float32 arrays, in the model's order
        new = [w - 0.01 * w for w in weights]
        return new, 100, {"loss": 0.5, "accuracy": 0.9}

    def evaluate(weights, plan):
        return 0.4, 0.91, 200         # test loss, accuracy, examples

    fedlearn.Client("127.0.0.1:50051", fit, evaluate).run()

The client joins, long-polls for tasks, verifies every chunk of the weights it gets
(CRC-32C per chunk and per tensor, shapes, finiteness), calls ``fit`` for TRAIN and
``evaluate`` for EVALUATE, pushes the update (dense or int8) chunked as the contract
says, heartbeats with progress while ``fit`` runs, honours WAIT, retries with capped
jittered backoff, joins again when a restarted coordinator has forgotten it, and returns
on DONE.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fedlearn import proto
from fedlearn.errors import FedlearnError, ProtocolError, from_rpc_error
from fedlearn.wire import MAX_CHUNK_BYTES, Payload, Reassembler, encode, push_requests

# How long past its round's deadline a push may go unanswered (the C++ agent's
# kPushGrace): the coordinator ends a push when its round closes.
PUSH_GRACE_S = 30.0
# Broken downloads in a row before run() gives up, and pushes answered "not now" in a
# row before their update is dropped (the C++ agent's --max_repeated_errors default).
MAX_REPEATED_ERRORS = 3

Weights = List[np.ndarray]


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """TLS for the channel: the CA to trust (PEM file; None: the system's), and for
    mutual TLS this client's certificate chain and key. ``server_name`` overrides the name
    the coordinator's certificate must carry (default: the host of the address)."""

    root_ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None


class Plan:
    """What the coordinator asks of one task: its round, the training plan's fields
    (``epochs``, ``batch_size``, ``optimizer``, ``learning_rate``, ``proximal_mu``,
    ``seed``, ``input_mean``, ``input_std``, ``validation_fraction``,
    ``reset_optimizer``) and ``run_validation``. ``fit`` reports progress with
    ``report_progress(done, total)``, which the heartbeats carry."""

    def __init__(self, task: Any, plan: Any):
        self.round: int = int(task.round)
        self.run_validation: bool = bool(task.run_validation)
        self.proto = plan
        self.epochs: int = plan.epochs
        self.batch_size: int = plan.batch_size
        self.optimizer: str = plan.optimizer
        self.learning_rate: float = plan.learning_rate
        self.validation_fraction: float = plan.validation_fraction
        self.seed: int = plan.seed
        self.input_mean: float = plan.input_mean
        self.input_std: float = plan.input_std
        self.proximal_mu: float = plan.proximal_mu
        self.reset_optimizer: bool = plan.reset_optimizer
        self._progress = (0, 0)
        self._lock = threading.Lock()

    def report_progress(self, done: int, total: int) -> None:
        """Batches done out of ``total`` this task; sent with the next heartbeat."""
        with self._lock:
            self._progress = (int(done), int(total))

    def progress(self) -> Tuple[int, int]:
        with self._lock:
            return self._progress


#: ``fit(weights, plan) -> (new weights or delta, num_examples, metrics)``; metrics may
#: hold ``loss``, ``accuracy``, ``validation_loss``, ``validation_accuracy`` and
#: ``num_validation_examples``.
FitFn = Callable[[Weights, Plan], Tuple[Sequence[np.ndarray], int, Dict[str, float]]]
#: ``evaluate(weights, plan) -> (test loss, test accuracy, num_examples)``.
EvaluateFn = Callable[[Weights, Plan], Tuple[float, float, int]]


@dataclasses.dataclass
class Summary:
    """What a run did, returned by ``Client.run``."""

    joins: int = 0
    # Updates the coordinator accepted. One it turned away because the round had moved
    # on (closed, not selecting this client, a duplicate, cancelled) counts under
    # updates_rejected.
    rounds_trained: int = 0
    updates_rejected: int = 0
    evaluations: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    # Seconds spent in the protocol (polls, reassembly, pushes) and in ``fit``; of the
    # protocol's: polls held open until their training task's header came
    # (task_wait), the weights that followed it received and verified (download),
    # and updates pushed (upload).
    protocol_seconds: float = 0.0
    fit_seconds: float = 0.0
    task_wait_seconds: float = 0.0
    download_seconds: float = 0.0
    upload_seconds: float = 0.0


@dataclasses.dataclass
class _HeldUpdate:
    """An update whose push a restarted coordinator refused, or the coordinator cut
    off, kept for its round: counted as rejected if another task comes instead."""

    run_id: str
    round: int
    weights_crcs: List[int]  # of the weights it was trained from
    header: Any  # UpdateHeader
    payloads: List[Payload]

    def same_task(self, run_id: str, round_: int, weights_crcs: List[int]) -> bool:
        return (self.run_id, self.round, self.weights_crcs) == (run_id, round_,
                                                               weights_crcs)


class Client:
    """One federated client. ``run()`` is called once, from one thread; ``stop()`` may
    be called from any thread and makes ``run()`` return soon.

    Args:
      coordinator: ``HOST:PORT`` of the coordinator's gRPC port.
      fit: trains on the task's weights (see ``FitFn``).
      evaluate: evaluates the final weights (see ``EvaluateFn``); None: the client joins
        saying it does not evaluate, and the coordinator never asks it to.
      returns: whether ``fit`` returns new ``"weights"`` (the default) or a ``"delta"``.
      update_encoding: ``"dense"`` (float32) or ``"int8"`` (a quarter of the bytes).
      join_token, display_name, num_train_examples, num_test_examples: sent at Join.
      tls: TLS or mutual TLS; None: an insecure channel.
      max_backoff: the cap, in seconds, of the jittered exponential backoff.
      reconnect_timeout: how long, in seconds, the coordinator may stay unreachable.
      poll_wait: seconds a long poll may be held by the coordinator.
      chunk_bytes: payload bytes per pushed chunk (at most 1 MiB).
      on_join: called with the ``JoinResponse`` after every join (its ``model`` is the
        spec); may raise to refuse the model.
      session_file: where the client keeps its id and session token (mode 0600). A
        client restarted after a crash presents them at its first join, and the
        coordinator retires its old identity at once rather than counting it alive,
        and sampling it, until its client timeout (README, "Alive, ready, retired").
        ``run()`` locks it ("<session_file>.lock") while it runs: a second client
        running on the same file is refused at once.
    """

    def __init__(self, coordinator: str, fit: FitFn,
                 evaluate: Optional[EvaluateFn] = None, *, returns: str = "weights",
                 update_encoding: str = "dense", join_token: str = "",
                 display_name: str = "", num_train_examples: int = 0,
                 num_test_examples: int = 0, tls: Optional[TlsConfig] = None,
                 max_backoff: float = 10.0, reconnect_timeout: float = 120.0,
                 poll_wait: float = 30.0, chunk_bytes: int = MAX_CHUNK_BYTES,
                 on_join: Optional[Callable[[Any], None]] = None,
                 session_file: Optional[str] = None):
        if returns not in ("weights", "delta"):
            raise ValueError(f"returns must be 'weights' or 'delta', not {returns!r}")
        if update_encoding not in ("dense", "int8"):
            raise ValueError(f"update_encoding must be 'dense' or 'int8', not "
                             f"{update_encoding!r}")
        self._grpc, self._pb2, pb2_grpc = proto.modules()
        self._address = coordinator
        self._fit = fit
        self._evaluate = evaluate
        self._returns = returns
        self._int8 = update_encoding == "int8"
        # Without evaluate, the coordinator never asks this client to evaluate: an
        # evaluation attempt would otherwise wait for its report until the deadline,
        # again and again.
        self._join_request = self._pb2.JoinRequest(
            join_token=join_token, display_name=display_name,
            num_train_examples=num_train_examples, num_test_examples=num_test_examples,
            no_evaluation=evaluate is None)
        self._max_backoff = max_backoff
        self._reconnect_timeout = reconnect_timeout
        self._poll_wait = poll_wait
        self._chunk_bytes = chunk_bytes
        self._on_join = on_join
        self._session_file = session_file
        self._channel = make_channel(coordinator, tls, max_backoff=max_backoff)
        self._stub = pb2_grpc.CoordinatorStub(self._channel)
        # PushGradient taking requests already serialized (wire.push_requests).
        push = self._pb2.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name[
            "PushGradient"]
        self._push_serialized = self._channel.stream_unary(
            f"/{push.containing_service.full_name}/{push.name}",
            response_deserializer=self._pb2.PushGradientResponse.FromString)
        self._stopping = threading.Event()
        # The poll under way, for stop() to cancel (guarded by _call_lock).
        self._call_lock = threading.Lock()
        self._poll_call: Any = None
        self._rng = random.Random()
        self._failures = 0
        self._failing_since: Optional[float] = None
        self._rejoins_in_a_row = 0
        self._protocol_errors = 0
        self.joined: Any = None  # the last JoinResponse
        # The weights are received into these every round (one model's bytes, made at
        # the first task after each join); fit and evaluate get copies.
        self._buffers: Optional[List[np.ndarray]] = None
        # The CRC-32Cs of the last weights received (Reassembler.tensor_crcs).
        self._weights_crcs: List[int] = []
        # An update a restarted coordinator refused for an identity it no longer
        # knew (NOT_FOUND, then a join): pushed again, without calling fit, if the same
        # run's same round comes back with the same weights, as the C++ agent does.
        self._held: Optional[_HeldUpdate] = None
        self.summary = Summary()

    # -----------------------------------------------------------------------------
    # The public surface.

    def run(self) -> Summary:
        """Runs until the coordinator says DONE; returns what it did. Raises
        ``FedlearnError`` (with the gRPC code) for what retrying cannot mend: a wrong
        join token, a refused request, a coordinator unreachable for
        ``reconnect_timeout``, or an error raised by ``fit``/``evaluate``/``on_join``."""
        lock = None
        try:
            lock = self._lock_session()
            self._join()
            while not self._stopping.is_set():
                received = self._call(self._poll, "RequestUpdate")
                if self._stopping.is_set():
                    break  # a task that came with the stop is not started
                if received is None:
                    continue
                task, weights = received
                types = self._pb2
                if task.type == types.TASK_TYPE_WAIT:
                    self._sleep(max(task.retry_after_ms, 10) / 1000.0)
                elif task.type == types.TASK_TYPE_TRAIN:
                    self._train(task, weights)
                elif task.type == types.TASK_TYPE_EVALUATE:
                    self._report(task, weights)
                elif task.type == types.TASK_TYPE_DONE:
                    self._drop_held()
                    return self.summary
                else:
                    raise FedlearnError(f"unknown task type {task.type}")
            raise FedlearnError("stopped", self._grpc.StatusCode.CANCELLED)
        except (self._grpc.RpcError, ValueError):
            # stop() closed the channel: a call under way ended CANCELLED, and
            # one begun after raises ValueError (a closed channel).
            if self._stopping.is_set():
                raise FedlearnError("stopped",
                                    self._grpc.StatusCode.CANCELLED) from None
            raise
        finally:
            self._channel.close()
            if lock is not None:
                os.close(lock)

    def stop(self) -> None:
        """Makes ``run()`` return (raising CANCELLED) soon: every call under way (a
        poll, a push, a join, a report, a heartbeat) is cancelled, as the C++ agent's
        Stop cancels its calls, by closing the client's channel; a ``fit`` running
        finishes first, and its update is not sent."""
        self._stopping.set()
        with self._call_lock:
            call = self._poll_call
        if call is not None:
            call.cancel()
        self._channel.close()

    # -----------------------------------------------------------------------------
    # Calls, and what their failures mean.

    def _metadata(self) -> list:
        return [("authorization", "Bearer " + self.joined.session_token)]

    def _mend(self, error: Any, what: str) -> Optional[str]:
        """What every call does about a failure that waiting or joining again mends,
        as the C++ agent does (common/retry.h): "backed off" while the coordinator is
        unreachable or the call was cut off on the way (UNAVAILABLE,
        DEADLINE_EXCEEDED, CANCELLED: a download that stalled for --stall_timeout, or
        whose round the run moved past, is cancelled), "rejoined" when a restarted
        one had forgotten this client or does not take its token (NOT_FOUND,
        UNAUTHENTICATED, PERMISSION_DENIED); None for any other code."""
        grpc = self._grpc
        code = error.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.CANCELLED):
            if code == grpc.StatusCode.CANCELLED:
                # Cut off by the coordinator, which is there: not silence, so a
                # client whose every download is cut off (too slow a link) backs
                # off and goes on rather than give up as unreachable.
                self._failing_since = None
            self._backoff(from_rpc_error(error, what))
            return "backed off"
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED):
            # A coordinator that forgets this client again right after each join
            # (two clients sharing a session file retire each other) is not
            # hammered: from the second re-join in a row on, a backoff first.
            if self._rejoins_in_a_row > 0:
                self._sleep(self._backoff_delay(self._rejoins_in_a_row))
            self._rejoins_in_a_row += 1
            self._join()
            return "rejoined"
        return None

    def _succeeded(self) -> None:
        self._failures = 0
        self._failing_since = None
        self._rejoins_in_a_row = 0
        self._protocol_errors = 0

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Runs ``fn``; on a failure ``_mend`` mends, returns None (to be called
        again). A download that breaks the contract (ProtocolError: a bad chunk, a
        CRC mismatch) is made again after a backoff, up to MAX_REPEATED_ERRORS in a
        row, as the C++ agent does with DATA_LOSS. Raises for the rest."""
        try:
            result = fn()
        except self._grpc.RpcError as e:
            if self._mend(e, what) is not None:
                return None
            raise from_rpc_error(e, what) from None
        except ProtocolError as e:
            self._protocol_errors += 1
            if self._protocol_errors >= MAX_REPEATED_ERRORS:
                raise FedlearnError(
                    f"{what}: {self._protocol_errors} broken downloads in a row: "
                    f"{e.message}", e.code) from None
            self._backoff(e)
            return None
        self._succeeded()
        return result

    def _backoff(self, error: FedlearnError, state: str = "unreachable") -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since > self._reconnect_timeout:
            raise FedlearnError(
                f"{self._address} {state} for {self._reconnect_timeout:.0f} s: "
                f"{error.message}", error.code)
        self._failures += 1
        self._sleep(self._backoff_delay(self._failures))

    def _backoff_delay(self, failures: int) -> float:
        """The jittered wait after ``failures`` in a row: 50 ms doubled per failure,
        capped at max_backoff, drawn from its upper half."""
        cap = min(self._max_backoff, 0.05 * 2 ** min(failures, 20))
        return self._rng.uniform(cap / 2, cap)

    def _sleep(self, seconds: float) -> None:
        if self._stopping.wait(seconds):
            raise FedlearnError("stopped", self._grpc.StatusCode.CANCELLED)

    def _lock_session(self) -> Optional[int]:
        """Locks the session file for this run, as the C++ agent does: an flock on
        "<session_file>.lock" (the session file itself is replaced at every join),
        released when run() returns or the process ends, however it ends. Two live
        clients sharing a session file would retire each other at every re-join, so
        a second one is refused at once. Returns the lock's descriptor (None without
        a session file)."""
        if self._session_file is None:
            return None
        path = f"{self._session_file}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FedlearnError(
                f"session file {self._session_file} is in use by another running "
                f"client ({path} is locked); give each client its own "
                f"session file") from None
        except OSError:
            os.close(fd)
            raise
        return fd

    def _read_session(self) -> None:
        """Puts the identity in the session file, if any, into the join request."""
        if self._session_file is None:
            return
        try:
            with open(self._session_file, encoding="utf-8") as f:
                lines = f.read().split()
        except OSError:
            return
        if len(lines) == 2:
            self._join_request.previous_client_id = lines[0]
            self._join_request.previous_session_token = lines[1]

    def _write_session(self) -> None:
        """Keeps the identity just joined as in the session file, atomically."""
        if self._session_file is None:
            return
        temp = f"{self._session_file}.tmp.{os.getpid()}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"{self.joined.client_id}\n{self.joined.session_token}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self._session_file)
        except OSError as e:
            # Joined all the same: only a restart's retiring of this identity is
            # lost (as the C++ agent, which logs it and goes on).
            print(f"fedlearn: session not saved to {self._session_file}: {e}",
                  file=sys.stderr)
            try:
                os.unlink(temp)
            except OSError:
                pass

    def _join(self) -> None:
        grpc = self._grpc
        self._read_session()
        while True:
            try:
                self.joined = self._stub.Join(self._join_request, timeout=30)
                # Made now, while the client waits for its first task; remade on
                # every join, since the model may differ after a restart.
                self._buffers = Reassembler.buffers(self.joined.model)
                break
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._backoff(from_rpc_error(e, "Join"))
                    continue
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # At --max_clients: slots free as gone clients time out (a
                    # fleet restarted at once finds its old identities holding
                    # them), so tried again, as the C++ agent does.
                    self._backoff(from_rpc_error(e, "Join"), "refusing the join")
                    continue
                raise from_rpc_error(e, "Join") from None
        self._failures = 0
        self._failing_since = None
        self._write_session()
        self.summary.joins += 1
        if self._on_join is not None:
            self._on_join(self.joined)

    def _poll(self) -> Tuple[Any, Optional[Weights]]:
        started = time.perf_counter()
        pb2 = self._pb2
        request = pb2.RequestUpdateRequest(
            client_id=self.joined.client_id, max_wait_ms=int(self._poll_wait * 1000))
        task = None
        first = started
        weights: Optional[Reassembler] = None
        call = self._stub.RequestUpdate(request, metadata=self._metadata(),
                                        timeout=self._poll_wait + 120)
        with self._call_lock:
            self._poll_call = call
        if self._stopping.is_set():
            call.cancel()  # stop() came before the call was there to cancel
        try:
            for message in call:
                if task is None:
                    first = time.perf_counter()
                    if not message.HasField("task"):
                        raise ProtocolError(
                            "RequestUpdate: the first message is not a task")
                    task = message.task
                    if task.type in (pb2.TASK_TYPE_TRAIN, pb2.TASK_TYPE_EVALUATE):
                        spec = self.joined.model
                        if task.num_tensors and task.num_tensors != len(spec.tensors):
                            raise ProtocolError(
                                f"task announces {task.num_tensors} tensors, the model "
                                f"has {len(spec.tensors)}")
                        weights = Reassembler(pb2, spec, self._buffers)
                elif weights is not None:
                    # Verified and placed as it arrives, while gRPC receives the next.
                    weights.add(message.chunk)
        except BaseException:
            call.cancel()  # a bad stream ends the call now, not at its deadline
            raise
        finally:
            with self._call_lock:
                self._poll_call = None
        if task is None:
            raise ProtocolError("RequestUpdate: the first message is not a task")
        if weights is None:
            return task, None
        tensors = weights.finish()
        self._weights_crcs = weights.tensor_crcs
        received = weights.received_bytes
        if task.payload_bytes and received != task.payload_bytes:
            raise ProtocolError(f"received {received} payload bytes, the task "
                                f"announced {task.payload_bytes}")
        self.summary.bytes_received += received
        done = time.perf_counter()
        self.summary.protocol_seconds += done - started
        self.summary.task_wait_seconds += first - started
        self.summary.download_seconds += done - first
        return task, tensors

    # -----------------------------------------------------------------------------
    # Tasks.

    def _train(self, task: Any, weights: Weights) -> None:
        plan = Plan(task, task.plan if task.HasField("plan") else self.joined.plan)
        started = time.perf_counter()
        # The push gives up 30 s after the round's deadline, as the C++ agent's: the
        # coordinator ends a push when its round closes, so only one that stopped
        # answering gets there. Without one in the task (async mode), each attempt
        # gets reconnect_timeout (_push).
        push_by = (time.monotonic() + task.deadline_ms / 1000.0 + PUSH_GRACE_S
                   if task.deadline_ms > 0 else None)
        # The run and weights it trains for, kept before a push's re-join can
        # replace self.joined (a held update belongs to this run, not the next).
        run_id, weights_crcs = self.joined.run_id, self._weights_crcs
        held = self._held
        if held is not None and held.same_task(run_id, task.round, weights_crcs):
            self._held = None
            held.header.client_id = self.joined.client_id
            if self._push(held.header, held.payloads, push_by) in ("rejoined",
                                                                   "cut off"):
                self._held = held  # kept again
            return
        self._drop_held()  # this task is not its round
        with _Heartbeats(self, plan):
            result = self._fit([w.copy() for w in weights], plan)
        self.summary.fit_seconds += time.perf_counter() - started
        trained, num_examples, metrics = result
        trained = list(trained)
        if len(trained) != len(weights):
            raise FedlearnError(f"fit returned {len(trained)} tensors, the model has "
                                f"{len(weights)}")
        delta = []
        for t, w, x in zip(self.joined.model.tensors, weights, trained):
            x = np.asarray(x, dtype=np.float32)
            if x.shape != w.shape:
                raise FedlearnError(f"fit returned {t.name} of shape {list(x.shape)}, "
                                    f"want {list(w.shape)}")
            delta.append(x - w if self._returns == "weights" else x)
        header = self._pb2.UpdateHeader(
            client_id=self.joined.client_id, round=task.round,
            num_examples=int(num_examples),
            train_loss=float(metrics.get("loss", 0.0)),
            train_accuracy=float(metrics.get("accuracy", 0.0)),
            validation_loss=float(metrics.get("validation_loss", 0.0)),
            validation_accuracy=float(metrics.get("validation_accuracy", 0.0)),
            num_validation_examples=int(metrics.get("num_validation_examples", 0)),
            encoding=(self._pb2.ENCODING_QUANTIZED if self._int8
                      else self._pb2.ENCODING_DENSE))
        payloads = [encode(d, self._int8)[0] for d in delta]
        outcome = self._push(header, payloads, push_by)
        if outcome in ("rejoined", "cut off"):
            self._held = _HeldUpdate(run_id, task.round, weights_crcs, header,
                                     payloads)

    def _drop_held(self) -> None:
        """Drops the held update, if any: another task came than its round (another
        round or run, EVALUATE, DONE), so it did not count; as the C++ agent."""
        if self._held is not None:
            self._held = None
            self.summary.updates_rejected += 1

    def _deliver(self, send: Callable[[], Any], what: str, not_now: tuple = (),
                 give_up_by: Optional[float] = None, keep_on: tuple = ()) -> str:
        """Sends a result of this client's task (an update, an evaluation) until it
        counts or cannot, as the C++ agent does: "sent"; "refused" (FAILED_PRECONDITION,
        ALREADY_EXISTS, CANCELLED: the round or the evaluation moved on;
        RESOURCE_EXHAUSTED: over a size or rate limit, the result dropped whole);
        "rejoined" (a restarted coordinator forgot this client, which joined again,
        under an identity the result was not asked of); "stopped". While the
        coordinator is unreachable the same result is sent again after a backoff, and
        ALREADY_EXISTS then means an earlier attempt arrived though its reply did not:
        "sent". A code in ``not_now`` (an update's RESOURCE_EXHAUSTED: a push preempted
        as too slow) sends the same result again after a backoff, before any poll could
        hand out a newer task: "refused" after MAX_REPEATED_ERRORS of them in a row, or
        once the backoff would end past ``give_up_by`` (time.monotonic: the round's
        deadline). A code in ``keep_on`` (an update's CANCELLED: cut off as its round
        closed or the coordinator shut down) returns "cut off", for the caller to keep
        the result until the next task says whether it is still wanted. Other codes
        raise."""
        grpc = self._grpc
        unanswered = False  # an attempt went unanswered: it may have arrived
        refusals = 0
        while not self._stopping.is_set():
            try:
                send()
            except grpc.RpcError as e:
                if self._stopping.is_set():
                    return "stopped"  # cut short by stop(), not refused
                code = e.code()
                if code == grpc.StatusCode.ALREADY_EXISTS and unanswered:
                    pass  # an earlier attempt arrived
                elif code in keep_on:
                    self._succeeded()  # it answered
                    return "cut off"
                elif code in not_now:
                    self._succeeded()  # it answered
                    refusals += 1
                    delay = self._backoff_delay(refusals)
                    if refusals >= MAX_REPEATED_ERRORS or (
                            give_up_by is not None
                            and time.monotonic() + delay >= give_up_by):
                        return "refused"
                    self._sleep(delay)
                    continue  # the same result
                elif code in (grpc.StatusCode.FAILED_PRECONDITION,
                              grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.CANCELLED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED):
                    return "refused"
                else:
                    mended = self._mend(e, what)
                    if mended is None:
                        raise from_rpc_error(e, what) from None
                    if mended == "rejoined":
                        return mended
                    unanswered = True
                    continue  # the same result, after the backoff
            self._succeeded()
            return "sent"
        return "stopped"

    def _push(self, header: Any, payloads: List[Payload],
              push_by: Optional[float]) -> str:
        """Pushes one update's encoded ``payloads``, each attempt giving up at
        ``push_by`` (time.monotonic; None: after reconnect_timeout); returns what
        _deliver did with it (an update the round no longer wants is dropped)."""
        started = time.perf_counter()
        attempt: Dict[str, float] = {}

        def send() -> None:
            attempt["started"] = time.perf_counter()
            # Never unbounded: without a round deadline (async mode) an attempt
            # gets reconnect_timeout, so a push queued at a coordinator whose
            # host vanished ends and is retried, as the C++ agent's.
            timeout = (self._reconnect_timeout if push_by is None
                       else max(1.0, push_by - time.monotonic()))
            self.push_update(header, payloads, timeout=timeout)

        grpc = self._grpc
        outcome = self._deliver(
            send, "PushGradient", not_now=(grpc.StatusCode.RESOURCE_EXHAUSTED,),
            give_up_by=None if push_by is None else push_by - PUSH_GRACE_S,
            keep_on=(grpc.StatusCode.CANCELLED,))
        if outcome == "sent":
            self.summary.upload_seconds += time.perf_counter() - attempt["started"]
            self.summary.rounds_trained += 1
            self.summary.bytes_sent += sum(len(p) for p in payloads)
        elif outcome == "refused":
            self.summary.updates_rejected += 1
        self.summary.protocol_seconds += time.perf_counter() - started
        return outcome

    def push_update(self, header: Any, payloads: Sequence[Payload],
                    timeout: Optional[float] = 120) -> Any:
        """Sends ``header`` and, once the coordinator admits it, the payloads' chunks,
        within ``timeout`` seconds (None: no deadline). Returns the
        ``PushGradientResponse``; raises ``grpc.RpcError``. (Public for tools that
        push hand-made updates.)"""
        go = threading.Event()
        state: Dict[str, Any] = {}
        pb2 = self._pb2
        spec = self.joined.model

        def requests() -> Iterator[bytes]:
            yield pb2.PushGradientRequest(header=header).SerializeToString()
            # The coordinator's initial metadata is the go-ahead: a rejected push
            # finishes before any chunk is sent.
            go.wait()
            if state["call"].done():
                return
            yield from push_requests(pb2, spec, payloads, self._chunk_bytes,
                                     header.encoding == pb2.ENCODING_QUANTIZED)

        call = self._push_serialized.future(requests(), metadata=self._metadata(),
                                            timeout=timeout)
        state["call"] = call
        try:
            call.initial_metadata()
        finally:
            go.set()
        return call.result()

    def _report(self, task: Any, weights: Weights) -> None:
        if self._evaluate is None:
            return
        plan = Plan(task, self.joined.plan)
        loss, accuracy, examples = self._evaluate([w.copy() for w in weights], plan)
        report = self._pb2.ReportEvalRequest(
            client_id=self.joined.client_id, round=task.round, test_loss=float(loss),
            test_accuracy=float(accuracy), num_examples=int(examples))
        outcome = self._deliver(
            lambda: self._stub.ReportEval(report, metadata=self._metadata(), timeout=30),
            "ReportEval")
        if outcome == "sent":
            self.summary.evaluations += 1


class _Heartbeats:
    """While ``fit`` runs: a thread that sends Heartbeat with the plan's progress every
    interval the coordinator suggested, so a slow client is told apart from a gone
    one. Its failures are ignored (the next poll or push reports them)."""

    def __init__(self, client: Client, plan: Plan):
        self._client = client
        self._plan = plan
        self._done = threading.Event()
        interval_ms = client.joined.heartbeat_interval_ms
        self._interval = interval_ms / 1000.0 if interval_ms > 0 else None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "_Heartbeats":
        if self._interval is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        c = self._client
        while not self._done.wait(self._interval):
            done, total = self._plan.progress()
            try:
                c._stub.Heartbeat(
                    c._pb2.HeartbeatRequest(client_id=c.joined.client_id,
                                            round=self._plan.round, batches_done=done,
                                            batches_total=total),
                    metadata=c._metadata(), timeout=10)
            except (c._grpc.RpcError, ValueError):
                pass  # ValueError: stop() closed the channel


def make_channel(address: str, tls: Optional[TlsConfig] = None,
                 max_backoff: float = 10.0) -> Any:
    """A gRPC channel to ``address`` that takes the contract's 1 MiB chunks and
    redials a coordinator that went away soon, then at most every ``max_backoff``
    seconds, in step with the client's own retries (as the C++ agent's channel: a
    call on a channel waiting out gRPC's default backoff, up to 120 s, fails at
    once without trying)."""
    grpc, _, _ = proto.modules()
    options = [("grpc.max_receive_message_length", MAX_CHUNK_BYTES + (64 << 10)),
               ("grpc.max_send_message_length", MAX_CHUNK_BYTES + (64 << 10)),
               ("grpc.initial_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms",
                max(100, int(max_backoff * 1000))),
               # RequestUpdate (unary-stream) runs on the thread that reads it, rather
               # than on gRPC's channel thread, which took the GIL from it for each of
               # the weights' 75 chunks: downloads 1.3x as fast (README, "Results").
               (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
    if tls is None:
        return grpc.insecure_channel(address, options=options)

    def read(path: Optional[str]) -> Optional[bytes]:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(tls.root_ca), private_key=read(tls.key),
        certificate_chain=read(tls.cert))
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(address, credentials, options=options)
