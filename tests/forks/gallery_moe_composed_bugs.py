"""Public bugs of expert parallelism composed with data parallelism, each a one-line change of the correct mean
composition (:mod:`tests.forks.gallery_moe_composed`), checked under ``--moe-mesh edp,ep --moe-reduction mean``:

- ``experts_averaged_over_replicas``: expert gradients averaged over their own expert-data-parallel group (divided
  by edp, not the world): x ep (Megatron-LM #5656 / PR 5956, DeepSpeed #5618 / PR 6546);
- ``experts_divided_by_ep``: divided by the expert-parallel size instead of the world: x edp, invisible when ep is
  the world (VeOmni PR 185);
- ``experts_divided_by_world_times_ep``: divided by the world and by ep: / ep (megablocks #86);
- ``experts_never_reduced``: never reduced over their replicas, each rank keeping its group's own: the replicas
  drift apart (fairseq #4220);
- ``dense_reduced_over_ep``: the router reduced over the expert-parallel group only (dense parameters of other
  groups never seen);
- ``local_experts_averaged_over_world``: rank-local experts averaged over the whole world with the dense
  parameters, mixing different experts' gradients (SpecForge PR 882).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.forks._composition import composed


def experts_averaged_over_replicas(layer: nn.Module, mesh: Any) -> nn.Module:
    """Expert gradients summed over edp and divided by edp."""
    return composed(layer, mesh, experts_divisor=lambda s: s["edp"])


def experts_divided_by_ep(layer: nn.Module, mesh: Any) -> nn.Module:
    """Expert gradients summed over edp and divided by ep."""
    return composed(layer, mesh, experts_divisor=lambda s: s["ep"])


def experts_divided_by_world_times_ep(layer: nn.Module, mesh: Any) -> nn.Module:
    """Expert gradients summed over edp and divided by the world times ep."""
    return composed(layer, mesh, experts_divisor=lambda s: s["W"] * s["ep"])


def experts_never_reduced(layer: nn.Module, mesh: Any) -> nn.Module:
    """Expert gradients divided by the world, never summed over their replicas."""
    return composed(layer, mesh, experts_over=None)


def dense_reduced_over_ep(layer: nn.Module, mesh: Any) -> nn.Module:
    """The router's gradient summed over the ep group only, divided by the world."""
    return composed(layer, mesh, dense_over=("ep",))


def _contiguous(rank: int, size: int, count: int) -> list[int]:
    """Rank ``rank``'s contiguous ``count / size`` experts."""
    return list(range(rank * count // size, (rank + 1) * count // size))


def local_experts_averaged_over_world(layer: nn.Module, mesh: Any) -> nn.Module:
    """Experts held rank-local (plain parameters of each rank's rows, no DTensor), and every gradient, theirs too,
    averaged over the world, as a data-parallel wrapper of the whole model does (SpecForge PR 882)."""
    return composed(layer, mesh, experts_over=("edp", "ep"), held=_contiguous)
