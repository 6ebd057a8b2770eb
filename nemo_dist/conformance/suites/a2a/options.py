"""The a2a suite's options and its component, declared to the engine (standard library only).

Loaded by file by :mod:`nemo_dist.conformance.engine.declarations` before torch is
imported: the options join the one option table, and :data:`TARGET` makes
``a2a`` a component the engine resolves, presets and labels.
"""

from __future__ import annotations

from nemo_dist.conformance.engine.declarations import SuiteTarget
from nemo_dist.conformance.engine.option_spec import Doc, Option

__all__ = ["A2A_SYMBOLS", "OPTIONS", "ORDER", "TABLES", "TARGET"]

#: Where this suite's checks stand in the run and its options in the table (engine.declarations).
ORDER = 80

_NAMES = "names"  # the README table "| option | what it names |"
_A2A = "a2a"  # the README table "| option | what it says |" of an all-to-all callable

#: The values a rank fills for each call of an all-to-all callable (``--a2a-kwarg NAME=@SYMBOL``), and what each
#: holds. A parameter named like one of them is filled with it unless ``--a2a-kwarg`` names it.
A2A_SYMBOLS: dict[str, str] = {
    "input": "the tensor this rank sends (default: the callable's first parameter)",
    "output": "an empty tensor of the rows this rank receives (shape, dtype, device), for a callable that writes "
    "into one",
    "input_split_sizes": "the list of rows this rank sends to each rank of the call's group, in group rank order",
    "output_split_sizes": "the list of rows this rank receives from each rank of the call's group",
    "group": "the call's process group: the subgroup the group check passes, else the whole world's",
    "rank": "this rank's rank in the call's group",
    "world_size": "the number of ranks of the call's group",
}

#: The README option table of an all-to-all callable (docs/a2a.md, "Any all-to-all").
TABLES = {_A2A: "what it says"}

OPTIONS: tuple[Option, ...] = (
    Option(
        "--a2a", metavar="MODULE",
        help="module with all_to_all_with_grad(tensor, output_split_sizes, input_split_sizes, group) and, "
        "if it has them, dispatch_tokens and combine_tokens",
        docs=(Doc(_NAMES, "a module with `all_to_all_with_grad(tensor, output_split_sizes, input_split_sizes, "
                          "group)` (and `dispatch_tokens` / `combine_tokens`, checked where it has them)"),),
    ),
    Option(
        "--a2a-fn", metavar="MODULE:NAME",
        help="one autograd all-to-all callable instead of a module: a function or a torch.autograd.Function "
        "subclass; parameters named input, output, input_split_sizes, output_split_sizes or group are filled, "
        "others by {opt:a2a_kwarg}",
        docs=(
            Doc(_NAMES, "one autograd all-to-all instead: a function or a `torch.autograd.Function` subclass "
                        "(see [Any all-to-all](a2a.md#any-all-to-all))"),
            Doc(_A2A, "the callable; a parameter named like a symbol below is filled with it, the tensor goes to "
                      "`@input` (default: the first parameter); a callable given no split sizes is checked on "
                      "equal splits"),
        ),
    ),
    Option(
        "--a2a-kwarg", metavar="NAME=VALUE", repeatable=True,
        help="a keyword of every call of {opt:a2a_fn}: a Python literal or a symbol filled per call (@input, "
        "@output, @input_split_sizes, @output_split_sizes, @group, @rank, @world_size), such as "
        "{opt:a2a_kwarg} input_=@input",
        docs=(Doc(_A2A, "a keyword of every call: a Python literal, or a symbol filled per call: "
                        + "; ".join(f"`@{name}` {what}" for name, what in A2A_SYMBOLS.items())),),
    ),
)

TARGET = SuiteTarget(
    component="a2a",
    fields=("a2a", "a2a_fn", "a2a_kwarg"),
    module_field="a2a",
    required=("all_to_all_with_grad",),
    reference={"a2a": "nemo_dist.distributed.all_to_all"},
    presets={"nemo_dist": {"a2a": "nemo_dist.distributed.all_to_all"}},
    label_fields=("a2a_fn", "a2a"),
    validate="nemo_dist.conformance.suites.a2a.target:validate",
    subject_fields=("a2a", "a2a_fn"),
)
