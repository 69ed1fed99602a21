"""Anemoi's GraphTransformerProcessor with gtnorm's fused attention + QK norm in every block, and an explicit choice
to run its last layers outside gradient checkpointing.

Anemoi checkpoints the processor in chunks of num_layers / num_chunks layers: the backward runs each chunk's forward
again, the whole processor's forward a second time. The last chunk is the first one the backward reaches, so the
activations a kept layer holds live only from its forward through the decoder's forward and backward: where the
step peaks elsewhere (in the first processor chunk's backward, as at O320) the first kept layer fits under that peak.
``layers_outside_checkpoint`` says how many of the last layers run without a checkpoint (0 by default: Anemoi's
checkpointing and peak). Measured at O320 on an H200 (40,962 hidden nodes x 1,024 channels, fp16, benchmarks/NOTES.md
v38): each kept layer saves ~3.5 ms a step and, past the first, adds ~1.3 GiB to the peak; at O800's 163,842 nodes
about four times both.
"""

from __future__ import annotations

import torch
from anemoi.models.layers import processor as anemoi_processor
from anemoi.models.layers.utils import maybe_checkpoint

from gtnorm.anemoi.block import convert_blocks


class GraphTransformerProcessor(anemoi_processor.GraphTransformerProcessor):
    """A drop-in for ``anemoi.models.layers.processor.GraphTransformerProcessor``: the same keyword arguments,
    the same parameters and state_dict keys, the same forward; its blocks run gtnorm's attention kernels with the
    QK norm fused (see :mod:`gtnorm.anemoi`). In a model config: ``_target_: gtnorm.anemoi.GraphTransformerProcessor``.

    ``layers_outside_checkpoint`` (default 0): with gradient checkpointing on, this many of the last layers run
    without a checkpoint, so the backward does not run them again (module docstring: the time and memory it trades).
    Results are bitwise those of the fully checkpointed processor. :func:`gtnorm.anemoi.use_gtnorm_attention`
    re-classes a built Anemoi processor to this class (0 layers kept, until set on the instance).
    """

    _layers_outside_checkpoint: int = 0  # a class default, so that an Anemoi processor re-classed in place has it

    def __init__(
        self, *, graph_attention_backend: str = "triton", layers_outside_checkpoint: int = 0, **kwargs
    ) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        self.layers_outside_checkpoint = layers_outside_checkpoint
        convert_blocks(self, graph_attention_backend)

    @property
    def layers_outside_checkpoint(self) -> int:
        return self._layers_outside_checkpoint

    @layers_outside_checkpoint.setter
    def layers_outside_checkpoint(self, layers: int) -> None:
        if isinstance(layers, bool) or not isinstance(layers, int) or not 0 <= layers <= self.num_layers:
            raise ValueError(
                f"layers_outside_checkpoint must be an int from 0 to num_layers ({self.num_layers}), got {layers!r}"
            )
        self._layers_outside_checkpoint = layers

    def run_layers(self, data: tuple, *args, **kwargs) -> tuple:
        # Anemoi's loop (maybe_checkpoint around run_layer_chunk), the chunk that reaches the kept layers cut short at
        # them. Written out rather than handing the default to Anemoi's run_layers: one call deeper, a compiled
        # processor under a model group breaks once more at the same log line (tests/distributed).
        kept = self.layers_outside_checkpoint if self.gradient_checkpointing and torch.is_grad_enabled() else 0
        first_kept = self.num_layers - kept
        for chunk_start in range(0, first_kept, self.chunk_size):
            enabled = self.gradient_checkpointing
            if chunk_start + self.chunk_size <= first_kept:
                data = maybe_checkpoint(self.run_layer_chunk, enabled, chunk_start, data, *args, **kwargs)
            else:
                data = maybe_checkpoint(self._run_layer_range, enabled, chunk_start, first_kept, data, *args, **kwargs)
        return self._run_layer_range(first_kept, self.num_layers, data, *args, **kwargs)

    def _run_layer_range(self, start: int, end: int, data: tuple, *args, **kwargs) -> tuple:
        for layer_id in range(start, end):
            data = self.proc[layer_id](*data, *args, **kwargs)
        return data
