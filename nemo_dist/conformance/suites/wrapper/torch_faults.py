"""Faults of torch itself that a wrapper's failure can show, each named only where torch alone, re-run, shows it.

torch 2.13's FSDP2 divides float64 and float16 gradients by a
``set_gradient_divide_factor`` factor twice where a shard group has one
rank (``fsdp/_fully_shard/_fsdp_collectives.py``: the pre/post divide it
uses for dtypes at overflow risk, and the ``world_size == 1`` copy's own
divide); float32 and bfloat16 are right. A correct wrapper that states its
factor then trains wrong through no fault of its own. :func:`divide_factor_state`
reads, on a rank, the factors a wrapped model's FSDP modules were given and
the smallest shard group of its DTensor parameters; :func:`probe` runs
torch's ``fully_shard`` alone on a two-feature ``Linear`` over the same mesh
with the same factor in float64 and float32; :func:`double_divide` names
torch as the cause where the wrapper's gradients are the right ones divided
by its factor once more, its dtype is one torch divides twice, a shard group
has one rank, and the probe shows torch alone doing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from nemo_dist.conformance.suites.ddp.sharded import shards
from nemo_dist.conformance.suites.wrapper.messages import Stepped

__all__ = ["DOUBLE_DIVIDE", "divide_factor_state", "double_divide", "probe"]

DOUBLE_DIVIDE = (
    "torch's FSDP2 divides {dtype} gradients by set_gradient_divide_factor's factor ({factor:g}) twice where a shard "
    "group has one rank (torch {version}, fsdp/_fully_shard/_fsdp_collectives.py: the pre/post divide for dtypes at "
    "overflow risk, and the world_size == 1 copy's own divide); float32 is right. A torch bug, not the {whose}: "
    "fully_shard alone, re-run here over the same mesh with the same factor, gives {float64:g} times the right "
    "gradient in float64 and {float32:g} times it in float32"
)

#: The dtypes torch 2.13's FSDP2 treats as at overflow risk (divided before and after the reduction).
_DIVIDED_TWICE = ("torch.float64", "torch.float16", "float64", "float16")


def divide_factor_state(model: nn.Module) -> dict[str, Any]:
    """``factors``: the gradient divide factors set on ``model``'s FSDP modules (none set: empty); ``min_shard``:
    the fewest ranks any DTensor parameter is sharded over (None: no sharded DTensor)."""
    factors = set()
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if not callable(state):
            continue
        for group in getattr(state(), "_fsdp_param_groups", ()) or ():
            factor = getattr(group, "gradient_divide_factor", None)
            if factor is not None:
                factors.add(float(factor))
    sizes = []
    for param in model.parameters():
        mesh, placements = getattr(param, "device_mesh", None), getattr(param, "placements", ())
        sizes += [mesh.size(i) for i, p in enumerate(placements) if mesh is not None and shards(p)]
    return {"factors": sorted(factors), "min_shard": min(sizes) if sizes else None}


def probe(mesh_shape: tuple[int, int] | None, factor: float) -> dict[str, float]:
    """torch's ``fully_shard`` alone over this world's mesh (``mesh_shape``: HSDP R x S, None: 1-D) with
    ``set_gradient_divide_factor(factor)``: its gradient as a multiple of the right one (the sum of every rank's
    over ``factor``), per dtype ("float64", "float32"). Every rank calls it."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from nemo_dist.conformance.suites.ddp.mesh import world_mesh
    from nemo_dist.conformance.suites.ddp.sharded import full
    from nemo_dist.conformance.suites.ddp.wrapped import rank_device

    device = rank_device()
    mesh = world_mesh(mesh_shape, device.type)
    rank, size = dist.get_rank(), dist.get_world_size()
    found = {}
    for dtype in (torch.float64, torch.float32):
        model: Any = nn.Linear(2, 2, bias=False, dtype=dtype, device=device)
        with torch.no_grad():
            model.weight.fill_(1.0)
        fully_shard(model, mesh=mesh)
        model.set_gradient_divide_factor(factor)
        model(torch.full((1, 2), float(rank + 1), dtype=dtype, device=device)).sum().backward()
        got = full(model.weight.grad).double().cpu()
        right = sum(r + 1 for r in range(size)) / factor
        found[str(dtype).removeprefix("torch.")] = float(got.mean()) / right
    return found


def double_divide(
    run: Callable[..., list[Any]], results: Sequence[Stepped], mesh_shape: tuple[int, int] | None,
    observed: Sequence[Any], expected: Sequence[Any],
) -> str:
    """:data:`DOUBLE_DIVIDE` where every rank's ``observed`` gradient is its ``expected`` one divided by the factor
    the wrapper set, its dtype is float64 or float16, a shard group has one rank, and :func:`probe` (through
    ``run``, the world's) shows torch alone dividing twice in float64 and not in float32; else ""."""
    state = results[0].divide_factors
    factors, dtype = state.get("factors") or [], results[0].dtype
    if len(factors) != 1 or state.get("min_shard") != 1 or dtype not in _DIVIDED_TWICE:
        return ""
    factor = factors[0]
    if factor == 1 or not observed or not all(
        isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) and o.shape == e.shape
        and torch.allclose(o.double(), e.double() / factor, rtol=1e-9, atol=1e-12)
        for o, e in zip(observed, expected, strict=True)
    ):
        return ""
    shown = run(probe, mesh_shape, factor)[0]
    if abs(shown["float64"] - 1 / factor) > 1e-9 or abs(shown["float32"] - 1) > 1e-6:
        return ""
    return DOUBLE_DIVIDE.format(dtype=dtype.removeprefix("torch."), factor=factor, version=torch.__version__,
                                float64=shown["float64"], float32=shown["float32"], whose="wrapper's")
