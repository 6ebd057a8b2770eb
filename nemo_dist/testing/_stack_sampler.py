"""Rank side of the progress probes: answer each SIGUSR1 with every thread's stack, written holding the GIL.

faulthandler can answer a signal with such a dump, but it writes from inside
the signal handler and walks the other threads' frames without the GIL. When
threads start and end meanwhile (torch's pools, gloo, a user's own) that walk
reads freed memory and the rank dies of SIGSEGV: the probe meant to give a slow
rank time would turn it into a crash verdict on correct code. So SIGUSR1 is
blocked in every thread, and one daemon thread takes it with ``sigwait`` and
writes the dump with the GIL held. A rank blocked in C code (a collective, a
receive) has released the GIL and is dumped; one holding the GIL in C code is
not dumped until it lets go, which the parent reads as "working".

The dump has faulthandler's format (``Thread 0x... (most recent call first):``
then ``  File "...", line N in NAME`` lines, threads a blank line apart), so
its reader is the same; the sampler's own thread is left out.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import IO

__all__ = ["PROBE_SIGNAL", "block_probe_signal", "format_stacks", "start_stack_sampler"]

#: The signal the parent sends to ask for a dump.
PROBE_SIGNAL = signal.SIGUSR1
#: Frames written per thread, innermost first (faulthandler's own limit).
_MAX_FRAMES = 100


def block_probe_signal() -> None:
    """Block SIGUSR1 in this thread, and so in every thread started from it afterwards.

    Call it before any other thread exists: a thread that does not block the
    signal could take it, and its default action ends the process.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {PROBE_SIGNAL})


def format_stacks(skip: int | None = None) -> str:
    """Every thread's stack but ``skip``'s (a thread ident), innermost frame first, in faulthandler's format.

    Reads frames through ``sys._current_frames``, so the caller must hold the
    GIL (any Python code does).
    """
    blocks = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        depth = 0
        current: FrameType | None = frame
        while current is not None and depth < _MAX_FRAMES:
            code = current.f_code
            lines.append(f'  File "{code.co_filename}", line {current.f_lineno} in {code.co_name}')
            current = current.f_back
            depth += 1
        if current is not None:
            lines.append("  ...")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def start_stack_sampler(sample_file: IO[str]) -> threading.Thread:
    """Start the daemon thread that appends a dump to ``sample_file`` for each SIGUSR1 (see the module doc).

    :func:`block_probe_signal` must have run first, in the main thread.
    """

    def serve() -> None:
        me = threading.get_ident()
        while True:
            signal.sigwait({PROBE_SIGNAL})
            sample_file.write(format_stacks(skip=me) + "\n")
            sample_file.flush()

    thread = threading.Thread(target=serve, name="nemo_dist-stack-sampler", daemon=True)
    thread.start()
    return thread
