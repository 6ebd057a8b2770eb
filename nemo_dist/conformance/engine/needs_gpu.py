"""Did a call fail only because it needs a GPU? One rule, read from the failure: :func:`gpu_need`.

A first call of a ``--gather-fn`` callable (:mod:`.gather.ranks`), the call
of a ``--ddp-fn`` wrapper (:mod:`.ddp.wrapped`) and a failed check in
``pytest conformance/`` (:mod:`.pytest_plugin`) all ask it; a yes there is
a usage error (run with ``--backend nccl``) or a "Likely cause" note, not a
FAIL. The rule is the union of the evidence the two earlier detectors read
(``mentions_cuda`` on the gather side, ``_needs_cuda`` on the wrapper side),
so that no failure either called a usage error becomes a FAIL. It reads
the failure only, never the machine: whether the call ran without a GPU (a
CPU tensor, a gloo world) is the caller's to know, and it asks only then.
"""

from __future__ import annotations

import re
import traceback

from nemo_dist.testing import RankFailure

__all__ = ["GPU_WORDS", "gpu_need"]

#: Words that speak of a GPU (matched in any case, anywhere in a message or line).
GPU_WORDS: tuple[str, ...] = ("cuda", "nvidia", "nccl")

_WORDS = re.compile("|".join(GPU_WORDS), re.IGNORECASE)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+')
_CARETS = re.compile(r"^\s*[~^]+\s*$")


def gpu_need(error: BaseException | str) -> str:
    """The evidence, in one line, that ``error`` failed for want of a GPU; "" when nothing in it says so.

    An exception is read with its chain (``__cause__``, else ``__context__``,
    outermost first). Each error of the chain is evidence when:

    - the source line that raised it (its traceback's last frame) names
      CUDA, NVIDIA or NCCL (:data:`GPU_WORDS`, any case), whatever the
      error's type (``assert x.is_cuda``); returned: that line;
    - its message names one of them, anywhere in the message (``Torch not
      compiled with CUDA enabled``, ``No CUDA GPUs are available``, also a
      path the message quotes: both earlier detectors counted that);
      returned: ``Type: first line of the message``;
    - a frame of its traceback lies inside the ``torch/cuda/`` package
      (``torch.cuda._lazy_init``); returned: ``Type: first line (raised
      inside torch.cuda)``.

    A :class:`~nemo_dist.testing.RankFailure` in the chain carries its ranks'
    errors as text (its message), and a ``str`` is such a text (an error relayed from
    another process: ``Type: message`` lines and traceback lines). A text is
    read line by line for the same evidence, and the line is returned:

    - an exception line (one holding ``Error: `` or ``Exception: ``) that
      names a GPU word;
    - a traceback source line that names one and is the raising line (no
      frame follows it) or an ``assert`` statement;
    - a frame line (``File "..."``) inside ``torch/cuda/``.

    Never evidence: the words in another line of a traceback, such as a
    file's path (``File "/opt/cuda_tools/io.py"``) or the line of a frame that
    called on (``y = x.cuda()`` in a caller); nor, in an exception, a frame's
    path outside ``torch/cuda/``.
    """
    if isinstance(error, str):
        return _text_evidence(error)
    for each in _chain(error):
        found = _text_evidence(str(each)) if isinstance(each, RankFailure) else _exception_evidence(each)
        if found:
            return found
    return ""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from or during (``__cause__``, else ``__context__``), outermost first."""
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _in_torch_cuda(filename: str) -> bool:
    return "/torch/cuda/" in filename.replace("\\", "/")


def _exception_evidence(error: BaseException) -> str:
    """The evidence of one error (not its chain): its raising line, its message, a frame in torch.cuda; or ""."""
    frames = traceback.extract_tb(error.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    if _WORDS.search(line):
        return line
    message = str(error).strip()
    first = f"{type(error).__name__}: {message.splitlines()[0] if message else ''}".rstrip(": ")
    if _WORDS.search(message):
        return first
    if any(_in_torch_cuda(frame.filename) for frame in frames):
        return f"{first} (raised inside torch.cuda)"
    return ""


def _text_evidence(text: str) -> str:
    """The first line of a relayed error's ``text`` that is evidence (see :func:`gpu_need`), or ""."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        frame = _FRAME.match(line)
        if frame:
            if _in_torch_cuda(frame["file"]):
                return stripped
            continue
        if not _WORDS.search(line):
            continue
        if "Error: " in line or "Exception: " in line or stripped.startswith("assert "):
            return stripped
        if index and _FRAME.match(lines[index - 1]) and _raising(lines, index):
            return stripped
    return ""


def _raising(lines: list[str], index: int) -> bool:
    """Whether the source line at ``index`` is its traceback's last: no frame line follows it (carets aside)."""
    following = (line for line in lines[index + 1 :] if not _CARETS.match(line))
    return not _FRAME.match(next(following, ""))
