"""nemo_dist: an exact autograd all-gather and a config-driven DDP manager.

The components live in ``nemo_dist.loss.dist_utils`` and
``nemo_dist.distributed`` (``config``, ``ddp``, ``activation_checkpointing``);
the multi-process test harness in ``nemo_dist.testing``; the conformance suite
in ``nemo_dist.conformance``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
