"""Rank-side functions of the FSDP2 checks: shard a :class:`~.models.TinyLM` through the component, report.

Every function runs on each rank of a world (``world.run``), shards a
seeded model through the implementation's entry point over NeMo AutoModel's
mesh (:mod:`.calls`, inside ``own_fsdp_internals``), and returns the
dataclasses of :mod:`.messages` (plain data, CPU tensors) for the parent to judge. A parameter is read through
``full_tensor()`` (a collective: every rank reads the same parameters in
the same order). FSDP's units and state are read here: which modules are
units, which of them hold unsharded parameters, their prefetch chains and
offload policy (torch's private ``_get_fsdp_state()``, NOT SUPPORTED where
a torch release lacks it).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.op_ranks import counted_parts, observe_blocks
from nemo_dist.conformance.suites.ddp.sharded import cpu_copy, full, grad_copy
from nemo_dist.conformance.suites.ddp.templates import fresh_copy
from nemo_dist.conformance.suites.fsdp2.calls import device, mesh, own_fsdp_internals, parallelize, sync_ctx
from nemo_dist.conformance.suites.fsdp2.messages import (
    Accumulation,
    Checkpointing,
    DTensorPlacement,
    Dtypes,
    FunctionalLayout,
    Groups,
    Offload,
    ShardedParam,
    Sharding,
    StateDicts,
    StepRun,
    SyncRun,
    Trained,
)
from nemo_dist.conformance.suites.fsdp2.models import blocks, tiny_lm
from nemo_dist.conformance.suites.wrapper.ranks import reductions

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

#: Token rows per rank and step.
PER_RANK = 2

__all__ = [
    "PER_RANK",
    "accumulation",
    "checkpointing",
    "functional_layout",
    "offload",
    "precision",
    "prefetch",
    "resharding",
    "sharding",
    "state_dicts",
    "tied_in_a_layer_list",
    "training",
    "warm_up",
]


def _tokens(seed: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's global batch, the same on every rank: token ids and target ids, ``[steps, W * PER_RANK]``."""
    generator = torch.Generator().manual_seed(seed)
    rows = PER_RANK * dist.get_world_size()
    return torch.randint(0, 10, (2, steps, rows), generator=generator).unbind(0)  # type: ignore[return-value]


def _local(batch: torch.Tensor) -> torch.Tensor:
    start = dist.get_rank() * PER_RANK
    return batch[start : start + PER_RANK].to(device())


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``model`` on the rows, computed where the model lives (the one-process copy: the CPU)."""
    where = next(model.parameters()).device
    logits = model(tokens.to(where))
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets.to(where))


def _local_part(param: Any) -> torch.Tensor:
    """This rank's shard of a DTensor parameter; any other tensor itself."""
    return param.to_local() if _is_dtensor(param) else param


def _is_dtensor(value: Any) -> TypeGuard[DTensor]:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _units(model: nn.Module) -> dict[str, Any]:
    """Every FSDP unit (``fully_shard``-ed module) by its name in ``model`` ("" the root)."""
    from torch.distributed.fsdp import FSDPModule

    return {name: unit for name, unit in model.named_modules() if isinstance(unit, FSDPModule)}


def _managed(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Per unit, the parameters it manages (its own, not those of units under it)."""
    units = _units(model)
    found = {}
    for name, unit in units.items():
        inner = {
            id(p) for other in units.values() if other is not unit and _under(other, unit) for p in other.parameters()
        }
        found[name] = [p for p in unit.parameters() if id(p) not in inner]
    return found


def _under(module: nn.Module, root: nn.Module) -> bool:
    return any(m is module for m in root.modules())


def _resharded(model: nn.Module) -> dict[str, bool]:
    """Per unit with parameters: are they sharded DTensors (resharded), rather than unsharded tensors, now?"""
    return {name: all(_is_dtensor(p) for p in params) for name, params in _managed(model).items() if params}


def _named_groups(replicas: int) -> Groups:
    """This rank's expected shard group and replica group (global ranks) in the ``(R, W/R)`` layout."""
    rank, shards = dist.get_rank(), dist.get_world_size() // replicas
    return Groups(
        shard=[rank // shards * shards + j for j in range(shards)],
        replicate=[rank % shards + i * shards for i in range(replicas)],
    )


def sharding(impl: Implementation, replicas: int, seed: int) -> Sharding:
    """Shard with mixed precision off; each parameter's placements, mesh dims' ranks, local rows, full tensor.

    Also whether the entry point returned the model itself, this rank's
    expected groups (:func:`_named_groups`), each parameter's row count and
    whether its full tensor equals the unsharded model's.
    """
    with own_fsdp_internals():
        reference = tiny_lm(seed, torch.float64)
        model: nn.Module = fresh_copy(reference).to(device())
        returned = parallelize(impl, model, mesh(replicas), {"mp_policy": {}})
        params = []
        param: Any
        for (name, param), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
            placed = None
            if _is_dtensor(param):
                device_mesh = param.device_mesh
                placed = DTensorPlacement(
                    placements=[repr(p) for p in param.placements],
                    dims=list(device_mesh.mesh_dim_names or ()),
                    groups=[dist.get_process_group_ranks(device_mesh.get_group(d)) for d in range(device_mesh.ndim)],
                    local_rows=param.to_local().shape[0],
                )
            params.append(ShardedParam(name, expected.shape[0], torch.equal(cpu_copy(param), expected), placed))
        return Sharding(returned_model=returned is model, params=params, expected=_named_groups(replicas))


def _optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=0.1)


def training(
    impl: Implementation, replicas: int, seed: int, optimizer: str, steps: int, fields: dict[str, Any], tied: bool
) -> Trained:
    """Train ``steps`` steps sharded and, beside it, one process on the whole batch; both models' final parameters.

    Also the parameters whose replicas differ under HSDP
    (:func:`_replicas_differ`) and whether ``head.weight`` is still
    ``embed.weight``.
    """
    with own_fsdp_internals():
        reference = tiny_lm(seed, torch.float64, tied)
        lm = fresh_copy(reference).to(device())
        model = parallelize(impl, lm, mesh(replicas), {"mp_policy": {}, **fields})
        tokens, targets = _tokens(seed, steps)
        sharded_opt, reference_opt = (
            _optimizer(optimizer, model.parameters()),
            _optimizer(optimizer, reference.parameters()),
        )
        for step in range(steps):
            _loss(model, _local(tokens[step]), _local(targets[step])).backward()
            sharded_opt.step()
            sharded_opt.zero_grad()
            _loss(reference, tokens[step], targets[step]).backward()
            reference_opt.step()
            reference_opt.zero_grad()
        return Trained(
            params=[cpu_copy(p) for p in model.parameters()],
            expected=[p.detach().clone() for p in reference.parameters()],
            replicas_differ=_replicas_differ(model),
            tied=lm.head.weight is lm.embed.weight,
        )


def tied_in_a_layer_list(impl: Implementation, seed: int) -> str:
    """Shard a tied model whose head is also an entry of its layer list; the exception type raised, "" if none."""
    with own_fsdp_internals():
        lm = tiny_lm(seed, torch.float64, tied=True).to(device())
        lm.layers.append(lm.head)
        try:
            parallelize(impl, lm, mesh(1), {"mp_policy": {}})
        except Exception as error:  # the type is the verdict's
            return type(error).__name__
        return ""


def functional_layout(impl: Implementation, seed: int) -> FunctionalLayout:
    """Shard through ``fsdp2_strategy_parallelize(model, mesh, mp_policy=MixedPrecisionPolicy())`` alone.

    Its own defaults otherwise (upstream's: prefetch on, depths 1 forward and
    2 backward, ``reshard_after_forward=None``). The prefetch chains set and
    the units resharded after a forward; NOT SUPPORTED where the module has
    no such function.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    entry = getattr(impl.module("fsdp2"), "fsdp2_strategy_parallelize", None)
    if entry is None:
        raise NotSupported(f"{impl.fsdp2} defines no fsdp2_strategy_parallelize")
    with own_fsdp_internals():
        model = tiny_lm(seed, torch.float64).to(device())
        entry(model, mesh(1), mp_policy=MixedPrecisionPolicy())
        chains = _chains(model)
        tokens, targets = _tokens(seed, 1)
        loss = _loss(model, _local(tokens[0]), _local(targets[0]))
        resharded = _resharded(model)
        loss.backward()
        return FunctionalLayout(prefetch=chains, resharded=resharded)


def _replicas_differ(model: nn.Module) -> list[str]:
    """The parameters whose local shard differs between this rank and another replica of it.

    A replica is what the parameter's own placement says: the ranks of its
    mesh's ``Replicate()`` dim (HSDP), whose shards are gathered and compared
    bit for bit. A collective over each such group, in parameter order.
    """
    from torch.distributed.tensor import Replicate

    differ = []
    for name, param in model.named_parameters():
        if not _is_dtensor(param) or param.device_mesh.ndim != 2 or not isinstance(param.placements[0], Replicate):
            continue
        group = param.device_mesh.get_group(0)
        mine = param.to_local().detach().contiguous()
        shards = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(shards, mine, group=group)
        if not all(torch.equal(mine, other) for other in shards):
            differ.append(name)
    return differ


def precision(impl: Implementation, replicas: int, seed: int, mp_policy: dict[str, str] | None) -> Dtypes:
    """Shard a float32 model with ``mp_policy``; the dtypes of compute, output, parameters, grads, Adam state, reduce.

    ``mp_policy`` None is the component's default policy.
    """
    with own_fsdp_internals():
        model: nn.Module = tiny_lm(seed, torch.float32).to(device())
        seen: dict[str, str] = {}
        first = blocks(model)["layers.0"]  # type: ignore[arg-type]  # a TinyLM, not yet sharded
        first.mlp.register_forward_hook(lambda module, args, out: seen.update(weight=str(module.up.weight.dtype)))
        # Inside the unit: what its forward receives after FSDP's pre-forward casts (cast_forward_inputs).
        first.attn.register_forward_pre_hook(lambda module, args: seen.update(layer_input=str(args[0].dtype)))
        model = parallelize(impl, model, mesh(replicas), {"mp_policy": mp_policy})
        tokens, targets = _tokens(seed, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with reductions() as reduced:
            logits = model(_local(tokens[0]))
            F.cross_entropy(logits.float(), _local(targets[0])).backward()
        optimizer.step()
        state = {str(v.dtype) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}
        return Dtypes(
            compute=seen.get("weight", "?").removeprefix("torch."),
            output=str(logits.dtype).removeprefix("torch."),
            layer_input=seen.get("layer_input", "?").removeprefix("torch."),
            params=sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}),
            grads=sorted({str(p.grad.dtype).removeprefix("torch.") for p in model.parameters() if p.grad is not None}),
            state=sorted(s.removeprefix("torch.") for s in state),
            reductions=reduced,
        )


def resharding(impl: Implementation, seed: int, fields: dict[str, Any]) -> dict[str, bool]:
    """Shard with ``fields``; per unit, whether its parameters are resharded between forward and backward."""
    with own_fsdp_internals():
        model = parallelize(impl, tiny_lm(seed, torch.float64).to(device()), mesh(1), {"mp_policy": {}, **fields})
        tokens, targets = _tokens(seed, 1)
        loss = _loss(model, _local(tokens[0]), _local(targets[0]))
        found = _resharded(model)
        loss.backward()
        return found


def accumulation(impl: Implementation, replicas: int, seed: int, micro: int) -> Accumulation:
    """Accumulate ``micro`` micro-batches through ``get_sync_ctx``, deferred and not; what each mode did.

    Per mode (deferred, eager): the gradient reductions the backend ran over all micro-batches (one profiler
    session), how many parameters held a (reduced, sharded) gradient after each micro-batch, and the final full
    gradients; beside them one process's gradients of the same micro-batches, summed.
    """
    get_sync_ctx = sync_ctx(impl)
    tokens, targets = _tokens(seed, micro)
    found: dict[str, SyncRun] = {}
    with own_fsdp_internals():
        reference = tiny_lm(seed, torch.float64)
        for mode, defer in (("deferred", True), ("eager", False)):
            model = parallelize(impl, fresh_copy(reference).to(device()), mesh(replicas), {"mp_policy": {}})
            held = []
            with reductions() as reduced:
                for index in range(micro):
                    with get_sync_ctx(model, index == micro - 1, defer):
                        _loss(model, _local(tokens[index]), _local(targets[index])).backward()
                    held.append(sum(p.grad is not None for p in model.parameters()))
            resume = getattr(model, "set_requires_gradient_sync", None)
            if resume is not None:
                resume(True)  # as the next step's first micro-batch would find it
            found[mode] = SyncRun(
                reductions=len(reduced), held=held, grads=[grad_copy(p, p.grad) for p in model.parameters()]
            )
        for index in range(micro):
            _loss(reference, tokens[index], targets[index]).backward()
        expected = [p.grad for p in reference.parameters()]
    return Accumulation(deferred=found["deferred"], eager=found["eager"], expected=expected, params=len(expected))


def state_dicts(impl: Implementation, replicas: int, seed: int) -> StateDicts:
    """A trained model's full and sharded state dicts, and the sharded one loaded into another sharded model.

    Model A (seed ``seed``) trains one SGD step; torch's
    ``get_model_state_dict`` gives its full state dict (every value whole)
    and its sharded one (DTensors), which ``set_model_state_dict`` loads into
    model B (seed ``seed + 1``, sharded the same way). Returned: the full
    state dict's keys and values, the unsharded model's keys, A's and B's
    full parameters after the load.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    with own_fsdp_internals():
        unsharded = tiny_lm(seed, torch.float64)
        first = parallelize(impl, fresh_copy(unsharded).to(device()), mesh(replicas), {"mp_policy": {}})
        tokens, targets = _tokens(seed, 1)
        _loss(first, _local(tokens[0]), _local(targets[0])).backward()
        torch.optim.SGD(first.parameters(), lr=0.1).step()
        whole = get_model_state_dict(first, options=StateDictOptions(full_state_dict=True))  # on every rank
        sharded = get_model_state_dict(first)
        second = parallelize(impl, tiny_lm(seed + 1, torch.float64).to(device()), mesh(replicas), {"mp_policy": {}})
        set_model_state_dict(second, sharded)
        return StateDicts(
            keys=sorted(whole),
            expected_keys=sorted(unsharded.state_dict()),
            whole={key: cpu_copy(value) for key, value in whole.items() if isinstance(value, torch.Tensor)},
            first={name: cpu_copy(p) for name, p in first.named_parameters()},
            second={name: cpu_copy(p) for name, p in second.named_parameters()},
        )


def _state(unit: nn.Module) -> Any:
    get = getattr(unit, "_get_fsdp_state", None)
    if get is None:
        raise NotSupported("torch's FSDPModule has no _get_fsdp_state here: the prefetch and offload state is unread")
    return get()


def prefetch(impl: Implementation, seed: int, fields: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """Shard with ``fields``; every prefetch chain set (:func:`_chains`)."""
    with own_fsdp_internals():
        return _chains(
            parallelize(impl, tiny_lm(seed, torch.float64).to(device()), mesh(1), {"mp_policy": {}, **fields})
        )


def _chains(model: nn.Module) -> list[tuple[str, str, list[str]]]:
    """Every prefetch chain set on ``model``'s units, as (direction, unit, the units it prefetches), sorted.

    Read from each unit's FSDP state (torch's private ``_states_to_*_prefetch``),
    however the chains were set.
    """
    units = _units(model)
    names = {id(_state(unit)): name for name, unit in units.items()}
    chains = []
    for name, unit in units.items():
        state = _state(unit)
        for way in ("forward", "backward"):
            targets = getattr(state, f"_states_to_{way}_prefetch", None)
            if targets is None:
                raise NotSupported(f"torch's FSDP state has no _states_to_{way}_prefetch here")
            if targets:
                chains.append((way, name, [names.get(id(t), "?") for t in targets]))
    return sorted(chains)


def offload(impl: Implementation, seed: int, fields: dict[str, Any]) -> Offload:
    """Shard with ``fields``; each unit's offload policy (its type's name) and where the sharded parameters live."""
    with own_fsdp_internals():
        model = parallelize(impl, tiny_lm(seed, torch.float64).to(device()), mesh(1), {"mp_policy": {}, **fields})
        policies = {}
        for name, unit in _units(model).items():
            group = getattr(_state(unit), "_fsdp_param_group", None)
            if group is not None:
                policies[name] = type(group.offload_policy).__name__
        devices = sorted({_local_part(p).device.type for p in model.parameters()})
        return Offload(policies=policies, devices=devices)


def checkpointing(impl: Implementation, seed: int, mode: bool | str, scope: str) -> Checkpointing:
    """One step with checkpointing ``mode`` and ``scope``; per block, its block run; the grads.

    A block run (:func:`~nemo_dist.conformance.suites.ddp.op_ranks.observe_blocks`):
    the attn and mlp calls in forward and in backward, and the ops they ran
    in each. Beside it, the same model sharded without checkpointing (its
    gradients are the expected ones).
    """
    with own_fsdp_internals():
        found: dict[str, StepRun] = {}
        for run, fields in (
            ("plain", {}),
            ("checkpointed", {"activation_checkpointing": mode, "activation_checkpointing_scope": scope}),
        ):
            lm = tiny_lm(seed, torch.float64).to(device())
            parts = counted_parts(blocks(lm))
            model = parallelize(impl, lm, mesh(1), {"mp_policy": {}, **fields})
            tokens, targets = _tokens(seed, 1)
            runs = observe_blocks(parts, functools.partial(_loss, model, _local(tokens[0]), _local(targets[0])))
            found[run] = StepRun(runs=runs, grads=[grad_copy(p, p.grad) for p in model.parameters()])
        return Checkpointing(plain=found["plain"], checkpointed=found["checkpointed"])


def warm_up() -> None:
    """Shard a tiny model and step it once on this rank: torch's first FSDP2 imports paid when a world starts."""
    model = tiny_lm(0, torch.float32).to(device())
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh(1)["dp_shard"])
    model(torch.zeros(1, dtype=torch.long, device=device())).sum().backward()
    full(next(model.parameters()))
