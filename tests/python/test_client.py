"""fedlearn.Client and the command line against a real coordinator process."""

import contextlib
import http.server
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import json
from contextlib import redirect_stdout

import grpc
import numpy as np

import fedlearn
from fedlearn.__main__ import get_status, main as cli
from fedlearn.v1 import coordinator_pb2
from coordinator import Coordinator


def free_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def restartable(*flags):
    """``flags`` for a coordinator that can be killed and started again where it was,
    and the port for both: a state directory of its own, a port free when picked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [*flags, f"--state_dir={tempfile.mkdtemp()}"], port


def run_clients(clients):
    """Runs each client on a thread; returns their summaries (or raises the first
    error)."""
    results = [None] * len(clients)

    def go(i):
        try:
            results[i] = clients[i].run()
        except Exception as e:  # handed to the test thread
            results[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results


def run_in_thread(client, until_polling=False):
    """Runs ``client.run()`` on a thread; returns the thread and a dict that gets the
    ``FedlearnError`` it ends with (``"error"``). With ``until_polling``, returns once
    the client holds a poll."""
    ended = {}

    def run():
        try:
            client.run()
        except fedlearn.FedlearnError as e:
            ended["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    if until_polling:
        deadline = time.monotonic() + 30
        while client._poll_call is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client._poll_call is not None, "no poll within 30 s"
    return thread, ended


class ScriptedFailure(grpc.RpcError):
    """A call's failure with `code`, as grpc raises it (no coordinator reached)."""

    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"scripted {self._code.name}"


class ClientTest(unittest.TestCase):
    def test_two_clients_train_evaluate_and_see_fedavg_to_the_bit(self):
        # Two rounds of two clients on mlp_2nn: client 0 (100 examples, dense) adds
        # 0.01 to every weight, client 1 (300 examples, dense) subtracts 0.02. In round
        # 2 each checks that the model it got is round 1's plus the example-weighted
        # mean of the deltas, computed in double and rounded once, as FedAvg does.
        adds = [np.float32(0.01), np.float32(-0.02)]
        examples = [100, 300]
        seen = {0: [], 1: []}

        def fit_for(i):
            def fit(weights, plan):
                seen[i].append((plan.round, [w.copy() for w in weights]))
                plan.report_progress(1, 1)
                return [w + adds[i] for w in weights], examples[i], {
                    "loss": 1.0 / plan.round, "accuracy": 0.5}
            return fit

        def evaluate(weights, plan):
            return 0.25, 0.75, 40

        with Coordinator("--model=mlp_2nn", "--min_clients=2", "--max_rounds=2",
                         "--convergence_threshold=-inf") as c:
            clients = [fedlearn.Client(c.address, fit_for(i), evaluate,
                                       display_name=f"py-{i}") for i in range(2)]
            summaries = run_clients(clients)
            status = get_status(c.address)
        for s in summaries:
            self.assertEqual(s.rounds_trained, 2)
            self.assertEqual(s.evaluations, 1)
            self.assertEqual(s.updates_rejected, 0)
            self.assertEqual(s.joins, 1)
        self.assertEqual(status.phase, 4)  # PHASE_DONE
        self.assertAlmostEqual(status.final_evaluation.test_accuracy, 0.75)
        (r1, w1), (r2, w2) = seen[0]
        self.assertEqual((r1, r2), (1, 2))
        mean = (100 * np.float64(adds[0]) + 300 * np.float64(adds[1])) / 400
        for before, after, t in zip(w1, w2, status.model.tensors):
            # Each client's delta is (w + a) - w in float32.
            d0 = ((before + adds[0]) - before).astype(np.float64)
            d1 = ((before + adds[1]) - before).astype(np.float64)
            want = (before.astype(np.float64) + (100 * d0 + 300 * d1) / 400).astype(
                np.float32)
            np.testing.assert_array_equal(after, want, err_msg=t.name)
            self.assertLess(float(np.max(np.abs(after - before - mean))), 1e-6)

    def test_int8_updates_and_heartbeats_with_progress(self):
        progress_seen = []

        with Coordinator("--model=mlp_2nn", "--min_clients=1", "--max_rounds=1",
                         "--heartbeat_interval=200ms",
                         "--convergence_threshold=-inf") as c:
            def fit(weights, plan):
                plan.report_progress(3, 7)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:  # until a heartbeat carried it
                    status = get_status(c.address)
                    mine = [x for x in status.clients if x.batches_total == 7]
                    if mine:
                        progress_seen.append((mine[0].batches_done, mine[0].state))
                        break
                    time.sleep(0.05)
                return [w * 0.5 for w in weights], 10, {"loss": 1.0}

            client = fedlearn.Client(c.address, fit, lambda w, p: (0.1, 0.9, 5),
                                     update_encoding="int8")
            summary = run_clients([client])[0]
            status = get_status(c.address)
        self.assertEqual(progress_seen, [(3, "training")])
        # int8: 4 bytes of scale and 1 per value, per tensor.
        n = status.model.num_parameters
        self.assertEqual(summary.bytes_sent, n + 4 * len(status.model.tensors))
        self.assertEqual(status.history[0].bytes_received, summary.bytes_sent)

    def test_errors_carry_the_grpc_code(self):
        with Coordinator("--model=mlp_2nn", "--join_token=secret") as c:
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                     join_token="wrong")
            with self.assertRaises(fedlearn.FedlearnError) as e:
                client.run()
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("join token", e.exception.message)

    def test_a_request_update_that_does_not_parse_is_invalid_argument(self):
        # RequestUpdate is a raw method in the coordinator (it writes pre-serialized
        # chunks), so parsing its request is the coordinator's own job.
        with Coordinator("--model=mlp_2nn") as c:
            channel = grpc.insecure_channel(c.address)
            raw = channel.unary_stream("/fedlearn.v1.Coordinator/RequestUpdate")
            # Field 1 (client_id) announces 127 bytes and the message ends.
            with self.assertRaises(grpc.RpcError) as e:
                list(raw(b"\x0a\x7f", timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("not a fedlearn.v1.RequestUpdateRequest", e.exception.details())
            # A well-formed request from a client that never joined: the usual answer.
            with self.assertRaises(grpc.RpcError) as e:
                list(raw(b"\x0a\x03abc", timeout=10))
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            channel.close()

    def test_an_unreachable_coordinator_is_unavailable_after_the_timeout(self):
        client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                 reconnect_timeout=0.5, max_backoff=0.1)
        with self.assertRaises(fedlearn.FedlearnError) as e:
            client.run()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_a_restarted_client_retires_the_identity_in_its_session_file(self):
        # A client "crashes" after joining (it just stops, holding nothing open); the
        # one restarted with the same session file retires it at once: the old id is
        # gone, not alive for its client timeout, and its calls are told why.
        session = os.path.join(tempfile.mkdtemp(), "agent.session")
        with Coordinator("--model=mlp_2nn", "--min_clients=5") as c:
            first = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                    session_file=session)
            first._join()
            self.assertEqual(os.stat(session).st_mode & 0o777, 0o600)
            with open(session, encoding="utf-8") as f:
                self.assertEqual(f.read().split(),
                                 [first.joined.client_id, first.joined.session_token])
            second = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                     session_file=session)
            second._join()
            self.assertEqual(second.joined.retired_client_id, first.joined.client_id)
            status = get_status(c.address)
            states = {x.client_id: x.state for x in status.clients}
            self.assertEqual(states[first.joined.client_id], "gone")
            self.assertEqual(states[second.joined.client_id], "ready")
            with self.assertRaises(grpc.RpcError) as e:
                first._poll()
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            self.assertIn(f"joined again as {second.joined.client_id}",
                          e.exception.details())

    def test_a_client_without_evaluate_is_never_asked_to_evaluate(self):
        # It joins saying so (JoinRequest.no_evaluation): the evaluation asks the
        # other client only and closes on its report, where before it waited for a
        # report that could not come until its deadline, and then again.
        with Coordinator("--model=mlp_2nn", "--min_clients=2", "--clients_per_round=2",
                         "--max_rounds=1", "--eval_timeout=60s") as c:
            fit = lambda w, p: ([x + 0.001 for x in w], 10, {"loss": 1.0})
            plain = fedlearn.Client(c.address, fit)
            evaluating = fedlearn.Client(c.address, fit, lambda w, p: (0.5, 0.75, 20))
            started = time.monotonic()
            summaries = run_clients([plain, evaluating])
            self.assertLess(time.monotonic() - started, 30)
            status = get_status(c.address)
        self.assertEqual(status.phase, 4)  # DONE
        self.assertEqual(status.final_evaluation.num_clients, 1)
        self.assertEqual([s.evaluations for s in summaries], [0, 1])

    def test_two_running_clients_cannot_share_a_session_file(self):
        # They would retire each other at every re-join, each presenting the identity
        # the other saved: the second is refused before it joins, the first goes on,
        # and the lock goes with the client that held it.
        session = os.path.join(tempfile.mkdtemp(), "agent.session")
        with Coordinator("--model=mlp_2nn", "--min_clients=2") as c:
            first = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                    session_file=session)
            thread, ended = run_in_thread(first, until_polling=True)
            second = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                     session_file=session)
            with self.assertRaises(fedlearn.FedlearnError) as e:
                second.run()
            self.assertIn(f"session file {session} is in use by another running "
                          "client", str(e.exception))
            status = get_status(c.address)
            self.assertEqual(status.client_counts.joined, 1)
            self.assertEqual([x.state for x in status.clients], ["ready"])
            first.stop()
            thread.join(15)
            self.assertFalse(thread.is_alive())
            self.assertEqual(ended["error"].code, grpc.StatusCode.CANCELLED)
            third = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                    session_file=session)
            lock = third._lock_session()
            self.assertIsNotNone(lock)
            os.close(lock)

    def test_a_join_refused_at_max_clients_is_tried_again_until_a_slot_frees(self):
        # A silent client holds the only slot until --client_timeout; the join is
        # refused RESOURCE_EXHAUSTED until then and tried again (before, run() raised
        # at once), as the C++ agent does.
        with Coordinator("--model=mlp_2nn", "--min_clients=1", "--max_rounds=1",
                         "--max_clients=1", "--client_timeout=1s",
                         "--round_timeout=2s", "--convergence_threshold=-inf") as c:
            silent = fedlearn.Client(c.address, lambda w, p: (w, 1, {}))
            silent._join()
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {"loss": 1.0}),
                                     lambda w, p: (0.5, 0.5, 1), max_backoff=0.2)
            summary = client.run()
        self.assertEqual(summary.joins, 1)
        self.assertEqual(summary.rounds_trained, 1)
        # Refused for longer than reconnect_timeout: raised, saying so.
        with Coordinator("--model=mlp_2nn", "--min_clients=5", "--max_clients=1") as c:
            fedlearn.Client(c.address, lambda w, p: (w, 1, {}))._join()
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                     max_backoff=0.05, reconnect_timeout=0.5)
            with self.assertRaises(fedlearn.FedlearnError) as e:
                client.run()
        self.assertEqual(e.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("refusing the join", str(e.exception))

    def test_a_session_file_that_cannot_be_written_does_not_end_the_join(self):
        # Joined all the same, as the C++ agent: only retiring this identity after a
        # restart is lost. A directory stands where the file should go, so the
        # temporary file is written and the rename fails: it must not be left behind.
        parent = tempfile.mkdtemp()
        session = os.path.join(parent, "agent.session")
        os.mkdir(session)
        with Coordinator("--model=mlp_2nn", "--min_clients=5") as c:
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {}),
                                     session_file=session)
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                client._join()
            self.assertTrue(client.joined.client_id)
            self.assertIn(f"session not saved to {session}", stderr.getvalue())
            self.assertEqual(os.listdir(parent), ["agent.session"])

    def test_tls_and_mutual_tls(self):
        certs = tempfile.mkdtemp()
        subprocess.run(["bash", os.path.join(os.environ["FEDLEARN_SOURCE_DIR"], "tests",
                                             "util", "make-test-certs.sh"), certs],
                       check=True)
        path = lambda name: os.path.join(certs, name)  # noqa: E731
        with Coordinator("--model=mlp_2nn", "--min_clients=1", "--max_rounds=1",
                         "--convergence_threshold=-inf",
                         f"--tls_cert={path('server.pem')}",
                         f"--tls_key={path('server.key')}",
                         f"--tls_client_ca={path('ca.pem')}") as c:
            address = c.address.replace("127.0.0.1", "localhost")
            # Without a client certificate the handshake fails: UNAVAILABLE at once.
            bare = fedlearn.Client(address, lambda w, p: (w, 1, {}),
                                   tls=fedlearn.TlsConfig(root_ca=path("ca.pem")),
                                   reconnect_timeout=1, max_backoff=0.2)
            with self.assertRaises(fedlearn.FedlearnError) as e:
                bare.run()
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
            tls = fedlearn.TlsConfig(root_ca=path("ca.pem"), cert=path("client.pem"),
                                     key=path("client.key"))
            client = fedlearn.Client(address, lambda w, p: (w, 1, {"loss": 1.0}),
                                     lambda w, p: (0.5, 0.5, 1), tls=tls)
            summary = client.run()
            # The dashboard is HTTPS with the same certificate: `model` trusts the CA
            # it is given, and refuses the certificate without it.
            http = c.http.replace("127.0.0.1", "localhost")
            out = os.path.join(certs, "model.safetensors")
            with redirect_stdout(io.StringIO()):
                self.assertEqual(cli(["model", http, out, "--tls_ca", path("ca.pem")]), 0)
            with open(out, "rb") as f:
                header_len = struct.unpack("<Q", f.read(8))[0]
            self.assertEqual(os.path.getsize(out), 8 + header_len + 199210 * 4)
            err = io.StringIO()
            with contextlib.redirect_stderr(err), redirect_stdout(io.StringIO()):
                self.assertEqual(cli(["model", f"https://{http}", out + ".2"]), 1)
            self.assertIn("CERTIFICATE_VERIFY_FAILED", err.getvalue())
            self.assertFalse(os.path.exists(out + ".2"))
        self.assertEqual(summary.rounds_trained, 1)
        self.assertEqual(summary.evaluations, 1)

    def _run_across_a_restart(self, flags, port, kill_round):
        """One client runs against a coordinator with ``flags`` on ``port``, which is
        SIGKILLed in the first ``fit`` of round ``kill_round`` and started again with
        the same flags; returns the client's summary, the rounds ``fit`` ran, and the
        restarted coordinator's status at the end."""
        first = Coordinator(*flags, port=port).__enter__()
        killed = threading.Event()
        rounds_fit = []

        def fit(weights, plan):
            rounds_fit.append(plan.round)
            if plan.round == kill_round and not killed.is_set():
                first.process.kill()
                first.process.wait()
                killed.set()
            return [w + 0.001 for w in weights], 10, {"loss": 1.0 / plan.round}

        client = fedlearn.Client(first.address, fit, lambda w, p: (0.5, 0.5, 1),
                                 max_backoff=0.2)
        result = {}
        thread = threading.Thread(target=lambda: result.update(s=client.run()))
        thread.start()
        self.assertTrue(killed.wait(60))
        with Coordinator(*flags, port=port) as second:
            thread.join(60)
            status = get_status(second.address)
        first._log.close()
        os.unlink(first.log_path)
        self.assertIn("s", result)
        return result["s"], rounds_fit, status

    def test_a_restarted_coordinator_is_joined_again(self):
        # The coordinator is killed in round 2 and restarted on the same port and
        # state directory: the client backs off while it is gone, is told NOT_FOUND by
        # the new process (which never saw it), joins again and finishes the run. The
        # resumed run asks for round 2 again with the same weights: the update trained
        # for it is pushed again, not trained again (as the C++ agent does).
        flags, port = restartable("--model=mlp_2nn", "--min_clients=1",
                                  "--max_rounds=3", "--convergence_threshold=-inf")
        summary, rounds_fit, status = self._run_across_a_restart(flags, port, 2)
        self.assertEqual(summary.joins, 2)
        self.assertEqual(rounds_fit, [1, 2, 3])
        self.assertEqual(summary.rounds_trained, 3)
        self.assertEqual(summary.updates_rejected, 0)
        self.assertEqual(status.phase, 4)  # DONE
        self.assertEqual(len([r for r in status.history if not r.evaluation]), 3)

    def test_an_update_is_not_pushed_into_another_run(self):
        # Restarted without a state directory, the coordinator starts a new run with
        # the same initial weights: round 1 comes back alike, but its plan may not be
        # the old run's, so fit runs again (the held update belongs to the old run).
        summary, rounds_fit, _ = self._run_across_a_restart(
            ["--model=mlp_2nn", "--min_clients=1", "--max_rounds=1"], free_port(), 1)
        self.assertEqual(rounds_fit, [1, 1])
        self.assertEqual(summary.rounds_trained, 1)

    def test_what_each_code_does_to_a_result_being_delivered(self):
        # _deliver, the policy pushes and evaluation reports share, fed scripted
        # failures (no coordinator is reached: the codes never ask for a join).
        def deliver(*codes):
            client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                     max_backoff=0.01)
            script = list(codes)
            sends = []

            def send():
                sends.append(1)
                if script:
                    raise ScriptedFailure(script.pop(0))

            return client._deliver(send, "PushGradient"), len(sends)

        C = grpc.StatusCode
        self.assertEqual(deliver(), ("sent", 1))
        # The round moved on, or the result is over a limit: dropped, not raised (an
        # evaluation report's policy; an update's push is below).
        for code in (C.FAILED_PRECONDITION, C.ALREADY_EXISTS, C.CANCELLED,
                     C.RESOURCE_EXHAUSTED):
            self.assertEqual(deliver(code), ("refused", 1), code)
        # Unreachable: the same result again; a duplicate then is the earlier
        # attempt having arrived.
        self.assertEqual(deliver(C.UNAVAILABLE, C.DEADLINE_EXCEEDED), ("sent", 3))
        self.assertEqual(deliver(C.UNAVAILABLE, C.ALREADY_EXISTS), ("sent", 2))
        with self.assertRaises(fedlearn.FedlearnError) as e:
            deliver(C.INVALID_ARGUMENT)
        self.assertEqual(e.exception.code, C.INVALID_ARGUMENT)
        self.assertIn("PushGradient: scripted INVALID_ARGUMENT", str(e.exception))

        # An update's push, as the C++ agent's (AgentPushAgainTest): "not now"
        # (preempted as too slow: RESOURCE_EXHAUSTED) pushes the same update again,
        # before any poll; refused three times in a row, or with its round's deadline
        # passing, it is dropped.
        def push(*codes, push_by=None):
            client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                     max_backoff=0.01)
            script = list(codes)
            sends = []

            def push_update(header, payloads, timeout):
                sends.append(header.round)
                if script:
                    raise ScriptedFailure(script.pop(0))

            client.push_update = push_update
            header = client._pb2.UpdateHeader(round=4)
            outcome = client._push(header, [], push_by)
            return (outcome, sends, client.summary.rounds_trained,
                    client.summary.updates_rejected)

        code = C.RESOURCE_EXHAUSTED
        self.assertEqual(push(code, code), ("sent", [4, 4, 4], 1, 0))
        self.assertEqual(push(code, code, code), ("refused", [4, 4, 4], 0, 1))
        # The round's deadline (push_by less the 30 s grace) has passed.
        self.assertEqual(push(code, push_by=time.monotonic() + 30),
                         ("refused", [4], 0, 1))
        self.assertEqual(push(C.FAILED_PRECONDITION), ("refused", [4], 0, 1))
        self.assertEqual(push(C.UNAVAILABLE), ("sent", [4, 4], 1, 0))
        # Cut off (its round closed at quorum, or the coordinator shut down): kept
        # for the next task to decide, not counted yet (_train).
        self.assertEqual(push(C.CANCELLED), ("cut off", [4], 0, 0))

    def test_an_update_cut_off_is_kept_for_the_next_task_to_decide(self):
        # _train with a scripted push: cut off (CANCELLED) once, then taken. The same
        # round with the same weights next (a resumed coordinator) gets the kept
        # update without fit; another round runs fit, and the kept one counts as
        # rejected; as AgentPushTest.APushCutOffIsKeptForTheNextTaskToDecide.
        _, pb2, _ = fedlearn.proto.modules()

        def train_twice(next_round):
            fits, pushes = [], []

            def fit(weights, plan):
                fits.append(1)
                return [w + 1 for w in weights], 10, {"loss": 1.0}

            client = fedlearn.Client("127.0.0.1:1", fit, max_backoff=0.01)
            client.joined = pb2.JoinResponse(
                client_id="client-1", run_id="r1",
                model=pb2.ModelSpec(name="t", num_parameters=3, tensors=[
                    pb2.TensorSpec(name="w", shape=[3], dtype=pb2.DTYPE_FLOAT32)]))
            client._weights_crcs = [7]

            def push_update(header, payloads, timeout):
                pushes.append(header.round)
                if len(pushes) == 1:
                    raise ScriptedFailure(grpc.StatusCode.CANCELLED)

            client.push_update = push_update
            weights = [np.zeros(3, np.float32)]
            client._train(pb2.Task(type=pb2.TASK_TYPE_TRAIN, round=1), weights)
            client._train(pb2.Task(type=pb2.TASK_TYPE_TRAIN, round=next_round), weights)
            return (len(fits), pushes, client.summary.rounds_trained,
                    client.summary.updates_rejected)

        self.assertEqual(train_twice(1), (1, [1, 1], 1, 0))
        self.assertEqual(train_twice(2), (2, [1, 2], 1, 1))

    def test_an_update_kept_is_dropped_and_counted_at_done(self):
        # run() with scripted calls: round 1 is trained, its push cut off (kept), and
        # DONE comes next: the kept update did not count (as the C++ agent's
        # AgentPushTest.APushCutOffIsKeptForTheNextTaskToDecide).
        _, pb2, _ = fedlearn.proto.modules()
        client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 10, {}),
                                 max_backoff=0.01)

        def join():
            client.joined = pb2.JoinResponse(
                client_id="client-1", run_id="r1",
                model=pb2.ModelSpec(name="t", num_parameters=3, tensors=[
                    pb2.TensorSpec(name="w", shape=[3], dtype=pb2.DTYPE_FLOAT32)]))
            client._weights_crcs = [7]

        tasks = [(pb2.Task(type=pb2.TASK_TYPE_TRAIN, round=1),
                  [np.zeros(3, np.float32)]),
                 (pb2.Task(type=pb2.TASK_TYPE_DONE), [])]

        def push_update(header, payloads, timeout):
            raise ScriptedFailure(grpc.StatusCode.CANCELLED)

        client._join = join
        client._poll = lambda: tasks.pop(0)
        client.push_update = push_update
        summary = client.run()
        self.assertEqual((summary.rounds_trained, summary.updates_rejected), (0, 1))
        self.assertIsNone(client._held)

    def test_polls_cut_off_by_the_coordinator_are_not_silence(self):
        # A client on a link too slow for every download is cut off (CANCELLED) again
        # and again, for longer than reconnect_timeout: the coordinator answered each
        # time, so the client goes on, as the C++ agent does
        # (AgentPollTest.PollsCutOffByTheCoordinatorAreNotSilence). Unreachable is
        # silence, and gives up after reconnect_timeout.
        client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                 max_backoff=0.01, reconnect_timeout=0.05)

        def fail(code):
            def call():
                raise ScriptedFailure(code)
            return call

        cut = fail(grpc.StatusCode.CANCELLED)
        until = time.monotonic() + 0.3
        while time.monotonic() < until:
            self.assertIsNone(client._call(cut, "RequestUpdate"))
        down = fail(grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(fedlearn.FedlearnError) as e:
            for _ in range(1000):
                client._call(down, "RequestUpdate")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("unreachable", str(e.exception))

    def test_a_poll_cut_off_mid_download_is_made_again(self):
        # The coordinator cancels a download that moved nothing for --stall_timeout:
        # the poll is made again after a backoff, as the C++ agent does (retry.h),
        # not raised out of run().
        client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                 max_backoff=0.01)
        script = [grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE]

        def poll():
            if script:
                raise ScriptedFailure(script.pop(0))
            return "task"

        results = [client._call(poll, "RequestUpdate") for _ in range(3)]
        self.assertEqual(results, [None, None, "task"])

    def test_a_broken_download_is_made_again_a_few_times(self):
        # A chunk that fails its checks (ProtocolError) ends that download; the poll
        # is made again after a backoff, and only three in a row end run(), as the
        # C++ agent's max_repeated_errors.
        from fedlearn.errors import ProtocolError
        client = fedlearn.Client("127.0.0.1:1", lambda w, p: (w, 1, {}),
                                 max_backoff=0.01)
        script = [ProtocolError("w: chunk CRC-32C mismatch")] * 2

        def poll():
            if script:
                raise script.pop(0)
            return "task"

        self.assertEqual([client._call(poll, "RequestUpdate") for _ in range(3)],
                         [None, None, "task"])
        script = [ProtocolError("w: chunk CRC-32C mismatch")] * 3
        self.assertIsNone(client._call(poll, "RequestUpdate"))
        self.assertIsNone(client._call(poll, "RequestUpdate"))
        with self.assertRaises(fedlearn.FedlearnError) as e:
            client._call(poll, "RequestUpdate")
        self.assertIn("3 broken downloads in a row", str(e.exception))

    def test_stop_cancels_a_poll_under_way(self):
        # A run that never starts (it needs two clients): the poll is held for the
        # client's poll_wait of 60 s, and stop() must end run() long before that.
        with Coordinator("--model=mlp_2nn", "--min_clients=2") as c:
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {}), poll_wait=60)
            thread, ended = run_in_thread(client, until_polling=True)
            client.stop()
            thread.join(15)
            self.assertFalse(thread.is_alive())
        self.assertEqual(ended["error"].code, grpc.StatusCode.CANCELLED)

    def test_stop_cancels_a_push_under_way(self):
        # The coordinator is frozen (SIGSTOP) as fit returns, so the push hangs with
        # its connection open: stop() must end run() at once, not after the push's
        # deadline (the round's 5 minutes and 30 s more).
        with Coordinator("--model=mlp_2nn", "--min_clients=1") as c:
            def fit(weights, plan):
                c.process.send_signal(signal.SIGSTOP)
                return weights, 10, {}

            client = fedlearn.Client(c.address, fit)
            try:
                thread, ended = run_in_thread(client)
                time.sleep(2)  # the push is under way, unanswered
                self.assertTrue(thread.is_alive())
                stopped = time.monotonic()
                client.stop()
                thread.join(15)
                self.assertFalse(thread.is_alive())
                self.assertLess(time.monotonic() - stopped, 5)
            finally:
                c.process.send_signal(signal.SIGCONT)
        self.assertEqual(ended["error"].code, grpc.StatusCode.CANCELLED)
        self.assertEqual(client.summary.updates_rejected, 0)

    def test_wait_is_honoured(self):
        # One client of the two the run needs: each poll is held for the client's
        # poll_wait of 0.1 s, then answered WAIT with retry_after_ms 200, and the
        # client must let those 200 ms pass before it polls again.
        with Coordinator("--model=mlp_2nn", "--min_clients=2") as c:
            client = fedlearn.Client(c.address, lambda w, p: (w, 1, {}), poll_wait=0.1)
            polls = []  # (when the poll started, the task's type and retry_after_ms)
            poll = client._poll

            def timed_poll():
                started = time.monotonic()
                task, weights = poll()
                polls.append((started, task.type, task.retry_after_ms))
                return task, weights

            client._poll = timed_poll
            thread, ended = run_in_thread(client)
            deadline = time.monotonic() + 30
            while len(polls) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            client.stop()
            thread.join(10)
        self.assertFalse(thread.is_alive())
        self.assertEqual(ended["error"].code, grpc.StatusCode.CANCELLED)  # stop()
        self.assertGreaterEqual(len(polls), 4)
        for started, kind, retry_after_ms in polls:
            self.assertEqual(kind, coordinator_pb2.TASK_TYPE_WAIT)
            self.assertEqual(retry_after_ms, 200)
        for (before, _, _), (after, _, _) in zip(polls, polls[1:]):
            # Held 0.1 s, then 0.2 s of waiting as told (10 ms of slack for the
            # coordinator's timer).
            self.assertGreaterEqual(after - before, 0.29)

    def test_an_evaluation_outlives_a_coordinator_restart(self):
        # The coordinator is killed while the client evaluates the final model, and
        # restarted on the same port and state directory. The report meets a
        # coordinator that is gone (UNAVAILABLE: backed off and sent again), then one
        # that never saw this client (joined again); the client evaluates again when
        # asked and the run ends DONE with its evaluation, no error surfacing.
        flags, port = restartable("--model=mlp_2nn", "--min_clients=1",
                                  "--max_rounds=1", "--convergence_threshold=-inf")
        first = Coordinator(*flags, port=port).__enter__()
        self.addCleanup(first.__exit__, None, None, None)
        killed = threading.Event()
        backed_off = threading.Event()  # the report met the dead coordinator

        def evaluate(weights, plan):
            if not killed.is_set():
                first.process.kill()
                first.process.wait()
                killed.set()
            return 0.5, 0.75, 10

        client = fedlearn.Client(first.address, lambda w, p: (w, 10, {}), evaluate,
                                 max_backoff=0.2)
        backoff = client._backoff

        def noted_backoff(error):
            if killed.is_set() and "ReportEval" in error.message:
                backed_off.set()
            backoff(error)

        client._backoff = noted_backoff
        result = {}
        thread = threading.Thread(target=lambda: result.update(s=client.run()))
        thread.start()
        self.assertTrue(killed.wait(60))
        self.assertTrue(backed_off.wait(60))
        with Coordinator(*flags, port=port) as second:
            thread.join(60)
            status = get_status(second.address)
        self.assertFalse(thread.is_alive())
        self.assertIn("s", result)  # run() returned rather than raised
        self.assertEqual(result["s"].joins, 2)
        self.assertEqual(result["s"].evaluations, 1)
        self.assertEqual(status.phase, 4)  # DONE
        self.assertEqual(status.final_evaluation.num_clients, 1)
        self.assertAlmostEqual(status.final_evaluation.test_accuracy, 0.75)

    def test_the_command_line_shows_status_and_downloads_the_model(self):
        with Coordinator("--model=mlp_2nn", "--min_clients=3") as c:
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(cli(["status", c.address]), 0)
            self.assertIn("phase WAITING_FOR_CLIENTS", out.getvalue())
            self.assertIn("model mlp_2nn (199,210 parameters)", out.getvalue())
            path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
            with redirect_stdout(io.StringIO()):
                self.assertEqual(cli(["model", c.http, path]), 0)
            with open(path, "rb") as f:
                header_len = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(header_len))
            self.assertEqual(os.path.getsize(path), 8 + header_len + 199210 * 4)
            self.assertIn("fc1.weight", header)
            # Made as open() makes a file (its temporary file's 0600 was kept before).
            umask = os.umask(0)
            os.umask(umask)
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o666 & ~umask)
        # A coordinator that is gone: exit 1 with the code.
        err = io.StringIO()
        sys_stderr, sys.stderr = sys.stderr, err
        try:
            self.assertEqual(cli(["status", c.address]), 1)
        finally:
            sys.stderr = sys_stderr
        self.assertIn("UNAVAILABLE", err.getvalue())

    def test_a_failed_model_download_leaves_the_file_as_it_was(self):
        def run_cli(*args):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), redirect_stdout(io.StringIO()):
                code = cli(["model", *args])
            return code, err.getvalue()

        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "model.safetensors")
        with open(path, "wb") as f:
            f.write(b"the model of yesterday")

        # A server that promises 1,000 bytes, sends 10 and hangs up.
        class Short(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b"0123456789")

            def log_message(self, *args):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Short)
        threading.Thread(target=server.handle_request, daemon=True).start()
        code, err = run_cli(f"127.0.0.1:{server.server_port}", path)
        server.server_close()
        self.assertEqual(code, 1)
        self.assertIn("got 10 of 1,000 bytes", err)
        self.assertNotIn("Traceback", err)

        # Nothing listens: the connection is refused.
        code, err = run_cli(f"127.0.0.1:{free_port()}", path)
        self.assertEqual(code, 1)
        self.assertIn("/api/model.safetensors", err)

        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"the model of yesterday")
        self.assertEqual(os.listdir(directory), ["model.safetensors"])  # no .part left

        # A directory that does not exist is named, not a traceback.
        missing = os.path.join(directory, "no", "such", "model.safetensors")
        code, err = run_cli(f"127.0.0.1:{free_port()}", missing)
        self.assertEqual(code, 1)
        self.assertIn(missing, err)
        self.assertNotIn("Traceback", err)

    def test_watch_redraws_until_the_run_is_done(self):
        with Coordinator("--model=mlp_2nn", "--min_clients=1", "--max_rounds=2",
                         "--convergence_threshold=-inf") as c:
            watch = subprocess.Popen(
                [sys.executable, "-m", "fedlearn", "watch", c.address, "--every", "0.1"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.addCleanup(watch.kill)
            seen = ""
            deadline = time.monotonic() + 30
            while "phase WAITING_FOR_CLIENTS" not in seen:  # drawn before any client
                line = watch.stdout.readline()  # a draw every 0.1 s while it runs
                if not line:  # it exited
                    self.fail(watch.stderr.read())
                self.assertLess(time.monotonic(), deadline, seen[-2000:])
                seen += line
            fedlearn.Client(c.address, lambda w, p: (w, 10, {}),
                            lambda w, p: (0.5, 0.5, 10)).run()
            rest, err = watch.communicate(timeout=30)
        self.assertEqual(watch.returncode, 0, err)
        draws = (seen + rest).split("\x1b[H\x1b[2J")[1:]
        self.assertGreaterEqual(len(draws), 2)
        self.assertIn("phase WAITING_FOR_CLIENTS", draws[0])
        self.assertIn("phase DONE", draws[-1])  # and then it stopped by itself
        self.assertNotIn("phase DONE", "".join(draws[:-1]))


if __name__ == "__main__":
    unittest.main()
