"""The ddp suite's options and its component, declared to the engine (loaded by file before torch).

Loaded by :mod:`nemo_dist.conformance.engine.declarations`: the options join the one option table, and
:data:`TARGET` makes ``ddp`` a component the engine resolves, validates, presets and labels. A ``--ddp-fn``
wrapper replaces the module; its own behaviour checks are the ``wrapper`` companion's
(:mod:`nemo_dist.conformance.suites.wrapper`).
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["DDP_APIS", "OPTIONS", "ORDER", "TABLES", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 20

_NAMES = "names"  # the README table "| option | what it names |"
_WRAPPER = "wrapper"  # the README table "| option | what it says |" of --ddp-fn

#: The README option table of a ``--ddp-fn`` wrapper (docs/wrappers.md).
TABLES = {_WRAPPER: "what it says"}

#: The two upstream DDP entry points, in the order their checks run (each one a module defines is checked).
DDP_APIS: tuple[str, ...] = ("parallelize_ddp", "DDPManager")

OPTIONS: tuple[Option, ...] = (
    Option(
        "--ddp", metavar="MODULE", help="module with parallelize_ddp, DDPManager, or both (each is checked)",
        docs=(Doc(_NAMES, "a module with `parallelize_ddp`, `DDPManager`, or both: each one present is checked "
                          "(`check[parallelize_ddp]`, `check[DDPManager]`)"),),
    ),
    Option(
        "--ddp-fn", metavar="MODULE:NAME",
        help="any data-parallel wrapper instead of a ddp module, checked by behaviour: a function taking the model "
        "or a class constructed with it (the model goes to the first parameter no {opt:ddp_kwarg} names); its return "
        "is the wrapped model (None: changed in place)",
        docs=(
            Doc(_NAMES, "any data-parallel wrapper instead of a ddp module, checked by behaviour (with `--ddp-method`, "
                        "`--ddp-kwarg`, `--ddp-output`, `--ddp-reduction`, `--ddp-buffers`, `--ddp-after-backward`, "
                        '`--ddp-grad-attr`, `--ddp-zero-grad`, `--ddp-start`, `--ddp-mesh`, `--ddp-compute-dtype`, '
                        '`--ddp-reduce-dtype`: see [docs/wrappers.md](wrappers.md))'),
            Doc(_WRAPPER, "a function taking the model, or a class constructed with it: `fn(model, **kwargs)`. The "
                          "model goes to the parameter named `model` or `module`, else to the first positional "
                          "parameter no `--ddp-kwarg` names (so `DistributedFairseqModel(args, model)` works with "
                          "`--ddp-kwarg args=...`). What comes back is the wrapped model; None means the model was "
                          "changed in place (composable `replicate`)"),
        ),
    ),
    Option(
        "--ddp-method", metavar="NAME",
        help="{opt:ddp_fn} is a class constructed from the keywords whose method NAME takes the model, such as "
        "{opt:ddp_method} setup_module",
        docs=(Doc(_WRAPPER, "`--ddp-fn` is a class constructed from the keywords, whose method `NAME` takes the model: "
                            "`fn(**kwargs).NAME(model)` (Lightning's `DDPStrategy(...).setup_module(model)`)"),),
        kind="method name",
    ),
    Option(
        "--ddp-kwarg", metavar="NAME=VALUE", repeatable=True,
        help="a keyword passed on every call of {opt:ddp_fn} (its constructor with {opt:ddp_method}), VALUE a Python "
        "literal, a symbol filled on each rank (@mesh: the world's DeviceMesh; @device: this rank's torch.device; "
        "@devices: every rank's, in rank order; @rank; @world_size) or MODULE:NAME() (a factory each rank calls "
        "once); repeatable (the DDP fields are the field checks' to pass)",
        docs=(Doc(_WRAPPER, "a keyword passed on every call (to the constructor with `--ddp-method`), VALUE a Python "
                            "literal; a symbol filled on each rank: `@mesh` (the world's `DeviceMesh`, "
                            "`init_device_mesh` on the backend's device type, `cpu` under gloo; given to a parameter "
                            "that wants a process group, annotated `ProcessGroup` or named `process_group`, `group` "
                            "or `pg`, the mesh's group; to one that wants devices, a list of them or named "
                            "`parallel_devices`, every rank's device), `@device` (this "
                            "rank's `torch.device`: its GPU under nccl, the CPU under gloo), `@devices` (every "
                            "rank's, in rank order: a strategy's `parallel_devices`), `@rank`, `@world_size`; or "
                            "`MODULE:NAME()`, an importable factory each rank calls once with no arguments (a "
                            "cluster environment, a handler). The five DDP fields are the field checks' "
                            "to pass (below), so naming one is a usage error"),),
    ),
    Option(
        "--ddp-output", metavar="INDEX", help="{opt:ddp_fn} returns a tuple or list with the model at INDEX",
        docs=(Doc(_WRAPPER, "the wrapper returns a tuple or list with the wrapped model at INDEX (ColossalAI's "
                            "`configure` returns `(model, optimizer, criterion, dataloader, lr_scheduler)`)"),),
    ),
    Option(
        "--ddp-reduction", metavar="mean|sum", choices=("mean", "sum"),
        help="how the wrapper combines the ranks' gradients (default mean)",
        docs=(Doc(_WRAPPER, "how the wrapper combines the ranks' gradients; under `sum` the full-batch equivalent is "
                            "W times the mean"),),
        doc_default="`mean` (as DDP)",
    ),
    Option(
        "--ddp-buffers", metavar="synced|local", choices=("synced", "local"),
        help="what the wrapper does with module buffers (default: reported, not required)",
        docs=(Doc(_WRAPPER, "what the wrapper does with module buffers; undeclared, the finding is reported (not "
                            "applicable) and nothing fails"),),
    ),
    Option(
        "--ddp-after-backward", metavar="METHOD",
        help="a method of what {opt:ddp_fn} returned, called after each backward that syncs (finish_grad_sync)",
        docs=(Doc(_WRAPPER, "a method of what came back, called after each backward that syncs (Megatron's "
                            "`finish_grad_sync`)"),),
    ),
    Option(
        "--ddp-grad-attr", metavar="NAME", help="the parameter attribute holding the reduced gradient (main_grad)",
        docs=(Doc(_WRAPPER, "the parameter attribute holding the reduced gradient (Megatron's `main_grad`)"),),
        kind="attribute name", doc_default="`grad`",
    ),
    Option(
        "--ddp-zero-grad", metavar="METHOD",
        help="a method of what {opt:ddp_fn} returned that clears the gradients each step (zero_grad_buffer)",
        docs=(Doc(_WRAPPER, "a method of what came back that clears the gradients each step (Megatron's "
                            "`zero_grad_buffer`)"),),
    ),
    Option(
        "--ddp-start", metavar="broadcast|identical", choices=("broadcast", "identical"),
        help="how ranks start: the wrapper broadcasts rank 0's weights (default), or identical: it expects identical "
        "weights on every rank (same seed or a checkpoint load, as fully_shard does), and the checks build them so",
        docs=(Doc(_WRAPPER, "`identical` declares that the wrapper expects identical weights on every rank (the same "
                            "seed, or a checkpoint load), as `fully_shard` does: every rank's model is then built from "
                            "one seed and `wrapper.identical_start` is not applicable; `broadcast`: the wrapper makes "
                            "the start identical itself"),),
        doc_default="`broadcast`",
    ),
    Option(
        "--ddp-mesh", metavar="RxS",
        help="makes the @mesh of {opt:ddp_kwarg} 2-D: R replicas x S shards, dimension names (dp_replicate, "
        "dp_shard), for HSDP; worlds of another size than R*S are not applicable",
        docs=(Doc(_WRAPPER, "makes `@mesh` 2-D, `(R, S)` with dimension names `(dp_replicate, dp_shard)`, as HSDP "
                            "takes it; a world of another size than R*S is not applicable, and R*S must be one of the "
                            "world sizes"),),
        kind="`RxS`, two integers", doc_default="a 1-D mesh over the world",
    ),
    Option(
        "--ddp-compute-dtype", metavar="DTYPE", choices=("float64", "float32", "bfloat16", "float16"),
        help="the dtype the wrapper computes forward and backward in (float64, float32, bfloat16 or float16; mixed "
        "precision, such as bfloat16): the training checks then allow that dtype's rounding (default: the model's)",
        docs=(Doc(_WRAPPER, "the dtype the wrapper computes forward and backward in (mixed precision: "
                            "`MixedPrecisionPolicy(param_dtype=torch.bfloat16)`); the training checks then allow that "
                            "dtype's rounding, derived from its unit roundoff. Undeclared, a wrapper computing in a "
                            "lower precision fails them, with that cause"),),
        doc_default="the model's",
    ),
    Option(
        "--ddp-reduce-dtype", metavar="DTYPE", choices=("float64", "float32", "bfloat16", "float16"),
        help="the lowest precision the wrapper may reduce gradients in (float64, float32, bfloat16 or float16), "
        "observed from the collectives it runs (default float32)",
        docs=(Doc(_WRAPPER, "the lowest precision the wrapper may reduce gradients in; "
                            "`wrapper.reduces_in_declared_dtype` reads the dtype of every reduction the backend runs, "
                            "so a `bfloat16` reduction fails whatever the tolerance"),),
        doc_default="`float32`",
    ),
)

_HOOKS = "nemo_dist.conformance.adapters.wrapper_spec"

TARGET = SuiteTarget(
    component="ddp",
    fields=("ddp", "ddp_wrapper"),
    settings=("ddp_api",),
    defaults={"ddp": "nemo_dist.distributed.ddp"},
    module_field="ddp",
    required_any=DDP_APIS,
    standalone=False,
    reference={"ddp": "nemo_dist.distributed.ddp"},
    presets={"nemo_automodel": {"ddp": "nemo_automodel.components.distributed.ddp"}},
    label=f"{_HOOKS}:ddp_label",
    resolve=f"{_HOOKS}:resolve_ddp",
    validate="nemo_dist.conformance.adapters.wrapping:validate_ddp",
    variant_names=DDP_APIS,
    variant_field="ddp_api",
    companions={"wrapper": "ddp_wrapper"},
)
