"""Anemoi's output boundings with the columns they bound held as buffers, so that they are on the model's device.

Anemoi's boundings (anemoi.models.layers.bounding: ReluBounding for ``tp`` in the default config) keep the output
columns they bound as CPU tensors in plain attributes and index the model's output with them:
``x[..., self.data_index] = relu(x[..., self.data_index])``. Indexing a CUDA tensor with a CPU index copies the
index to the device with a blocking copy, a host sync: two per bounding and call, at the end of the forward. In a
training step the host then waits there for the whole forward before it launches the loss and the backward, so
the GPU idles while the backward's first kernels are launched, and the host starts the next step with nothing
queued ahead; at O320 the host waited 12-17 ms a call in the bounding (benchmarks/NOTES.md v47).

Held as non-persistent buffers, the same tensors move with the model (``model.to(device)``) and the indexing reads
them on the device: the same values, no sync, and no state_dict key (non-persistent buffers are not saved).
"""

from __future__ import annotations

import torch
from anemoi.models.layers.bounding import BaseBounding
from torch import nn

# The index tensors Anemoi 0.19's boundings keep: every bounding's columns, and FractionBounding's total.
INDEX_ATTRIBUTES = ("data_index", "total_variable")


def bounding_indices_as_buffers(module: nn.Module) -> None:
    """Every Anemoi bounding inside ``module`` (itself included) holds its index tensors as non-persistent buffers,
    moved to the device of ``module``'s parameters (CPU without any). Repeating it changes nothing."""
    parameter = next(module.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    for bounding in module.modules():
        if not isinstance(bounding, BaseBounding):
            continue
        for name in INDEX_ATTRIBUTES:
            index = bounding.__dict__.get(name)  # a plain attribute; a buffer lives in bounding._buffers
            if isinstance(index, torch.Tensor):
                delattr(bounding, name)
                bounding.register_buffer(name, index.to(device), persistent=False)
