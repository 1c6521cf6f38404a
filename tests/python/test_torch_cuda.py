"""The torch backend on cuda tensors, on a real GPU (scripts/device-check.sh runs this; without a
CUDA build of torch and a device every test skips, saying why). The ranks are processes sharing
device 0; railyardd runs with --cuda_ipc (PyTorch's caching allocator hands out cudaMalloc'd
segments, registered by legacy CUDA IPC). test_torch_device.py runs the same backend paths on
fake device memory everywhere.
"""

from __future__ import annotations

import os

import pytest
from conftest import Daemon, RankPool

import rank_tasks

torch = pytest.importorskip("torch")


def _why_no_gpu():
    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) was built without CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


@pytest.fixture(scope="module")
def gpu_ranks():
    why = _why_no_gpu()
    if why is not None:
        pytest.skip(why)
    daemon = Daemon("--cuda_ipc", node_name="pytest-torch-cuda")
    pool = RankPool(2, {"RAILYARD_SOCKET": daemon.socket, "RAILYARD_JOB": "torch-cuda",
                        "RAILYARD_TOKEN": ""})
    try:
        yield pool
    finally:
        pool.close()
        daemon.stop()


def test_collectives_and_ddp_on_cuda_tensors(gpu_ranks, tmp_path):
    n = 2
    store = os.path.join(str(tmp_path), "store")
    results = gpu_ranks.run(rank_tasks.torch_cuda_collectives,
                            [(r, n, store) for r in range(n)], timeout=240)
    for r, got in enumerate(results):
        assert got["all_reduce"] == [2.0 * (1 + 2)] * 4, r  # (1 + 2), doubled by stream work
        assert got["strided_max"] == [1.0 + 4 * i + (n - 1) for i in range(6)], r
        assert got["strided_rest"] == [4.0 * i + r for i in range(6)], r
        assert got["all_gather_base"] == [float(q) for q in range(n) for _ in range(3)], r
        assert got["all_gather"] == [[q, -q] for q in range(n)], r
        assert got["broadcast"] == [float(n - 1)] * 5, r
        assert got["ddp_max_diff"] < 1e-5, r
