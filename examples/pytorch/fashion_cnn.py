#!/usr/bin/python3
"""Federating a PyTorch model that is not in fedlearn's registry: a small CNN with batch
norm on Fashion-MNIST, over 4 Python clients on a Dirichlet split.

    # 1. the model's initial weights, for the coordinator
    python3 examples/pytorch/fashion_cnn.py export cnn.safetensors
    # 2. the coordinator, serving that model with a plan of SGD at 0.05, batches of 32,
    #    every round waiting for all four clients (--tolerance=0)
    fedlearn-coordinator --model=cnn.safetensors --min_clients=4 --max_rounds=5 \
        --optimizer=sgd --learning_rate=0.05 --batch_size=32 --tolerance=0
    # 3. the clients (4 here, in one process)
    python3 examples/pytorch/fashion_cnn.py train --coordinator=127.0.0.1:50051

Each client trains on its share of 8,000 training images (Dirichlet(0.5) over the
labels, seeded), evaluates on its share of 2,000 test images, with SGD (momentum 0.9)
at the plan's learning rate, in batches of --batch_size (32, as the plan above). Data: data/fashion-mnist from
scripts/fetch-data.sh (IDX files, gzipped or not).

Why --tolerance=0: with the default 0.3 a round of four closes at three updates, and the
client with the largest share, the last to finish every round, would never be counted
(each client prints how many of its updates were accepted and how many rejected).
"""

import argparse
import gzip
import os
import sys
import threading

import numpy as np
import torch
from torch import nn

import fedlearn
import fedlearn.torch as ft


class FashionCnn(nn.Module):
    """conv 3x3 16, BN, ReLU, max pool; conv 3x3 32, BN, ReLU, max pool; dense 64; 10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array."""
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rb") as f:
                data = f.read()
            dims = data[3]
            shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                          for i in range(dims))
            return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise FileNotFoundError(f"{path}[.gz]: run scripts/fetch-data.sh")


def load(data_dir, split, count, seed):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    pick = np.random.default_rng(seed).permutation(len(labels))[:count]
    x = (images[pick].astype(np.float32) / 255 - 0.2860) / 0.3530  # fashion-mnist
    return torch.from_numpy(x[:, None]), torch.from_numpy(labels[pick].astype(np.int64))


def dirichlet_split(labels, clients, alpha, seed):
    """Index lists, one per client: each class shared out by Dirichlet(alpha)."""
    rng = np.random.default_rng(seed)
    parts = [[] for _ in range(clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * clients)) * len(idx)).astype(int)[:-1]
        for part, share in zip(parts, np.split(idx, cuts)):
            part.extend(share.tolist())
    return [np.array(sorted(p), dtype=np.int64) for p in parts]


def loader(x, y, batch, shuffle_seed=None):
    """Batches of (x, y); reshuffled on every pass when shuffle_seed is given."""
    class Batches:
        def __init__(self):
            self.rng = np.random.default_rng(shuffle_seed)

        def __len__(self):
            return (len(y) + batch - 1) // batch

        def __iter__(self):
            order = (self.rng.permutation(len(y)) if shuffle_seed is not None
                     else np.arange(len(y)))
            for i in range(0, len(y), batch):
                sel = torch.from_numpy(order[i:i + batch])
                yield x[sel], y[sel]
    return Batches()


def train(args):
    torch.set_num_threads(1)
    x, y = load(args.data_dir, "train", args.train_examples, seed=1)
    tx, ty = load(args.data_dir, "test", args.test_examples, seed=2)
    train_parts = dirichlet_split(y.numpy(), args.clients, args.alpha, seed=3)
    test_parts = np.array_split(np.arange(len(ty)), args.clients)
    errors = []
    reports = [""] * args.clients  # printed in order once all are done

    def client(i):
        try:
            model = FashionCnn()
            tr, te = train_parts[i], test_parts[i]
            c = ft.TorchClient(
                args.coordinator, model, display_name=f"torch-{i}",
                num_train_examples=len(tr), num_test_examples=len(te),
                train_loader=loader(x[tr], y[tr], args.batch_size, shuffle_seed=10 + i),
                test_loader=loader(tx[te], ty[te], 256),
                optimizer=lambda params, plan: torch.optim.SGD(
                    params, lr=plan.learning_rate, momentum=0.9))
            s = c.run()
            reports[i] = (f"client {i}: {len(tr)} examples, {s.rounds_trained} updates "
                          f"accepted, {s.updates_rejected} rejected, fit "
                          f"{s.fit_seconds:.1f} s, protocol {s.protocol_seconds:.2f} s")
        except Exception as e:  # reported by the main thread
            errors.append(f"client {i}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("\n".join(r for r in reports if r), file=sys.stderr)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write the initial model for --model=PATH")
    e.add_argument("out")
    e.add_argument("--seed", type=int, default=1)
    t = sub.add_parser("train", help="run the clients until the coordinator is DONE")
    t.add_argument("--coordinator", default="127.0.0.1:50051")
    t.add_argument("--data_dir",
                   default=os.path.join(here, "..", "..", "data", "fashion-mnist"))
    t.add_argument("--clients", type=int, default=4)
    t.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    t.add_argument("--train_examples", type=int, default=8000)
    t.add_argument("--test_examples", type=int, default=2000)
    t.add_argument("--batch_size", type=int, default=32)
    args = p.parse_args()
    if args.command == "export":
        torch.manual_seed(args.seed)
        ft.export_safetensors(FashionCnn(), args.out, name="fashion_cnn")
        print(args.out)
        return 0
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
