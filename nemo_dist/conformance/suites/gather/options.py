"""The gather suite's options and its component, declared to the engine (loaded by file before torch).

Loaded by :mod:`nemo_dist.conformance.engine.declarations`: the options join the one option table, and
:data:`TARGET` makes ``gather`` a component the engine resolves, validates, presets and labels. Its hooks
(how options become a callable's fields, its label, its validation) are an adapter's,
:mod:`nemo_dist.conformance.adapters.gather_spec`.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["OPTIONS", "ORDER", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 10

_NAMES = "names"  # the README table "| option | what it names |"

OPTIONS: tuple[Option, ...] = (
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
)

_HOOKS = "nemo_dist.conformance.adapters.gather_spec"

TARGET = SuiteTarget(
    component="gather",
    fields=("gather", "gather_fn"),
    settings=("no_grad_fn", "gather_form", "gather_kwargs", "gather_output", "gather_init"),
    defaults={"gather": "nemo_dist.loss.dist_utils", "gather_form": "auto", "gather_kwargs": (), "gather_init": ()},
    options=("gather_kwarg",),
    module_field="gather",
    required=("all_gather_with_grad", "all_gather_no_grad"),
    standalone=False,
    reference={"gather": "nemo_dist.loss.dist_utils"},
    presets={"nemo_automodel": {"gather": "nemo_automodel.components.loss.dist_utils"}},
    label=f"{_HOOKS}:gather_label",
    resolve=f"{_HOOKS}:resolve_gather",
    validate=f"{_HOOKS}:validate_gather",
)
