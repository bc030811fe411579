#!/usr/bin/python3
"""The Python SDK's protocol cost per round, and a PyTorch epoch of the same model.

    sdk_overhead.py client HOST:PORT     one fedlearn.Client whose fit returns at once,
                                         until DONE; prints its Summary as JSON
    sdk_overhead.py epoch                the seed CNN (mnist_cnn) in PyTorch: one local
                                         epoch of 800 examples at B=10 with Adadelta,
                                         timed (median of 3); prints JSON
    sdk_overhead.py codec                the SDK's own share, without gRPC: reassembly
                                         with every check, and encoding into serialized
                                         requests, of mnist_cnn's 4.8 MB (median of 20); prints JSON

Run by bench/sdk-overhead.sh with the Python of the SDK's environment.
"""

import dataclasses
import json
import statistics
import sys
import time


def client(address):
    import fedlearn

    def fit(weights, plan):
        return [w + 1e-3 for w in weights], 800, {"loss": 1.0 / plan.round}

    summary = fedlearn.Client(address, fit, lambda w, p: (1.0, 0.5, 10),
                              display_name="sdk-bench").run()
    print(json.dumps(dataclasses.asdict(summary)))


def epoch():
    import torch
    from torch import nn
    torch.set_num_threads(1)
    torch.manual_seed(1)
    # The seed CNN, as the registry's mnist_cnn (1,199,882 parameters).
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128),
        nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))
    assert sum(p.numel() for p in model.parameters()) == 1199882
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-7)
    x = torch.randn(800, 1, 28, 28)
    y = torch.randint(0, 10, (800,))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(0, 800, 10):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 10]), y[i:i + 10]).backward()
            opt.step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"epoch_seconds": statistics.median(times), "threads": 1,
                      "examples": 800, "batch_size": 10}))


def codec():
    import numpy as np
    from fedlearn import wire
    from fedlearn.v1 import coordinator_pb2 as pb2
    shapes = [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 9216), (128,),
              (10, 128), (10,)]  # mnist_cnn
    spec = pb2.ModelSpec(name="mnist_cnn", tensors=[
        pb2.TensorSpec(name=f"t{i}", shape=list(s), dtype=pb2.DTYPE_FLOAT32)
        for i, s in enumerate(shapes)])
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    size = sum(v.nbytes for v in values)
    out = {}
    for chunk in (64 << 10, 1 << 20):
        def encode():
            return list(wire.push_requests(pb2, spec, [wire.encode(v, False)[0]
                                                       for v in values], chunk, False))
        chunks = [pb2.PushGradientRequest.FromString(r).chunk for r in encode()]
        buffers = wire.Reassembler.buffers(spec)  # as the client: the same every round

        def reassemble():
            r = wire.Reassembler(pb2, spec, buffers)
            for c in chunks:
                r.add(c)
            return r.finish()
        reassemble()  # warm: the CRC shift matrices
        for name, fn in (("reassemble", reassemble), ("encode", encode)):
            times = []
            for _ in range(20):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            out[f"{name}_{chunk >> 10}k_mbps"] = size / statistics.median(times) / 1e6
    print(json.dumps(out))


if __name__ == "__main__":
    {"client": lambda: client(sys.argv[2]), "epoch": epoch, "codec": codec}[sys.argv[1]]()
