"""The tp suite's options and its component, declared to the engine (standard library only).

Loaded by file by :mod:`nemo_dist.conformance.engine.declarations` before torch is
imported: the options join the one option table, and :data:`TARGET` makes
``tp`` a component the engine resolves, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["OPTIONS", "ORDER", "TABLES", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 70

_NAMES = "names"  # the README table "| option | what it names |"
_TP = "tp"  # the README table "| option | what it says |" of a tensor-parallel plan

#: The README option table of a tensor-parallel plan (docs/tp.md, "Any tensor-parallel plan").
TABLES = {_TP: "what it says"}

OPTIONS: tuple[Option, ...] = (
    Option(
        "--tp", metavar="MODULE",
        help="module with parallelize_tp(model, tp_mesh, *, sequence_parallel) or upstream's "
        "fsdp2_strategy_parallelize: its tensor-parallel plans, with and without sequence parallelism",
        docs=(Doc(_NAMES, "a module with `parallelize_tp(model, tp_mesh, *, sequence_parallel)` (else upstream's "
                          "`fsdp2_strategy_parallelize`): its plans, with and without sequence parallelism"),),
    ),
    Option(
        "--tp-plan", metavar="MODULE:NAME",
        help="any tensor-parallel plan instead of a module: a function (model, tp_mesh) -> model (None: in place) "
        "or a parallelize_module plan dict",
        docs=(
            Doc(_NAMES, "any tensor-parallel plan instead: a function `(model, tp_mesh) -> model` or a "
                        "`parallelize_module` plan dict "
                        "(see [Any tensor-parallel plan](tp.md#any-tensor-parallel-plan))"),
            Doc(_TP, "a function `(model, tp_mesh) -> model` (None: changed in place), or a dict of torch "
                     "parallel styles by module name, applied with `parallelize_module`"),
        ),
    ),
    Option(
        "--tp-model", metavar="MODULE:NAME",
        help="a zero-argument factory of the unsharded model the plan is written for (default: the suite's own "
        "tiny Llama, untied and tied)",
        docs=(Doc(_TP, "a zero-argument factory of the unsharded model the plan is written for; every rank calls it "
                       "under the same seed"),),
        doc_default="the suite's tiny Llama, untied and tied",
    ),
    Option(
        "--tp-arch", metavar="CLASSES",
        help="comma-separated transformers classes (LlamaForCausalLM,Qwen3ForCausalLM) also checked, each built "
        "from a tiny config, float64, nothing downloaded",
        docs=(Doc(_TP, "transformers classes also checked (`LlamaForCausalLM,Qwen3ForCausalLM`), "
                       "each built from a tiny config in float64, nothing downloaded"),),
        kind="class names, comma-separated",
    ),
    Option(
        "--tp-input", metavar="MODULE:NAME",
        help="a factory fn(batch, seq, generator) of the model's input (default: token ids for an embedding, "
        "features for a Linear)",
        docs=(Doc(_TP, "a factory `fn(batch, seq, generator)` of the model's input"),),
        doc_default="token ids when the model starts with an embedding, float64 features for a Linear",
    ),
    Option(
        "--tp-after-backward", metavar="MODULE:NAME",
        help="a step the training loop takes after every backward, called as fn([model], device_mesh) (upstream's "
        "synchronize_tp_replica_gradients)",
        docs=(Doc(_TP, "a step your training loop takes after every backward, called as `fn([model], device_mesh)`, "
                       "such as upstream's `tp_replicas:synchronize_tp_replica_gradients` (the preset declares it)"),),
    ),
)

TARGET = SuiteTarget(
    component="tp",
    fields=("tp", "tp_plan", "tp_model", "tp_arch", "tp_input", "tp_after_backward"),
    module_field="tp",
    reference={"tp": "nemo_dist.distributed.tensor_parallel"},
    presets={
        "nemo_dist": {"tp": "nemo_dist.distributed.tensor_parallel"},
        "nemo_automodel": {
            "tp": "nemo_automodel.components.distributed.parallelizer",
            "tp_after_backward": "nemo_automodel.components.distributed.tp_replicas:synchronize_tp_replica_gradients",
        },
    },
    label_fields=("tp_plan", "tp"),
    subject_fields=("tp", "tp_plan"),
    validate="nemo_dist.conformance.suites.tp.target:validate",
)
