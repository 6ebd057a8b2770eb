"""The ``nemo-dist-conformance`` console script.

It starts the fork server of the ranks first (outside an env:// world, whose
ranks start no worlds of their own), so that the server imports torch, the
suites and what their checks preload (:mod:`nemo_dist.conformance.frontends.rank_preload`)
while this process imports torch and the suites; then it runs the command
(:func:`nemo_dist.conformance.frontends.cli.main`). Nothing here imports torch.
"""

from __future__ import annotations

import sys

from nemo_dist.testing import launcher

__all__ = ["main"]


#: Options after which the command starts no world: it prints and exits.
_NO_WORLD = frozenset({"-h", "--help", "--version", "--list-checks"})


def main() -> int:
    """Start the ranks' fork server in the background (unless the command only prints: ``--help``, ``--version``,
    ``--list-checks``), then run the command; its exit status."""
    if not launcher.in_env_world() and not _NO_WORLD & set(sys.argv[1:]):
        launcher.start_fork_server(preload=["nemo_dist.conformance.frontends.rank_preload"])
    from nemo_dist.conformance.frontends.cli import main as command

    return command()

if __name__ == "__main__":
    sys.exit(main())
