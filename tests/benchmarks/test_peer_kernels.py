"""benchmarks/peer_kernels.py: a peer's kernel files load from the path given, their imports of each other resolve to
those files, and the installed anemoi-models is left as it was."""

import sys
import textwrap

import pytest
import torch

from benchmarks.graphs.catalog import BenchGraph
from benchmarks.graphs.variants import build_variant, make_inputs
from benchmarks.peer_kernels import PACKAGE, find_triton_dir, load_anemoi_fused_qk

# Stand-ins for the branch's three files, importing each other as the branch's do; the Function adds its qk_norm code
# to q so the test can see which code the loader passes.
FAKE_FILES = {
    "utils.py": "MARK = 'peer utils'\n",
    "norm.py": "from anemoi.models.triton.utils import MARK\nNORM_MARK = MARK + ' via norm'\n",
    "gt.py": textwrap.dedent(
        """
        import torch
        from anemoi.models.triton.norm import NORM_MARK
        from anemoi.models.triton.utils import MARK


        class GraphTransformerFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, e, csc, reverse, qk_norm):
                return q + qk_norm

            @staticmethod
            def backward(ctx, grad):
                return grad, None, None, None, None, None, None
        """
    ),
}


@pytest.fixture
def checkout(tmp_path):
    folder = tmp_path / "anemoi-core" / "models/src/anemoi/models/triton"
    folder.mkdir(parents=True)
    for name, text in FAKE_FILES.items():
        (folder / name).write_text(text)
    return tmp_path / "anemoi-core"


def test_loads_from_a_checkout_a_folder_or_gt_py(checkout):
    folder = checkout / "models/src/anemoi/models/triton"
    before = {name: sys.modules.get(f"{PACKAGE}.{name}") for name in ("utils", "norm", "gt")}
    for path in (checkout, folder, folder / "gt.py"):
        assert find_triton_dir(path) == folder
        attention = load_anemoi_fused_qk(path, "layer")
        q = torch.zeros(3, 2, 4)
        assert torch.equal(attention(q, q, q, q, None, None), q + 2)  # the branch's code for LayerNorm
    assert {name: sys.modules.get(f"{PACKAGE}.{name}") for name in ("utils", "norm", "gt")} == before


def test_clear_errors(tmp_path, checkout):
    with pytest.raises(FileNotFoundError, match="gt.py, norm.py and utils.py"):
        find_triton_dir(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="qk_norm"):
        load_anemoi_fused_qk(checkout, "group")
    edge_index = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2]])
    graph = BenchGraph("tiny", "encoder", edge_index, 4, 3, "test graph")
    inputs = make_inputs(graph, heads=2, channels=8, dtype=torch.float32, device=torch.device("cpu"), eps=1e-5)
    with pytest.raises(ValueError, match="--anemoi-fused-qk"):
        build_variant("anemoi_fused_qk", inputs)
