"""What the wrapper suite's ranks send the parent: typed, so that every read of a rank's answer is checked by mypy."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FirstCall"]


@dataclass(frozen=True)
class FirstCall:
    """One rank's first wrap and training step of a small model (:func:`~.ranks.first_call`).

    ``error``: ``Type: message`` of a failure ("" without); ``wrapped``: whether the wrapping itself returned
    (False when ``error`` is its); ``need``: the one-line message when the world lacks CUDA or a launcher
    variable; ``refused``: Python refused the call's arguments (the ``TypeError``); ``returned``: what came
    back; ``ddp_at`` and ``ddp``: where a DistributedDataParallel sits inside and its settings ("" without);
    ``missing``: the step-protocol methods (option field, method name) what came back lacks; ``dtype``: the
    parameters' dtype after wrapping; ``accumulates``: ``no_sync``, ``set_requires_gradient_sync`` or "";
    ``sharding``: how each parameter is held (:func:`~nemo_dist.conformance.ddp.sharded.sharding`; empty
    when none is a DTensor).
    """

    error: str = ""
    wrapped: bool = False
    need: str = ""
    refused: str = ""
    returned: str = ""
    ddp_at: str = ""
    ddp: str = ""
    missing: list[tuple[str, str]] = field(default_factory=list)
    dtype: str = ""
    accumulates: str = ""
    sharding: list[str] = field(default_factory=list)
