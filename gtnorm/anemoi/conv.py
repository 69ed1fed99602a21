"""The drop-in blocks' conv: an instance of Anemoi's own GraphTransformerConv class that computes with gtnorm.

Code that inspects a model (Anemoi's tests, exporters, checkpoint tools) finds ``block.conv`` where Anemoi puts
it, a submodule of Anemoi's ``anemoi.models.layers.conv.GraphTransformerConv`` class with its attributes
(``out_channels``, ``dropout``) and no parameters, as Anemoi's own. Its forward, same signature, runs
:class:`gtnorm.GraphTransformerConv` with the block's ``q_norm`` / ``k_norm`` (and ``lin_edge`` where it is fused).
That gtnorm conv is a plain attribute, outside the module tree: the norms and ``lin_edge`` belong to the block,
which registered them; as a submodule it would list their parameters a second time (``conv.fused.q_norm.*``).
"""

from __future__ import annotations

from anemoi.models.layers.conv import GraphTransformerConv as AnemoiGraphTransformerConv
from torch import Tensor, nn

from gtnorm.nn.conv import GraphTransformerConv


class FusedGraphTransformerConv(AnemoiGraphTransformerConv):
    """Anemoi's GraphTransformerConv (isinstance holds), computing with gtnorm's fused kernels.

    Args:
        out_channels: channels per head (C), as Anemoi's conv takes it.
        backend, q_norm, k_norm, lin_edge: those of :class:`gtnorm.GraphTransformerConv`; the modules are the
            block's own.

    Shapes: as :class:`gtnorm.GraphTransformerConv`: query [N_dst, H, C]; key, value [N_src, H, C]; edge_attr
    [M, H, C] ([M, D] raw attributes where lin_edge is fused); edge_index [2, M]; output [N_dst, H, C].
    """

    def __init__(
        self,
        out_channels: int,
        *,
        backend: str,
        q_norm: nn.Module | None,
        k_norm: nn.Module | None,
        lin_edge: nn.Linear | None,
    ):
        super().__init__(out_channels=out_channels)
        fused = GraphTransformerConv(out_channels, backend=backend, q_norm=q_norm, k_norm=k_norm, lin_edge=lin_edge)
        object.__setattr__(self, "fused", fused)  # not a submodule: see the module docstring

    @property
    def lin_edge(self) -> nn.Linear | None:
        """The block's lin_edge where the kernels apply it, else None (the block applies it)."""
        return self.fused.lin_edge

    def forward(
        self,
        query: Tensor,  # [N_dst, H, C]
        key: Tensor,  # [N_src, H, C]
        value: Tensor,  # [N_src, H, C]
        edge_attr: Tensor | None,  # [M, H, C]; [M, D] raw attributes where lin_edge is fused
        edge_index: Tensor,  # [2, M]: row 0 = source, row 1 = destination
        size: tuple[int, int] | None = None,  # (N_src, N_dst)
    ) -> Tensor:  # [N_dst, H, C]
        if self.dropout and self.training:
            # Anemoi's conv drops attention weights; the kernels have no dropout. Its blocks build the conv with 0.
            raise NotImplementedError(
                f"conv.dropout={self.dropout}: gtnorm's kernels have no attention dropout (Anemoi's blocks use 0)"
            )
        return self.fused(query, key, value, edge_attr, edge_index, size=size)

    def extra_repr(self) -> str:
        return f"out_channels={self.out_channels}, {self.fused.extra_repr()}"
