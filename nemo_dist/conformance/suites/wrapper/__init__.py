"""The wrapper suite: any data-parallel wrapper (``--ddp-fn``) checked by behaviour, whatever its shape.

Importing it registers its checks (:mod:`.checks`) and a suite with three
steps: the ddp suite's world setup (torch's first DDP paid while a world
starts); :func:`first_call`, which wraps and steps a small model once on
every rank of each world before the checks (a wrapper needing CUDA or a
launcher's variable, or lacking a declared step-protocol method, is then a
usage error in one line; what came back, the DDP found inside and its
settings are notes under the header); and :func:`screen`, which keeps the
ddp checks of the contract's entry points off a wrapper: those about
``DDPManager``/``parallelize_ddp`` themselves are not applicable, the
training ones where the declared reduction or step protocol is not theirs,
and the real-model checkpointing checks are not supported by a wrapper
taking no ``activation_checkpointing``.
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.engine.deadlines import warm_up as warm_up_step
from nemo_dist.conformance.engine.errors import NotApplicable, NotSupported, OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import Check, Suite, register_suite
from nemo_dist.conformance.suites.ddp.mesh import mesh_mismatch
from nemo_dist.conformance.suites.ddp.ranks import warm_up
from nemo_dist.conformance.suites.wrapper import checks, ranks
from nemo_dist.conformance.suites.wrapper.messages import FirstCall

__all__ = ["checks", "first_call", "screen"]

#: ddp checks of what the contract's entry points themselves promise, and why they do not apply to a wrapper.
ENTRY_POINT_CHECKS = {
    "ddp.requires_process_group": "the contract's entry points raise without a process group; a wrapper in the "
    "wild may return the model as it is there (detectron2's create_ddp_model does)",
    "ddp.manager_attributes": "checks DDPManager's attributes; a --ddp-fn wrapper is no DDPManager",
    "ddp.parallelize_wraps_and_places": "checks that the entry point returns a DistributedDataParallel; a wrapper "
    "may be any data parallel, judged by the wrapper.* checks",
    "ddp.world_of_one_wrapped_in_ddp": "nemo_dist's own promise for its entry points; wrapper.world_of_one_trains "
    "checks a wrapper in a world of one",
}
#: ddp checks comparing training with one process under DDP's mean reduction.
MEAN_TRAINING_CHECKS = frozenset({"ddp.contrastive_loss_equals_full_batch", "ddp.any_config_trains_like_one_process"})


def screen(check: Check, impl: Implementation) -> None:
    """Raise ``NotApplicable`` or ``NotSupported`` for a ddp check that cannot apply to ``impl``'s wrapper."""
    wrapper = impl.ddp_wrapper
    if wrapper is None or check.component != "ddp":
        return
    if check.name in ENTRY_POINT_CHECKS:
        raise NotApplicable(ENTRY_POINT_CHECKS[check.name])
    if wrapper.step_protocol:
        raise NotApplicable(
            "the ddp field checks step with param.grad after a plain backward; a wrapper with a step protocol "
            "(--ddp-after-backward, --ddp-grad-attr, --ddp-zero-grad) is judged by the wrapper.* checks"
        )
    if wrapper.reduction != "mean" and check.name in MEAN_TRAINING_CHECKS:
        raise NotApplicable(
            f"compares training with DDP's mean reduction; --ddp-reduction {wrapper.reduction} is judged by "
            "wrapper.trains_like_one_process"
        )
    if "real_models" in check.name:
        from nemo_dist.conformance.adapters.wrapping import accepts, receivers
        from nemo_dist.conformance.engine.importing import resolve_callable

        takes, _ = receivers(resolve_callable(wrapper.fn), wrapper.method)
        if not accepts(takes, "activation_checkpointing", var_keyword=False):
            raise NotSupported(
                f"needs activation_checkpointing=: {wrapper.fn} takes no activation_checkpointing= parameter"
            )


def _ddp_note(found: FirstCall) -> str:
    if not found.ddp_at:
        return "no DistributedDataParallel inside"
    settings = f" ({found.ddp})" if found.ddp else ""
    return f"a DistributedDataParallel at {found.ddp_at}{settings}"


def _cannot_start(label: str, ranks_failed: list[int], size: int, error: str) -> str:
    """The usage error of a wrapper whose wrapping raised: on which ranks, the error, and what may fix it."""
    where = "every rank" if len(ranks_failed) == size else "rank" + ("s " if len(ranks_failed) > 1 else " ") + \
        ", ".join(map(str, ranks_failed))
    hint = (
        "give what it needs with {opt:ddp_kwarg} (a Python literal; a symbol filled on each rank: @device, @devices, "
        "@rank, @world_size, @mesh; or MODULE:NAME() for an object each rank makes), or name a callable that wraps "
        "the model as it is"
    )
    if size == 1:
        hint += "; if it needs 2 or more ranks, leave 1 out of the world sizes"
    first = error.splitlines()[0] if error else "an error without a message"
    return f"{{opt:ddp_fn}} {label} cannot start: wrapping the model raised on {where} of a world of {size}: " \
        f"{first}; {hint}"


def first_call(world: Any, impl: Implementation, notes: list[str]) -> Implementation:
    """Wrap and step a small model once on every rank; raise ``OptionError`` where the options cannot work.

    A wrapper whose first call says on every rank that the world lacks CUDA
    or a launcher's variable, that Python refuses the call's arguments, or
    whose return lacks a declared step-protocol method, is a usage error; so
    is one whose wrapping raises on any rank (it cannot start: no check could
    run). A wrapper that wraps and then fails its first step gets a note, and
    the checks report the failure, each. Otherwise notes say what came back in this world size and
    what it holds, and how each parameter is sharded where any is a DTensor.
    A world that cannot hold the ``--ddp-mesh`` mesh gets a note and no call.
    An implementation without a wrapper comes back as it is.
    """
    wrapper = impl.ddp_wrapper
    if wrapper is None:
        return impl
    mismatch = mesh_mismatch(wrapper.mesh, world.size)
    if mismatch:
        notes.append(f"{wrapper.label}: not called in this world: {mismatch}; its checks are not applicable here")
        return impl
    calls: list[FirstCall] = warm_up_step(world, ranks.first_call, impl)
    if calls and all(c.need for c in calls):
        raise OptionError(calls[0].need)
    if calls and all(c.refused for c in calls):
        raise OptionError(
            f"{{opt:ddp_fn}} {wrapper.label} cannot be called with the model as the options say "
            f"({calls[0].refused}); give the keywords it needs with {{opt:ddp_kwarg}}, or name the callable "
            "that takes the model"
        )
    missing = [c.missing for c in calls if c.missing]
    if calls and len(missing) == len(calls):
        field, name = missing[0][0]
        raise OptionError(
            f"{{opt:{field}}} {name}: what {wrapper.fn} returned ({calls[0].returned}) has no method {name!r}"
        )
    unwrapped = [rank for rank, c in enumerate(calls) if not c.wrapped]
    if unwrapped:
        raise OptionError(_cannot_start(wrapper.label, unwrapped, len(calls), calls[unwrapped[0]].error))
    failed = [(rank, c.error) for rank, c in enumerate(calls) if c.error]
    if failed:
        rank, error = failed[0]
        notes.append(f"{wrapper.label}: its first call failed on rank {rank}: {error.splitlines()[0]}")
        return impl
    found = calls[0]
    size = len(calls)
    ranks_word = "rank" if size == 1 else "ranks"
    note = f"{wrapper.label}: in a world of {size} {ranks_word} returned {found.returned}, {_ddp_note(found)}"
    if found.dtype != "torch.float64":
        note += f"; the float64 model's parameters became {found.dtype}"
    notes.append(note)
    if found.sharding:
        notes.append(f"{wrapper.label}: in a world of {size} {ranks_word}, parameters on rank 0: "
                     + "; ".join(found.sharding))
    return impl


register_suite(Suite("wrapper", world_setup=warm_up, prepare=first_call, screen=screen))
