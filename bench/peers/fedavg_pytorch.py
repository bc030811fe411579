#!/usr/bin/python3
"""FedAvg simulated in PyTorch: the reference bench/convergence.cc is measured against.

Run with Debian's /usr/bin/python3 (python3-torch). An independent simulation, in one
process, of what fedlearn's coordinator and agents do in bench/convergence.cc:
  - the same partition of the training split (--partitions, written by convergence
    --partitions_out) and the same initial global weights (--initial, a safetensors file
    written by convergence --initial_out; without it PyTorch's own Glorot-uniform draw);
  - the registry model named by --model: mnist_cnn (the seed CNN, MnistCnn from
    bench/peers/train_pytorch.py), fedavg_cnn (the FedAvg paper's CNN) or mlp_2nn, with
    the registry's tensor names, shapes and order (common/model_spec.cc);
  - --clients_per_round clients per round (default: all). With --replay (the JSON lines
    convergence printed) round n trains the clients fedlearn's coordinator sampled for its
    round n ("selected"); rounds beyond the replayed ones, or without --replay, sample
    their own clients uniformly without replacement (numpy, seeded with --seed), and
    each round line says which ("sampling": "replay" or "own");
  - each selected client trains its partition for E=--epochs epochs in batches of B=10
    in a shuffled order (its own seeded generator), starting from the global weights,
    with Adadelta(lr=--learning_rate, default 1.0, rho=0.95, eps=1e-7) whose state the client keeps across
    rounds (also across rounds it is not selected in), or with plain SGD (--optimizer=sgd:
    w -= lr g, no state);
  - the round's update Delta is the mean of the selected clients' weights weighted by
    their train size, minus the global weights; --strategy's server optimizer applies it
    (ServerOptimizer below, written from Reddi et al. 2021, Algorithm 2, in float64;
    fedavg: the new global model is that mean), and --proximal_mu adds FedProx's
    (mu / 2) ||w - w_global||^2 to every client's loss (Li et al. 2020);
    --reset_optimizer gives every client a fresh Adadelta each round;
  - after every round the global model is evaluated on the whole test split.
Clients train one after another on --threads threads (torch and OpenBLAS), on one shared
model: a client owns only its optimizer state and generator, so 100 clients cost 100
optimizer states, not 100 models.

One JSON line per round:
  {"side":"pytorch","round":1,"test_accuracy":...,"test_loss":...,"train_loss":...,
   "round_seconds":...,"seconds_since_start":...,"sampling":"replay","selected":[...]}
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
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_pytorch import (MnistCnn, evaluate, input_norm, load_images, make_optimizer,  # noqa: E402
                           set_threads, to_tensors)

# fedlearn-coordinator's --input_norm presets (server/options.cc).
INPUT_NORM_PRESETS = {"mnist": "0.1307,0.3081", "fashion-mnist": "0.2860,0.3530"}


class FedAvgCnn(nn.Module):
    """fedavg_cnn as common/nn/network.cc builds it (McMahan et al. 2017's MNIST CNN):
    Conv 5x5 32 'same' ReLU MaxPool 2, Conv 5x5 64 'same' ReLU MaxPool 2, Flatten in (c, y,
    x) order as common/nn's Flatten, Dense 512 ReLU, Dense 10. No dropout."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class Mlp2nn(nn.Module):
    """mlp_2nn: 784-200-200-10 with ReLUs (the FedAvg paper's 2NN)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 200)
        self.fc2 = nn.Linear(200, 200)
        self.fc3 = nn.Linear(200, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# Attribute names and definition order are the registry's tensor names and wire order.
MODELS = {"mnist_cnn": MnistCnn, "fedavg_cnn": FedAvgCnn, "mlp_2nn": Mlp2nn}


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


def initial_state(model, path):
    """The global weights to start from: the safetensors file at `path` (names and shapes
    must be the model's), or else Glorot uniform (xavier_uniform_'s conv fans are
    in*k*k and out*k*k, as Keras') and zero biases from torch's generator."""
    state = model.state_dict()
    if path:
        tensors = read_safetensors(path)
        if sorted(tensors) != sorted(state):
            sys.exit(f"{path}: tensors {sorted(tensors)}, expected {sorted(state)}")
        for name, value in state.items():
            if tuple(tensors[name].shape) != tuple(value.shape):
                sys.exit(f"{path}: {name} has shape {tensors[name].shape}, "
                         f"expected {tuple(value.shape)}")
            value.copy_(torch.from_numpy(tensors[name].copy()))
    else:
        for name, value in state.items():
            if name.endswith(".weight"):
                nn.init.xavier_uniform_(value)
            else:
                nn.init.zeros_(value)
    return {k: v.detach().clone() for k, v in state.items()}


class Client:
    """One simulated client: its data, optimizer (state kept across rounds) and shuffling
    generator. Clients share one model; its parameter tensors are updated in place
    (load_state_dict copies into them), so each client's Adadelta keeps its state keyed
    on the same tensors."""

    def __init__(self, model, x, y, seed, lr, proximal_mu=0.0, reset_optimizer=False,
                 optimizer="adadelta"):
        self.model = model
        self.x, self.y = x, y
        self.lr = lr
        self.optimizer_name = optimizer
        self.optimizer = make_optimizer(model, lr, optimizer)
        self.generator = torch.Generator().manual_seed(seed)
        self.proximal_mu = proximal_mu
        self.reset_optimizer = reset_optimizer

    def fit(self, global_state, batch_size, epochs):
        """`epochs` epochs from the global weights; returns (weights, mean train loss over
        all epochs, as CnnTrainer reports it). The weights are the shared model's: use them
        before the next client trains."""
        self.model.load_state_dict(global_state)
        self.model.train()
        if self.reset_optimizer:
            self.optimizer = make_optimizer(self.model, self.lr, self.optimizer_name)
        anchor = [p.detach().clone() for p in self.model.parameters()]
        loss_sum = 0.0
        for _ in range(epochs):
            order = torch.randperm(len(self.y), generator=self.generator)
            for first in range(0, len(order), batch_size):
                index = order[first:first + batch_size]
                x, y = self.x[index], self.y[index]
                self.optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(self.model(x), y)
                objective = loss
                if self.proximal_mu > 0:
                    objective = loss + self.proximal_mu / 2 * sum(
                        ((p - a) ** 2).sum() for p, a in zip(self.model.parameters(), anchor))
                objective.backward()
                self.optimizer.step()
                loss_sum += loss.item() * len(y)
        return self.model.state_dict(), loss_sum / (len(self.y) * epochs)


class ServerOptimizer:
    """The server update of Reddi et al. 2021 ("Adaptive Federated Optimization",
    Algorithm 2) and FedAvgM (Hsu et al. 2019), on the round's update Delta (the paper's
    pseudo-gradient is -Delta), in float64:
      fedavg, fedprox  x = x + lr Delta
      fedavgm          v = momentum v + Delta;  x = x + lr v
      fedadagrad       m = b1 m + (1 - b1) Delta;  v = v + Delta^2
      fedadam          m as above;  v = b2 v + (1 - b2) Delta^2
      fedyogi          m as above;  v = v - (1 - b2) Delta^2 sign(v - Delta^2)
      adaptive ones    x = x + lr_t m / (sqrt(v) + tau), m_{-1} = 0, v_{-1} = tau^2,
                       lr_t = lr, or lr sqrt(1 - b2^t) / (1 - b1^t) with bias_correction.
    """

    ADAPTIVE = ("fedadagrad", "fedadam", "fedyogi")

    def __init__(self, name, lr, momentum=0.9, beta_1=0.9, beta_2=0.99, tau=1e-3,
                 bias_correction=False):
        self.name, self.lr, self.momentum = name, lr, momentum
        self.b1, self.b2, self.tau, self.bias_correction = beta_1, beta_2, tau, bias_correction
        self.t = 0
        self.m, self.v = {}, {}

    def step(self, x, delta):
        """The next global state from `x` and `delta` (dicts of tensors)."""
        self.t += 1
        out = {}
        for k, d in delta.items():
            d = d.double()
            xk = x[k].double()
            if self.name in ("fedavg", "fedprox"):
                out[k] = xk + self.lr * d
            elif self.name == "fedavgm":
                self.v[k] = self.momentum * self.v.get(k, torch.zeros_like(d)) + d
                out[k] = xk + self.lr * self.v[k]
            else:
                m = self.m.get(k, torch.zeros_like(d))
                v = self.v.get(k, torch.full_like(d, self.tau ** 2))
                m = self.b1 * m + (1 - self.b1) * d
                d2 = d * d
                if self.name == "fedadagrad":
                    v = v + d2
                elif self.name == "fedadam":
                    v = self.b2 * v + (1 - self.b2) * d2
                else:  # fedyogi
                    v = v - (1 - self.b2) * d2 * torch.sign(v - d2)
                self.m[k], self.v[k] = m, v
                lr = self.lr
                if self.bias_correction:
                    lr *= (1 - self.b2 ** self.t) ** 0.5 / (1 - self.b1 ** self.t)
                out[k] = xk + lr * m / (v.sqrt() + self.tau)
            out[k] = out[k].to(x[k].dtype)
        return out


def weighted_delta(global_state, results, sizes):
    """FedAvg's aggregate, in float64: sum_i n_i / n (w_i - w), over (weights_i, n_i)."""
    total = sum(sizes)
    acc = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
    for weights, n in zip(results, sizes):
        for k in acc:
            acc[k].add_(weights[k].double() - global_state[k].double(), alpha=n / total)
    return acc


def self_test():
    """The server optimizers against steps worked out by hand: tau 1 (v starts at 1),
    b1 = b2 = 0.5, lr 1, Delta = [1, 3] from x = 0: m = [0.5, 1.5];
    fedadagrad v = [2, 10], fedadam v = [1, 5], fedyogi v = [1, 5.5]; x = m / (sqrt(v) + 1).
    fedavgm (momentum 0.5): Delta [1, 2] then [1, -2] gives x [1, 2] then [2.5, 1].
    The clients' SGD: w = [1, 2], input [1, 1], loss (w . x)^2 / 2 has gradient 3 x, so one
    step at lr 0.1 gives [0.7, 1.7]."""
    linear = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0]]))
    sgd = make_optimizer(linear, 0.1, "sgd")
    (linear(torch.ones(1, 2)) ** 2 / 2).sum().backward()
    sgd.step()
    got = linear.weight.detach()[0].tolist()
    assert all(abs(g - w) < 1e-6 for g, w in zip(got, [0.7, 1.7])), got
    x = {"w": torch.zeros(2)}
    delta = {"w": torch.tensor([1.0, 3.0])}
    for name, v in (("fedadagrad", (2, 10)), ("fedadam", (1, 5)), ("fedyogi", (1, 5.5))):
        got = ServerOptimizer(name, 1.0, beta_1=0.5, beta_2=0.5, tau=1.0).step(x, delta)["w"]
        want = [0.5 / (v[0] ** 0.5 + 1), 1.5 / (v[1] ** 0.5 + 1)]
        assert all(abs(float(g) - w) < 1e-6 for g, w in zip(got, want)), (name, got, want)
    m = ServerOptimizer("fedavgm", 1.0, momentum=0.5)
    x1 = m.step(x, {"w": torch.tensor([1.0, 2.0])})
    x2 = m.step(x1, {"w": torch.tensor([1.0, -2.0])})
    assert x1["w"].tolist() == [1.0, 2.0] and x2["w"].tolist() == [2.5, 1.0], (x1, x2)
    # Bias correction as Adam's (Kingma & Ba): at t = 1 with b1 = b2 = 0.5 the step is
    # scaled by sqrt(1 - 0.5) / (1 - 0.5) = sqrt(2): fedadam's x above, times sqrt(2).
    got = ServerOptimizer("fedadam", 1.0, beta_1=0.5, beta_2=0.5, tau=1.0,
                          bias_correction=True).step(x, delta)["w"]
    want = [2 ** 0.5 * 0.5 / (1 + 1), 2 ** 0.5 * 1.5 / (5 ** 0.5 + 1)]
    assert all(abs(float(g) - w) < 1e-6 for g, w in zip(got, want)), (got, want)
    # The clients' Adadelta (rho 0.95, eps 1e-7, lr 1), one step on the gradient
    # [3, 3] above: E[g^2] = 0.05 * 9 = 0.45, step = sqrt(0 + eps) / sqrt(0.45 + eps) * 3.
    linear = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0]]))
    adadelta = make_optimizer(linear, 1.0, "adadelta")
    (linear(torch.ones(1, 2)) ** 2 / 2).sum().backward()
    adadelta.step()
    step = (1e-7 / (0.45 + 1e-7)) ** 0.5 * 3
    got = linear.weight.detach()[0].tolist()
    assert all(abs(g - w) < 1e-6 for g, w in zip(got, [1 - step, 2 - step])), (got, step)
    # FedAvg's mean weighs each client's change by its examples: n = 1 and 3,
    # w - w0 = 4 and 8 gives (1 * 4 + 3 * 8) / 4 = 7.
    w0 = {"w": torch.tensor([1.0])}
    mean = weighted_delta(w0, [{"w": torch.tensor([5.0])}, {"w": torch.tensor([9.0])}],
                          [1, 3])
    assert mean["w"].tolist() == [7.0], mean
    print(json.dumps({"side": "pytorch", "event": "self_test", "ok": True}), flush=True)


def replayed_selections(path):
    """round -> agent indices fedlearn's coordinator sampled, from convergence's output."""
    selections = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row.get("side") == "fedlearn" and "selected" in row:
                if any(i < 0 for i in row["selected"]):
                    sys.exit(f"{path}: round {row['round']} has an unknown client")
                selections[row["round"]] = row["selected"]
    return selections


def parse_knobs(text):
    """ "a: 1 b: true" (a StrategyConfig's one-line text format) -> {"a": 1.0, "b": 1.0}."""
    words = text.replace(":", " ").split()
    if len(words) % 2:
        sys.exit(f"--strategy_config: cannot read {text!r}")
    return {k: float({"true": 1, "false": 0}.get(v, v)) for k, v in zip(words[::2], words[1::2])}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default="data/mnist")
    parser.add_argument("--model", default="mnist_cnn", choices=sorted(MODELS))
    parser.add_argument("--partitions", required=True,
                        help='JSON {"partitions": [[train indices], ...]}')
    parser.add_argument("--initial", help="initial global weights (safetensors)")
    parser.add_argument("--rounds", type=int, default=40, help="most rounds to run")
    parser.add_argument("--target", type=float, default=0.97,
                        help="stop once the test accuracy reaches this")
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=1, help="local epochs per round (E)")
    parser.add_argument("--learning_rate", type=float, default=1.0,
                        help="the clients' learning rate")
    parser.add_argument("--optimizer", default="adadelta", choices=["adadelta", "sgd"],
                        help="the clients' optimizer")
    parser.add_argument("--clients_per_round", type=int, default=0,
                        help="clients trained per round; 0: all")
    parser.add_argument("--replay",
                        help="convergence's JSON lines: train the clients its coordinator "
                             "sampled in each round it ran")
    parser.add_argument("--input_norm", default="none",
                        help="as fedlearn-coordinator's: none (p/255), mnist, fashion-mnist "
                             "or MEAN,STD")
    parser.add_argument("--strategy", default="fedavg",
                        choices=["fedavg", "fedprox", "fedavgm"] + list(ServerOptimizer.ADAPTIVE))
    parser.add_argument("--strategy_config", default="",
                        help='the knobs every one resolved, as fedlearn prints them in '
                             'GetStatus and convergence\'s start line: "server_learning_rate: '
                             '0.01 beta_1: 0.9 ..."')
    parser.add_argument("--reset_optimizer", action="store_true",
                        help="every client starts each round with a fresh Adadelta")
    parser.add_argument("--self_test", action="store_true",
                        help="check the server optimizers against hand-worked steps, then exit")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1,
                        help="client i shuffles and drops out from seed * 1000 + i; own "
                             "sampling draws from numpy's default_rng(seed)")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return

    set_threads(args.threads)
    torch.manual_seed(args.seed)
    train_images, train_labels = load_images(args.data_dir, train=True)
    mean, std = input_norm(INPUT_NORM_PRESETS.get(args.input_norm, args.input_norm),
                           train_images)
    train_x, train_y = to_tensors(train_images, train_labels, mean, std)
    test_x, test_y = to_tensors(*load_images(args.data_dir, train=False), mean, std)
    with open(args.partitions) as f:
        partitions = json.load(f)["partitions"]
    model = MODELS[args.model]()
    knobs = parse_knobs(args.strategy_config)
    if knobs.get("clip_norm", 0) > 0:
        sys.exit("--strategy_config: clip_norm is not simulated here")
    server = ServerOptimizer(args.strategy, knobs.get("server_learning_rate", 1.0),
                             momentum=knobs.get("server_momentum", 0.9),
                             beta_1=knobs.get("beta_1", 0.9), beta_2=knobs.get("beta_2", 0.99),
                             tau=knobs.get("tau", 1e-3),
                             bias_correction=bool(knobs.get("bias_correction", False)))
    mu = knobs.get("proximal_mu", 0.0)
    clients = [Client(model, train_x[p], train_y[p], args.seed * 1000 + i, args.learning_rate,
                      proximal_mu=mu, reset_optimizer=args.reset_optimizer,
                      optimizer=args.optimizer)
               for i, p in enumerate(partitions)]
    sizes = [len(p) for p in partitions]
    per_round = args.clients_per_round or len(clients)
    if per_round > len(clients):
        sys.exit(f"--clients_per_round={per_round} exceeds the {len(clients)} partitions")
    replay = replayed_selections(args.replay) if args.replay else {}
    sampler = np.random.default_rng(args.seed)
    global_state = initial_state(model, args.initial)

    def judge():
        model.load_state_dict(global_state)
        return evaluate(model, test_x, test_y)

    print(json.dumps({"side": "pytorch", "event": "start", "model": args.model,
                      "clients": len(clients), "clients_per_round": per_round,
                      "epochs": args.epochs, "batch_size": args.batch_size,
                      "optimizer": args.optimizer, "learning_rate": args.learning_rate,
                      "replayed_rounds": len(replay), "client_sizes": sizes, "test_examples": len(test_y),
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
        if rnd in replay:
            sampling, selected = "replay", replay[rnd]
            if len(selected) != per_round:
                sys.exit(f"{args.replay}: round {rnd} selected {len(selected)} clients, "
                         f"expected {per_round}")
        elif per_round == len(clients):
            sampling, selected = "all", list(range(len(clients)))
        else:
            sampling = "own"
            selected = sorted(sampler.choice(len(clients), per_round, replace=False).tolist())
        total = sum(sizes[i] for i in selected)
        acc = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        train_loss = 0.0
        for i in selected:
            weights, loss = clients[i].fit(global_state, args.batch_size, args.epochs)
            # The shared model's tensors: folded before the next client trains.
            part = weighted_delta(global_state, [weights], [1])
            for k in acc:
                acc[k].add_(part[k], alpha=sizes[i] / total)
            train_loss += loss * sizes[i] / total
        global_state = server.step(global_state, acc)
        round_seconds = time.perf_counter() - start
        elapsed += round_seconds
        test_loss, test_acc = judge()
        print(json.dumps({"side": "pytorch", "round": rnd,
                          "test_accuracy": round(test_acc, 4),
                          "test_loss": round(test_loss, 4),
                          "train_loss": round(train_loss, 4),
                          "round_seconds": round(round_seconds, 2),
                          "seconds_since_start": round(elapsed, 2),
                          "sampling": sampling, "selected": selected}), flush=True)
        if test_acc >= args.target:
            reason = "target"
            break
    print(json.dumps({"side": "pytorch", "event": "stopped", "reason": reason,
                      "round": rnd}), flush=True)


if __name__ == "__main__":
    main()
