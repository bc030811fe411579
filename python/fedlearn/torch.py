"""Federate a PyTorch ``nn.Module`` with the fedlearn coordinator.

    import torch, fedlearn.torch

    model = MyNet()
    fedlearn.torch.export_safetensors(model, "init.safetensors")  # fedlearn-coordinator --model=init.safetensors
    client = fedlearn.torch.TorchClient(
        "127.0.0.1:50051", model, train_loader=train, test_loader=test,
        optimizer=lambda params, plan: torch.optim.SGD(params, lr=plan.learning_rate))
    client.run()

The coordinator's tensors are the model's parameters and floating-point buffers (batch
norm's running statistics), by ``state_dict`` name and in ``state_dict`` order; integer
buffers (``num_batches_tracked``) stay local. A model whose names or shapes differ from
the coordinator's spec is refused at join with the differences listed. When the
strategy sends FedProx's ``proximal_mu``, ``mu (w - w_global)`` is added to every
gradient while the round trains, whether ``TorchClient`` runs the epochs or the user's
``train`` function does (``proximal_term``). PyTorch is imported only by this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence,
                    Tuple)

import numpy as np
import torch
from torch import nn

from fedlearn.client import Client, Plan
from fedlearn.errors import ModelMismatchError


def federated_tensors(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The tensors the coordinator holds for ``model``: its parameters and floating
    buffers by ``state_dict`` name, in ``state_dict`` order."""
    return {name: t for name, t in model.state_dict(keep_vars=True).items()
            if t.is_floating_point()}


def spec_differences(model: nn.Module, spec: Any) -> List[str]:
    """What differs between ``model``'s federated tensors and a ``ModelSpec``: missing,
    extra, reordered or reshaped tensors, one line each (empty when they agree)."""
    local = [(n, tuple(t.shape)) for n, t in federated_tensors(model).items()]
    remote = [(t.name, tuple(int(d) for d in t.shape)) for t in spec.tensors]
    out = []
    local_names = dict(local)
    remote_names = dict(remote)
    for name, shape in remote:
        if name not in local_names:
            out.append(f"{name} {list(shape)}: in the coordinator's model, not in this one")
        elif local_names[name] != shape:
            out.append(f"{name}: shape {list(local_names[name])} here, {list(shape)} "
                       f"at the coordinator")
    for name, shape in local:
        if name not in remote_names:
            out.append(f"{name} {list(shape)}: in this model, not in the coordinator's")
    if not out and [n for n, _ in local] != [n for n, _ in remote]:
        out.append("the same tensors in another order: export the model with "
                   "fedlearn.torch.export_safetensors")
    return out


def load_weights(model: nn.Module, weights: Sequence[np.ndarray]) -> None:
    """Copies the coordinator's weights (in spec order) into ``model``."""
    with torch.no_grad():
        for t, w in zip(federated_tensors(model).values(), weights):
            t.copy_(torch.from_numpy(np.ascontiguousarray(w)).to(t.dtype))


def model_weights(model: nn.Module) -> List[np.ndarray]:
    """``model``'s federated tensors as float32 numpy arrays, in spec order."""
    return [t.detach().to("cpu", torch.float32).numpy().copy()
            for t in federated_tensors(model).values()]


def export_safetensors(model: nn.Module, path: str, name: Optional[str] = None) -> None:
    """Writes ``model``'s federated tensors as a safetensors file of float32 tensors in
    ``state_dict`` order, the file to start a coordinator with (``--model=PATH``);
    ``name`` (default: the model's class name) is the model's name in its metadata."""
    tensors = federated_tensors(model)
    header: Dict[str, Any] = {"__metadata__": {"model": name or type(model).__name__}}
    blobs = []
    offset = 0
    for tensor_name, t in tensors.items():
        data = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
        raw = data.tobytes()
        header[tensor_name] = {"dtype": "F32", "shape": list(data.shape),
                               "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    # Whole or not at all: written beside `path` and renamed over it, so that a
    # failure (a full disk) leaves no truncated model for a coordinator to refuse.
    temp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for raw in blobs:
                f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


@contextlib.contextmanager
def proximal_term(model: nn.Module, mu: float) -> Iterator[None]:
    """FedProx (Li et al. 2020) for whatever trains ``model`` inside the ``with``:
    every ``backward()`` adds ``mu (w - w_global)`` to each parameter's gradient, the
    gradient of ``mu/2 |w - w_global|^2``, where ``w_global`` is the parameters'
    value on entry (the round's weights), so a plain training loop and any optimizer
    get the term without being changed. It joins each gradient as ``backward()``
    computes it, which has three consequences: a loop that accumulates k backward
    passes into one step gets it k times (as if each pass's loss carried it); a loss
    scaler for mixed precision (``torch.cuda.amp.GradScaler``) divides it by the scale
    with the rest, so under one the term is that much weaker; and a parameter that did
    not require grad on entry gets none. ``mu <= 0`` adds nothing."""
    if mu <= 0:
        yield
        return
    handles = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        anchor = p.detach().clone()

        def hook(grad: torch.Tensor, p: torch.Tensor = p,
                 anchor: torch.Tensor = anchor) -> torch.Tensor:
            return grad + mu * (p.detach() - anchor)

        handles.append(p.register_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


#: ``train(model, plan) -> (num_examples, metrics)``: trains ``model`` in place.
TrainFn = Callable[[nn.Module, Plan], Tuple[int, Dict[str, float]]]
#: ``evaluate(model, plan) -> (loss, accuracy, num_examples)``.
EvalFn = Callable[[nn.Module, Plan], Tuple[float, float, int]]


class TorchClient(Client):
    """A ``fedlearn.Client`` for a PyTorch model. Give either ``train``/``evaluate``
    functions, or loaders and an optimizer factory, with which it runs the plan's epochs
    itself (cross-entropy on class labels). FedProx's term, when the plan carries one,
    applies on both paths (``proximal_term``).

    Args:
      coordinator: ``HOST:PORT``.
      model: the ``nn.Module``; its tensors must match the coordinator's spec.
      train, evaluate: see ``TrainFn`` and ``EvalFn``.
      train_loader, test_loader: iterables of ``(inputs, labels)`` batches.
      optimizer: ``optimizer(parameters, plan) -> torch.optim.Optimizer``, made anew
        each round (or kept when ``keep_optimizer`` and the plan does not reset it).
      loss: the training loss (default: cross-entropy).
      Other keyword arguments go to ``fedlearn.Client``.
    """

    def __init__(self, coordinator: str, model: nn.Module, *,
                 train: Optional[TrainFn] = None, evaluate: Optional[EvalFn] = None,
                 train_loader: Optional[Iterable] = None,
                 test_loader: Optional[Iterable] = None,
                 optimizer: Optional[Callable[[Any, Plan], Any]] = None,
                 loss: Optional[Callable] = None, keep_optimizer: bool = False,
                 **kwargs: Any):
        if train is None and (train_loader is None or optimizer is None):
            raise ValueError("give train=, or train_loader= and optimizer=")
        self.model = model
        self._train_fn = train
        self._eval_fn = evaluate
        self._train_loader = train_loader
        self._test_loader = test_loader
        self._make_optimizer = optimizer
        self._loss = loss or nn.functional.cross_entropy
        self._keep_optimizer = keep_optimizer
        self._optimizer = None
        has_eval = evaluate is not None or test_loader is not None
        user_on_join = kwargs.pop("on_join", None)

        def on_join(joined: Any) -> None:
            differences = spec_differences(model, joined.model)
            if differences:
                raise ModelMismatchError(
                    f"this model does not match the coordinator's {joined.model.name!r}:"
                    "\n  " + "\n  ".join(differences))
            if user_on_join is not None:
                user_on_join(joined)

        super().__init__(coordinator, self._fit_model,
                         self._evaluate_model if has_eval else None, on_join=on_join,
                         **kwargs)

    def _fit_model(self, weights: List[np.ndarray],
                   plan: Plan) -> Tuple[List[np.ndarray], int, Dict[str, float]]:
        load_weights(self.model, weights)
        # FedProx's term on both paths: the user's train function trains under it
        # unchanged.
        with proximal_term(self.model, plan.proximal_mu):
            if self._train_fn is not None:
                examples, metrics = self._train_fn(self.model, plan)
            else:
                examples, metrics = self._run_epochs(plan)
        return model_weights(self.model), examples, metrics

    def _run_epochs(self, plan: Plan) -> Tuple[int, Dict[str, float]]:
        model = self.model
        model.train()
        if self._optimizer is None or not self._keep_optimizer or plan.reset_optimizer:
            self._optimizer = self._make_optimizer(model.parameters(), plan)
        opt = self._optimizer
        batches = len(self._train_loader) if hasattr(self._train_loader, "__len__") else 0
        total = max(1, plan.epochs) * batches
        done = 0
        examples = 0
        loss_sum = 0.0
        correct = 0
        device = _device_of(model)
        for _ in range(max(1, plan.epochs)):
            for inputs, labels in self._train_loader:
                inputs, labels = inputs.to(device), labels.to(device)
                opt.zero_grad()
                out = model(inputs)
                loss = self._loss(out, labels)
                loss.backward()
                opt.step()
                n = int(labels.shape[0])
                examples += n
                loss_sum += float(loss.detach()) * n
                correct += int((out.detach().argmax(1) == labels).sum())
                done += 1
                plan.report_progress(done, total)
        # num_examples is the local data set's size (FedAvg's weight), not x epochs.
        epochs = max(1, plan.epochs)
        return examples // epochs, {"loss": loss_sum / max(1, examples),
                                    "accuracy": correct / max(1, examples)}

    def _evaluate_model(self, weights: List[np.ndarray],
                        plan: Plan) -> Tuple[float, float, int]:
        load_weights(self.model, weights)
        if self._eval_fn is not None:
            return self._eval_fn(self.model, plan)
        return evaluate_loader(self.model, self._test_loader, self._loss)


def _device_of(model: nn.Module) -> "torch.device":
    """Where the model's parameters are (the CPU for a model without any): its
    batches go there, so a CUDA model can be fed by a CPU DataLoader."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def evaluate_loader(model: nn.Module, loader: Iterable,
                    loss: Callable = nn.functional.cross_entropy) -> Tuple[float, float, int]:
    """Mean loss, accuracy and examples of ``model`` (in eval mode) over ``loader``."""
    model.eval()
    device = _device_of(model)
    total = 0
    loss_sum = 0.0
    correct = 0
    with torch.no_grad():
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            out = model(inputs)
            n = int(labels.shape[0])
            total += n
            loss_sum += float(loss(out, labels)) * n
            correct += int((out.argmax(1) == labels).sum())
    return loss_sum / max(1, total), correct / max(1, total), total
