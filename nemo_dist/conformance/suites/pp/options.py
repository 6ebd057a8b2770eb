"""The pp suite's options and its component, declared to the engine (standard library only).

Loaded by file by :mod:`nemo_dist.conformance.engine.declarations` before torch is
imported: the options join the one option table, and :data:`TARGET` makes
``pp`` a component the engine resolves, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["OPTIONS", "ORDER", "TABLES", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 100

_NAMES = "names"  # the README table "| option | what it names |"
_PP = "pp"  # the table "| option | what it says |" of docs/pp.md

#: The option table of pipeline parallelism (docs/pp.md).
TABLES = {_PP: "what it says"}

#: The bundled pipeline, as the bundled run checks it.
_BUNDLED = {
    "pp_fn": "nemo_dist.distributed.pipeline_parallel:build_pipeline",
    "pp_loss": "token_sum",
    "pp_schedule": "GPipe,1F1B,Interleaved1F1B",
}

OPTIONS: tuple[Option, ...] = (
    Option(
        "--pp-fn", metavar="MODULE:NAME",
        help="pipeline parallelism: a function (model, pp_mesh, n_microbatches, loss_fn) -> (schedule, stages), "
        "checked on the suite's tiny language model against one process",
        docs=(
            Doc(_NAMES, "pipeline parallelism: a function `(model, pp_mesh, n_microbatches, loss_fn) -> (schedule, "
                        "stages)` (see [docs/pp.md](pp.md))"),
            Doc(_PP, "your pipeline: a function `(model, pp_mesh, n_microbatches, loss_fn) -> (schedule, stages)`, "
                     "`pp_mesh` a 1-D mesh named `(\"pp\",)` over the world, `stages` this rank's `PipelineStage` "
                     "objects, `schedule` a torch schedule over them; given `dp_mesh=` where it takes one, composed "
                     "with data parallelism"),
        ),
    ),
    Option(
        "--pp-loss", metavar="CONVENTION", choices=("mean", "token_sum"), doc_default="`mean`",
        help="the loss convention {opt:pp_fn} is written for: mean (default: loss_fn is a microbatch's mean cross "
        "entropy, the schedule averages over microbatches, torch's scale_grads=True) or token_sum (upstream's: "
        "loss_fn sums over label tokens, the suite divides every gradient by the batch's label tokens after the "
        "step, as upstream's training loop does)",
        docs=(Doc(_PP, "the loss convention your pipeline is written for: `mean` (`loss_fn` is a "
                       "microbatch's mean cross entropy and the schedule averages over the microbatches, torch's "
                       "`scale_grads=True`) or `token_sum` (upstream's: `loss_fn` sums over the label tokens, "
                       "the schedule scales nothing, and the suite divides every gradient by the batch's label "
                       "tokens after the step, as upstream's training loop does)"),),
    ),
    Option(
        "--pp-model", metavar="MODULE:NAME", doc_default="the suite's tiny language model",
        help="a zero-argument factory of the model {opt:pp_fn} is written for, called as model(token_ids) -> logits "
        "(or an output with .logits) (default: the suite's tiny language model)",
        docs=(Doc(_PP, "a zero-argument factory of the model your pipeline is written for (a transformers "
                       "`LlamaForCausalLM` from a tiny config, say), called as `model(token_ids)` and returning "
                       "logits or an output with `.logits`; every rank calls it under the same seed"),),
    ),
    Option(
        "--pp-compute-dtype", metavar="DTYPE", choices=("float64", "float32"), doc_default="`float64`",
        help="the dtype the model is built and computed in: float64 (default) or float32 (a pipeline that cannot "
        "run in float64); the checks then allow that dtype's rounding",
        docs=(Doc(_PP, "the dtype the model is built and computed in: `float64` or `float32` (upstream's "
                       "AutoPipeline accepts hidden states between stages only in 16 or 32 bits); the checks then "
                       "allow 32 roundings of float32, and the training check takes two SGD steps instead of SGD "
                       "and Adam"),),
    ),
    Option(
        "--pp-step", metavar="MODULE:NAME",
        doc_default="the suite's own: zero, step, and under `token_sum` divide by the batch's label tokens",
        help="your training loop's step, called on every rank with the whole batch as fn(schedule, stages, "
        "inputs, labels, losses): it zeroes, runs schedule.step and scales gradients as your loop does; the suite "
        "then steps the optimizer (default: zero, step, and under token_sum divide by the label tokens); composed with "
        "data parallelism it gets this rank's rows and dp_mesh=",
        docs=(Doc(_PP, "your training loop's step, called on every rank with the whole batch as `fn(schedule, "
                       "stages, inputs, labels, losses)`: it zeroes the gradients, runs `schedule.step` and scales "
                       "the gradients as your loop does, and the suite then takes the optimizer step; composed "
                       "with data parallelism it gets this rank's rows and `dp_mesh=`"),),
    ),
    Option(
        "--pp-schedule", metavar="NAMES", kind="schedule names, comma-separated",
        doc_default="the function's own choice, no keyword",
        help="comma-separated torch schedule names (GPipe,1F1B,Interleaved1F1B,...), each passed to {opt:pp_fn} as "
        "schedule=NAME (default: the function's own choice)",
        docs=(Doc(_PP, "comma-separated torch schedule names (`GPipe,1F1B,Interleaved1F1B,LoopedBFS,"
                       "InterleavedZeroBubble,ZBVZeroBubble,DualPipeV`), each passed to your function as "
                       "`schedule=NAME` and checked"),),
    ),
)

TARGET = SuiteTarget(
    component="pp",
    fields=("pp_fn", "pp_loss", "pp_model", "pp_compute_dtype", "pp_step", "pp_schedule"),
    reference=_BUNDLED,
    presets={"nemo_dist": _BUNDLED},
    label_fields=("pp_fn",),
    validate="nemo_dist.conformance.suites.pp.target:validate",
    subject_fields=("pp_fn",),
)
