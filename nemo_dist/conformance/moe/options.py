"""The moe suite's options and its component, declared to the engine (standard library only).

Loaded by file by :mod:`nemo_dist.conformance.suites` before torch is
imported: the options join the one option table, and :data:`TARGET` makes
``moe`` a component the engine resolves, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.option_spec import Doc, Option
from nemo_dist.conformance.suites import SuiteTarget

__all__ = ["OPTIONS", "TABLES", "TARGET"]

_NAMES = "names"  # the README table "| option | what it names |"
_MOE = "moe"  # the README table "| option | what it says |" of the expert-parallel section


#: The README option table of expert parallelism (conformance/README.md, "Mixture of experts under expert
#: parallelism").
TABLES = {_MOE: "what it says"}

OPTIONS: tuple[Option, ...] = (
    Option(
        "--moe-fn", metavar="MODULE:NAME",
        help="expert parallelism for a mixture-of-experts layer: a function (moe_layer, ep_mesh) -> layer "
        "(None: changed in place), checked on the suite's tiny top-k layer against one process",
        docs=(
            Doc(_NAMES, "expert parallelism: a function `(moe_layer, ep_mesh) -> layer` (see \"Mixture of "
                        "experts under expert parallelism\" below)"),
            Doc(_MOE, "expert parallelism: a function `(moe_layer, ep_mesh) -> layer` (None: changed in place), "
                      "`ep_mesh` a 1-D mesh over the world"),
        ),
    ),
    Option(
        "--moe-layer", metavar="MODULE:NAME",
        help="a zero-argument factory of the unsharded layer {opt:moe_fn} is written for, called as layer(tokens) "
        "-> output or (output, aux_loss) (default: the suite's tiny top-k layer)",
        docs=(Doc(_MOE, "a zero-argument factory of the unsharded layer `--moe-fn` is written for, called as "
                        "`layer(tokens)` with tokens `[T, dim]`, returning the output or `(output, aux_loss)` "
                        "(default: the suite's tiny top-k layer); every rank calls it under the same seed"),),
    ),
    Option(
        "--moe-compute-dtype", metavar="DTYPE", choices=("float64", "float32", "bfloat16", "float16"),
        help="the least precise dtype the layer computes or adds up in whatever its parameters' (float64, "
        "float32, bfloat16 or float16; default float64): the checks then allow that dtype's rounding",
        docs=(Doc(_MOE, "the least precise dtype the layer computes or adds up in, whatever its parameters' "
                        "(default `float64`; upstream's `GroupedExperts` gathers its routing weights in `float32`): "
                        "the checks then allow 32 roundings of that dtype instead of 1e-10"),),
    ),
)

TARGET = SuiteTarget(
    component="moe",
    fields=("moe_fn", "moe_layer", "moe_compute_dtype"),
    reference={"moe_fn": "nemo_dist.distributed.expert_parallel:parallelize_experts"},
    presets={
        "nemo_dist": {"moe_fn": "nemo_dist.distributed.expert_parallel:parallelize_experts"},
    },
    label_fields=("moe_fn",),
    validate="nemo_dist.conformance.moe.target:validate",
    subject_fields=("moe_fn",),
)
