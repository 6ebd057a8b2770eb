"""The fsdp2 suite's options and its component, declared to the engine (loaded by file before torch).

Loaded by :mod:`nemo_dist.conformance.engine.declarations`: the options join the one option table, and
:data:`TARGET` makes ``fsdp2`` a component the engine resolves, validates, presets and labels.
"""

from __future__ import annotations

from typing import Any

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["FSDP2_APIS", "OPTIONS", "ORDER", "TARGET", "resolve", "validate"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 60

_NAMES = "names"  # the README table "| option | what it names |"

#: The FSDP2 entry points a fsdp2 module may define; the checks use the first one it has.
FSDP2_APIS: tuple[str, ...] = ("FSDP2Manager", "fsdp2_strategy_parallelize")

OPTIONS: tuple[Option, ...] = (
    Option(
        "--fsdp2", metavar="MODULE", help="module with FSDP2Config and FSDP2Manager or fsdp2_strategy_parallelize",
        docs=(Doc(_NAMES, "a module with `FSDP2Config` and `FSDP2Manager` (else `fsdp2_strategy_parallelize`): the "
                          "FSDP2 component, its `get_sync_ctx` too when it has one"),),
    ),
    Option(
        "--fsdp2-sync-ctx", metavar="MODULE:NAME",
        help="the FSDP2 component's get_sync_ctx(model, is_optim_step, defer_fsdp_grad_sync) where the {opt:fsdp2} "
        "module has none (upstream keeps it in components.distributed.utils)",
        docs=(Doc(_NAMES, "the component's `get_sync_ctx(model, is_optim_step, defer_fsdp_grad_sync)` where the "
                          "`--fsdp2` module has none (upstream keeps it in `components.distributed.utils`)"),),
    ),
)


def resolve(given: dict[str, Any]) -> dict[str, Any]:
    """The fields the fsdp2 options hold: a module named without ``--fsdp2-sync-ctx`` takes no preset's."""
    if given.get("fsdp2") is not None and given.get("fsdp2_sync_ctx") is None:
        return {**given, "fsdp2_sync_ctx": None}
    return given


def validate(impl: Any) -> None:
    """Resolve ``--fsdp2-sync-ctx`` where given; raises ``OptionError`` naming it."""
    from nemo_dist.conformance.engine.errors import OptionError
    from nemo_dist.conformance.engine.importing import resolve_callable

    if impl.fsdp2_sync_ctx is not None:
        try:
            resolve_callable(impl.fsdp2_sync_ctx)
        except OptionError as exc:
            raise OptionError(f"{{opt:fsdp2_sync_ctx}}: {exc.template}") from None


TARGET = SuiteTarget(
    component="fsdp2",
    fields=("fsdp2",),
    settings=("fsdp2_sync_ctx",),
    defaults={"fsdp2": "nemo_dist.distributed.fsdp2"},
    module_field="fsdp2",
    required=("FSDP2Config",),
    required_any=FSDP2_APIS,
    reference={"fsdp2": "nemo_dist.distributed.fsdp2"},
    presets={
        "nemo_automodel": {
            "fsdp2": "nemo_automodel.components.distributed.fsdp2",
            "fsdp2_sync_ctx": "nemo_automodel.components.distributed.utils:get_sync_ctx",
        },
    },
    label_fields=("fsdp2",),
    resolve="nemo_dist.conformance.suites.fsdp2.options:resolve",
    validate="nemo_dist.conformance.suites.fsdp2.options:validate",
)
