"""The gather suite: conformance checks of an all-gather (a dist_utils module or one callable).

Importing it registers its checks (core: :mod:`.checks`, extended:
:mod:`.extended`), its worlds' setup (a first gather with autograd, see
:func:`.ranks.warm_up`) and its suite step: a callable checked with
``--gather-fn`` is called once on every rank of each world before the
checks. Its output form is detected there (``--gather-form auto``); a first
call that fails everywhere for a missing parameter is a usage error
(:class:`~nemo_dist.conformance.engine.target.MissingParameter`), and so is one that
fails everywhere on a CPU tensor for want of CUDA (one line: run with
``--backend nccl``); any other failure is a note under the header (the
checks then report it, each).
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.adapters.gather_spec import gather_label
from nemo_dist.conformance.adapters.signature import GROUP_PARAMETERS
from nemo_dist.conformance.engine.deadlines import warm_up
from nemo_dist.conformance.engine.errors import MissingParameter, OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import Suite, register_suite
from nemo_dist.conformance.suites.gather import checks, extended, ranks
from nemo_dist.conformance.suites.gather.messages import FirstCall

__all__ = ["checks", "detect_output_form", "extended", "missing_parameter"]


def missing_parameter(impl: Implementation, names: str, error: str) -> MissingParameter:
    """The usage error of a first call of ``impl``'s callable that raised ``error`` lacking ``names`` (comma-joined)."""
    name = names.split(",")[0]
    if name in GROUP_PARAMETERS:
        remedy = f"its signature is hidden: pass it on every call with {{opt:gather_kwarg}} {name}=@group"
    elif name == "uneven":
        remedy = "the checks pass uneven= only where they need it: give the parameter a default (False)"
    else:
        remedy = f"pass it on every call with {{opt:gather_kwarg}} {name}=VALUE (VALUE a Python literal)"
    return MissingParameter(
        f"{{opt:gather_fn}} {impl.gather_fn} failed its first call on every rank for a missing parameter "
        f"{name!r} ({error}); {remedy}",
        name,
    )


def detect_output_form(world: Any, impl: Implementation, notes: list[str]) -> Implementation:
    """Call ``impl``'s gather callable once on every rank; ``impl`` with its output form fixed when detected.

    With ``--gather-form auto`` and the same form on every rank, the form
    is fixed and a note names it. Raises ``MissingParameter`` when every
    rank's call failed for a missing parameter, ``OptionError`` when every
    rank's call on a CPU tensor failed speaking of CUDA; another failure adds a note
    with the first rank's error. An implementation that names a module comes
    back as it is, with no call.
    """
    if impl.gather_fn is None:
        return impl
    calls: list[FirstCall] = warm_up(world, ranks.first_call, impl)
    if calls and all(c.missing for c in calls):
        raise missing_parameter(impl, calls[0].missing, calls[0].error.splitlines()[0])
    if calls and all(c.cuda for c in calls):
        raise OptionError(
            f"{{opt:gather_fn}} {impl.gather_fn} needs CUDA: its first call on a CPU tensor failed on every rank "
            f"at `{calls[0].cuda}`; run it on GPUs with {{opt:backend}} nccl (one GPU per rank)"
        )
    failed = [(rank, c.error) for rank, c in enumerate(calls) if c.error]
    if failed:
        rank, error = failed[0]
        notes.append(f"{gather_label(impl)}: its first call failed on rank {rank}: {error.splitlines()[0]}")
        return impl
    forms = [c.form for c in calls]
    if impl.gather_form == "auto" and len(set(forms)) == 1 and forms[0]:
        notes.append(f"{gather_label(impl)}: output form {forms[0]!r}, detected from its first call")
        return impl.replaced(gather_form=forms[0])
    return impl


register_suite(Suite("gather", world_setup=ranks.warm_up, prepare=detect_output_form))
