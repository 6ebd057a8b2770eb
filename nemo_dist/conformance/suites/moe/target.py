"""How the moe suite calls what it checks: the unsharded layer, the expert-parallel function, the layer's outputs.

The target is a function ``(moe_layer, ep_mesh) -> layer`` (``--moe-fn``;
None back: changed in place) applied to a copy of the unsharded layer: the
suite's :class:`~nemo_dist.conformance.suites.moe.layer.TinyMoE`, or the
``--moe-layer`` factory's. ``ep_mesh`` is a 1-D ``DeviceMesh`` named
``("ep",)`` over the whole world on the backend's device type, or under a
composition (``--moe-mesh``) one named ``("edp", "ep")`` or ``("edp", "ep",
"tp")`` in the layout's shape, ranks in row-major order: the ranks of a
tensor-parallel group are consecutive, and share one batch of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from nemo_dist.conformance.adapters.wrapping import DTYPES
from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.suites.ddp.expectations import COMPUTE_ROUNDINGS, unit_roundoff
from nemo_dist.conformance.suites.ddp.templates import manual_seed
from nemo_dist.conformance.suites.moe.layer import TinyMoE

__all__ = ["AUX_REDUCTIONS", "AUX_WEIGHT", "FLOAT64_TOLERANCE", "LOSS_SCALES", "MESHES", "MUTE", "REDUCTIONS",
           "Layout", "after_backward", "aux_weight", "batches", "build_layer", "composed", "describe_layout", "dim_of",
           "dtype_tolerance", "layouts", "loss_scale", "mean_divisor", "outputs", "parallelize", "routed_experts",
           "steer", "steerable", "tolerance", "tp_size", "validate"]

#: ``--moe-mesh``'s values: the 1-D ep mesh, ep borrowed from data parallelism, and that with tensor parallelism.
MESHES = ("ep", "edp,ep", "edp,ep,tp")
#: ``--moe-reduction``'s values.
REDUCTIONS = ("mean", "sum")
#: ``--moe-aux-reduction``'s values: each rank's auxiliary loss counted as its other loss is, or averaged over the
#: data-parallel ranks.
AUX_REDUCTIONS = ("sum", "mean")
#: ``--moe-loss-scale``'s named sizes of a layout (besides a number).
LOSS_SCALES = ("@world", "@dp", "@edp", "@ep", "@tp")

#: A composition's layout: ``(edp, ep)`` or ``(edp, ep, tp)`` ranks (None: the 1-D ep mesh over the world).
Layout = tuple[int, ...] | None

#: The auxiliary loss's weight in the loss every check backpropagates.
AUX_WEIGHT = 0.25
#: How far a float64 layer may be from one process: the same products added in another order.
FLOAT64_TOLERANCE = 1e-10


def dtype_tolerance(name: str) -> float:
    """The largest difference, relative to ``max(1, max |expected|)``, of a layer computed in dtype ``name``.

    1e-10 for float64; below it,
    :data:`~nemo_dist.conformance.suites.ddp.expectations.COMPUTE_ROUNDINGS`
    roundings of that dtype's unit roundoff (about 1.9e-6 for float32).
    """
    if name == "float64":
        return FLOAT64_TOLERANCE
    return COMPUTE_ROUNDINGS * unit_roundoff(getattr(torch, name))


def tolerance(impl: Implementation) -> float:
    """The largest difference the checks allow: :func:`dtype_tolerance` of ``--moe-compute-dtype`` (float64)."""
    return dtype_tolerance(impl.suite_option("moe_compute_dtype") or "float64")


def build_layer(impl: Implementation, seed: int) -> nn.Module:
    """The unsharded layer, float64, seeded with ``seed`` (the same on every rank)."""
    manual_seed(seed)
    factory = impl.suite_option("moe_layer")
    layer = resolve_callable(factory)() if factory else TinyMoE()
    return layer.to(torch.float64)


#: What steering takes off a muted expert's router logit: its score is then below e^-40 (about 4e-18) of the others'.
MUTE = 40.0


def steerable(layer: nn.Module) -> bool:
    """Whether the suite can steer ``layer``'s routing: it has ``num_experts``, an int ``top_k`` below it and a
    ``router`` Linear with a bias of ``num_experts`` logits (the suite's own layer does; a ``--moe-layer`` may)."""
    router, experts, top_k = getattr(layer, "router", None), getattr(layer, "num_experts", None), getattr(
        layer, "top_k", None)
    return (isinstance(router, nn.Linear) and router.bias is not None and isinstance(experts, int)
            and router.out_features == experts and isinstance(top_k, int) and 0 < top_k < experts)


def steer(layer: nn.Module, muted: Sequence[int]) -> None:
    """Steer ``layer``'s router away from the ``muted`` experts (:data:`MUTE` off their bias), so that no token
    chooses them while ``top_k`` others are left; the layer is otherwise unchanged and its router still learns.
    Raises ``ValueError`` for a layer that is not :func:`steerable` or too few experts left."""
    if not steerable(layer):
        raise ValueError("the layer's routing cannot be steered (no router Linear with a bias of num_experts logits)")
    router: Any = layer.router
    experts: int = getattr(layer, "num_experts")  # noqa: B009 (a Module's attribute mypy reads as a Tensor)
    if experts - len(set(muted)) < getattr(layer, "top_k"):  # noqa: B009
        raise ValueError(f"muting {len(set(muted))} of {layer.num_experts} experts leaves fewer than top_k")
    with torch.no_grad():
        router.bias[list(muted)] -= MUTE


def routed_experts(layer: nn.Module, tokens: torch.Tensor) -> torch.Tensor | None:
    """The experts one process routes each of ``tokens`` to (``[T, top_k]``), for a :func:`steerable` layer (its
    top-k router logits, as its softmax keeps their order); None for any other layer."""
    if not steerable(layer):
        return None
    router: Any = layer.router
    with torch.no_grad():
        return torch.topk(router(tokens), getattr(layer, "top_k"), dim=-1).indices  # noqa: B009


def dim_of(layer: nn.Module) -> int:
    """The width of the tokens ``layer`` takes: its router's (or first Linear's) input features."""
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            return module.in_features
    for param in layer.parameters():
        return int(param.shape[-1])
    raise OptionError("{opt:moe_layer} builds a layer with no parameters")


def parallelize(impl: Implementation, layer: nn.Module, mesh: Any) -> nn.Module:
    """``layer`` under the target's expert parallelism (its return value, or ``layer`` where it returns None)."""
    made = resolve_callable(impl.suite_option("moe_fn"))(layer, mesh)
    return layer if made is None else made


def outputs(found: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer call's ``(output, aux_loss)``: a tuple's first two, or the output alone (no auxiliary loss)."""
    if isinstance(found, (tuple, list)):
        aux = found[1] if len(found) > 1 and isinstance(found[1], torch.Tensor) else None
        return found[0], aux
    return found, None


def composed(impl: Implementation) -> bool:
    """Whether ``--moe-mesh`` declares a composition (``edp,ep`` or ``edp,ep,tp``: the target makes every
    reduction itself)."""
    return impl.suite_option("moe_mesh") in MESHES[1:]


def layouts(impl: Implementation, size: int, experts: int) -> list[Layout]:
    """The layouts a world of ``size`` runs: the 1-D mesh (``[None]``); under ``edp,ep`` every ``(edp, ep)`` with
    ``edp * ep == size`` whose ep divides ``experts``, expert groups of one rank first; under ``edp,ep,tp`` every
    such ``(edp, ep, tp)``, tensor-parallel groups of one rank first."""
    if not composed(impl):
        return [None]
    with_tp = impl.suite_option("moe_mesh") == MESHES[2]
    found: list[Layout] = []
    for tp in [t for t in range(1, size + 1) if size % t == 0] if with_tp else [1]:
        dp = size // tp
        for ep in range(1, dp + 1):
            if dp % ep == 0 and experts % ep == 0:
                found.append((dp // ep, ep, tp) if with_tp else (dp // ep, ep))
    return found


def tp_size(layout: Layout) -> int:
    """How many ranks of ``layout`` share one batch of tokens (its tensor-parallel size; 1 without a tp dim)."""
    return layout[2] if layout is not None and len(layout) > 2 else 1


def batches(layout: Layout, size: int) -> int:
    """How many batches of tokens a world of ``size`` holds in ``layout``: its data-parallel size (the world over
    tp). Rank r holds batch ``r // tp``: the ranks of a tensor-parallel group share theirs."""
    return size // tp_size(layout)


def describe_layout(layout: Layout) -> str:
    """``edp 2 x ep 1`` or ``edp 1 x ep 1 x tp 2``; "" for the 1-D mesh."""
    if layout is None:
        return ""
    return " x ".join(f"{name} {n}" for name, n in zip(("edp", "ep", "tp"), layout, strict=False))


def loss_scale(impl: Implementation, layout: Layout, size: int) -> float:
    """What each rank's loss is multiplied by before backward (``--moe-loss-scale``; 1 outside a composition)."""
    declared = impl.suite_option("moe_loss_scale")
    if declared is None or layout is None:
        return 1.0
    symbols = {"@world": size, "@dp": batches(layout, size), "@edp": layout[0], "@ep": layout[1],
               "@tp": tp_size(layout)}
    return float(symbols[declared]) if declared in symbols else float(declared)


def mean_divisor(impl: Implementation, layout: Layout, size: int) -> float:
    """What one process's summed gradient is divided by to give the expected one: the data-parallel size (the
    world over tp) under a composition declared ``--moe-reduction mean``, else 1."""
    if layout is not None and impl.suite_option("moe_reduction") == REDUCTIONS[0]:
        return float(batches(layout, size))
    return 1.0


def aux_weight(impl: Implementation, layout: Layout, size: int) -> float:
    """How much each rank's auxiliary loss counts in the objective, relative to its other loss: 1, or under a
    composition declared ``--moe-aux-reduction mean`` one over the data-parallel size (the world over tp)."""
    if layout is not None and impl.suite_option("moe_aux_reduction") == AUX_REDUCTIONS[1]:
        return 1.0 / batches(layout, size)
    return 1.0


def after_backward(impl: Implementation, layer: nn.Module, mesh: Any) -> None:
    """The declared step after backward (``--moe-after-backward``), called as ``fn(layer, mesh)``."""
    declared = impl.suite_option("moe_after_backward")
    if declared is not None:
        resolve_callable(declared)(layer, mesh)


def validate(impl: Implementation) -> None:
    """Import what the moe options name (in the parent, before any world starts); ``OptionError`` naming it."""
    dtype = impl.suite_option("moe_compute_dtype")
    if dtype is not None and dtype not in DTYPES:
        raise OptionError(f"{{opt:moe_compute_dtype}} expects one of {', '.join(DTYPES)}; got {dtype!r}")
    for field, allowed in (("moe_mesh", MESHES), ("moe_reduction", REDUCTIONS), ("moe_aux_reduction", AUX_REDUCTIONS)):
        value = impl.suite_option(field)
        if value is not None and value not in allowed:
            raise OptionError(f"{{opt:{field}}} expects one of {', '.join(allowed)}; got {value!r}")
    scale = impl.suite_option("moe_loss_scale")
    if scale is not None and scale not in LOSS_SCALES:
        try:
            float(scale)
        except ValueError:
            raise OptionError(
                f"{{opt:moe_loss_scale}} expects a number or one of {', '.join(LOSS_SCALES)}; got {scale!r}"
            ) from None
    declared = [f for f in ("moe_reduction", "moe_loss_scale", "moe_aux_reduction", "moe_after_backward")
                if impl.suite_option(f)]
    if declared and not composed(impl):
        raise OptionError(f"{{opt:{declared[0]}}} applies under {{opt:moe_mesh}} edp,ep or edp,ep,tp, where the "
                          "target makes its own reductions")
    for field, what in (("moe_fn", "an expert-parallel function"), ("moe_layer", "a layer factory"),
                        ("moe_after_backward", "a step after backward")):
        spec = impl.suite_option(field)
        if spec is not None:
            try:
                resolve_callable(spec, "mypackage.moe:apply_ep", what)
            except OptionError as exc:
                raise OptionError(f"{{opt:{field}}}: {exc.template}") from None
