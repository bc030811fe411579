"""examples/pytorch: a model outside the registry learns through the coordinator."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

from fedlearn.__main__ import get_status
from coordinator import Coordinator

EXAMPLE = os.path.join(os.environ.get("FEDLEARN_SOURCE_DIR", "../.."), "examples",
                       "pytorch", "fashion_cnn.py")
ROUNDS = 5
# Central training of this CNN on the same 8,000 images reaches about 85% in an
# epoch; 4 non-IID clients after 5 rounds of one epoch each are well above 70%, and a
# model that does not learn sits at 10%.
FLOOR = 0.70


class PytorchExampleTest(unittest.TestCase):
    def test_fashion_cnn_learns_over_four_dirichlet_clients(self):
        path = os.path.join(tempfile.mkdtemp(), "fashion_cnn.safetensors")
        subprocess.run([sys.executable, EXAMPLE, "export", path], check=True,
                       capture_output=True, timeout=120)
        with Coordinator(f"--model={path}", "--min_clients=4", f"--max_rounds={ROUNDS}",
                         "--optimizer=sgd", "--learning_rate=0.05", "--batch_size=32",
                         "--tolerance=0", "--round_timeout=2m",
                         "--convergence_threshold=-inf") as c:
            started = time.monotonic()
            run = subprocess.run([sys.executable, EXAMPLE, "train",
                                  f"--coordinator={c.address}"],
                                 capture_output=True, text=True, timeout=280)
            self.assertEqual(run.returncode, 0, run.stderr[-2000:])
            status = get_status(c.address, client_ids=True)
        self.assertEqual(status.model.name, "fashion_cnn")
        training = [r for r in status.history if not r.evaluation]
        # Every round waited for all four (the example's --tolerance=0), so every
        # client, the one with the largest share too, was folded every round.
        self.assertEqual(len(training), ROUNDS)
        for r in training:
            self.assertEqual(r.outcome, "all")
            self.assertEqual(len(r.accepted_clients), 4)
            self.assertCountEqual(r.accepted_clients, r.selected_clients)
        accuracy = status.final_evaluation.test_accuracy
        print(f"fashion_cnn: {ROUNDS} rounds in {time.monotonic() - started:.1f} s, "
              f"test accuracy {100 * accuracy:.2f}% over "
              f"{status.final_evaluation.num_examples} examples", file=sys.stderr)
        self.assertGreaterEqual(accuracy, FLOOR)


if __name__ == "__main__":
    unittest.main()
