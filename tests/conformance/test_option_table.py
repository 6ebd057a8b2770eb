"""Layer 0 (no process group): one option table, read by both front ends, both Reproduce lines and the docs.

The pytest front end is read in this process through ``pytester.parseconfig``
(its options parsed, no test collected, no world started).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

# Imported before any in-process pytest run: pytester removes afterwards the modules a run imported, and torch
# cannot be imported twice in one process.
import nemo_dist.conformance.frontends.pytest_plugin as plugin
from nemo_dist.conformance.engine import options
from nemo_dist.conformance.engine.option_spec import COMMAND, PYTEST, PYTEST_PREFIX, Option
from nemo_dist.conformance.frontends import arguments, option_docs
from tests.conformance._cli import ROOT

_PLUGIN = ("-p", "nemo_dist.conformance.frontends.pytest_plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning")
#: The pages whose option tables are rendered (scripts/render_option_tables.py renders the same ones).
_READMES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


class _ParserRecorder:
    """A plugin keeping the parser pytest hands to ``pytest_addoption``, to read the options declared on it."""

    parser: pytest.Parser | None = None

    def pytest_addoption(self, parser: pytest.Parser) -> None:
        self.parser = parser


def _pytest_options(pytester: pytest.Pytester) -> dict[str, Any]:
    """The options of the plugin's ``conformance`` group, by name (pytest's ``Argument`` objects)."""
    recorder = _ParserRecorder()
    pytester.plugins.append(recorder)
    config = pytester.parseconfig(*_PLUGIN)
    config.pluginmanager.check_pending()  # the plugin defines no unknown pytest_* hook (an imported name, say)
    assert recorder.parser is not None
    group = recorder.parser.getgroup("conformance")
    return {name: argument for argument in group.options for name in argument.names()}


def _command_actions() -> dict[str, Any]:
    """The command parser's options (help aside), by their longest spelling (argparse's actions)."""
    actions = [a for a in arguments.parser()._actions if a.option_strings and a.dest != "help"]
    return {max(a.option_strings, key=len): a for a in actions}


def _given(option: Option, front_end: str) -> tuple[list[str], Any]:
    """Words giving ``option`` on ``front_end``'s command line (twice for a repeatable one), and the value expected."""
    spelled = option.spelling(front_end)
    assert spelled is not None
    if option.flag:
        return [spelled], True
    if option.repeatable:
        return [spelled, "a=1", spelled, "b=2"], ["a=1", "b=2"]
    convert = option.pytest.type if front_end == PYTEST and option.pytest and option.pytest.type else str
    return [spelled, "3"], convert("3")


def test_the_command_declares_each_of_its_table_options_as_the_table_says() -> None:
    """The command's parser holds exactly the table's command options: spellings, metavar, default, help, action."""
    actions = _command_actions()
    assert list(actions) == [o.name for o in options.declared(COMMAND)]
    for option in options.declared(COMMAND):
        action = actions[option.name]
        assert action.option_strings == ([option.short] if option.short else []) + [option.name]
        assert (action.dest, action.metavar) == (option.dest, option.metavar)
        assert action.default == option.default_in(COMMAND), option.name
        assert action.help == option.help_in(COMMAND, options.BY_FIELD)


def test_every_command_option_reaches_the_command_under_its_spelling() -> None:
    """Given all at once, each command option sets its field (a flag True, a repeatable one every value)."""
    argv: list[str] = []
    expected: dict[str, Any] = {}
    for option in options.declared(COMMAND):
        words, expected[option.dest] = _given(option, COMMAND)
        argv += words
    args = arguments.parser().parse_args(argv)
    assert {field: getattr(args, field) for field in expected} == expected


def test_pytest_declares_each_of_its_table_options_as_the_table_says(pytester: pytest.Pytester) -> None:
    """The plugin's group holds exactly the table's pytest options, prefixed: metavar, default, type, help."""
    found = _pytest_options(pytester)
    assert list(found) == [o.spelling(PYTEST) for o in options.declared(PYTEST)]
    for option in options.declared(PYTEST):
        attrs = found[plugin.option_name(option.dest)].attrs()
        assert attrs["metavar"] == option.metavar
        assert attrs["default"] == option.default_in(PYTEST), option.name
        assert attrs["type"] == (option.pytest.type if option.pytest else None)
        assert attrs["help"] == option.help_in(PYTEST, options.BY_FIELD)


def test_every_pytest_option_reaches_pytest_under_its_spelling(pytester: pytest.Pytester) -> None:
    """Given all at once, each ``--conformance-*`` option reads back as given (converted where pytest types it)."""
    argv: list[str] = []
    expected: dict[str, Any] = {}
    for option in options.declared(PYTEST):
        words, expected[plugin.option_name(option.dest)] = _given(option, PYTEST)
        argv += words
    config = pytester.parseconfig(*_PLUGIN, *argv)
    assert {name: config.getoption(name) for name in expected} == expected


def test_an_option_of_one_front_end_only_is_declared_so_in_the_table(pytester: pytest.Pytester) -> None:
    """The options one front end has and the other lacks are exactly those the table gives that front end alone."""
    command = {name.removeprefix("--") for name in _command_actions()}
    under_pytest = {name.removeprefix(PYTEST_PREFIX) for name in _pytest_options(pytester)}
    assert command - under_pytest == {o.name[2:] for o in options.OPTIONS if o.front_ends == (COMMAND,)}
    assert under_pytest - command == {o.name[2:] for o in options.OPTIONS if o.front_ends == (PYTEST,)}


def test_pytest_has_an_option_in_place_of_each_command_only_option_with_an_equivalent(
    pytester: pytest.Pytester,
) -> None:
    """``--dist-world-sizes``, ``--hypothesis-seed``, ``-k`` ... parse with the plugins pytest loads."""
    argv: list[str] = []
    for option in options.OPTIONS:
        if PYTEST not in option.front_ends and option.pytest_equivalent is not None:
            argv += [option.pytest_equivalent] if option.flag else [option.pytest_equivalent, "1"]
    assert "--dist-world-sizes" in argv
    pytester.parseconfig(*_PLUGIN, *argv)  # a usage error for an unknown option


def test_help_names_other_options_as_each_front_end_spells_them() -> None:
    """No help keeps a ``{opt:...}`` field; pytest's never names a command spelling, the command's no pytest one."""
    command_spellings = [o.name for o in options.declared(PYTEST)]
    for option in options.OPTIONS:
        for front_end in option.front_ends:
            text = option.help_in(front_end, options.BY_FIELD)
            assert "{opt:" not in text, (option.name, front_end)
            if front_end == PYTEST:
                assert not [s for s in command_spellings if re.search(rf"(?<![\w-]){s}(?![\w-])", text)], text
            else:
                assert PYTEST_PREFIX not in text, text
    no_grad = options.option("no_grad_fn")
    assert no_grad.help_in(PYTEST, options.BY_FIELD).startswith("the no-grad counterpart of --conformance-gather-fn")
    deadline = options.option("min_deadline").help_in(PYTEST, options.BY_FIELD)
    assert "at most --dist-timeout" in deadline


def test_choices_and_defaults_repeat_the_engine_constants() -> None:
    """The table's choices and defaults are the engine's (which import torch); help or metavar lists the choices."""
    from nemo_dist.conformance import PRESETS, TIERS
    from nemo_dist.conformance.adapters.gather_spec import GATHER_FORMS
    from nemo_dist.conformance.adapters.wrapping import BUFFERS, DTYPES, REDUCTIONS, STARTS
    from nemo_dist.conformance.engine.deadlines import FLOOR_S
    from nemo_dist.conformance.suites.moe.target import AUX_REDUCTIONS, MESHES
    from nemo_dist.conformance.suites.moe.target import REDUCTIONS as MOE_REDUCTIONS
    from nemo_dist.conformance.suites.pp.target import CONVENTIONS
    from nemo_dist.conformance.suites.pp.target import DTYPES as PP_DTYPES

    engine = {"gather_form": GATHER_FORMS, "tier": TIERS, "preset": tuple(PRESETS), "ddp_reduction": REDUCTIONS,
              "ddp_buffers": BUFFERS, "ddp_start": STARTS, "backend": ("gloo", "nccl"),
              "ddp_compute_dtype": DTYPES, "ddp_reduce_dtype": DTYPES, "moe_compute_dtype": DTYPES,
              "moe_mesh": MESHES, "moe_reduction": MOE_REDUCTIONS, "moe_aux_reduction": AUX_REDUCTIONS,
              "pp_loss": CONVENTIONS, "pp_compute_dtype": PP_DTYPES}
    assert {o.dest: o.choices for o in options.OPTIONS if o.choices} == engine
    for field, choices in engine.items():
        text = f"{options.option(field).metavar} {options.option(field).help}"
        assert all(re.search(rf"\b{choice}\b", text) for choice in choices), text
    assert str(FLOOR_S).removesuffix(".0") == options.DEFAULT_MIN_DEADLINE
    from nemo_dist.conformance.suites.moe.target import LOSS_SCALES

    assert all(f"`{scale}`" in (options.option("moe_loss_scale").kind or "") for scale in LOSS_SCALES)


def test_every_wrapper_option_field_is_an_option_of_both_front_ends() -> None:
    """``wrapper_from_options`` reads each ``--ddp-fn`` field from either front end: each is declared in both."""
    from nemo_dist.conformance.adapters.wrapping import WRAPPER_OPTION_FIELDS

    both = {o.dest for o in options.OPTIONS if set(o.front_ends) == {COMMAND, PYTEST}}
    assert set(WRAPPER_OPTION_FIELDS) <= both


def test_every_option_naming_what_is_checked_is_read_by_both_front_ends_through_one_function() -> None:
    """The options of the README's "what it names" table are exactly those ``implementation_from_options`` and
    ``wrapper_from_options`` read (so a new one reaches both front ends by the table and that one tuple), each
    declared in both front ends."""
    from nemo_dist.conformance.adapters.wrapping import WRAPPER_OPTION_FIELDS
    from nemo_dist.conformance.engine.target import IMPLEMENTATION_OPTION_FIELDS

    naming = {o.dest for o in options.OPTIONS if any(doc.table == "names" for doc in o.docs)}
    both = {o.dest for o in options.OPTIONS if set(o.front_ends) == {COMMAND, PYTEST}}
    # A suite's own options may document themselves in a table of the suite's (the tp plan's "what it says").
    documented = {o.dest for o in options.OPTIONS if o.docs}
    assert set(IMPLEMENTATION_OPTION_FIELDS) <= documented
    assert naming <= set(IMPLEMENTATION_OPTION_FIELDS) | set(WRAPPER_OPTION_FIELDS)
    assert set(IMPLEMENTATION_OPTION_FIELDS) <= both


def test_the_command_reproduce_line_repeats_the_marked_options_in_table_order() -> None:
    """Every repeated option set off its default comes back, long form, quoted, in order; the others never do."""
    argv: list[str] = []
    for option in options.declared(COMMAND):
        argv += _given(option, COMMAND)[0]
    line = arguments.reproduce_command(arguments.parser().parse_args(argv), "prog")
    assert line == (
        "prog --preset 3 --gather 3 --gather-fn 3 --no-grad-fn 3 --gather-form 3 --gather-kwarg a=1 --gather-kwarg b=2 "
        "--gather-init a=1 --gather-init b=2 --gather-output 3 --ddp 3 --ddp-fn 3 --ddp-method 3 --ddp-kwarg a=1 "
        "--ddp-kwarg b=2 --ddp-output 3 --ddp-reduction 3 --ddp-buffers 3 --ddp-after-backward 3 --ddp-grad-attr 3 "
        "--ddp-zero-grad 3 --ddp-start 3 --ddp-mesh 3 --ddp-compute-dtype 3 --ddp-reduce-dtype 3 "
        "--config 3 --fsdp2 3 --fsdp2-sync-ctx 3 --tp 3 --tp-plan 3 --tp-model 3 --tp-arch 3 --tp-input 3 "
        "--tp-after-backward 3 --a2a 3 --a2a-fn 3 --a2a-kwarg a=1 --a2a-kwarg b=2 --moe-fn 3 --moe-layer 3 "
        "--moe-compute-dtype 3 --moe-mesh 3 --moe-reduction 3 --moe-loss-scale 3 --moe-aux-reduction 3 "
        "--moe-after-backward 3 --pp-fn 3 --pp-loss 3 --pp-model 3 --pp-compute-dtype 3 --pp-step 3 --pp-schedule 3 "
        "--backend 3 --tier 3 --max-examples 3 --strict --timeout 3 --min-deadline 3 "
        "--hypothesis-db 3"
    )


def test_options_given_at_their_defaults_are_left_out_of_the_command_reproduce_line() -> None:
    """A Reproduce line repeats only what differs from the defaults; values are shell-quoted."""
    argv = ["--gather-form", "auto", "--tier", "all", "--backend", "gloo", "--max-examples", "10", "--timeout", "120",
            "--min-deadline", "10", "--gather-kwarg", "x='a b'"]
    line = arguments.reproduce_command(arguments.parser().parse_args(argv))
    assert line == "nemo-dist-conformance --gather-kwarg 'x='\"'\"'a b'\"'\"''"


def test_the_pytest_reproduce_line_repeats_the_marked_options_in_table_order(pytester: pytest.Pytester) -> None:
    """The pytest line: node id, every repeated option off its default in table order, world size, seed."""
    argv: list[str] = []
    for option in options.declared(PYTEST):
        argv += _given(option, PYTEST)[0]
    config = pytester.parseconfig(*_PLUGIN, *argv)
    assert plugin.reproduce_line(config, "t.py::test[c-w2]", 2, 7) == (
        "pytest 't.py::test[c-w2]' --conformance-preset 3 --conformance-gather 3 --conformance-gather-fn 3 "
        "--conformance-no-grad-fn 3 "
        "--conformance-gather-form 3 --conformance-gather-kwarg a=1 --conformance-gather-kwarg b=2 "
        "--conformance-gather-init a=1 --conformance-gather-init b=2 --conformance-gather-output 3 "
        "--conformance-ddp 3 --conformance-ddp-fn 3 --conformance-ddp-method 3 --conformance-ddp-kwarg a=1 "
        "--conformance-ddp-kwarg b=2 --conformance-ddp-output 3 --conformance-ddp-reduction 3 "
        "--conformance-ddp-buffers 3 --conformance-ddp-after-backward 3 --conformance-ddp-grad-attr 3 "
        "--conformance-ddp-zero-grad 3 --conformance-ddp-start 3 --conformance-ddp-mesh 3 "
        "--conformance-ddp-compute-dtype 3 --conformance-ddp-reduce-dtype 3 "
        "--conformance-config 3 --conformance-fsdp2 3 --conformance-fsdp2-sync-ctx 3 "
        "--conformance-tp 3 --conformance-tp-plan 3 --conformance-tp-model 3 --conformance-tp-arch 3 "
        "--conformance-tp-input 3 --conformance-tp-after-backward 3 --conformance-a2a 3 --conformance-a2a-fn 3 "
        "--conformance-a2a-kwarg a=1 --conformance-a2a-kwarg b=2 --conformance-moe-fn 3 --conformance-moe-layer 3 "
        "--conformance-moe-compute-dtype 3 --conformance-moe-mesh 3 --conformance-moe-reduction 3 "
        "--conformance-moe-loss-scale 3 --conformance-moe-aux-reduction 3 --conformance-moe-after-backward 3 "
        "--conformance-pp-fn 3 --conformance-pp-loss 3 --conformance-pp-model 3 --conformance-pp-compute-dtype 3 "
        "--conformance-pp-step 3 --conformance-pp-schedule 3 --conformance-backend 3 "
        "--conformance-tier 3 --conformance-max-examples 3 --conformance-min-deadline 3 "
        "--conformance-hypothesis-db 3 --dist-world-sizes 2 --hypothesis-seed=7"
    )
    defaults = pytester.parseconfig(*_PLUGIN, "--conformance-tier", "all", "--conformance-gather-form", "auto")
    assert plugin.reproduce_line(defaults, "t.py::test", 0, 8) == "pytest t.py::test --hypothesis-seed=8"


@pytest.mark.parametrize("readme", _READMES, ids=lambda path: str(path.relative_to(ROOT)))
def test_readme_option_tables_are_rendered_from_the_table(readme: Any) -> None:
    """Each marked README option table is what the table renders: its options, their metavars, their docs."""
    text = readme.read_text()
    assert option_docs.render_readme(text) == text, "run: python scripts/render_option_tables.py"


def test_every_readme_option_table_is_marked_and_every_marked_table_is_known() -> None:
    """A README table headed ``| option |`` lies between markers; the marked tables are those the table's docs fill."""
    marked: list[str] = []
    for readme in _READMES:
        text = readme.read_text()
        marked += option_docs.marked_tables(text)
        unmarked = re.sub(r"<!-- options:([\w-]+) -->\n.*?<!-- /options:\1 -->", "", text, flags=re.S)
        assert not re.search(r"^\| option \|", unmarked, re.M), f"{readme}: an option table without markers"
    documented = {doc.table for o in options.OPTIONS for doc in o.docs}
    assert sorted(marked) == sorted(option_docs.TABLES) == sorted(documented)


def test_a_readme_table_whose_row_differs_from_the_table_is_rendered_anew() -> None:
    """A stale metavar, a missing row or an extra row is replaced by the table's rows (so the README test fails)."""
    fresh = option_docs.render_table("wrapper")
    for stale in (fresh.replace("`--ddp-output INDEX`", "`--ddp-output N`"),
                  "\n".join(line for line in fresh.splitlines() if "--ddp-buffers" not in line) + "\n",
                  fresh + "| `--ddp-extra X` | not an option |\n"):
        block = "before\n<!-- options:wrapper -->\n{}<!-- /options:wrapper -->\nafter\n"
        assert option_docs.render_readme(block.format(stale)) == block.format(fresh)


def test_every_option_is_named_in_the_docs() -> None:
    """Each front end's spelling of every option it declares appears in the pages of docs/ (``-k``/``-q`` do)."""
    text = "\n".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))

    def named(spelling: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", text) is not None

    missing = [
        (option.name, front_end)
        for option in options.OPTIONS
        for front_end in option.front_ends
        if not named(option.spelling(front_end) or "") and not (front_end == COMMAND and named(option.short or ""))
    ]
    assert not missing


def _rows(name: str) -> list[list[str]]:
    """The cells of each line of README table ``name`` as rendered (header and rule included), split at the pipes
    no backslash escapes."""
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in option_docs.render_table(name).splitlines()]


def _documented() -> list[tuple[str, Option, list[str]]]:
    """Every rendered row: its table, its option, its cells."""
    found = []
    for name in option_docs.TABLES:
        rows = iter(_rows(name)[2:])
        for option in options.OPTIONS:
            found += [(name, option, next(rows)) for doc in option.docs if doc.table == name]
    return found


def test_every_option_table_has_a_type_and_a_default_column() -> None:
    """Each table's header is option, type, default and its own column, and every row has those four cells."""
    for name, second in option_docs.TABLES.items():
        rows = _rows(name)
        assert rows[0] == ["option", "type", "default", second]
        assert {len(row) for row in rows} == {4}, name


def test_each_row_types_its_option_from_the_declaration() -> None:
    """A choices option's type cell lists exactly its choices, in order; a flag's says flag; a repeatable option's
    ends ``, repeatable``; a declared ``kind`` is the cell; any other cell is what KINDS says of the metavar."""
    for _, option, (key, type_cell, _, _) in _documented():
        assert key == option_docs.row_key(option)
        assert key.startswith(f"`{option.name}")
        if option.choices:
            assert type_cell.split(" \\| ") == [f"`{choice}`" for choice in option.choices], option.name
            assert key == f"`{option.name}`" or option.doc_value is not None  # the choices are said once
        elif option.flag:
            assert type_cell == "flag"
        else:
            expected = option.kind or option_docs.KINDS[option.metavar or ""]
            assert type_cell == expected.replace("|", "\\|") + (", repeatable" if option.repeatable else "")


def test_each_row_says_its_default_once_from_the_declaration() -> None:
    """A declared default is the default cell (in code), else the declared ``doc_default``, else ``-``; a row whose
    default cell says it does not say it again in its text."""
    for _, option, (_, _, default, text) in _documented():
        if option.default is not None:
            assert default == f"`{option.default}`"
        elif option.doc_default is not None:
            assert default == option.doc_default.replace("|", "\\|")
        else:
            assert default == ("off" if option.flag else "-")
        if default != "-":
            assert not re.search(r"\bdefault\b", text), (option.name, text)


def test_the_default_cells_are_what_the_engine_applies_to_an_option_not_given() -> None:
    """The wrapper's and the moe suite's ``doc_default`` name what ``parse_wrapper`` and the moe target make of an
    option left out (a fake implementation given no suite option)."""
    from types import SimpleNamespace

    from nemo_dist.conformance.adapters.wrapping import parse_wrapper
    from nemo_dist.conformance.suites.moe import target as moe

    wrapper = parse_wrapper(ddp_fn="m:f")
    assert wrapper is not None
    assert (wrapper.start, wrapper.mesh, wrapper.grad_attr, wrapper.compute_dtype) == (None, None, None, None)
    impl: Any = SimpleNamespace(suite_option=lambda field, default=None: default)
    assert not moe.composed(impl)
    layout = (1, 2)
    assert (moe.tolerance(impl), moe.loss_scale(impl, layout, 2), moe.mean_divisor(impl, layout, 2),
            moe.aux_weight(impl, layout, 2)) == (moe.dtype_tolerance("float64"), 1.0, 1.0, 1.0)
    applied = {"ddp_reduction": wrapper.reduction, "ddp_reduce_dtype": wrapper.reduce_dtype, "ddp_start": "broadcast",
               "ddp_grad_attr": "grad", "moe_mesh": moe.MESHES[0], "moe_compute_dtype": "float64",
               "moe_loss_scale": "1", "moe_reduction": "sum", "moe_aux_reduction": "sum"}
    assert {field: option_docs.default_cell(options.option(field)).split()[0] for field in applied} == {
        field: f"`{value}`" for field, value in applied.items()}


def test_any_option_renders_a_type_and_a_default() -> None:
    """A suite's new option renders without code of its own: an unknown metavar in code, a flag ``off``, pipes of a
    declared kind escaped; a ``doc_default`` beside a declared default is refused."""
    unknown = Option("--x-stages", help="h", metavar="STAGES")
    assert (option_docs.type_cell(unknown), option_docs.default_cell(unknown)) == ("`STAGES`", "-")
    flag = Option("--x-strict", help="h", flag=True)
    assert (option_docs.type_cell(flag), option_docs.default_cell(flag)) == ("flag", "off")
    kind = Option("--x-scale", help="h", metavar="F", kind="number | `@dp`", repeatable=True, doc_default="`a|b`")
    assert (option_docs.type_cell(kind), option_docs.default_cell(kind)) == (
        "number \\| `@dp`, repeatable", "`a\\|b`")
    with pytest.raises(ValueError, match="doc_default"):
        Option("--x-y", help="h", default="1", doc_default="`1`")
