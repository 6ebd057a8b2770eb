"""The fork server of a World's parent (child side): imports torch once, then forks one rank per request.

Started by :mod:`nemo_dist.testing.launcher` as ``python -m
nemo_dist.testing._zygote FD PARENT_PID``, where ``FD`` is its end of a
private ``SOCK_SEQPACKET`` socket pair. It imports torch, ``torch.distributed``,
DDP and the rank loop, answers ``("ready", pid)``, then serves requests:

* parent to server: one message ``("spawn", env, stderr_path, preload)``
  carrying the rank's socket as an ``SCM_RIGHTS`` file descriptor; the server
  first imports each module of ``preload`` it has not imported yet (a module
  that fails to import is left to the rank, which then reports the error
  itself), so that every later rank inherits it;
* parent to server: ``("preload", modules)``, imported the same way, with
  no answer (sent as soon as the server is launched, so its imports overlap
  the parent's own);
* server to parent: ``("pid", pid)`` for each request, in order, and
  ``("exit", pid, returncode)`` once it reaped a rank (``returncode`` as
  ``subprocess.Popen`` gives it: negative for a signal).

The forked rank takes ``env`` as its whole environment, writes its stdout and
stderr to ``stderr_path`` and runs :func:`nemo_dist.testing._rank.main`; it
dies with this server (``PR_SET_PDEATHSIG``), which dies with the parent (the
same, and EOF on its socket). The server is single-threaded and never touches
CUDA, so a forked rank may initialise it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys
from typing import Any

#: What the server imports once, so that no rank imports it again (DDP's constructor imports torch._dynamo).
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo")
#: Largest message either side sends (an environment is a few KiB).
MAX_MESSAGE = 1 << 20


def _serve_rank(rank_fd: int, env: dict[str, str], stderr_path: str, server_pid: int) -> int:
    """In the forked child: become the rank (environment, stderr, loop); return its exit status."""
    from nemo_dist.testing import _rank

    os.environ.clear()
    os.environ.update(env)
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return _rank.main([str(rank_fd)], parent_pid=server_pid)


def _fork_rank(control: socket.socket, wakeup: tuple[int, int], request: tuple[Any, ...], fds: list[int]) -> int:
    """Fork one rank for a request; return its pid (in this server).

    The child closes what is the server's (its socket, the wakeup pipe) and
    restores the signal handling the server changed before it becomes the rank.
    """
    _, env, stderr_path, preload = request
    (rank_fd,) = fds
    _preload(preload)
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # the rank
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            control.close()
            for fd in wakeup:
                os.close(fd)
            code = _serve_rank(rank_fd, env, stderr_path, server_pid)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(rank_fd)
    return pid


def _preload(modules: list[str]) -> None:
    """Import each of ``modules`` once, here in the server; an import error is left for the rank to meet."""
    missing = [name for name in modules if name not in sys.modules]
    for name in missing:
        with contextlib.suppress(Exception, SystemExit):
            importlib.import_module(name)
    if missing:
        # What is imported now lives in every rank forked later: kept out of the collector's reach, a rank's
        # collections neither walk it nor write to its pages (each write would copy a page into the rank).
        gc.collect()
        gc.freeze()


def _reap(control: socket.socket) -> None:
    """Report every rank that exited: ``("exit", pid, returncode)``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def serve(control: socket.socket) -> None:
    """Answer spawn requests until the parent closes its end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    control.send(pickle.dumps(("ready", os.getpid())))
    while True:
        for key, _ in selector.select():
            if key.fileobj is control:
                payload, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 1)
                if not payload:
                    return  # the parent is gone: the ranks die with this process
                request = pickle.loads(payload)
                if request[0] == "preload":
                    _preload(request[1])
                    continue
                pid = _fork_rank(control, (wake_r, wake_w), request, fds)
                control.send(pickle.dumps(("pid", pid)))
            else:
                os.read(wake_r, 4096)
        _reap(control)


def main(argv: list[str] | None = None) -> int:
    """Import what every rank needs, then serve; exit status 0."""
    from nemo_dist.testing import _rank

    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    _rank.die_with_parent(int(args[1]))
    _preload(list(PRELOAD))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
