import sys

import torch

sys.path.insert(0, ".")
import gtnorm
from tests.graphs import make_graph
from tests.triton.test_attention import layout_of
from tests.triton.test_edge_projection import leaf_copies, make_inputs, rel_error, run_gtnorm, run_reference

dev = "cuda"


def materialised(inputs, layout, grad_out, qk):
    e = (inputs["edge_features"].detach() @ inputs["edge_weight"].detach() + inputs["edge_bias"].detach())
    e = e.view(-1, *inputs["query"].shape[1:]).float().to(dev).requires_grad_()
    names = ["query", "key", "value", "q_norm_weight", "q_norm_bias", "k_norm_weight"]
    t = {n: inputs[n].detach().float().to(dev).requires_grad_() for n in names if inputs.get(n) is not None}
    out = gtnorm.graph_transformer_attention(t["query"], t["key"], t["value"], e, layout, qk_norm=qk, eps=1e-5,
        q_norm_weight=t["q_norm_weight"], q_norm_bias=t.get("q_norm_bias"), k_norm_weight=t["k_norm_weight"])
    gq, gk = torch.autograd.grad(out, [t["query"], t["key"]], grad_out.to(dev))
    return gq.cpu(), gk.cpu()


for qk, bias, D in (("layer", True, 3), ("layer", False, 8), ("rms", True, 3)):
    rows = []
    for seed in range(16):
        graph = make_graph("encoder_like", seed=seed)
        inputs = make_inputs(graph, 3, 5, D, bias=True, qk_norm=qk, seed=seed)
        g = torch.randn(graph.num_dst, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        ro, rg = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, g, qk, eps=1e-5)
        fo, fg = run_reference(leaf_copies(inputs, torch.float32, dev), graph, g.float().to(dev), qk, eps=1e-5)
        go, gg = run_gtnorm(leaf_copies(inputs, torch.float32, dev), layout_of(graph), g.float().to(dev), qk, eps=1e-5)
        mq, mk = materialised(inputs, layout_of(graph), g.float(), qk)
        e = lambda a, n: rel_error(a[n].cpu(), rg[n])
        rows.append((max(e(gg, "query"), e(gg, "key")), max(e(fg, "query"), e(fg, "key")),
                     max(rel_error(mq, rg["query"]), rel_error(mk, rg["key"]))))
    rows.sort(reverse=True)
    print(qk, D, "worst dq/dk err over 16 seeds (projection, pyg fp32, materialised):",
          [tuple(f"{x:.1e}" for x in r) for r in rows[:4]], flush=True)
