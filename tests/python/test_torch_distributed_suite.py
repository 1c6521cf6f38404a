"""PyTorch's own test suite for torch.distributed backends, run against the "railyard" backend.

The suite is ``torch.testing._internal.distributed.distributed_test`` (the body of PyTorch's
``test/distributed/test_distributed_spawn.py``), as shipped by Debian's python3-torch 1.13. It
runs here with railyard as a "plugin" backend that also has the "ddp" and "subgroup" features,
world size 3, every test in 3 fresh processes talking to one railyardd (the session's ``daemon``
fixture of conftest.py). Its own CTest entry (python_torch_suite) runs it; the
python_tests entry leaves it out, so the two run side by side.

The suite decides at import time which tests run, partly by the backend's *name* ("Only gloo
backend supports timeouts", ...). Those name gates are lifted for railyard: see NAME_GATES. Every
other gate (CUDA, NCCL, world size, ...) stays. Tests that fail for gloo too, for a reason of
this machine's environment, are listed in ENVIRONMENT_FAILURES.

Environment:
    RAILYARD_TORCH_SUITE_BACKEND  ``railyard`` (default) or ``gloo``: the same suite against
                                  gloo, as the reference it is compared with.
    RAILYARD_TORCH_SUITE_START    ``spawn`` (default, as test_distributed_spawn.py) or ``fork``:
                                  how each test's processes start. Spawned, each of them imports
                                  torch and the suite again: ten times the CPU of fork (here 21
                                  CPU minutes against 2). CTest runs it with fork, which gives the
                                  same outcome for every test, for both backends. (Spawn all
                                  the same where other test modules of the same run connected
                                  this process to a daemon: gRPC does not survive fork.)
    DISTRIBUTED_TESTS_DEFAULT_TIMEOUT  seconds a test's processes may take (default here 180).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import tempfile
import unittest
from typing import Optional

import pytest

WORLD_SIZE = 3
START_METHOD = os.environ.get("RAILYARD_TORCH_SUITE_START", "spawn")
if START_METHOD not in ("spawn", "fork"):
    raise ValueError(f"RAILYARD_TORCH_SUITE_START={START_METHOD!r}: expected spawn or fork")
SUITE_BACKEND = os.environ.get("RAILYARD_TORCH_SUITE_BACKEND", "railyard")
if SUITE_BACKEND not in ("railyard", "gloo"):
    raise ValueError(f"RAILYARD_TORCH_SUITE_BACKEND={SUITE_BACKEND!r}: expected railyard or gloo")

# The suite reads these when it is imported (here, and again in every spawned test process, which
# imports this module to find the test class; they inherit the environment).
os.environ["BACKEND"] = SUITE_BACKEND
os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "180")
# As PyTorch's run_test.py runs the spawn suite: a file:// init method (tests that re-initialize
# the default group need it; each test's setUp points it at a fresh file).
# A fresh directory per run (the test processes inherit the variable): a fixed path outlives a
# run whose processes were killed, and torch's store-based barrier then counts the old run's
# ranks too ("worker_count=12" for world size 3) and times out.
if not os.environ.get("INIT_METHOD", "").startswith("file://"):
    os.environ["INIT_METHOD"] = "file://" + os.path.join(tempfile.mkdtemp(prefix="ry-suite-"),
                                                         "init")

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

try:
    import expecttest  # noqa: F401
except ImportError:  # not packaged in Debian: the suite needs two names of it (see stand_ins/)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins"))

if "torch.testing._internal.distributed.distributed_test" in sys.modules:
    raise RuntimeError("distributed_test was imported before this module could configure it")

from torch.testing._internal import common_distributed, common_utils  # noqa: E402

# Skip reasons that gate a test on the backend's name only (the test needs nothing railyard
# lacks: CPU tensors, operations the backend implements). Lifted for railyard; every other gate
# keeps skipping. Each must lift at least one test (checked below), so the list cannot go stale.
NAME_GATES = {
    "Test requires backend to be one of {'gloo'}",
    # The suite's "gpu" backends. Its object collectives (all_gather_object, gather_object,
    # broadcast_object_list) need no GPU but have only this gate; every other test behind it
    # needs CUDA and has a CUDA gate of its own, which still skips it (see _cuda_skip).
    "Test requires backend to be one of {'gloo', 'nccl'}",
    "Only gloo backend supports timeouts",
    "GLOO Batch Send Recv CPU",
    "Only Gloo backend support sparse all reduce",
    "get_future is only supported on mpi, nccl and gloo",
    # CPU all_to_all, which railyard does (gloo skips these too).
    "Only MPI supports CPU all_to_all_single",
    "Only MPI supports all_to_all",
}

# Tests that fail here for gloo as well, for a reason of this machine's environment: torch 1.13's
# torch.distributed._shard does not import under Python 3.11 (a dataclass field with a mutable
# default), and the suite turns on a DDP mode (ReplicatedTensor) that imports it. Each must fail,
# in every process that fails, with exactly that error as its last line (else the test fails),
# and reports as xfail; one that passes fails too (then it belongs off this list).
ENVIRONMENT_FAILURES = {
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view",
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_ddp_create_graph",
    "test_ddp_logging_data_cpu",
    "test_static_graph_api_cpu",
}
ENVIRONMENT_ERROR = ("ValueError: mutable default <class 'torch.distributed._shard.sharded_tensor."
                     "metadata.TensorProperties'> for field tensor_properties is not allowed: use "
                     "default_factory")

# Tests that cannot apply to a plugin backend, skipped for railyard with the reason: the
# suite's body branches on the backend's name at run time and has no branch for one. (Each
# is in ENVIRONMENT_FAILURES too: gloo reaches the _shard import and fails there.) The branch is
# checked to still be there (test_not_applicable_still_cannot_apply).
NOT_APPLICABLE = {
    name: "distributed_test._test_accumulate_gradients_no_sync builds its model only for "
          "BACKEND mpi, gloo or nccl (for any other backend it fails with UnboundLocalError)"
    for name in ("test_accumulate_gradients_no_sync",
                 "test_accumulate_gradients_no_sync_allreduce_hook",
                 "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
                 "test_accumulate_gradients_no_sync_grad_is_view")
}

lifted: dict = {}  # reason -> names of the tests whose gate was lifted


def _normal(reason: str) -> str:
    """A skip reason with the set it names in sorted order (the suite prints a set of backend
    names, whose order varies with the hash seed)."""
    m = re.fullmatch(r"(.*)(\{'[^{}]*'\})", reason)
    if m is None:
        return reason
    names = sorted(re.findall(r"'([^']*)'", m.group(2)))
    return m.group(1) + "{" + ", ".join(repr(n) for n in names) + "}"


def _lifting(skip_if):
    """Wraps sandcastle_skip_if / sandcastle_skip so that a NAME_GATES reason marks nothing.

    The gates are applied while distributed_test is imported; intercepting them there (rather than
    clearing ``__unittest_skip__`` afterwards) keeps the other gates stacked on the same test:
    unittest keeps only the outermost reason, and functools.wraps copies the mark onto wrappers.
    """
    def gate(*args):
        condition, reason = (args[0], args[1]) if len(args) == 2 else (True, args[0])
        decorate = skip_if(*args)
        reason = _normal(reason)
        if not (condition and SUITE_BACKEND == "railyard" and reason in NAME_GATES):
            return decorate

        def lift(func):
            lifted.setdefault(reason, []).append(func.__name__)
            return func
        return lift
    return gate


_originals = (common_utils.sandcastle_skip_if, common_utils.sandcastle_skip)
common_utils.sandcastle_skip_if = _lifting(_originals[0])
common_utils.sandcastle_skip = _lifting(_originals[1])
try:
    if SUITE_BACKEND == "railyard":
        import railyard.torch  # noqa: F401  (registers the backend)
        for feature in ("plugin", "ddp", "subgroup"):
            common_distributed.DistTestCases.backend_feature[feature].add("railyard")
    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest, TestDistBackend)
finally:
    common_utils.sandcastle_skip_if, common_utils.sandcastle_skip = _originals

if SUITE_BACKEND == "railyard":
    _stale = NAME_GATES - set(lifted)
    assert not _stale, f"NAME_GATES reasons that gate no test (suite changed?): {_stale}"


_NO_GPU_WRAPPER = common_distributed.skip_if_no_gpu(lambda: None).__code__
_LT_X_GPU_WRAPPER = common_distributed.skip_if_lt_x_gpu(1)(lambda: None).__code__


def _cuda_skip(func) -> Optional[str]:
    """The skip that the processes of a test behind skip_if_no_gpu / skip_if_lt_x_gpu would exit
    with on this machine (None: they would run it). With CUDA devices, such a test is skipped for
    railyard anyway: it moves CUDA tensors, also in operations railyard takes on the CPU only."""
    skips = common_distributed.TEST_SKIPS
    while func is not None:
        code = getattr(func, "__code__", None)  # wraps() copies the names, not the code
        if code in (_NO_GPU_WRAPPER, _LT_X_GPU_WRAPPER) and SUITE_BACKEND == "railyard" and \
                torch.cuda.is_available():
            return ("needs CUDA tensors in operations railyard runs on CPU tensors only "
                    "(its cuda path: tests/python/test_torch_cuda.py)")
        if code is _NO_GPU_WRAPPER:
            if not torch.cuda.is_available():
                return skips["no_cuda"].message
            if torch.cuda.device_count() < WORLD_SIZE:
                return skips[f"multi-gpu-{WORLD_SIZE}"].message
        elif code is _LT_X_GPU_WRAPPER:
            x = inspect.getclosurevars(func).nonlocals["x"]
            if not (torch.cuda.is_available() and torch.cuda.device_count() >= x):
                return skips[f"multi-gpu-{x}"].message
        func = getattr(func, "__wrapped__", None)
    return None


def _start_method() -> str:
    """START_METHOD, except spawn where this process has connected to a railyardd (other test
    modules of the same pytest run): gRPC does not survive fork, and railyard refuses to connect
    from a child forked after that."""
    if START_METHOD == "fork" and "railyard.client" in sys.modules and \
            sys.modules["railyard.client"]._grpc_pid == os.getpid():
        return "spawn"
    return START_METHOD


def _environment_failure(text: str) -> bool:
    """Whether the failure of a test's processes (the main process's RuntimeError) is the
    ENVIRONMENT_ERROR in each process that failed, and nothing else."""
    blocks = re.split(r"Process \d+ exited with error code \d+ and exception:\n", text)[1:]
    return bool(blocks) and all(b.strip().splitlines()[-1] == ENVIRONMENT_ERROR for b in blocks)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As in test_distributed_spawn.py. Tests whose spawned processes would only exit with a CUDA
    skip (no GPU here) are skipped with the same words before spawning them (a third of the
    suite: it saves their 3 process starts each); so are NOT_APPLICABLE ones for railyard."""

    def __init__(self, method_name: str = "runTest") -> None:
        super().__init__(method_name)
        if method_name in ENVIRONMENT_FAILURES:
            run = getattr(self, method_name)

            def expect_environment_failure() -> None:
                if self.rank != self.MAIN_PROCESS_RANK:
                    return run()
                try:
                    run()
                except RuntimeError as e:
                    if _environment_failure(str(e)):
                        pytest.xfail("torch.distributed._shard does not import here: "
                                     + ENVIRONMENT_ERROR)
                    raise
                raise AssertionError(f"{method_name} passed: remove it from "
                                     "ENVIRONMENT_FAILURES")

            setattr(self, method_name, expect_environment_failure)

    def setUp(self):
        skip = _cuda_skip(getattr(type(self), self._testMethodName, None))
        if SUITE_BACKEND == "railyard" and self._testMethodName in NOT_APPLICABLE:
            skip = "not applicable to a plugin backend: " + NOT_APPLICABLE[self._testMethodName]
        if skip is not None:
            raise unittest.SkipTest(skip)
        super().setUp()
        if _start_method() == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


@pytest.fixture(scope="module", autouse=True)
def _railyard_daemon(request):
    """The daemon the spawned test processes connect to (they inherit the environment)."""
    if SUITE_BACKEND != "railyard":
        yield
        return
    daemon = request.getfixturevalue("daemon")
    saved = {k: os.environ.get(k) for k in ("RAILYARD_SOCKET", "RAILYARD_JOB", "RAILYARD_TOKEN")}
    os.environ.update(RAILYARD_SOCKET=daemon.socket, RAILYARD_JOB="torch-suite",
                      RAILYARD_TOKEN="")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_gates_lifted_are_name_gates_only():
    """The lifted tests run; the CUDA/NCCL gates stacked on the same tests, and every other gate,
    still skip."""
    if SUITE_BACKEND != "railyard":
        pytest.skip("gates are lifted for railyard only")
    base = DistributedTest._DistTestBase
    for reason, names in lifted.items():
        for name in names:
            func = getattr(base, name)
            if getattr(func, "__unittest_skip__", False):  # another gate of its own
                assert func.__unittest_skip_why__ not in NAME_GATES, (name, reason)
    still = {_normal(getattr(f, "__unittest_skip_why__", "")) for f in vars(base).values()
             if getattr(f, "__unittest_skip__", False)}
    assert not still & NAME_GATES
    assert getattr(base.test_sparse_all_reduce_sum_cuda, "__unittest_skip__", False) is False
    if not torch.cuda.is_available():  # skipped by the CUDA gates, not run
        assert _cuda_skip(base.test_sparse_all_reduce_sum_cuda) == "CUDA is not available."
        assert _cuda_skip(base.test_new_subgroups) == "Need at least 2 CUDA devices"
        assert _cuda_skip(base.test_sparse_all_reduce_sum) is None
    assert "Only Nccl supports CUDA all_to_all_single" in still
    assert "Test requires backend to be one of {'nccl'}" in still
    # Every test the "gpu" gate was lifted from either needs no GPU or has a CUDA gate.
    cpu = {"test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
           "test_broadcast_object_list", "test_gather_object", "test_gather_object_subgroup"}
    gpu_gate = lifted["Test requires backend to be one of {'gloo', 'nccl'}"]
    assert cpu <= set(gpu_gate)
    for name in set(gpu_gate) - cpu:
        assert not name.startswith("test_") or _cuda_skip(getattr(base, name)) is not None or \
            torch.cuda.is_available(), name
    assert _normal("Test requires backend to be one of {'nccl', 'gloo'}") == \
        "Test requires backend to be one of {'gloo', 'nccl'}"


def test_environment_failure_is_matched_exactly():
    ok = f"Traceback (most recent call last):\n  ...\n{ENVIRONMENT_ERROR}\n"
    other = "Traceback (most recent call last):\n  ...\nAssertionError: 1 != 2\n"
    chained = (f"{ok}\nDuring handling of the above exception, another exception occurred:\n\n"
               f"{other}")

    def failure(*tracebacks: str) -> str:
        return "".join(f"Process {i} exited with error code 10 and exception:\n{t}\n"
                       for i, t in enumerate(tracebacks))

    assert _environment_failure(failure(ok, ok, ok))
    assert _environment_failure(failure(ok))
    assert not _environment_failure(failure(ok, other))
    assert not _environment_failure(failure(chained))
    assert not _environment_failure("Process 0 terminated or timed out after 180 seconds")


def test_not_applicable_still_cannot_apply():
    source = inspect.getsource(DistributedTest._DistTestBase._test_accumulate_gradients_no_sync)
    assert 'if BACKEND == "mpi" or BACKEND == "gloo":' in source
    assert "model, ddp_model, input, target = self._prepare_cpu_module(" in source
    assert set(NOT_APPLICABLE) <= ENVIRONMENT_FAILURES
