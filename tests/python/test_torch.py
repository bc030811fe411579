"""fedlearn.torch: a PyTorch model federated through a real coordinator."""

import errno
import os
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch
from torch import nn

import fedlearn
import fedlearn.torch as ft
from fedlearn.__main__ import get_status
from coordinator import Coordinator


class Net(nn.Module):
    """Not a registry model: a conv with batch norm."""

    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def batches(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    return [(x[i:i + 8], y[i:i + 8]) for i in range(0, n, 8)]


class TorchTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "net.safetensors")

    def test_an_exported_model_is_the_coordinators_and_trains(self):
        model = Net()
        ft.export_safetensors(model, self.path)
        names = list(ft.federated_tensors(model))
        # Parameters and float buffers, not num_batches_tracked.
        self.assertEqual(names, ["conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                 "bn.running_mean", "bn.running_var", "fc.weight",
                                 "fc.bias"])
        initial = ft.model_weights(model)
        with Coordinator(f"--model={self.path}", "--min_clients=1", "--max_rounds=1",
                         "--convergence_threshold=-inf") as c:
            status = get_status(c.address)
            self.assertEqual(status.model.name, "Net")
            self.assertEqual([t.name for t in status.model.tensors], names)
            self.assertEqual(status.model.num_parameters,
                             sum(w.size for w in initial))
            local = Net()  # another initialisation: the coordinator's weights win
            client = ft.TorchClient(
                c.address, local, train_loader=batches(), test_loader=batches(seed=1),
                optimizer=lambda p, plan: torch.optim.SGD(p, lr=0.1))
            summary = client.run()
            final = get_status(c.address)
        self.assertEqual(summary.rounds_trained, 1)
        self.assertEqual(summary.evaluations, 1)
        self.assertEqual(final.history[0].metrics.num_examples, 32)
        # The model moved, batch norm's running statistics with it.
        trained = ft.model_weights(local)
        self.assertFalse(np.array_equal(trained[0], initial[0]))
        self.assertFalse(np.array_equal(trained[4], initial[4]))  # running_mean

    def test_an_export_that_fails_leaves_the_file_as_it_was(self):
        # Written beside the file and renamed over it: a disk that fills up midway
        # (the third write fails, ENOSPC) leaves the old file whole and no part.
        ft.export_safetensors(Net(), self.path)
        with open(self.path, "rb") as f:
            before = f.read()

        class FillsUp:
            def __init__(self, f):
                self.f, self.writes = f, 0

            def write(self, data):
                self.writes += 1
                if self.writes == 3:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

        with mock.patch.object(ft, "open", lambda p, m="r": FillsUp(open(p, m)),
                               create=True):
            with self.assertRaises(OSError):
                ft.export_safetensors(Net(width=5), self.path)
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(os.listdir(self.dir), ["net.safetensors"])

    def test_a_model_that_differs_is_refused_at_join_with_the_differences(self):
        ft.export_safetensors(Net(), self.path)
        with Coordinator(f"--model={self.path}") as c:
            client = ft.TorchClient(c.address, Net(width=5), train=lambda m, p: (1, {}))
            with self.assertRaises(fedlearn.ModelMismatchError) as e:
                client.run()
        text = str(e.exception)
        self.assertIn("conv.weight: shape [5, 1, 3, 3] here, [4, 1, 3, 3] at the "
                      "coordinator", text)
        self.assertIn("fc.weight: shape [3, 180] here, [3, 144]", text)

    def test_the_proximal_term_is_mu_times_the_distance_to_the_global_model(self):
        # A loss w . (1, 1), whose own gradient is (1, 1), two SGD steps at lr 0.5
        # under mu 0.1, by hand: step 1 starts at the anchor (1, -2), so the term
        # is 0 and w becomes (0.5, -2.5); step 2's gradient is (1, 1) + 0.1 *
        # ((0.5, -2.5) - (1, -2)) = (0.95, 0.95), and w becomes (0.025, -2.975).
        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, -2.0]]))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.ones(1, 2)

        def step():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        with ft.proximal_term(model, 0.1):
            step()
            torch.testing.assert_close(model.weight.grad, torch.tensor([[1.0, 1.0]]))
            step()
            torch.testing.assert_close(model.weight.grad, torch.tensor([[0.95, 0.95]]))
        torch.testing.assert_close(model.weight, torch.tensor([[0.025, -2.975]]))
        # Gone once the round's training is over, and never there with mu 0.
        step()
        torch.testing.assert_close(model.weight.grad, torch.tensor([[1.0, 1.0]]))
        with ft.proximal_term(model, 0.0):
            step()
            step()
        torch.testing.assert_close(model.weight.grad, torch.tensor([[1.0, 1.0]]))

    def test_fedprox_reaches_a_users_own_training_loop(self):
        # --strategy=fedprox with mu 0.5: the train function is the user's own
        # loop and knows nothing of FedProx. Its first step moves every parameter
        # by -lr = -0.1 (loss: the sum of the parameters); its second step's loss
        # has no gradient of its own, so what the optimizer gets is the proximal
        # term alone, mu (w - w_global) = 0.5 * -0.1 = -0.05 everywhere.
        model = Net()
        ft.export_safetensors(model, self.path)
        seen = {}

        def train(m: nn.Module, plan) -> tuple:
            seen["mu"] = plan.proximal_mu
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for scale in (1.0, 0.0):
                opt.zero_grad()
                (scale * sum(p.sum() for p in m.parameters())).backward()
                seen["grads"] = [p.grad.clone() for p in m.parameters()]
                opt.step()
            return 8, {"loss": 1.0}

        with Coordinator(f"--model={self.path}", "--min_clients=1", "--max_rounds=1",
                         "--convergence_threshold=-inf", "--strategy=fedprox",
                         "--strategy_config=proximal_mu: 0.5") as c:
            summary = ft.TorchClient(c.address, Net(), train=train,
                                     evaluate=lambda m, plan: (1.0, 0.5, 8)).run()
        self.assertEqual(summary.rounds_trained, 1)
        self.assertAlmostEqual(seen["mu"], 0.5)
        for g in seen["grads"]:
            torch.testing.assert_close(g, torch.full_like(g, -0.05))

if __name__ == "__main__":
    unittest.main()
