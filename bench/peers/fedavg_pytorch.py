#!/usr/bin/python3
"""FedAvg simulated in PyTorch: the reference bench/convergence.cc is measured against.

Run with Debian's /usr/bin/python3 (python3-torch). An independent simulation, in one
process, of what fedlearn's coordinator and agents do in bench/convergence.cc:
  - the same partition of the training split (--partitions, written by convergence
    --partitions_out) and the same initial global weights (--initial, a safetensors file
    written by convergence --initial_out; without it PyTorch's own Glorot-uniform draw);
  - the seed CNN (MnistCnn, imported from bench/peers/train_pytorch.py);
  - every client in every round; each trains its partition for E=1 epoch in batches of
    B=10 in a shuffled order (its own seeded generator), starting from the global weights,
    with Adadelta(lr=1.0, rho=0.95, eps=1e-7) whose state the client keeps across rounds;
  - the new global model is the mean of the clients' weights weighted by their train size;
  - after every round the global model is evaluated on the whole test split.
Clients train one after another on --threads threads (torch and OpenBLAS).

One JSON line per round:
  {"side":"pytorch","round":1,"test_accuracy":...,"test_loss":...,"train_loss":...,
   "round_seconds":...,"seconds_since_start":...}
seconds_since_start counts training and aggregation only, not the evaluations (fedlearn's
evaluations run beside its training and are not counted either).
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_pytorch import (REGISTRY_TENSORS, MnistCnn, evaluate, load_split,  # noqa: E402
                           make_model, make_optimizer, set_threads)


def read_safetensors(path):
    """name -> float32 array of a safetensors file (8-byte little-endian header length,
    JSON header, data; offsets count from the start of the data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
    return tensors


def initial_state(path):
    model = make_model()  # Glorot uniform from torch's generator
    if path:
        tensors = read_safetensors(path)
        names = [name for name, _ in REGISTRY_TENSORS]
        if sorted(tensors) != sorted(names):
            sys.exit(f"{path}: tensors {sorted(tensors)}, expected {sorted(names)}")
        state = model.state_dict()
        for name, shape in REGISTRY_TENSORS:
            if tuple(tensors[name].shape) != shape:
                sys.exit(f"{path}: {name} has shape {tensors[name].shape}, expected {shape}")
            state[name].copy_(torch.from_numpy(tensors[name].copy()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Client:
    """One simulated client: its data, model, optimizer (state kept across rounds) and
    shuffling generator."""

    def __init__(self, x, y, seed):
        self.x, self.y = x, y
        self.model = MnistCnn()
        self.optimizer = make_optimizer(self.model)
        self.generator = torch.Generator().manual_seed(seed)

    def fit(self, global_state, batch_size):
        """One epoch from the global weights; returns (weights, mean train loss)."""
        self.model.load_state_dict(global_state)
        self.model.train()
        loss_sum = 0.0
        order = torch.randperm(len(self.y), generator=self.generator)
        for first in range(0, len(order), batch_size):
            index = order[first:first + batch_size]
            x, y = self.x[index], self.y[index]
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            loss_sum += loss.item() * len(y)
        return self.model.state_dict(), loss_sum / len(self.y)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default="data/mnist")
    parser.add_argument("--partitions", required=True,
                        help='JSON {"partitions": [[train indices], ...]}')
    parser.add_argument("--initial", help="initial global weights (safetensors)")
    parser.add_argument("--rounds", type=int, default=40, help="most rounds to run")
    parser.add_argument("--target", type=float, default=0.97,
                        help="stop once the test accuracy reaches this")
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1,
                        help="client i shuffles and drops out from seed * 1000 + i")
    args = parser.parse_args()

    set_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y = load_split(args.data_dir, train=True)
    test_x, test_y = load_split(args.data_dir, train=False)
    with open(args.partitions) as f:
        partitions = json.load(f)["partitions"]
    clients = [Client(train_x[p], train_y[p], args.seed * 1000 + i)
               for i, p in enumerate(partitions)]
    sizes = [len(p) for p in partitions]
    total = sum(sizes)
    global_state = initial_state(args.initial)
    model = MnistCnn()

    def judge():
        model.load_state_dict(global_state)
        return evaluate(model, test_x, test_y)

    print(json.dumps({"side": "pytorch", "event": "start", "clients": len(clients),
                      "client_sizes": sizes, "test_examples": len(test_y),
                      "max_rounds": args.rounds, "target": args.target,
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "initial": args.initial or "xavier_uniform (torch generator)"}),
          flush=True)
    test_loss, test_acc = judge()
    print(json.dumps({"side": "pytorch", "round": 0, "test_accuracy": round(test_acc, 4),
                      "test_loss": round(test_loss, 4), "seconds_since_start": 0}),
          flush=True)
    elapsed = 0.0
    reason = "max_rounds"
    for rnd in range(1, args.rounds + 1):
        start = time.perf_counter()
        acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
        train_loss = 0.0
        for client, n in zip(clients, sizes):
            weights, loss = client.fit(global_state, args.batch_size)
            for k in acc:
                acc[k].add_(weights[k], alpha=n / total)
            train_loss += loss * n / total
        global_state = acc
        round_seconds = time.perf_counter() - start
        elapsed += round_seconds
        test_loss, test_acc = judge()
        print(json.dumps({"side": "pytorch", "round": rnd,
                          "test_accuracy": round(test_acc, 4),
                          "test_loss": round(test_loss, 4),
                          "train_loss": round(train_loss, 4),
                          "round_seconds": round(round_seconds, 2),
                          "seconds_since_start": round(elapsed, 2)}), flush=True)
        if test_acc >= args.target:
            reason = "target"
            break
    print(json.dumps({"side": "pytorch", "event": "stopped", "reason": reason,
                      "round": rnd}), flush=True)


if __name__ == "__main__":
    main()
