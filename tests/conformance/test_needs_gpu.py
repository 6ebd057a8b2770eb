"""Layer 0 (no process group): one rule says whether a failure needs a GPU, from each kind of evidence it leaves.

:func:`~nemo_dist.conformance.engine.needs_gpu.gpu_need` replaced two detectors
(the gather side's ``mentions_cuda``, the wrapper side's ``_needs_cuda``) and
the pytest mode's reading of rank tracebacks. A yes is a usage error (or a
"Likely cause" note), so the rule must say yes wherever an old one did: the
old detectors are kept here, verbatim, as oracles, and every case checks it.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.needs_gpu import gpu_need
from nemo_dist.conformance.frontends.pytest_plugin import _cuda_cause
from nemo_dist.testing import RankFailure


def _raised(fn: Callable[[], Any]) -> BaseException:
    """What ``fn()`` raised, with its traceback."""
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


def _in_file(filename: str, source: str, name: str) -> Callable[[], Any]:
    """Function ``name`` of ``source``, compiled as if it lived in ``filename`` (its frames carry that path)."""
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]  # type: ignore[no-any-return]


def _asserts_is_cuda() -> None:
    x = torch.zeros(2)
    assert x.is_cuda


def _raises_not_compiled() -> None:
    message = "Torch not compiled with CUDA enabled"
    raise AssertionError(message)


def _raises_no_gpus() -> None:
    message = "No CUDA GPUs are available"
    raise RuntimeError(message)


def _raises_no_gpus_on_its_line() -> None:
    raise RuntimeError("No CUDA GPUs are available")


def _raised_from_nccl_cause() -> None:
    message = "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        raise ValueError("could not build the communicator") from exc


def _raised_while_handling_nvidia() -> None:
    message = "libnvidia-ml.so.1: cannot open shared object file"
    try:
        raise OSError(message)
    except OSError:
        raise ValueError("no device to place the buffers on") from None


def _fails(flag: bool) -> None:
    raise ValueError("rows differ: 2 vs 3")


def _calls_with_cuda_on_its_line() -> None:
    _fails(torch.zeros(1).is_cuda)


_TORCH_CUDA_FRAME = _in_file(
    "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py",
    "def _lazy_init():\n    raise RuntimeError('lazy initialisation failed')\n",
    "_lazy_init",
)
_CUDA_IN_A_PATH = _in_file(
    "/opt/cuda_tools/reader.py", "def read():\n    raise ValueError('bad header')\n", "read"
)

_ASSERT_TEXT = """rank 0 raised AssertionError:\x20
Traceback (most recent call last):
  File "/work/nemo_dist/conformance/suites/gather/target.py", line 120, in first_call
    return self.gather(x)
  File "/work/tests/forks/gallery_gather_asserts_cuda.py", line 40, in gather_on_cuda
    assert x.is_cuda
           ^^^^^^^^^
AssertionError
"""
_RAISING_LINE_TEXT = """rank 1 raised RuntimeError: invalid device ordinal
Traceback (most recent call last):
  File "/work/fork.py", line 12, in gather
    torch.cuda.set_device(rank)
RuntimeError: invalid device ordinal
"""
_TORCH_CUDA_TEXT = """rank 0 raised RuntimeError: lazy initialisation failed
Traceback (most recent call last):
  File "/work/fork.py", line 12, in gather
    setup()
  File "/venv/site-packages/torch/cuda/__init__.py", line 522, in _lazy_init
    raise RuntimeError("lazy initialisation failed")
RuntimeError: lazy initialisation failed
"""
_PATH_AND_CALLER_TEXT = """rank 0 raised ValueError: rows differ
Traceback (most recent call last):
  File "/opt/cuda_tools/reader.py", line 3, in read
    y = to_device(x.cuda())
  File "/work/fork.py", line 9, in to_device
    raise ValueError("rows differ")
ValueError: rows differ
"""

#: (id, the failure, the evidence gpu_need must return: "" for none).
CASES: list[tuple[str, Callable[[], BaseException | str], str]] = [
    ("an-assert-line-naming-is_cuda", lambda: _raised(_asserts_is_cuda), "assert x.is_cuda"),
    ("torch-not-compiled-with-cuda-assertion", lambda: _raised(_raises_not_compiled),
     "AssertionError: Torch not compiled with CUDA enabled"),
    ("no-cuda-gpus-are-available-runtime-error", lambda: _raised(_raises_no_gpus),
     "RuntimeError: No CUDA GPUs are available"),
    ("the-raising-line-comes-before-the-message", lambda: _raised(_raises_no_gpus_on_its_line),
     'raise RuntimeError("No CUDA GPUs are available")'),
    ("an-error-raised-inside-a-torch-cuda-frame", lambda: _raised(_TORCH_CUDA_FRAME),
     "RuntimeError: lazy initialisation failed (raised inside torch.cuda)"),
    ("an-nccl-error-as-the-cause", lambda: _raised(_raised_from_nccl_cause),
     "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"),
    ("an-nvidia-error-as-the-context-even-from-none", lambda: _raised(_raised_while_handling_nvidia),
     "OSError: libnvidia-ml.so.1: cannot open shared object file"),
    ("a-message-quoting-a-path-with-cuda-counts-as-the-old-rules-did",
     lambda: FileNotFoundError("no such file: /data/cuda_runs/x.pt"),
     "FileNotFoundError: no such file: /data/cuda_runs/x.pt"),
    ("relayed-rank-text-with-an-assert-line", lambda: RankFailure({0: _ASSERT_TEXT}, world_size=2),
     "assert x.is_cuda"),
    ("relayed-rank-text-with-a-raising-line-naming-torch-cuda",
     lambda: RankFailure({1: _RAISING_LINE_TEXT}, world_size=2), "torch.cuda.set_device(rank)"),
    ("relayed-rank-text-with-a-torch-cuda-frame", lambda: RankFailure({0: _TORCH_CUDA_TEXT}),
     'File "/venv/site-packages/torch/cuda/__init__.py", line 522, in _lazy_init'),
    ("relayed-text-given-as-a-string", lambda: "rank 0 raised RuntimeError: No CUDA GPUs are available",
     "rank 0 raised RuntimeError: No CUDA GPUs are available"),
    ("a-rank-failure-as-the-cause", lambda: _raised_from(RankFailure({0: _ASSERT_TEXT})), "assert x.is_cuda"),
    ("no-a-value-error-unrelated-to-cuda", lambda: _raised(lambda: _fails(False)), ""),
    ("no-cuda-only-in-the-path-of-the-raising-file", lambda: _raised(_CUDA_IN_A_PATH), ""),
    ("no-cuda-only-on-a-calling-frames-line", lambda: _raised(_calls_with_cuda_on_its_line), ""),
    ("no-relayed-text-with-cuda-only-in-a-path-and-a-caller",
     lambda: RankFailure({0: _PATH_AND_CALLER_TEXT}, world_size=1), ""),
]


def _raised_from(cause: BaseException) -> BaseException:
    def fail() -> None:
        raise RuntimeError("the check's world failed") from cause

    return _raised(fail)


def _old_mentions_cuda(exc: BaseException) -> bool:
    """The gather side's former rule (on a rank's own exception): the raising line or the message speaks of CUDA."""
    frames = traceback.extract_tb(exc.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return bool(re.search("cuda", line, re.IGNORECASE) or re.search("cuda", str(exc), re.IGNORECASE))


def _old_needs_cuda(exc: BaseException) -> bool:
    """The wrapper side's former ``_needs_cuda`` (on a rank's own exception)."""
    current: BaseException | None = exc
    chain: list[BaseException] = []
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in chain:
        if any(word in str(error).lower() for word in ("cuda", "nvidia", "nccl")):
            return True
        frames = traceback.extract_tb(error.__traceback__)
        if any("/torch/cuda/" in frame.filename.replace("\\", "/") for frame in frames):
            return True
        if isinstance(error, AssertionError) and frames and "cuda" in (frames[-1].line or "").lower():
            return True
    return False


def _old_cuda_cause_lines(text: str) -> bool:
    """The pytest mode's former reading of ``str(exc)``: an assert line or an error line speaks of CUDA."""
    lines = [line.strip() for line in text.splitlines()]
    return any("cuda" in line.lower() and (line.startswith("assert ") or "Error: " in line) for line in lines)


@pytest.mark.parametrize(("make", "evidence"), [pytest.param(m, e, id=i) for i, m, e in CASES])
def test_gpu_need_finds_each_kind_of_evidence_and_nothing_else(
    make: Callable[[], BaseException | str], evidence: str
) -> None:
    """Each kind of evidence gives its line; a failure with none of it gives ""."""
    assert gpu_need(make()) == evidence


@pytest.mark.parametrize("make", [pytest.param(m, id=i) for i, m, _ in CASES])
def test_gpu_need_says_yes_wherever_a_former_detector_did(make: Callable[[], BaseException | str]) -> None:
    """No failure the former rules took for a missing GPU (a usage error) can now become a FAIL."""
    error = make()
    said_yes = _old_cuda_cause_lines(str(error))
    if isinstance(error, BaseException) and not isinstance(error, RankFailure):  # a rank's own exception
        said_yes = said_yes or _old_mentions_cuda(error) or _old_needs_cuda(error)
    if said_yes:
        assert gpu_need(error)


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch here has CUDA: its lazy init does not fail")
def test_the_real_torch_cuda_failure_on_a_cpu_machine_is_evidence() -> None:
    """``torch.cuda.current_device()`` without CUDA fails in a way the rule reads (the message, a torch.cuda frame)."""
    assert gpu_need(_raised(torch.cuda.current_device))


def test_the_pytest_mode_cause_names_the_evidence_for_a_gather_callable_only() -> None:
    """In pytest mode a gather callable's GPU need is a note naming the evidence; a module implementation gets none."""
    failure = RankFailure({0: _ASSERT_TEXT}, world_size=2)
    callable_impl = Implementation(gather_fn="tests.forks.gallery_gather_asserts_cuda:gather_on_cuda")
    assert _cuda_cause(callable_impl, failure) == (
        "tests.forks.gallery_gather_asserts_cuda:gather_on_cuda needs CUDA (its error says so: assert x.is_cuda); "
        "run it on GPUs with --conformance-backend nccl"
    )
    assert _cuda_cause(Implementation(), failure) == ""
    assert _cuda_cause(callable_impl, RankFailure({0: _PATH_AND_CALLER_TEXT})) == ""
