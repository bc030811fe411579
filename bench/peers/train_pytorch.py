#!/usr/bin/python3
"""The seed's MNIST CNN in PyTorch: the peer fedlearn's C++/Eigen CNN is measured against.

Run with Debian's /usr/bin/python3 (python3-torch 1.13). The model is the one common/nn
builds for "mnist_cnn" (and PyTorch's own examples/mnist): Conv2d(1,32,3) ReLU
Conv2d(32,64,3) ReLU MaxPool2d(2) Dropout(0.25) Flatten Linear(9216,128) ReLU Dropout(0.5)
Linear(128,10), softmax cross-entropy, Adadelta(lr=1.0, rho=0.95, eps=1e-7). The tensor
names, shapes and order of its state_dict are the registry's wire order
(common/model_spec.cc), so weights written by bench/central_train --init_out load as they
are.

Modes (one JSON object per output line):
  --mode=speed     samples/s of whole training steps (forward, loss, backward, Adadelta
                   step) and of inference (eval mode, no_grad), on random inputs, for
                   batch sizes 10 and 64 and 1 and 2 threads: the median of --windows
                   timed windows of at least --window_seconds each, after warm-up. First
                   prints which BLAS / conv backends torch uses.
  --mode=accuracy  central training on an IDX directory (--data_dir, files raw or .gz)
                   for --epochs epochs, test accuracy after each (epoch 0: before
                   training), and wall time.
"""

import argparse
import ctypes
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Registry order and shapes of mnist_cnn (common/model_spec.cc, MnistCnn()).
REGISTRY_TENSORS = [
    ("conv1.weight", (32, 1, 3, 3)), ("conv1.bias", (32,)),
    ("conv2.weight", (64, 32, 3, 3)), ("conv2.bias", (64,)),
    ("fc1.weight", (128, 9216)), ("fc1.bias", (128,)),
    ("fc2.weight", (10, 128)), ("fc2.bias", (10,)),
]


class MnistCnn(nn.Module):
    """mnist_cnn as common/nn/network.cc builds it; attribute names are the registry's."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(9216, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)  # (c, y, x) order, as common/nn's Flatten
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


def make_model(init_weights=None):
    """The model, initialised as the registry does (Glorot uniform with Keras' fans, zero
    biases) from torch's generator, or from a raw float32 file in wire order."""
    model = MnistCnn()
    state = model.state_dict()
    assert [(k, tuple(v.shape)) for k, v in state.items()] == REGISTRY_TENSORS, state.keys()
    if init_weights:
        flat = np.fromfile(init_weights, dtype="<f4")
        expected = sum(int(np.prod(s)) for _, s in REGISTRY_TENSORS)
        if flat.size != expected:
            sys.exit(f"{init_weights}: expected {expected} floats, got {flat.size}")
        offset = 0
        for name, shape in REGISTRY_TENSORS:
            n = int(np.prod(shape))
            state[name].copy_(torch.from_numpy(flat[offset:offset + n].reshape(shape)))
            offset += n
    else:
        # xavier_uniform_'s fans for conv weights are in*k*k and out*k*k, as Keras'.
        for module in (model.conv1, model.conv2, model.fc1, model.fc2):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def make_optimizer(model, lr=1.0, name="adadelta"):
    """Adadelta(rho 0.95, eps 1e-7), or plain SGD (w -= lr g: no momentum, no decay)."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr)
    if name != "adadelta":
        raise ValueError(f"optimizer {name!r}: adadelta or sgd")
    return torch.optim.Adadelta(model.parameters(), lr=lr, rho=0.95, eps=1e-7)


# --- threads and BLAS --------------------------------------------------------------------

def loaded_libraries(pattern_words=("blas", "lapack", "dnnl", "gomp", "omp")):
    """Shared objects mapped into this process whose names contain one of the words."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                base = os.path.basename(fields[5]).lower()
                if any(w in base for w in pattern_words):
                    paths.add(fields[5])
    return sorted(paths)


def openblas():
    """ctypes handle on the libopenblas this process loaded (None if none)."""
    for path in loaded_libraries(("openblas",)):
        if "libopenblas" in os.path.basename(path):
            return ctypes.CDLL(path)
    return None


def set_threads(threads):
    """Intra-op threads for torch (OpenMP) and for OpenBLAS. torch.set_num_threads does not
    reach a pthread-build OpenBLAS, which would then use every core; fedlearn's
    SetComputeThreads sets both the same way."""
    torch.set_num_threads(threads)
    lib = openblas()
    if lib is not None and hasattr(lib, "openblas_set_num_threads"):
        lib.openblas_set_num_threads(ctypes.c_int(threads))


def backend_report():
    """Which BLAS, OpenMP and conv implementation this torch uses."""
    config = torch.__config__.show().splitlines()
    keep = ("MKL", "OpenMP", "LAPACK", "CPU capability")
    excerpt = [line.strip() for line in config
               if any(k in line for k in keep) and "Build settings" not in line]
    for line in config:
        if "BLAS_INFO" in line:
            excerpt += [s.strip() for s in line.split(",") if "BLAS_INFO" in s or "LAPACK_INFO" in s]
    report = {"kind": "backends", "torch": torch.__version__,
              "config": excerpt,
              "mkldnn_available": torch.backends.mkldnn.is_available(),
              "loaded": [f"{p} -> {os.path.realpath(p)}" for p in loaded_libraries()],
              "env": {k: os.environ.get(k) for k in
                      ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                       "OMP_NUM_THREADS", "LD_LIBRARY_PATH")}}
    lib = openblas()
    if lib is not None:
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        report["openblas_config"] = lib.openblas_get_config().decode()
        report["openblas_core"] = lib.openblas_get_corename().decode()
        if hasattr(lib, "openblas_get_parallel"):
            report["openblas_parallel"] = {0: "sequential", 1: "pthreads", 2: "openmp"}.get(
                lib.openblas_get_parallel(), "unknown")
    # The aten ops one training step runs for its convolutions and matrix products.
    model = make_model()
    optimizer = make_optimizer(model)
    x, y = torch.rand(10, 1, 28, 28), torch.randint(0, 10, (10,))
    with torch.autograd.profiler.profile() as prof:
        train_step(model, optimizer, x, y)
    report["step_ops"] = sorted({e.name for e in prof.function_events
                                 if any(w in e.name for w in ("conv", "mm", "linear"))})
    return report


# --- speed -------------------------------------------------------------------------------

def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def inference_step(model, x, y):
    # As fedlearn's Evaluate: logits, the loss and the number correct.
    logits = model(x)
    return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()


def samples_per_second(step, batch, windows, window_seconds, warmup_seconds):
    """Median over `windows` windows of whole steps lasting >= window_seconds each."""
    start = time.perf_counter()
    for i in range(1 << 30):
        step()
        if i >= 2 and time.perf_counter() - start >= warmup_seconds:
            break
    rates = []
    for _ in range(windows):
        steps, start = 0, time.perf_counter()
        while True:
            step()
            steps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= window_seconds:
                break
        rates.append(steps * batch / elapsed)
    return statistics.median(rates), rates


def run_speed(args):
    if not args.skip_backends:
        print(json.dumps(backend_report()), flush=True)
    torch.manual_seed(args.seed)
    for kind in args.kinds:
        for batch in args.batch_sizes:
            for threads in args.threads_list:
                set_threads(threads)
                model = make_model()
                x = torch.rand(batch, 1, 28, 28)
                y = torch.randint(0, 10, (batch,))
                if kind == "train":
                    model.train()
                    optimizer = make_optimizer(model)
                    step = lambda: train_step(model, optimizer, x, y)
                    rate, rates = samples_per_second(step, batch, args.windows,
                                                     args.window_seconds, args.warmup_seconds)
                else:
                    model.eval()
                    with torch.no_grad():
                        step = lambda: inference_step(model, x, y)
                        rate, rates = samples_per_second(step, batch, args.windows,
                                                         args.window_seconds,
                                                         args.warmup_seconds)
                print(json.dumps({"kind": kind, "batch": batch, "threads": threads,
                                  "torch_threads": torch.get_num_threads(),
                                  "samples_per_second": round(rate, 1),
                                  "windows": [round(r, 1) for r in rates]}), flush=True)


# --- accuracy ----------------------------------------------------------------------------

def read_idx(path):
    """An IDX file of unsigned bytes (gzip detected from its first two bytes) as an array."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    magic = int.from_bytes(data[0:4], "big")
    if magic >> 8 != 0x08:
        sys.exit(f"{path}: not an unsigned-byte IDX file (magic {magic:#010x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        sys.exit(f"{path}: {body.size} bytes of data, header says {dims}")
    return body.reshape(dims)


def input_norm(flag, train_images):
    """--input_norm as (mean, std), as central_train's: none, train (the train split's pixel
    mean and std on the [0, 1] scale, common/idx.h's ComputePixelStats) or MEAN,STD."""
    if flag == "none":
        return 0.0, 1.0
    if flag == "train":
        pixels = train_images.astype(np.float64) / 255.0
        return float(np.float32(pixels.mean())), float(np.float32(max(pixels.std(), 1e-6)))
    mean, std = (float(v) for v in flag.split(","))
    if not std > 0:
        sys.exit(f"--input_norm={flag}: STD must be > 0")
    return mean, std


def load_images(data_dir, train):
    """As common/idx.h's LoadMnistDir: the uncompressed name wins over the .gz."""
    prefix = "train" if train else "t10k"
    arrays = []
    for name in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        path = os.path.join(data_dir, name)
        if not os.path.exists(path):
            path += ".gz"
        arrays.append(read_idx(path))
    return arrays


def to_tensors(images, labels, mean, std):
    """As fedlearn's CnnTrainer: (pixel / 255 - mean) / std, float32."""
    x = (images.astype(np.float32) / 255.0 - np.float32(mean)) / np.float32(std)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def evaluate(model, x, y, batch=50):
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(y), batch):
            loss, right = inference_step(model, x[start:start + batch], y[start:start + batch])
            loss_sum += loss.item()
            correct += right.item()
    return loss_sum / len(y), correct / len(y)


def run_accuracy(args):
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    train_images, train_labels = load_images(args.data_dir, train=True)
    mean, std = input_norm(args.input_norm, train_images)
    train_x, train_y = to_tensors(train_images, train_labels, mean, std)
    test_x, test_y = to_tensors(*load_images(args.data_dir, train=False), mean, std)
    model = make_model(args.init_weights)
    optimizer = make_optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.lr_decay)
    generator = torch.Generator().manual_seed(args.seed)
    print(json.dumps({"side": "pytorch", "event": "start", "data_dir": args.data_dir,
                      "train_examples": len(train_y), "test_examples": len(test_y),
                      "threads": args.threads, "batch_size": args.batch_size,
                      "input_mean": round(mean, 4), "input_std": round(std, 4),
                      "lr_decay": args.lr_decay,
                      "init": args.init_weights or "xavier_uniform (torch generator)"}),
          flush=True)
    start = time.perf_counter()
    test_loss, test_acc = evaluate(model, test_x, test_y)
    print(json.dumps({"side": "pytorch", "epoch": 0, "test_loss": round(test_loss, 4),
                      "test_accuracy": round(test_acc, 4)}), flush=True)
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.perf_counter()
        model.train()
        loss_sum, correct = 0.0, 0
        order = torch.randperm(len(train_y), generator=generator)
        for first in range(0, len(order), args.batch_size):
            index = order[first:first + args.batch_size]
            x, y = train_x[index], train_y[index]
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
        scheduler.step()
        test_loss, test_acc = evaluate(model, test_x, test_y)
        now = time.perf_counter()
        print(json.dumps({"side": "pytorch", "epoch": epoch,
                          "train_loss": round(loss_sum / len(train_y), 4),
                          "train_accuracy": round(correct / len(train_y), 4),
                          "test_loss": round(test_loss, 4), "test_accuracy": round(test_acc, 4),
                          "epoch_seconds": round(now - epoch_start, 2),
                          "wall_seconds": round(now - start, 2)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("speed", "accuracy"), required=True)
    parser.add_argument("--seed", type=int, default=1)
    speed = parser.add_argument_group("speed")
    speed.add_argument("--kinds", nargs="+", choices=("train", "inference"),
                       default=["train", "inference"])
    speed.add_argument("--batch_sizes", type=int, nargs="+", default=[10, 64])
    speed.add_argument("--threads_list", type=int, nargs="+", default=[1, 2])
    speed.add_argument("--windows", type=int, default=5, help="timed windows per config")
    speed.add_argument("--window_seconds", type=float, default=2.0)
    speed.add_argument("--warmup_seconds", type=float, default=1.0)
    speed.add_argument("--skip_backends", action="store_true",
                       help="do not print the BLAS / backend report first")
    accuracy = parser.add_argument_group("accuracy")
    accuracy.add_argument("--data_dir", default="data/mnist")
    accuracy.add_argument("--epochs", type=int, default=5)
    accuracy.add_argument("--batch_size", type=int, default=10)
    accuracy.add_argument("--threads", type=int, default=1)
    accuracy.add_argument("--init_weights",
                          help="raw float32 initial weights in wire order (central_train "
                               "--init_out); default: Glorot uniform from torch's generator")
    accuracy.add_argument("--lr_decay", type=float, default=1.0,
                          help="learning rate multiplier after every epoch (StepLR gamma)")
    accuracy.add_argument("--input_norm", default="none",
                          help="none (pixel / 255), train (standardised with the train "
                               "split's pixel mean and std) or MEAN,STD, as central_train's")
    args = parser.parse_args()
    if args.mode == "speed":
        run_speed(args)
    else:
        run_accuracy(args)


if __name__ == "__main__":
    main()
