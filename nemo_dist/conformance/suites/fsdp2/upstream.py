"""What upstream's FSDP2 path sets on the suite's :class:`~.models.TinyLM`, as the checks of :mod:`.checks`
expect it: the units it reshards after forward, and the prefetch chains between the layer units."""

from __future__ import annotations

from nemo_dist.conformance.suites.fsdp2.models import LAYERS

__all__ = ["prefetch_chains", "reshard_expected"]


def reshard_expected(flag: bool | None) -> dict[str, bool]:
    """Upstream's choice per unit: layers (None: all but the last), the input embedding; the head, the root never."""
    layers = {f"layers.{i}": (i < LAYERS - 1 if flag is None else flag) for i in range(LAYERS)}
    return {"": False, "embed": True if flag is None else flag, **layers, "head": False}


def prefetch_chains(forward: int, backward: int) -> list[tuple[str, str, list[str]]]:
    """The prefetch chains upstream sets over the layer units: each the next ``forward``, the previous ``backward``."""
    found = []
    for index in range(LAYERS):
        following = [f"layers.{i}" for i in range(index + 1, min(LAYERS, index + 1 + forward))]
        preceding = [f"layers.{index - d}" for d in range(1, backward + 1) if index - d >= 0]
        found += [("forward", f"layers.{index}", following)] if following else []
        found += [("backward", f"layers.{index}", preceding)] if preceding else []
    return sorted(found)
