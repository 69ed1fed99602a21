"""Anemoi's encoder-processor-decoder model with its residual added out of place.

AnemoiModelEncProcDec adds the input's prognostic variables to the output in place, through indices on the last
dimension: ``x_out[..., output_idx] += x_skip[..., input_idx]``. Autograd records that as reading x_out's columns
(``index``) and writing them back (``index_put_``), so the backward accumulates the output's gradient columns into
a zero-filled tensor with torch's sorting index backward: at O800 a [2.59M, 94] fp32 gradient took 47 ms of a
1,567 ms compiled step on an H200, on both sides (benchmarks/NOTES.md, v32). The same sum as one out-of-place
``index_add`` has an identity backward for x_out and a gather for x_skip. Where the output indices are distinct (a
variable appears once in a model's output; checked once, when the model is made or converted), every element
receives at most one addend: the values are bitwise those of Anemoi's in-place add (``index_add`` adds onto a copy,
as Anemoi adds onto its ``clone``), and its atomics add a single term each, whatever their order. The indices (CPU
tensors of Anemoi's data indices) are copied to the device each call with ``non_blocking=True``, where Anemoi's indexing
copies them implicitly with a blocking copy; from pageable memory the copy is staged without waiting on the device
(H200, cProfile of the O320 call: ~0.1 ms of host time here, and no sync under torch's sync debug mode in
tests/anemoi/test_bounding.py; benchmarks/NOTES.md v47). The output boundings' own indices are buffers (bounding.py).

The grid input it assembles for the encoder, which the decoder takes as its destinations, is marked with the
columns whose gradient reaches a parameter, the nodes' trainable ones (grad_columns.py: the decoder's chunks then
hold a gradient of those columns only).
"""

from __future__ import annotations

from anemoi.models.models import encoder_processor_decoder as anemoi_model

from gtnorm.anemoi.bounding import bounding_indices_as_buffers
from gtnorm.anemoi.grad_columns import mark_grad_columns


class AnemoiModelEncProcDec(anemoi_model.AnemoiModelEncProcDec):
    """A drop-in for ``anemoi.models.models.AnemoiModelEncProcDec``: the same arguments, state_dict keys and
    results, with the residual added out of place (module docstring). In a model config:
    ``_target_: gtnorm.anemoi.AnemoiModelEncProcDec``; use_gtnorm_attention re-classes a built model to it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.check_residual_indices()
        bounding_indices_as_buffers(self)

    def check_residual_indices(self) -> None:
        """Finds, per dataset, whether its residual can be added out of place (distinct output indices); a plain
        attribute, not state: nothing is added to the state_dict. Called again if the indices are changed."""
        self._gtnorm_residual_out_of_place = {
            name: index.unique().numel() == index.numel() and self._internal_input_idx[name].numel() == index.numel()
            for name, index in self._internal_output_idx.items()
        }

    def _assemble_input(self, x, batch_size, grid_shard_sizes, model_comm_group=None, dataset_name=None):
        # x: [batch, time, ensemble, grid, vars] -> x_data_latent: [batch * ensemble * grid, time * vars + attributes]
        x_data_latent, x_skip, shard_sizes = super()._assemble_input(
            x, batch_size, grid_shard_sizes, model_comm_group, dataset_name
        )
        # Anemoi's row: the data's columns, then the node attributes (sin/cos coordinates, then the trainable
        # parameters, last). Only those reach a parameter, unless the data itself requires a gradient.
        trainable = self.node_attributes.trainable_tensors[dataset_name].trainable
        if trainable is not None and not x.requires_grad:
            mark_grad_columns(x_data_latent, x_data_latent.shape[-1] - trainable.shape[-1])
        return x_data_latent, x_skip, shard_sizes

    def _assemble_output(self, x_out, x_skip, batch_size, ensemble_size, dtype, dataset_name):
        # x_out: [batch * ensemble * grid, time * vars]; x_skip: [batch, time, ensemble, grid, vars_in] or None
        # -> [batch, time, ensemble, grid, vars]
        out_of_place = getattr(self, "_gtnorm_residual_out_of_place", {}).get(dataset_name, False)
        # A dtype promotion of the in-place add is Anemoi's to do.
        if x_skip is None or x_skip.dtype != dtype or not out_of_place:
            return super()._assemble_output(x_out, x_skip, batch_size, ensemble_size, dtype, dataset_name)
        output_idx = self._internal_output_idx[dataset_name].to(x_out.device, non_blocking=True)
        input_idx = self._internal_input_idx[dataset_name].to(x_skip.device, non_blocking=True)
        grid = x_out.shape[0] // (batch_size * ensemble_size)
        x_out = x_out.reshape(batch_size, ensemble_size, grid, self.n_step_output, -1).permute(0, 3, 1, 2, 4)
        x_out = x_out.to(dtype).index_add(-1, output_idx, x_skip.index_select(-1, input_idx))
        for bounding in self.boundings[dataset_name]:
            x_out = bounding(x_out)
        return x_out
