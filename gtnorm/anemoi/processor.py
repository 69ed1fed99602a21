"""Anemoi's GraphTransformerProcessor with gtnorm's fused attention + QK norm in every block, and two explicit choices
of what the backward runs again under gradient checkpointing.

Anemoi checkpoints the processor in chunks of num_layers / num_chunks layers: the backward runs each chunk's forward
again, the whole processor's forward a second time. The last chunk is the first one the backward reaches, so the
activations a kept layer holds live only from its forward through the decoder's forward and backward: where the
step peaks elsewhere (in the first processor chunk's backward, as at O320) the first kept layer fits under that peak.
``layers_outside_checkpoint`` says how many of the last layers run without a checkpoint (0 by default: Anemoi's
checkpointing and peak). Measured at O320 on an H200 (40,962 hidden nodes x 1,024 channels, fp16, benchmarks/NOTES.md
v38): each kept layer saves ~3.5 ms a step and, past the first, adds ~1.3 GiB to the peak; at O800's 163,842 nodes
about four times both.

``keep_attention_outputs`` keeps each checkpointed layer's attention outputs from its forward for the recompute
(gtnorm/triton/kept_outputs.py): the recompute runs everything but the attention kernels again, for the outputs'
memory ([N, H, C] in the activations' dtype, [N, H] and [N, H, D + 1] fp32 a layer) held from a chunk's forward to
its recompute.
"""

from __future__ import annotations

import torch
from anemoi.models.layers import processor as anemoi_processor
from anemoi.models.layers.utils import maybe_checkpoint
from torch.utils.checkpoint import checkpoint

from gtnorm.anemoi.block import convert_blocks
from gtnorm.triton.kept_outputs import attention_outputs_kept


class GraphTransformerProcessor(anemoi_processor.GraphTransformerProcessor):
    """A drop-in for ``anemoi.models.layers.processor.GraphTransformerProcessor``: the same keyword arguments,
    the same parameters and state_dict keys, the same forward; its blocks run gtnorm's attention kernels with the
    QK norm fused (see :mod:`gtnorm.anemoi`). In a model config: ``_target_: gtnorm.anemoi.GraphTransformerProcessor``.

    ``layers_outside_checkpoint`` (default 0): with gradient checkpointing on, this many of the last layers run
    without a checkpoint, so the backward does not run them again (module docstring: the time and memory it trades).
    ``keep_attention_outputs`` (default False): with gradient checkpointing on, the checkpointed layers' attention
    outputs are kept from the forward, and the backward's recompute does not run the attention kernels again.
    Results are bitwise those of the fully checkpointed processor with either.
    :func:`gtnorm.anemoi.use_gtnorm_attention` re-classes a built Anemoi processor to this class (no layer kept, no
    outputs kept, until set on the instance).
    """

    # Class defaults, so that an Anemoi processor re-classed in place has them.
    _layers_outside_checkpoint: int = 0
    keep_attention_outputs: bool = False

    def __init__(
        self,
        *,
        graph_attention_backend: str = "triton",
        layers_outside_checkpoint: int = 0,
        keep_attention_outputs: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        self.layers_outside_checkpoint = layers_outside_checkpoint
        if not isinstance(keep_attention_outputs, bool):
            raise ValueError(f"keep_attention_outputs must be a bool, got {keep_attention_outputs!r}")
        self.keep_attention_outputs = keep_attention_outputs
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
        checkpointing = self.gradient_checkpointing and torch.is_grad_enabled()
        first_kept = self.num_layers - (self.layers_outside_checkpoint if checkpointing else 0)
        for chunk_start in range(0, first_kept, self.chunk_size):
            run, chunk = self.run_layer_chunk, [chunk_start, data]
            if chunk_start + self.chunk_size > first_kept:
                run, chunk = self._run_layer_range, [chunk_start, first_kept, data]
            if checkpointing and self.keep_attention_outputs:
                context_fn = attention_outputs_kept()
                data = checkpoint(run, *chunk, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
            else:
                data = maybe_checkpoint(run, self.gradient_checkpointing, *chunk, *args, **kwargs)
        return self._run_layer_range(first_kept, self.num_layers, data, *args, **kwargs)

    def _run_layer_range(self, start: int, end: int, data: tuple, *args, **kwargs) -> tuple:
        for layer_id in range(start, end):
            data = self.proc[layer_id](*data, *args, **kwargs)
        return data
