#!/usr/bin/env python3
"""A fedlearn client in Python on the SDK: Join, one TRAIN task, push, check the next model.

Uses the Python SDK (python/, `pip install --no-build-isolation ./python` into an
environment that sees Debian's python3-grpcio): the protocol (chunks, CRC-32C, the
push's go-ahead, int8) is the SDK's, so this file only says what to do with the
weights.

    python3 examples/python/client.py --coordinator=127.0.0.1:50051 [--int8]

It does no real training: the update is a small step of plain weight decay computed
with numpy (delta = -step * w; --step=0 pushes a zero delta). When its round closed with
its update alone and it gets the next round, it checks that round's model is the old one
plus the update as the coordinator decodes it, to the bit. On success it prints one JSON
object (the round it trained, the update's size, whether the model was checked, the
coordinator's phase and round history) and exits 0; on failure it prints a message to
stderr and exits non-zero.
"""

import argparse
import json
import sys
import time

import numpy as np
from google.protobuf import json_format

import fedlearn
from fedlearn.__main__ import get_status
from fedlearn.v1 import coordinator_pb2
from fedlearn.wire import MAX_CHUNK_BYTES, encode


def run(args):
    state = {}

    def fit(weights, plan):
        if "round" in state:
            # The next round: its model must be the last one plus the decoded update
            # (FedAvg of one, summed in double, rounded once).
            if plan.round == state["round"] + 1:
                for w, before, decoded in zip(weights, state["weights"], state["decoded"]):
                    want = (before.ravel().astype(np.float64) +
                            decoded.astype(np.float64)).astype(np.float32)
                    if not np.array_equal(w.ravel(), want):
                        bad = int(np.argmax(w.ravel() != want))
                        raise fedlearn.FedlearnError(
                            f"round {plan.round}'s model [{bad}] is {w.ravel()[bad]!r}, "
                            f"want {want[bad]!r}")
                state["model_verified"] = True
            client.stop()
            return [np.zeros_like(w) for w in weights], args.num_examples, {"loss": 1.0}
        delta = [(-args.step * w).astype("<f4") for w in weights]
        # What the coordinator will decode, and the bytes the update takes on the
        # wire: one encoding per tensor (the SDK encodes the same way when it pushes).
        encoded = [encode(d, args.int8) for d in delta]
        state.update(round=plan.round, weights=weights,
                     decoded=[values for _, values in encoded],
                     update_bytes=sum(len(payload) for payload, _ in encoded))
        return delta, args.num_examples, {"loss": 1.0, "accuracy": 0.0}

    client = fedlearn.Client(args.coordinator, fit, returns="delta",
                             update_encoding="int8" if args.int8 else "dense",
                             join_token=args.join_token, display_name=args.display_name,
                             num_train_examples=args.num_examples,
                             chunk_bytes=args.chunk_bytes,
                             reconnect_timeout=args.timeout, poll_wait=5)
    deadline = time.monotonic() + args.timeout
    try:
        client.run()
    except fedlearn.FedlearnError as e:
        if e.code is None or e.code.name != "CANCELLED":  # CANCELLED: stop() above
            raise
    if "round" not in state:
        raise fedlearn.FedlearnError("the run ended before this client got a TRAIN task")
    status = get_status(args.coordinator)
    while (not any(r.round == state["round"] and not r.evaluation for r in status.history)
           and time.monotonic() < deadline):
        time.sleep(0.2)
        status = get_status(args.coordinator)
    print(json.dumps({
        "client_id": client.joined.client_id,
        "run_id": status.run_id,
        "trained_round": state["round"],
        "encoding": "int8" if args.int8 else "dense",
        "update_bytes": state["update_bytes"],
        "model_verified": state.get("model_verified"),
        "phase": coordinator_pb2.Phase.Name(status.phase),
        "round": status.round,
        "history": [json_format.MessageToDict(r, preserving_proto_field_name=True,
                                              including_default_value_fields=True)
                    for r in status.history],
    }, indent=2))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", default="127.0.0.1:50051", help="HOST:PORT")
    p.add_argument("--join_token", default="")
    p.add_argument("--display_name", default="python-example")
    p.add_argument("--num_examples", type=int, default=100,
                   help="num_examples in the update header (its FedAvg weight)")
    p.add_argument("--step", type=float, default=0.01,
                   help="delta = -step * weights (0: a zero delta)")
    p.add_argument("--chunk_bytes", type=int, default=MAX_CHUNK_BYTES)
    p.add_argument("--int8", action="store_true",
                   help="send the update int8-quantized (ENCODING_QUANTIZED)")
    p.add_argument("--timeout", type=float, default=45, help="seconds for the whole flow")
    args = p.parse_args()
    try:
        run(args)
    except fedlearn.FedlearnError as e:
        print(f"client.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
