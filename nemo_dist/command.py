"""The ``nemo-dist-conformance`` console script.

It starts the fork server of the ranks first (outside an env:// world, whose
ranks start no worlds of their own), so that the server imports torch, the
suites and what their checks preload (:mod:`nemo_dist.conformance.rank_preload`)
while this process imports torch and the suites; then it runs the command
(:func:`nemo_dist.conformance.cli.main`). Nothing here imports torch.
"""

from __future__ import annotations

from nemo_dist.testing import launcher

__all__ = ["main"]


def main() -> int:
    """Start the ranks' fork server in the background, then run the command; its exit status."""
    if not launcher.in_env_world():
        launcher.start_fork_server(preload=["nemo_dist.conformance.rank_preload"])
    from nemo_dist.conformance.cli import main as command

    return command()

if __name__ == "__main__":
    import sys

    sys.exit(main())
