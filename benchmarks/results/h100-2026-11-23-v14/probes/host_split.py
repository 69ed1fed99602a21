"""Device probe of session 14: where the host time of one f+b call goes (worker-thread split), and what a direct
launch of a compiled Triton kernel costs against kernel[grid](...)."""

import collections
import functools
import sys
import time

import torch
import triton
import triton.language as tl

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.host_time import loop_us
from gtnorm.triton import ops

try:
    from anemoi.models.triton.gt import graph_transformer_attention_conv as anemoi_conv
    from anemoi.models.triton.utils import edge_index_to_csc
except ImportError:
    anemoi_conv = None

acc = collections.defaultdict(float)
cnt = collections.Counter()
stamps = {}


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        t = time.perf_counter()
        r = fn(*a, **k)
        acc[name] += time.perf_counter() - t
        cnt[name] += 1
        return r

    return wrapper


def enqueue_us(fn, n=100, trials=7):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(trials):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    return sorted(best)[trials // 2]


@triton.jit
def _three_args(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class _Null(torch.autograd.Function):
    @staticmethod
    def forward(ctx, launch, *inputs):
        q = inputs[0]
        ctx.save_for_backward(*inputs[:11], q, None)
        ctx.layout = inputs[11:22]
        ctx.set_materialize_grads(False)
        return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32), None

    @staticmethod
    def backward(ctx, g, *_):
        saved = ctx.saved_tensors
        grads = [torch.empty_like(t) if t is not None else None for t in saved[:11]]
        return None, *grads, *([None] * 14)


def run(graph_name, heads, channels=64):
    device = torch.device("cuda")
    graph = load_graph(graph_name)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()

    q = randn(graph.num_dst, heads, channels)
    k, v = randn(graph.num_src, heads, channels), randn(graph.num_src, heads, channels)
    e = randn(graph.num_edges, heads, channels)
    w_q = torch.ones(channels, device=device, requires_grad=True)
    w_k = torch.ones(channels, device=device, requires_grad=True)
    grad = torch.randn_like(q)
    edge_index = graph.edge_index.to(device)
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (graph.num_src, graph.num_dst))
    leaves = [q, k, v, e, w_q, w_k]
    inputs = [q, k, v, e, None, None, None, w_q, None, w_k, None, *layout.tensors()]
    print(f"== {graph_name} H={heads}: {graph.num_src}->{graph.num_dst}, {graph.num_edges} edges", flush=True)

    def op():
        norm = dict(qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k)
        return gtnorm.graph_transformer_attention(q, k, v, e, layout, **norm)

    def row(label, us):
        print(f"  {label:48s} {us:8.1f} us", flush=True)

    row("op f+b loop", loop_us(lambda: op().backward(grad), leaves))
    row("op f+b enqueue", enqueue_us(lambda: [setattr(t, "grad", None) for t in leaves] and op().backward(grad)))
    with torch.no_grad():
        row("op fwd no_grad loop", loop_us(op))
        row("op fwd no_grad enqueue", enqueue_us(op))
    row("null Function f+b (same arity, empties) loop",
        loop_us(lambda: _Null.apply(None, *inputs, "rms", 1e-6, 1e-6)[0].backward(grad), leaves))  # fmt: skip
    if anemoi_conv is not None:
        csc, perm, reverse = edge_index_to_csc(edge_index, (graph.num_src, graph.num_dst), reverse=True)

        def anemoi():
            edges = e.index_select(0, perm) if perm is not None else e
            return anemoi_conv(q, k, v, edges, csc, reverse)

        row("anemoi kernel f+b loop (no norm)", loop_us(lambda: anemoi().backward(grad), leaves))
        with torch.no_grad():
            row("anemoi kernel fwd loop", loop_us(anemoi))

    # Split of one f+b call: instrument functions (wrappers add ~1 us each).
    saved = {}
    names = {
        "attention_forward": ops,
        "attention_backward": ops,
        "new_output": ops,
        "_zero_rows": ops,
        "_param_grads": ops,
        "column_sum": ops,
    }
    for name, mod in names.items():
        saved[(mod, name)] = getattr(mod, name)
        setattr(mod, name, timed(name, getattr(mod, name)))
    kernels = [ops.graph_attention_forward_kernel, ops.edge_softmax_backward_by_destination_kernel,
               ops.edge_softmax_backward_by_source_kernel]  # fmt: skip
    for kern in kernels:
        kern.run = timed("launch " + kern.fn.__name__, kern.run)
    orig_bwd = ops._EagerGraphAttention.backward

    def bwd(ctx, *g):
        stamps["enter"] = time.perf_counter()
        r = orig_bwd(ctx, *g)
        stamps["exit"] = time.perf_counter()
        return r

    ops._EagerGraphAttention.backward = staticmethod(bwd)
    acc.clear()
    cnt.clear()
    reps = 200
    for i in range(reps + 20):
        if i == 20:
            acc.clear()
            cnt.clear()
        for t in leaves:
            t.grad = None
        t0 = time.perf_counter()
        out = op()
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        acc["[main] forward call"] += t1 - t0
        acc["[main] backward call"] += t2 - t1
        acc["[engine] backward call -> our backward"] += stamps["enter"] - t1
        acc["[ours] backward body"] += stamps["exit"] - stamps["enter"]
        acc["[engine] our backward -> return"] += t2 - stamps["exit"]
        for key in ("[main] forward call", "[main] backward call", "[engine] backward call -> our backward",
                    "[ours] backward body", "[engine] our backward -> return"):  # fmt: skip
            cnt[key] += 1
    torch.cuda.synchronize()
    for key in sorted(acc):
        print(f"  {key:48s} {acc[key] / reps * 1e6:8.1f} us per f+b  ({cnt[key] / reps:.0f} calls)")
    for (mod, name), fn in saved.items():
        setattr(mod, name, fn)
    for kern in kernels:
        del kern.run
    ops._EagerGraphAttention.backward = orig_bwd

    # Direct launch of the compiled forward kernel against kernel[grid](...).
    captured = {}
    kern = ops.graph_attention_forward_kernel
    orig_run = kern.run

    def grab(*a, grid, warmup, **kw):
        captured["args"], captured["kw"], captured["grid"] = a, kw, grid
        captured["kernel"] = orig_run(*a, grid=grid, warmup=warmup, **kw)
        return captured["kernel"]

    kern.run = grab
    with torch.no_grad():
        op()
    del kern.run
    a, kw, grid = captured["args"], captured["kw"], captured["grid"]
    compiled = captured["kernel"]
    binder = kern.device_caches[torch.cuda.current_device()][4]
    bound, spec, opts = binder(*a, **kw)
    values = list(bound.values())
    stream = torch.cuda.current_stream().cuda_stream
    g = tuple(grid) + (1,) * (3 - len(grid))
    with torch.no_grad():
        row(f"fwd kernel[grid] enqueue ({len(values)} args)", enqueue_us(lambda: kern[grid](*a, **kw)))
        row("fwd binder alone", enqueue_us(lambda: binder(*a, **kw)))
        row("fwd direct compiled.run enqueue",
            enqueue_us(lambda: compiled.run(*g, stream, compiled.function, compiled.packed_metadata, None, None,
                                            None, *values)))  # fmt: skip
        get_stream = torch._C._cuda_getCurrentRawStream
        row("fwd direct run + stream + key tuple",
            enqueue_us(lambda: (tuple((t.dtype, t.data_ptr() % 16 == 0) if isinstance(t, torch.Tensor) else t
                                      for t in values),
                                compiled.run(*g, get_stream(0), compiled.function, compiled.packed_metadata, None,
                                             None, None, *values))))  # fmt: skip
        x = torch.zeros(64, device="cuda")
        row("empty kernel 3 args enqueue", enqueue_us(lambda: _three_args[(1,)](x, 16, BLOCK=16)))
        row("torch.empty enqueue", enqueue_us(lambda: torch.empty((1000, 16), device="cuda")))
        row("index_fill_ enqueue (64 rows)",
            enqueue_us(lambda: x.index_fill_(0, torch.arange(8, device="cuda"), 0)))  # fmt: skip


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    x = torch.zeros(16, device="cuda", requires_grad=True)
    print(f"trivial backward loop {loop_us(lambda: (x * 2).sum().backward(), [x]):.1f} us")
    for spec in sys.argv[1:] or ["h_to_h_tiny:16", "h_to_era_small:4"]:
        name, heads = spec.split(":")
        run(name, int(heads))


if __name__ == "__main__":
    main()
