"""Layer 2/3: any gather signature from the command line (``--gather-kwarg``, ``--gather-output``, ``--gather-init``).

The fork ``tests/forks/gallery_gather_with_sizes.py`` has a required keyword
``dim`` and returns ``(gathered, sizes)``; the other gallery forks bring a
required process group before ``dim``, a module class built with its dim, a
``*buffers`` parameter and a list of every rank's sizes. Usage errors are
checked in-process through ``main(argv)`` (no world starts); the verdicts in
gloo worlds of 1, 2 and 3 ranks (the session's worlds, or those of
``main(argv)`` run in this process, for the command's exit status; the real
process's exit statuses are test_cli's).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nemo_dist.conformance import Implementation, MissingParameter, load_checks, run_checks, select_checks
from nemo_dist.conformance.adapters.signature import arguments, missing_in, parameters_after_x
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.frontends.cli import main
from nemo_dist.conformance.suites.gather.target import _as_cat
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance._cli import run_in_process
from tests.forks import gallery_gather_forward_reduce_scatter_backward as colossal
from tests.forks import gallery_gather_into_buffers as buffers
from tests.forks import gallery_gather_with_sizes as fork
from tests.forks import gallery_module_all_gather as module

FORK = "tests.forks.gallery_gather_with_sizes"
WITH_SIZES = f"{FORK}:gather_with_sizes"
QUICK = ("--max-examples", "3", "-q")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--gather-fn tests.forks.gallery_gather_with_sizes:gather_with_sizes has required keyword-only "
             "parameter 'dim' that no option fills; pass it on every call with --gather-kwarg dim=VALUE"),
        (["--gather-kwarg", "dim=zero"], "--gather-kwarg 'dim=zero': 'zero' is not a Python literal"),
        (["--gather-kwarg", "dim"], "--gather-kwarg expects NAME=VALUE (VALUE a Python literal or an @symbol)"),
        (["--gather-kwarg", "dim=0", "--gather-kwarg", "dim=1"], "--gather-kwarg names 'dim' twice"),
        (["--gather-kwarg", "dim=0", "--gather-kwarg", "group=None"],
         "--gather-kwarg 'group=None': the checks pass group= themselves"),
        (["--gather-kwarg", "dim=0", "--gather-kwarg", "uneven=True"],
         "--gather-kwarg 'uneven=True': the checks pass uneven= themselves"),
        (["--gather-kwarg", "dim=0", "--gather-kwarg", "axis=0"],
         "--gather-kwarg axis=...: tests.forks.gallery_gather_with_sizes:gather_with_sizes takes no parameter 'axis'"),
        (["--gather-kwarg", "dim=0", "--gather-output", "first"],
         "--gather-output expects the index (>= 0) of the gathered tensor"),
    ],
    ids=["missing-dim", "not-a-literal", "no-equals", "twice", "group", "uneven", "unknown-name", "output-not-int"],
)
def test_bad_gather_call_options_exit_two_naming_option_and_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad --gather-kwarg/--gather-output (or a required parameter left unfilled) exits 2 before any world."""
    assert main(["--gather-fn", WITH_SIZES, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [["--gather-kwarg", "dim=0"], ["--gather-output", "0"], ["--gather-init", "dim=0"]],
    ids=["kwarg", "output", "init"],
)
def test_gather_call_options_apply_to_a_gather_fn_only(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--gather-kwarg and --gather-output with a module (or nothing) named are usage errors saying so."""
    assert main(["--gather", "nemo_dist.loss.dist_utils", *option]) == 2
    assert f"{option[0]} applies to a --gather-fn callable only" in capsys.readouterr().err


def test_a_required_parameter_of_an_autograd_function_is_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """forward(ctx, x, dim, group=None) needs dim: the usage error names it and the flag (group is the checks')."""
    assert main(["--gather-fn", f"{FORK}:AllGatherOnDim"]) == 2
    assert "required parameter 'dim' that no option fills; pass it on every call with --gather-kwarg dim=VALUE" \
        in capsys.readouterr().err


def test_values_reach_an_autograd_function_by_position_and_a_function_by_keyword() -> None:
    """apply() takes positions only: dim lands after x, group after it; a keyword-only dim stays a keyword."""
    on_dim = parameters_after_x(fork.AllGatherOnDim)
    assert on_dim is not None
    assert arguments(on_dim, {"dim": 1}, function_class=True) == ([1], {})
    assert arguments(on_dim, {"group": "g", "dim": 0}, function_class=True) == ([0, "g"], {})
    with_sizes = parameters_after_x(fork.gather_with_sizes)
    assert with_sizes is not None
    assert arguments(with_sizes, {"dim": 0}, function_class=False) == ([], {"dim": 0})


class _SetupContextStyle(torch.autograd.Function):
    """A Function with ``setup_context``: its ``forward`` has no ``ctx``."""

    @staticmethod
    def forward(x: torch.Tensor, dim: int) -> torch.Tensor:
        return x

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        return None


def test_parameters_after_x_skip_ctx_only_where_forward_has_it() -> None:
    """forward(ctx, x, dim, group=None) and a setup_context-style forward(x, dim) both ask for dim first."""
    old_style = parameters_after_x(fork.AllGatherOnDim)
    new_style = parameters_after_x(_SetupContextStyle)
    assert old_style is not None
    assert new_style is not None
    assert [p.name for p in old_style] == ["dim", "group"]
    assert [p.name for p in new_style] == ["dim"]


def test_missing_parameters_are_read_from_both_type_error_wordings() -> None:
    """Python's "missing 1 required keyword-only argument: 'dim'" and autograd apply's wording both name dim."""
    with pytest.raises(TypeError) as python:
        fork.gather_with_sizes(None)  # type: ignore[call-arg]
    assert missing_in(python.value) == ("dim",)
    assert missing_in(TypeError("forward() missing required argument: 'dim' (position 1)")) == ("dim",)
    assert missing_in(TypeError("f() missing 2 required positional arguments: 'a' and 'b'")) == ("a", "b")
    assert missing_in(ValueError("missing 1 required positional argument: 'a'")) == ()


def _run(impl: Implementation, world_factory: WorldFactory, sizes: tuple[int, ...], names: tuple[str, ...]) -> Any:
    checks = [c for c in select_checks(load_checks().values(), impl, "core", None, ("gather",)) if c.name in names]
    return run_checks(checks, impl, sizes, max_examples=3, timeout=60, worlds=world_factory, components=("gather",))


def test_a_tuple_not_of_w_tensors_is_said_to_be_so(world_factory: WorldFactory) -> None:
    """(gathered, sizes) without --gather-output at world size 3: the header and the failure say it is no W-tuple."""
    impl = Implementation(gather=None, gather_fn=WITH_SIZES, gather_kwargs=(("dim", "0"),))
    report = _run(impl, world_factory, (3,), ("gather.forward_matches_cat",))
    table = format_report(report)
    said = (
        "returned a tuple of 2 items (Tensor, list) at world size 3; the tuple form needs one tensor per rank; "
        "a (gathered, extra) return needs --gather-output 0"
    )
    assert report.exit_code() == 1, table
    assert f"{WITH_SIZES}(x, dim=0): its first call failed on rank 0: TypeError: {WITH_SIZES} {said}" \
        in report.notes, table
    [verdict] = report.verdicts
    assert verdict.outcome == "fail"
    assert said in verdict.message, table


def test_a_tuple_of_w_items_that_are_not_rank_tensors_is_said_to_be_so(world_factory: WorldFactory) -> None:
    """At world size 2 the 2-tuple (gathered, sizes) has W items, and is still not taken for the W tensors."""
    impl = Implementation(gather=None, gather_fn=WITH_SIZES, gather_kwargs=(("dim", "0"),))
    report = _run(impl, world_factory, (2,), ("gather.forward_matches_cat",))
    [verdict] = report.verdicts
    assert verdict.outcome == "fail", format_report(report)
    assert "returned a tuple of 2 items (Tensor, list); the tuple form needs W tensors; a (gathered, extra) " \
        "return needs --gather-output 0" in verdict.message


def test_an_autograd_function_gets_its_keyword_by_position_and_conforms(world_factory: WorldFactory) -> None:
    """AllGatherOnDim.apply(x, dim) with --gather-kwarg dim=0 passes the forward and gradient checks in worlds of 2."""
    impl = Implementation(gather=None, gather_fn=f"{FORK}:AllGatherOnDim", gather_kwargs=(("dim", "0"),))
    report = _run(impl, world_factory, (2,), ("gather.forward_matches_cat", "gather.backward_sums_rank_slices"))
    assert [v.outcome for v in report.verdicts] == ["pass", "pass"], format_report(report)


def test_a_hidden_required_parameter_is_one_usage_error_from_the_first_call(world_factory: WorldFactory) -> None:
    """Behind a decorator hiding the signature, the first call's TypeError stops the run: MissingParameter('dim')."""
    impl = Implementation(gather=None, gather_fn=f"{FORK}:timed_gather_with_sizes")
    with pytest.raises(MissingParameter) as raised:
        _run(impl, world_factory, (2,), ("gather.forward_matches_cat",))
    assert raised.value.parameter == "dim"
    assert "failed its first call on every rank for a missing parameter 'dim'" in str(raised.value)
    assert "pass it on every call with gather_kwarg dim=VALUE" in str(raised.value)


def test_gather_with_sizes_conforms_on_core_with_the_two_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--gather-kwarg dim=0 --gather-output 0 make the (gathered, sizes) gather checkable: CONFORMS, exit 0."""
    result = run_in_process(
        capsys, "--gather-fn", WITH_SIZES, "--gather-kwarg", "dim=0", "--gather-output", "0",
        "--tier", "core", "-k", "gather", "--world-sizes", "1,2", *QUICK,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"gather={WITH_SIZES}(x, dim=0)[0]" in result.stdout
    assert "output form 'cat', detected from its first call" in result.stdout
    assert "CONFORMS (exit 0)" in result.stdout


def test_a_hidden_missing_parameter_exits_two_naming_it_and_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The command turns the first call's missing 'dim' into exit 2 with one message, no table."""
    result = run_in_process(capsys, "--gather-fn", f"{FORK}:timed_gather_with_sizes", "--tier", "core",
                            "-k", "forward_matches", "--world-sizes", "2", *QUICK)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nemo-dist-conformance: error: --gather-fn tests.forks.gallery_gather_with_sizes:timed_gather_with_sizes " \
        "failed its first call on every rank for a missing parameter 'dim'" in result.stderr
    assert "pass it on every call with --gather-kwarg dim=VALUE" in result.stderr
    assert result.stdout == ""



def test_a_two_tensor_tuple_at_world_size_three_is_not_taken_for_the_w_tensors() -> None:
    """(gathered, sizes) with sizes a tensor: the length is said, with the index that picks the gathered tensor."""
    x = torch.zeros(2, 3)
    out = (torch.zeros(6, 3), torch.tensor([2, 2, 2]))
    with pytest.raises(TypeError, match=r"f returned a tuple of 2 tensors at world size 3; the tuple form needs one "
                                        r"tensor per rank; a \(gathered, extra\) return needs --gather-output 0"):
        _as_cat(out, x, "auto", "f", world_size=3)
    with pytest.raises(TypeError, match=r"of shapes \(6, 3\), \(3,\) for x of shape \(2, 3\)"):
        _as_cat(out, x, "auto", "f", world_size=2)
    assert torch.equal(_as_cat(out, x, "auto", "f", world_size=3, index=0), out[0])


MODULE = "tests.forks.gallery_module_all_gather:SummedAllGather"
BUFFERS = "tests.forks.gallery_gather_into_buffers:AllGatherFunc"
COLOSSAL = "tests.forks.gallery_gather_forward_reduce_scatter_backward:GatherForwardReduceScatterBackward"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([MODULE, "--gather-output", "0"],
         f"--gather-fn class {MODULE}'s constructor has required keyword-only parameter 'dim' that no option fills; "
         "it is built once per rank: give it with --gather-init dim=VALUE"),
        ([MODULE, "--gather-init", "dim=zero"], "--gather-init 'dim=zero': 'zero' is not a Python literal"),
        ([MODULE, "--gather-init", "dim=0", "--gather-init", "axis=1"],
         f"--gather-init axis=...: the constructor of {MODULE} takes no parameter 'axis' (it takes: dim)"),
        ([MODULE, "--gather-init", "dim=@row_sizes"],
         "--gather-init 'dim=@row_sizes': '@row_sizes' is no symbol; the symbols are @group, @rank, @world_size"),
        ([WITH_SIZES, "--gather-kwarg", "dim=0", "--gather-init", "dim=0"],
         f"--gather-init applies to a class that is built, then called (such as an nn.Module); {WITH_SIZES} is a "
         "function, called as it is"),
        ([f"{FORK}:AllGatherOnDim", "--gather-kwarg", "dim=0", "--gather-init", "dim=0"],
         "is an autograd Function, called through .apply: leave --gather-init out"),
        ([WITH_SIZES, "--gather-kwarg", "dim=@dims"], "'@dims' is no symbol; the symbols are @group, @rank, "
                                                      "@world_size, @row_sizes, @out_buffers"),
        ([BUFFERS, "--gather-kwarg", "gather_list=3"], "--gather-kwarg gather_list=3: *gather_list takes a list"),
        ([BUFFERS, "--gather-kwarg", "gather_list=@rank"], "*gather_list takes a list spread over positions"),
        ([COLOSSAL, "--gather-kwarg", "dim=0", "--gather-kwarg", "process_group=None"],
         "--gather-kwarg 'process_group=None': the checks pass process_group= themselves"),
    ],
    ids=["init-missing", "init-not-a-literal", "init-unknown-name", "init-call-symbol", "init-on-a-function",
         "init-on-an-autograd-function", "unknown-symbol", "spread-not-a-list", "spread-a-scalar-symbol",
         "group-literal"],
)
def test_bad_constructor_and_symbol_options_exit_two_before_any_world(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A class's missing or unknown constructor keyword, --gather-init where nothing is built, a bad symbol: exit 2."""
    assert main(["--gather-fn", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_required_group_before_dim_is_placed_by_position_never_left_empty() -> None:
    """forward(ctx, input_, process_group, dim): the group lands before dim; a value missing there is a TypeError."""
    parameters = parameters_after_x(colossal.GatherForwardReduceScatterBackward)
    assert parameters is not None
    assert [p.name for p in parameters] == ["process_group", "dim", "fp8_communication"]
    assert arguments(parameters, {"dim": 0, "process_group": "world"}, function_class=True) == (["world", 0], {})
    with pytest.raises(TypeError, match=r"missing required argument: 'process_group'") as raised:
        arguments(parameters, {"dim": 0}, function_class=True)
    assert missing_in(raised.value) == ("process_group",)


def test_a_star_args_value_is_spread_and_a_module_class_is_read_from_its_forward() -> None:
    """forward(ctx, tensor, *gather_list) takes the list spread; AllGather's call is forward(x, sizes=None)."""
    spread = parameters_after_x(buffers.AllGatherFunc)
    assert spread is not None
    assert arguments(spread, {"gather_list": ["b0", "b1"]}, function_class=True) == (["b0", "b1"], {})
    called = parameters_after_x(module.AllGather)
    assert called is not None
    assert [p.name for p in called] == ["sizes"]
