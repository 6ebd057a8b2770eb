"""torchtitan's composition of expert parallelism with FSDP2 (its ``apply_fsdp`` over ``dp_mod_ep``), re-expressed on
the suite's layer and ``("edp", "ep")`` mesh, checked with ``--moe-mesh edp,ep --moe-reduction mean``:

- the experts ``Shard(0)`` over ep with tokens dispatched by the autograd all-to-all (the ep group's gradients sum
  in its backward), then ``fully_shard`` over edp (torchtitan's ``dp_mod_ep``) with
  ``set_gradient_divide_factor(dp)``: "the gradient division factor should be consistent with data" (torchtitan's
  comment), so the experts come out averaged over the data-parallel ranks as the dense parameters do;
- the router under ``fully_shard`` over the whole world (the data-parallel mesh), averaged by FSDP2 itself.

``fsdp_divided`` is that composition. In float64 torch 2.13's FSDP2 divides by the factor twice where the shard
group has one rank (edp 1): the composition is right and torch is not; the failure names torch.

``fsdp_averaged`` leaves FSDP2's default average over edp and divides the expert gradients by ep after backward
(``divide_experts_by_ep``, given as ``--moe-after-backward``): the same gradients without a divide factor, so it
conforms in every layout. Where edp and ep are both 2 FSDP2 lays its shard over the ep shard as a
``_StridedShard`` (whose ``is_shard()`` is False): the suite read those replicas as holding the same part, a
false FAIL before it counted a strided shard as a shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from tests.forks._composition import sizes_of
from tests.forks._experts import dispatched


def fsdp_divided(layer: nn.Module, mesh: Any) -> nn.Module:
    """Experts dispatched over ep and sharded by FSDP2 over edp with the data-parallel divide factor; the rest under
    FSDP2 over the world."""
    dispatched(layer, mesh["ep"])
    experts = fully_shard(layer.experts, mesh=mesh["edp"], reshard_after_forward=False)
    experts.set_gradient_divide_factor(float(sizes_of(mesh)["dp"]))
    fully_shard(layer, mesh=mesh._flatten("dp"), reshard_after_forward=False)
    return layer


def fsdp_averaged(layer: nn.Module, mesh: Any) -> nn.Module:
    """:func:`fsdp_divided` without the divide factor: FSDP2 averages the experts over edp."""
    dispatched(layer, mesh["ep"])
    fully_shard(layer.experts, mesh=mesh["edp"], reshard_after_forward=False)
    fully_shard(layer, mesh=mesh._flatten("dp"), reshard_after_forward=False)
    return layer


@torch.no_grad()
def divide_experts_by_ep(layer: nn.Module, mesh: Any) -> None:
    """The expert gradients, summed over ep by the all-to-all and averaged over edp, divided by ep: averaged over
    the world as the router is."""
    for param in layer.experts.parameters():
        if param.grad is not None:
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            grad.div_(mesh["ep"].size())
