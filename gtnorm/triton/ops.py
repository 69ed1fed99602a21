"""Op glue: the walk's launches (attention_launch.py) as ``torch.library`` custom ops with fake impls and autograd,
and :func:`graph_attention`, which runs them.

The layout's index tensors are op arguments (not a Python object) so that torch.compile can trace the op and
the autograd formula can hand them to the backward op. Outside torch.compile the same implementations and the
same autograd formula run as a plain ``torch.autograd.Function``: the custom-op dispatch (argument binding,
schema checks, its autograd wrapper) costs host time on every call that only tracing needs.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

from gtnorm.triton.attention_launch import attention_backward, attention_forward, extended_dim_of
from gtnorm.triton.config import AttentionLaunchConfig
from gtnorm.triton.kept_outputs import run_or_replay


def _op_schema(fn, outputs: int | None = None) -> str:
    """``fn``'s schema without its ``launch`` argument: a plan is a Python object, which an op cannot take, so
    the custom ops (what torch.compile traces) always run the default plan. ``outputs``: the op returns that many
    tensors (where fn may return None for some)."""
    signature = inspect.signature(fn)

    def prototype():  # defined here, so fn's string annotations resolve in this module's namespace
        pass

    kept = [p for name, p in signature.parameters.items() if name != "launch"]
    returns = signature.return_annotation if outputs is None else tuple[(Tensor,) * outputs]
    prototype.__signature__ = signature.replace(parameters=kept, return_annotation=returns)
    return torch.library.infer_schema(prototype, mutates_args=())


def _recorded_forward(*args, **kwargs) -> tuple[Tensor, Tensor, Tensor | None]:
    """attention_forward, or what a checkpointed region's forward kept of this call for its recompute
    (kept_outputs.py): the training paths' forward. attention_forward is looked up per call (tests count it)."""
    return run_or_replay(attention_forward, *args, **kwargs)


def _attention_forward_op(*args, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
    """attention_forward with an empty fp32 query_proj where there is none, as an op must return tensors."""
    out, lse, query_proj = _recorded_forward(*args, **kwargs)
    return out, lse, query_proj if query_proj is not None else lse.new_empty(0)


# A CUDA graph replays the ops' kernels, not their Python: captured (torch.compile's mode="reduce-overhead"), an op
# handed an edge_index would run every later graph of that shape on the layout found at capture. Tagged unsafe, the
# capture is split around the ops (torch >= 2.9 knows the tag).
_NOT_IN_CUDA_GRAPHS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

graph_attention_forward = torch.library.custom_op(
    "gtnorm::graph_attention_forward",
    mutates_args=(),
    schema=_op_schema(attention_forward, outputs=3),
    tags=_NOT_IN_CUDA_GRAPHS,
)(_attention_forward_op)


@graph_attention_forward.register_fake
def _(query, key, value, edge_attr, edge_features, edge_weight, edge_bias, *norm_params_layout_and_flags):
    proj_shape = (*query.shape[:2], extended_dim_of(edge_features, edge_bias)) if edge_features is not None else (0,)
    return (
        torch.empty_like(query),
        query.new_empty(query.shape[:2], dtype=torch.float32),
        query.new_empty(proj_shape, dtype=torch.float32),
    )


# query, key, value, edge_attr, edge_features, edge_weight, edge_bias, q_norm_weight, q_norm_bias, k_norm_weight,
# k_norm_bias: the op's differentiable inputs, in its argument order.
_TENSOR_INPUTS = 11
_EDGE_FEATURES_INPUT = 4
_NORM_PARAMS = 4


def _attention_backward_op(*args, **kwargs) -> tuple[Tensor, ...]:
    """attention_backward with an empty fp32 tensor for every absent gradient, as an op must return tensors (each
    its own: outputs may not alias)."""
    grads = attention_backward(*args, **kwargs)
    empty = functools.partial(torch.empty, 0, dtype=torch.float32, device=grads[0].device)
    # The eager path hands out a norm's weight and bias gradients as views of one sum (_param_grads): the second
    # of two that share memory is copied. By storage, not by ``_base``: under a dispatch mode (opcheck's schema
    # check) a slice's result has no ``_base``.
    outputs, storages = [], set()
    for grad in grads:
        if grad is None:
            grad = empty()
        elif grad.numel():
            storage = grad.untyped_storage().data_ptr()
            grad = grad.clone() if storage in storages else grad
            storages.add(storage)
        outputs.append(grad)
    return tuple(outputs)


graph_attention_backward = torch.library.custom_op(
    "gtnorm::graph_attention_backward",
    mutates_args=(),
    schema=_op_schema(attention_backward, outputs=_TENSOR_INPUTS),
    tags=_NOT_IN_CUDA_GRAPHS,
)(_attention_backward_op)


@graph_attention_backward.register_fake
def _(grad_out, query, key, value, edge_attr, edge_features, edge_weight, edge_bias, *rest):
    def grad_or_empty(t):
        empty = query.new_empty((0,), dtype=torch.float32)
        return t.new_empty(t.shape) if t is not None else empty  # contiguous, as the real grads

    norm_params, edge_features_grad = rest[:_NORM_PARAMS], rest[-1]
    return (
        torch.empty_like(query),
        torch.empty_like(key),
        torch.empty_like(value),
        grad_or_empty(edge_attr),
        grad_or_empty(edge_features if edge_features_grad else None),
        grad_or_empty(edge_weight),
        grad_or_empty(edge_bias),
        *(grad_or_empty(p) for p in norm_params),
    )


def _setup_context(ctx, inputs, output, graph_on_ctx: bool = False):
    """``graph_on_ctx``: hold the layout's index tensors (or the edge_index) as a plain attribute instead of saving
    them (eager path only: torch.compile's tracing needs every tensor the backward reads saved). They are static
    (the layout cache owns them, nothing writes them), so the version checks of saved tensors guard nothing there,
    and under activation checkpointing (Anemoi's blocks) every saved tensor runs a Python pack hook in the forward
    and an unpack hook in the backward: 11 of each per call, for arrays no recompute needs to rebuild."""
    tensors = inputs[:_TENSOR_INPUTS]
    graph, ctx.qk_norm, ctx.eps_q, ctx.eps_k = inputs[_TENSOR_INPUTS:]
    _out, lse, query_proj = output
    if graph_on_ctx:
        ctx.save_for_backward(*tensors, lse, query_proj)
        ctx.graph = graph
    else:
        ctx.save_for_backward(*tensors, lse, query_proj, *graph)
        ctx.graph = None
    edge_features = tensors[_EDGE_FEATURES_INPUT]
    ctx.edge_features_grad = edge_features is not None and edge_features.requires_grad
    ctx.mark_non_differentiable(*(t for t in (lse, query_proj) if t is not None))


def _backward(ctx, grad_out, _grad_lse, _grad_query_proj, backward=torch.ops.gtnorm.graph_attention_backward):
    saved = ctx.saved_tensors  # once: under checkpointing each access unpacks them again
    inputs = saved[:_TENSOR_INPUTS]
    graph = ctx.graph if ctx.graph is not None else list(saved[_TENSOR_INPUTS + 2 :])
    lse, query_proj = saved[_TENSOR_INPUTS : _TENSOR_INPUTS + 2]
    edge_features_grad = ctx.edge_features_grad
    grads = backward(grad_out, *inputs, lse, query_proj, graph, ctx.qk_norm, ctx.eps_q, ctx.eps_k, edge_features_grad)
    # d edge_features is empty unless asked for: None there, as for absent inputs.
    needed = [t is not None for t in inputs]
    needed[_EDGE_FEATURES_INPUT] = edge_features_grad
    # The custom op's autograd wants a gradient per tensor of the graph list; the eager Function one None for it.
    no_graph_grad = None if ctx.graph is not None else [None] * len(graph)
    return *(grad if need else None for grad, need in zip(grads, needed, strict=True)), no_graph_grad, None, None, None


graph_attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerGraphAttention(torch.autograd.Function):
    """The custom op's forward, backward and autograd formula, without its dispatch (module docstring)."""

    @staticmethod
    def forward(ctx, launch, *inputs):
        output = _recorded_forward(*inputs, launch=launch)
        _setup_context(ctx, inputs, output, graph_on_ctx=True)
        ctx.launch = launch
        # lse takes no gradient: without this autograd would allocate and zero-fill one for it at every backward.
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse, grad_query_proj):
        backward = functools.partial(attention_backward, launch=ctx.launch)
        return None, *_backward(ctx, grad_out, grad_lse, grad_query_proj, backward=backward)


def graph_attention(*inputs, launch: AttentionLaunchConfig | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, query_proj) of the attention (:func:`attention_forward`); inputs as attention_forward takes them,
    ``launch`` the plan (None: attention_launch_config's). The custom op where torch.compile traces, the same
    functions directly elsewhere."""
    if torch.compiler.is_compiling():
        if launch is not None:
            raise ValueError("a launch plan cannot be passed through torch.compile: the custom ops run the default")
        return graph_attention_forward(*inputs)
    if not torch.is_grad_enabled():  # inference: no graph to record, and Function.apply's own cost saved (v22)
        return attention_forward(*inputs, launch=launch)
    return _EagerGraphAttention.apply(launch, *inputs)
