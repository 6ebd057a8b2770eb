"""The moe suite's options and its component, declared to the engine (standard library only).

Loaded by file by :mod:`nemo_dist.conformance.engine.declarations` before torch is
imported: the options join the one option table, and :data:`TARGET` makes
``moe`` a component the engine resolves, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["OPTIONS", "ORDER", "TABLES", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 90

_NAMES = "names"  # the README table "| option | what it names |"
_MOE = "moe"  # the README table "| option | what it says |" of the expert-parallel section


#: The option table of expert parallelism (docs/moe.md).
TABLES = {_MOE: "what it says"}

OPTIONS: tuple[Option, ...] = (
    Option(
        "--moe-fn", metavar="MODULE:NAME",
        help="expert parallelism for a mixture-of-experts layer: a function (moe_layer, ep_mesh) -> layer "
        "(None: changed in place), checked on the suite's tiny top-k layer against one process",
        docs=(
            Doc(_NAMES, "expert parallelism: a function `(moe_layer, ep_mesh) -> layer` (see "
                        "[docs/moe.md](moe.md))"),
            Doc(_MOE, "expert parallelism: a function `(moe_layer, ep_mesh) -> layer` (None: changed in place), "
                      "`ep_mesh` a 1-D mesh over the world, or the 2-D mesh `--moe-mesh` names"),
        ),
    ),
    Option(
        "--moe-layer", metavar="MODULE:NAME",
        help="a zero-argument factory of the unsharded layer {opt:moe_fn} is written for, called as layer(tokens) "
        "-> output or (output, aux_loss) (default: the suite's tiny top-k layer)",
        docs=(Doc(_MOE, "a zero-argument factory of the unsharded layer `--moe-fn` is written for, called as "
                        "`layer(tokens)` with tokens `[T, dim]`, returning the output or `(output, aux_loss)`; every "
                        "rank calls it under the same seed"),),
        doc_default="the suite's tiny top-k layer",
    ),
    Option(
        "--moe-compute-dtype", metavar="DTYPE", choices=("float64", "float32", "bfloat16", "float16"),
        help="the least precise dtype the layer computes or adds up in whatever its parameters' (float64, "
        "float32, bfloat16 or float16; default float64): the checks then allow that dtype's rounding",
        docs=(Doc(_MOE, "the least precise dtype the layer computes or adds up in, whatever its parameters' "
                        "(upstream's `GroupedExperts` gathers its routing weights in `float32`): the checks then "
                        "allow 32 roundings of that dtype instead of 1e-10"),),
        doc_default="`float64`",
    ),

    Option(
        "--moe-mesh", metavar="DIMS", choices=("ep", "edp,ep", "edp,ep,tp"),
        help="the mesh {opt:moe_fn} is given: ep (a 1-D mesh over the world; the suite sums replicated gradients "
        "over the world itself), edp,ep (ep borrowed from data parallelism: every layout edp x ep of the world, "
        "expert groups of one rank and of more; the target makes every reduction itself, as training does) or "
        "edp,ep,tp (the same with tensor parallelism: every layout edp x ep x tp, the ranks of a tp group sharing "
        "one batch of tokens)",
        docs=(Doc(_MOE, "the mesh `--moe-fn` is given: `ep` (a 1-D mesh over the world; the suite sums "
                        "replicated gradients over the world as a training loop's data parallelism would), "
                        "`edp,ep` (ep borrowed from data parallelism, as torchtitan and upstream compose it: a 2-D "
                        "mesh named `(\"edp\", \"ep\")` for every layout `edp x ep` of the world whose ep divides "
                        "the experts, every rank its own tokens; the target makes every reduction, dense and "
                        "expert, itself) or `edp,ep,tp` (the same with tensor parallelism: a 3-D mesh named "
                        "`(\"edp\", \"ep\", \"tp\")` for every layout `edp x ep x tp`, the ranks of a tp group "
                        "consecutive and sharing one batch of tokens, as a TP block's input is replicated)"),),
        doc_default="`ep` (the bundled run: `edp,ep`)",
    ),
    Option(
        "--moe-reduction", metavar="MODE", choices=("mean", "sum"),
        help="under a composed {opt:moe_mesh}, what the target's reductions make of the ranks' gradients: sum "
        "(default) or mean (divided by the data-parallel size, the world over tp, every parameter alike)",
        docs=(Doc(_MOE, "under a composed `--moe-mesh`, what the target's reductions make of every rank's "
                        "gradients: `sum` or `mean` (divided by the data-parallel size, the world over tp, every "
                        "parameter alike)"),),
        doc_default="`sum`",
    ),
    Option(
        "--moe-loss-scale", metavar="FACTOR",
        help="under a composed {opt:moe_mesh}, what each rank's loss is multiplied by before backward, as the "
        "training recipe does: a number, or @world, @dp (the world over tp), @edp, @ep or @tp of the layout "
        "(default 1)",
        docs=(Doc(_MOE, "under a composed `--moe-mesh`, what each rank's loss is multiplied by before backward, as "
                        "the training recipe does (upstream multiplies by the data-parallel size): a number, or "
                        "`@world`, `@dp` (the world over tp), `@edp`, `@ep` or `@tp` of the layout; "
                        "`--moe-after-backward` undoes it"),),
        kind="number | `@world` | `@dp` | `@edp` | `@ep` | `@tp`", doc_default="`1`",
    ),
    Option(
        "--moe-aux-reduction", metavar="MODE", choices=("sum", "mean"),
        help="under a composed {opt:moe_mesh}, how the ranks' auxiliary losses enter what the gradients must be: "
        "sum (default: each counts as its rank's other loss does) or mean (averaged over the data-parallel ranks, "
        "each counting 1/dp of that, as where the aux gradient is injected outside the loss scale)",
        docs=(Doc(_MOE, "under a composed `--moe-mesh`, how the ranks' auxiliary losses (each over its rank's own "
                        "tokens) enter what the gradients must be: `sum` (each counts as its rank's other loss "
                        "does) or `mean` (averaged over the data-parallel ranks, each counting 1/dp of that: "
                        "upstream's recipe injects the aux gradient in backward, outside its loss multiplier, and "
                        "FSDP2 averages it). An aux loss injected by a hook rather than returned is found by a "
                        "backward of the loss times zero"),),
        doc_default="`sum`",
    ),
    Option(
        "--moe-after-backward", metavar="MODULE:NAME",
        help="under a composed {opt:moe_mesh}, a step the training loop takes after every backward, called as "
        "fn(layer, mesh) (a gradient scaling, a reduction of its own)",
        docs=(Doc(_MOE, "under a composed `--moe-mesh`, a step your training loop takes after every backward, called "
                        "as `fn(layer, mesh)` (upstream's gradient scaling, a reduction the target leaves to the "
                        "loop)"),),
    ),
)

TARGET = SuiteTarget(
    component="moe",
    fields=("moe_fn", "moe_layer", "moe_compute_dtype", "moe_mesh", "moe_reduction", "moe_loss_scale",
            "moe_aux_reduction", "moe_after_backward"),
    # The bundled run checks the bundled layer as training composes it: ep borrowed from data parallelism.
    reference={"moe_fn": "nemo_dist.distributed.expert_parallel:parallelize_experts", "moe_mesh": "edp,ep"},
    presets={
        "nemo_dist": {"moe_fn": "nemo_dist.distributed.expert_parallel:parallelize_experts", "moe_mesh": "edp,ep"},
    },
    label_fields=("moe_fn",),
    validate="nemo_dist.conformance.suites.moe.target:validate",
    subject_fields=("moe_fn",),
)
