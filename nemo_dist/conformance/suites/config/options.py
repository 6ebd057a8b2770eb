"""The config suite's options and its component, declared to the engine (loaded by file before torch).

Loaded by :mod:`nemo_dist.conformance.engine.declarations`: the options join the one option table, and
:data:`TARGET` makes ``config`` a component the engine resolves, validates, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["OPTIONS", "ORDER", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 30

_NAMES = "names"  # the README table "| option | what it names |"

OPTIONS: tuple[Option, ...] = (
    Option("--config", metavar="MODULE", help="module with DDPConfig",
           docs=(Doc(_NAMES, "a module with `DDPConfig`"),)),
)

TARGET = SuiteTarget(
    component="config",
    fields=("config",),
    defaults={"config": "nemo_dist.distributed.config"},
    module_field="config",
    required=("DDPConfig",),
    standalone=False,
    reference={"config": "nemo_dist.distributed.config"},
    presets={"nemo_automodel": {"config": "nemo_automodel.components.distributed.config"}},
    label_fields=("config",),
)
