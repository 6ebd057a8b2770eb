"""Every option of the conformance suite, declared once: :data:`OPTIONS`, read by both front ends.

The command's argparse parser (:func:`nemo_dist.conformance.frontends.arguments.parser`)
and the pytest plugin's ``pytest_addoption`` are built from this table
(:func:`declared`), both Reproduce lines repeat the options it marks
(:func:`repeated`), and the README's option tables are rendered from its
``docs`` (:mod:`nemo_dist.conformance.frontends.option_docs`). How one entry is read is
:class:`~nemo_dist.conformance.engine.option_spec.Option`'s docstring. The order is
the command's ``--help`` order and the order a Reproduce line writes options in.

Values of ``choices`` and defaults repeat engine constants that import torch
(``GATHER_FORMS``, ``TIERS``, ``PRESETS``, ``FLOOR_S``): this module stays
importable without it, and ``tests/conformance/test_option_table.py`` pins them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_dist.conformance.engine.declarations import suite_option_modules, suite_options
from nemo_dist.conformance.engine.option_spec import COMMAND, PYTEST, Doc, Option, PytestVariant

__all__ = [
    "BY_FIELD",
    "COMMAND",
    "DEFAULT_MAX_EXAMPLES",
    "DEFAULT_MIN_DEADLINE",
    "DEFAULT_WORLD_SIZES",
    "OPTIONS",
    "PYTEST",
    "declarations",
    "declared",
    "option",
    "repeated",
    "sections",
    "spelling",
]

#: World sizes when ``--world-sizes`` is not given (every check's range on a CPU machine; the reference
#: run's time with them: benchmarks/results/).
DEFAULT_WORLD_SIZES: tuple[int, ...] = (1, 2, 3, 4)
#: Hypothesis examples per check when the command's ``--max-examples`` is not given.
DEFAULT_MAX_EXAMPLES = 10
#: The command's ``--min-deadline`` when not given: the deadlines' floor, ``FLOOR_S`` seconds.
DEFAULT_MIN_DEADLINE = "10"

_NAMES = "names"  # the README table "| option | what it names |"
_WRAPPER = "wrapper"  # the README table "| option | what it says |" of --ddp-fn
_COMMAND_ONLY = (COMMAND,)

#: What is checked: the engine's own components (a suite's own options follow them, see :data:`OPTIONS`).
_TARGET_OPTIONS: tuple[Option, ...] = (
    Option(
        "--gather", metavar="MODULE", help="module with all_gather_with_grad and all_gather_no_grad",
        docs=(Doc(_NAMES, "a module with `all_gather_with_grad`, `all_gather_no_grad` (and `_AllGatherWithGrad` if "
                          "you kept it)"),),
    ),
    Option(
        "--gather-fn", metavar="MODULE:NAME",
        help="one all-gather callable instead of a module: a function or a torch.autograd.Function subclass (called "
        "through .apply); its output is the concatenation on dim 0, a tuple of W tensors or a stacked [W, ...] tensor",
        docs=(Doc(_NAMES, "one all-gather callable instead: a function, or a `torch.autograd.Function` subclass "
                          "(called through `.apply`)"),),
    ),
    Option(
        "--no-grad-fn", metavar="MODULE:NAME",
        help="the no-grad counterpart of {opt:gather_fn} (default: {opt:gather_fn} under torch.no_grad())",
        docs=(Doc(_NAMES, "its no-grad counterpart"),), doc_default="`--gather-fn` under `torch.no_grad()`",
    ),
    Option(
        "--gather-form", default="auto", choices=("auto", "cat", "tuple", "stacked"),
        help="output form of {opt:gather_fn}: auto, cat, tuple, stacked (default auto: detected from its first call)",
        docs=(Doc(_NAMES, "the callable's output: the concatenation on dim 0, a tuple or list of W tensors, or a "
                          "stacked `[W, *x.shape]` tensor; `auto` detects it from its first call and says it in the "
                          "table's header"),),
    ),
    Option(
        "--gather-kwarg", metavar="NAME=VALUE", repeatable=True,
        help="a keyword passed on every call of {opt:gather_fn} (and {opt:no_grad_fn}), VALUE a Python literal, such "
        "as {opt:gather_kwarg} dim=0, or a symbol filled per call: @out_buffers (W empty tensors like x), @row_sizes "
        "(every rank's rows), @world_size, @rank, @group, or MODULE:NAME() (a factory each rank calls once); a "
        "*args name spreads a list; repeatable (group= and uneven= are the checks' to pass)",
        docs=(Doc(_NAMES, "a keyword passed on every call of the callable (and `--no-grad-fn`), VALUE a Python "
                          "literal, a symbol filled per call (`@out_buffers`, `@row_sizes` ...) or `MODULE:NAME()` "
                          "(a factory each rank calls once; see "
                          "[Any signature](gather.md#any-signature))"),),
    ),
    Option(
        "--gather-init", metavar="NAME=VALUE", repeatable=True,
        help="{opt:gather_fn} names a class (an nn.Module, say) built once per rank with this keyword, then called: "
        "such as {opt:gather_init} dim=0; VALUE a Python literal, @group/@rank/@world_size or MODULE:NAME(); "
        "repeatable",
        docs=(Doc(_NAMES, "the callable is a class (an `nn.Module`, say): built once per rank with this keyword, "
                          "then the object is called; VALUE a Python literal, `@group`, `@rank`, `@world_size` or "
                          "`MODULE:NAME()`"),),
    ),
    Option(
        "--gather-output", metavar="INDEX",
        help="{opt:gather_fn} returns a tuple or list holding the gathered value at INDEX, such as "
        "{opt:gather_output} 0 for a (gathered, sizes) return; {opt:gather_form} applies to that element",
        docs=(Doc(_NAMES, "the callable returns a tuple or list with the gathered tensor at INDEX (`--gather-form` "
                          "applies to that element)"),),
    ),
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
    Option("--config", metavar="MODULE", help="module with DDPConfig",
           docs=(Doc(_NAMES, "a module with `DDPConfig`"),)),
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
    Option(
        "--preset", metavar="NAME", choices=("nemo_dist", "nemo_automodel"),
        help="named module layout: nemo_dist, nemo_automodel", doc_value="nemo_automodel",
        docs=(Doc(_NAMES, "all four, at upstream's module paths (install it with `pip install --no-deps "
                          "nemo-automodel==0.7.0`)"),),
    ),
)

#: How a run runs.
_RUN_OPTIONS: tuple[Option, ...] = (
    Option(
        "--world-sizes", metavar="SIZES", default=",".join(map(str, DEFAULT_WORLD_SIZES)),
        help="comma-separated world sizes (default %(default)s; ignored under torchrun)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--dist-world-sizes", reproduce=False,
    ),
    Option(
        "--backend", default="gloo", choices=("gloo", "nccl"),
        help="gloo (CPU) or nccl (one GPU per rank); default gloo",
    ),
    Option("--tier", default="all", choices=("core", "extended", "all"), help="core, extended or all (default all)"),
    Option(
        "--max-examples", metavar="N", default=str(DEFAULT_MAX_EXAMPLES),
        help="hypothesis examples per check (default %(default)s)",
        pytest=PytestVariant(type=int, help="hypothesis examples per check (default: the active hypothesis profile's)"),
    ),
    Option(
        "--strict", flag=True,
        help="fail on any failing or unsupported check, not only core, and on a check not applicable because of "
        "what the code under test chose (no DDP object to inspect, a comm hook of its own)",
        front_ends=_COMMAND_ONLY
    ),
    Option(
        "--junit-xml", metavar="PATH", help="also write a JUnit XML report to PATH",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--junit-xml", reproduce=False,
    ),
    Option(
        "--json", metavar="PATH",
        help="also write every verdict and the header (versions included) as JSON to PATH (schema: docs/ci.md)",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--list-checks", flag=True,
        help="print the checks the run would make (name, component, tier, promise) and exit, running none",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--version", flag=True, help="print the versions of nemo_dist, torch and Python and exit",
        front_ends=_COMMAND_ONLY, reproduce=False,
    ),
    Option(
        "--select", short="-k", metavar="TEXT",
        help="run only checks whose name contains TEXT ('not TEXT': all but those)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="-k", reproduce=False,
    ),
    Option(
        "--check", metavar="NAME",
        help="run only the check of this exact name (a ddp check's NAME[entry point] runs that entry point alone), "
        "as each failure's Reproduce line does",
        front_ends=_COMMAND_ONLY, reproduce=False,  # under pytest, a node id names the test
    ),
    Option(
        "--timeout", metavar="SECONDS", default="120",
        help="the most one step may take: its deadline is 10 x the slowest passing step so far, at least "
        "{opt:min_deadline}, and past it a step whose ranks are still working gets time up to this many seconds "
        "(default %(default)s)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--dist-timeout",
    ),
    Option(
        "--min-deadline", metavar="SECONDS", default=DEFAULT_MIN_DEADLINE,
        help=f"the least per-step deadline (default {DEFAULT_MIN_DEADLINE}; at most {{opt:timeout}}). A step past its "
        "deadline is reported hung once every unfinished rank is blocked in a collective or a receive; while one is "
        "still working (importing, compiling, computing) it gets time up to {opt:timeout}",
        pytest=PytestVariant(),  # not given: the plugin's min_deadline() applies the floor
    ),
    Option(
        "--seed", metavar="N",
        help="hypothesis seed of every check (default: a fresh one, printed in the header and in each failure's "
        "Reproduce line, which runs that check alone with it)",
        front_ends=_COMMAND_ONLY, pytest_equivalent="--hypothesis-seed", reproduce=False,
    ),
    Option(
        "--hypothesis-db", metavar="DIR|none",
        help="where hypothesis keeps its example database (failing examples are replayed first on the next run) and "
        "its caches: DIR, or none for no database (caches in a temporary directory); default "
        "$XDG_CACHE_HOME/nemo_dist/hypothesis (else ~/.cache/nemo_dist/hypothesis), never the current directory",
        kind="directory or `none`",
    ),
    Option(
        "--quiet", short="-q", flag=True, help="no per-check progress on stderr",
        front_ends=_COMMAND_ONLY, pytest_equivalent="-q", reproduce=False,
    ),
)

#: Every option: what is checked (the engine's components, then each suite's own options, declared in its
#: ``options`` module: :mod:`nemo_dist.conformance.engine.declarations`), then how the run runs.
OPTIONS: tuple[Option, ...] = (*_TARGET_OPTIONS, *suite_options(), *_RUN_OPTIONS)

#: The options by field (``gather_fn``), as help texts and ``{opt:FIELD}`` name them.
BY_FIELD: Mapping[str, Option] = {o.dest: o for o in OPTIONS}


def option(field: str) -> Option:
    """The option that sets ``field`` (``"gather_fn"``); ``KeyError`` for a field no option sets."""
    return BY_FIELD[field]


def spelling(field: str, front_end: str) -> str:
    """How ``front_end`` spells the option of ``field``: its own, or the option declared in its place there.

    Raises ``LookupError`` for a field no option sets or one ``front_end`` has no spelling for.
    """
    spelled = option(field).spelling(front_end)
    if spelled is None:
        raise LookupError(f"{front_end} has no option for {field}")
    return spelled


def declared(front_end: str) -> tuple[Option, ...]:
    """The options ``front_end`` declares (``COMMAND`` or ``PYTEST``), in table order."""
    return tuple(o for o in OPTIONS if front_end in o.front_ends)


def declarations(front_end: str) -> tuple[tuple[tuple[str, ...], dict[str, Any]], ...]:
    """The ``(names, keywords)`` each option of ``front_end`` is declared with, in table order.

    Passed as ``add_argument(*names, **keywords)`` to argparse; pytest's ``OptionGroup.addoption`` takes the same.
    """
    return tuple(o.declaration(front_end, BY_FIELD) for o in declared(front_end))


def sections(front_end: str) -> tuple[tuple[str, tuple[Option, ...]], ...]:
    """The options ``front_end`` declares, grouped as ``--help`` lists them: what is checked by the engine's own
    components, then each suite's own options under its component's name, then how the run runs."""
    mine = set(declared(front_end))
    groups: list[tuple[str, tuple[Option, ...]]] = [
        ("what is checked: gather, ddp, config, fsdp2 and data-parallel wrappers", _TARGET_OPTIONS)
    ]
    for module in suite_option_modules():
        target = getattr(module, "TARGET", None)
        name = target.component if target is not None else module.__name__.split(".")[-2]
        groups.append((f"the {name} suite", tuple(getattr(module, "OPTIONS", ()))))
    groups.append(("how the run runs", _RUN_OPTIONS))
    return tuple((title, found) for title, group in groups if (found := tuple(o for o in group if o in mine)))


def repeated(front_end: str) -> tuple[Option, ...]:
    """The options ``front_end``'s Reproduce line repeats (when their value differs from the default)."""
    return tuple(o for o in declared(front_end) if o.reproduce)


def _check_table() -> None:
    """Fields are unique and every help text words in each front end declaring it (fails at import, not at --help)."""
    if len(BY_FIELD) != len(OPTIONS):
        raise ValueError("two options set the same field")
    for entry in OPTIONS:
        for front_end in entry.front_ends:
            entry.help_in(front_end, BY_FIELD)


_check_table()
