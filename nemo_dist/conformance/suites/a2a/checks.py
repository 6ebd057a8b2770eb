"""Conformance checks of an autograd all-to-all: routing, its gradient rule, groups, refusals, dispatch and combine.

Each check draws its examples in the parent with hypothesis: a split matrix
(``m[i][j]`` rows from rank i to rank j; zeros included; equal splits for a
callable given no split sizes), a trailing shape, a float dtype and a seed
from which every rank makes its rows and gradients
(:func:`~nemo_dist.conformance.suites.a2a.ranks.rows`). The parent rebuilds them and
computes what each rank must receive (:func:`routed`). Before anything is
drawn, every world of 2 or more runs the edge cases on purpose
(:func:`edge_matrices`, :func:`edge_dispatches`): a rank that receives
nothing, a rank that sends nothing, everything sent to one rank. An
all-to-all is a copy, so outputs and gradients are compared bit for bit in
every dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from nemo_dist.conformance.engine.errors import NotApplicable, NotSupported
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike
from nemo_dist.conformance.suites.a2a import ranks
from nemo_dist.conformance.suites.a2a.causes import (
    DETACHED,
    GROUP,
    IN_PLACE,
    NONDETERMINISTIC,
    NOT_GROUP,
    NOT_SWAPPED,
    a2a_check,
    failure,
    gradient_cause,
    routing_cause,
)
from nemo_dist.conformance.suites.a2a.messages import Dispatched, Exchanged
from nemo_dist.conformance.suites.a2a.target import caller, module_function
from nemo_dist.conformance.suites.gather.properties import (
    LastFailure,
    assert_same,
    diagnosed,
    error_rows,
    interleaved_partition,
)
from nemo_dist.conformance.suites.gather.ranks import same_bits
from nemo_dist.testing import RankFailure
from nemo_dist.testing import strategies as ds

__all__ = [
    "CRASHES",
    "backward_returns_each_row_its_gradient",
    "bad_destinations_refused_on_every_rank",
    "dispatch_combine_round_trips",
    "edge_dispatches",
    "edge_matrices",
    "forward_routes_rows_in_rank_order",
    "group_is_honoured",
    "inputs_and_grads_not_modified",
    "mismatched_sizes_refused_on_every_rank",
    "routed",
]

Matrix = list[list[int]]


def routed(blocks: Sequence[torch.Tensor], matrix: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """What each rank receives when rank i sends ``matrix[i][j]`` consecutive rows of ``blocks[i]`` to rank j."""
    size = len(matrix)
    pieces = [list(torch.split(blocks[i], list(matrix[i]))) for i in range(size)]
    return [torch.cat([pieces[i][r] for i in range(size)]) for r in range(size)]


def _transposed(matrix: Sequence[Sequence[int]]) -> Matrix:
    return [[matrix[j][i] for j in range(len(matrix))] for i in range(len(matrix))]


def _draw_matrix(data: st.DataObject, size: int, uneven: bool, symmetric: bool) -> Matrix:
    if not uneven:
        rows = data.draw(st.integers(0, 3), label="rows per rank pair")
        return [[rows] * size for _ in range(size)]
    flat = data.draw(st.lists(st.integers(0, 3), min_size=size * size, max_size=size * size), label="splits")
    matrix = [flat[i * size:(i + 1) * size] for i in range(size)]
    return [[matrix[min(i, j)][max(i, j)] for j in range(size)] for i in range(size)] if symmetric else matrix


def _draw_example(data: st.DataObject, sizes: Sequence[int], uneven: bool, symmetric: bool) -> dict[str, Any]:
    """One example: a split matrix per group (of ``sizes`` ranks; ``symmetric``: each rank sends each rank what it
    receives from it), a trailing shape, a float dtype, a seed."""
    return {
        "matrices": [_draw_matrix(data, size, uneven, symmetric) for size in sizes],
        "trailing": tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="trailing shape")),
        "dtype": data.draw(ds.float_dtypes(), label="dtype"),
        "seed": data.draw(st.integers(0, 2**16), label="seed"),
    }


def edge_matrices(size: int, symmetric: bool) -> list[Matrix]:
    """The split matrices every world of 2+ ranks runs before anything drawn: rank 0 sends no row while the last
    rank receives none, (3+ ranks) every row to rank 0, and every rank sending each other rank what it receives from
    it and nothing to itself; symmetric, the last rank neither sending nor receiving."""
    if size < 2:
        return []

    def where(keep: Callable[[int, int], bool]) -> Matrix:
        return [[(1 + (i + j) % 3) if keep(i, j) else 0 for j in range(size)] for i in range(size)]

    apart = where(lambda i, j: size - 1 not in (i, j))
    if symmetric:
        return [apart]
    found = [where(lambda i, j: i != 0 and j != size - 1)]
    return found + ([where(lambda _i, j: j == 0)] if size > 2 else []) + [where(lambda i, j: i != j)]


def _edge_examples(sizes: Sequence[int], uneven: bool, symmetric: bool) -> list[dict[str, Any]]:
    """:func:`edge_matrices` as examples (every group's at once, float64 rows of width 2); none for a callable
    given no split sizes, whose splits are equal (its drawn examples include zero rows per pair)."""
    if not uneven:
        return []
    per_group = [edge_matrices(size, symmetric) for size in sizes]
    count = max((len(m) for m in per_group), default=0)
    def matrix(i: int, size: int, edges: list[Matrix]) -> Matrix:
        return edges[i] if i < len(edges) else [[1] * size for _ in range(size)]

    return [
        {"matrices": [matrix(i, size, m) for size, m in zip(sizes, per_group, strict=True)],
         "trailing": (2,), "dtype": torch.float64, "seed": i}
        for i in range(count)
    ]


def _blocks(example: dict[str, Any], index: int, *, salt: int = 0, counts: Sequence[int]) -> list[torch.Tensor]:
    return [
        ranks.rows(example["seed"], r + 100 * index, n, example["trailing"], example["dtype"], salt)
        for r, n in enumerate(counts)
    ]


def _expected(example: dict[str, Any], index: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Group ``index``'s outputs, and its input gradients for the seeded output gradients, rank by rank."""
    matrix = example["matrices"][index]
    inputs = _blocks(example, index, counts=[sum(row) for row in matrix])
    outputs = routed(inputs, matrix)
    grads_out = _blocks(example, index, salt=1, counts=[o.shape[0] for o in outputs])
    return outputs, routed(grads_out, _transposed(matrix))


def _differs(first: list[Exchanged], again: list[Exchanged]) -> bool:
    """Whether a re-run's outputs or gradients differ from the first run's, bit for bit, on any rank."""
    for a, b in zip(first, again, strict=True):
        for x, y in ((a.out, b.out), (a.grad, b.grad)):
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                if x.shape != y.shape or not same_bits(x, y):
                    return True
            elif (x is None) != (y is None):
                return True
    return False


def _group_cause(world: WorldLike, impl: Implementation, backward: bool) -> str:
    """Whether the exchange that failed over the groups is right over the whole world: then the groups are the
    cause (proven by the comparison); else the target fails without groups too, which is what the cause says."""
    matrix = [[1 + (i + j) % 3 for j in range(world.size)] for i in range(world.size)]
    example = {"matrices": [matrix], "trailing": (2,), "dtype": torch.float64, "seed": 0}
    results: list[Exchanged] = world.run(
        ranks.exchanged, impl, example["matrices"], (2,), torch.float64, 0, requires_grad=True, backward=backward
    )
    outputs, grads = _expected(example, 0)
    whole_right = all(
        isinstance(f.out, torch.Tensor) and f.out.shape == outputs[r].shape and same_bits(f.out, outputs[r])
        and (not backward or (isinstance(f.grad, torch.Tensor) and f.grad.shape == grads[r].shape
                              and same_bits(f.grad, grads[r])))
        for r, f in enumerate(results)
    )
    return GROUP if whole_right else NOT_GROUP


def _members(partition: Sequence[Sequence[int]] | None, size: int) -> list[list[int]]:
    return [list(m) for m in partition] if partition is not None else [list(range(size))]


def _property(
    world: WorldLike, impl: Implementation, *, backward: bool, grouped: bool = False, intact_only: bool = False
) -> None:
    """The shared property: every rank's output (and input gradient) bit-exact, the caller's tensors intact."""
    call = caller(impl)
    if grouped and not call.grouped:
        raise NotSupported(f"{call.label} is passed no process group (no @group parameter): nothing to honour")
    partition = interleaved_partition(world.size) if grouped else None
    members = _members(partition, world.size)
    last = LastFailure()

    def run(example: dict[str, Any], requires_grad: bool) -> list[Exchanged]:
        return world.run(
            ranks.exchanged, impl, example["matrices"], example["trailing"], example["dtype"],
            example["seed"], requires_grad=requires_grad, backward=backward, partition=partition,
        )

    def judge(example: dict[str, Any], requires_grad: bool) -> None:
        results: list[Exchanged] = []
        with last.record(example=example, results=results, requires_grad=requires_grad):
            results += run(example, requires_grad)
            for index, group in enumerate(members):
                outputs, grads = _expected(example, index)
                for place, rank in enumerate(group):
                    found = results[rank]
                    where = f"rank {rank}" + (f" (rank {place} of group {group})" if grouped else "")
                    assert found.input_intact, f"{where}: the all-to-all modified the caller's input in place"
                    if backward:
                        assert found.grad_intact, f"{where}: backward modified the output gradient it was given"
                    if intact_only:
                        continue
                    assert_same(found.out, outputs[place], f"{where}: output of splits {example['matrices'][index]}")
                    if found.requires_grad != requires_grad:
                        message = (f"{where}: output requires_grad is {found.requires_grad} for an input with "
                                   f"requires_grad={requires_grad}")
                        raise failure(message, DETACHED) if requires_grad else AssertionError(message)
                    if backward:
                        assert found.grad is not None, f"{where}: the sent rows got no gradient"
                        assert_same(found.grad, grads[place], f"{where}: input gradient of splits "
                                    f"{example['matrices'][index]}")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        # Intactness alone on symmetric splits: a backward that fails on uneven ones (its own check's bug) still runs.
        example = _draw_example(data, [len(m) for m in members], call.uneven, symmetric=intact_only)
        judge(example, backward or data.draw(st.booleans(), label="requires_grad"))

    def edges_then_drawn() -> None:
        for example in _edge_examples([len(m) for m in members], call.uneven, symmetric=intact_only):
            judge(example, True)
        prop()

    def right_when_symmetric(example: dict[str, Any]) -> bool:
        """Whether the example's splits made symmetric (each rank sends each rank what it receives from it, where
        swapped and unswapped split sizes are the same) pass: an isolating re-run."""
        symmetric = [[[m[min(i, j)][max(i, j)] for j in range(len(m))] for i in range(len(m))]
                     for m in example["matrices"]]
        if symmetric == example["matrices"]:
            return False
        try:
            judge({**example, "matrices": symmetric}, True)
        except (AssertionError, RankFailure):
            return False
        return True

    def cause(failed: dict[str, Any]) -> str:
        results, example = failed["results"], failed["example"]
        if len(results) != world.size:  # a rank raised: only a re-run that isolates the fault can name it
            if backward and not intact_only and not grouped and right_when_symmetric(example):
                return NOT_SWAPPED
            return _group_cause(world, impl, backward) if grouped else ""
        if not all(f.input_intact and f.grad_intact for f in results):
            return IN_PLACE
        if intact_only:
            return ""
        found, wanted, rows_in, rows_out = [], [], [], []
        for index, group in enumerate(members):
            outputs, grads = _expected(example, index)
            matrix = example["matrices"][index]
            for place, rank in enumerate(group):
                found.append(results[rank].grad if backward else results[rank].out)
                wanted.append(grads[place] if backward else outputs[place])
                rows_in.append(sum(matrix[i][place] for i in range(len(matrix))))
                rows_out.append(sum(matrix[place]))
        named = (gradient_cause(found, wanted, rows_in, len(members[0])) if backward
                 else routing_cause(found, wanted, rows_out))
        if not named and _differs(results, run(example, failed["requires_grad"])):
            named = NONDETERMINISTIC
        if not named and backward and right_when_symmetric(example):
            named = NOT_SWAPPED
        if grouped and not named:
            named = _group_cause(world, impl, backward)
        return named

    diagnosed(edges_then_drawn, last, cause)


@a2a_check("a2a.forward_routes_rows_in_rank_order")
def forward_routes_rows_in_rank_order(world: WorldLike, impl: Implementation) -> None:
    """Rank r receives, in rank order, the rows each rank addressed to it: uneven and zero-size splits, dtype kept."""
    _property(world, impl, backward=False)


@a2a_check("a2a.backward_returns_each_row_its_gradient")
def backward_returns_each_row_its_gradient(world: WorldLike, impl: Implementation) -> None:
    """Each sent row's gradient is the gradient of the row it became: the inverse all-to-all, splits swapped."""
    _property(world, impl, backward=True)


@a2a_check("a2a.inputs_and_grads_not_modified")
def inputs_and_grads_not_modified(world: WorldLike, impl: Implementation) -> None:
    """Neither the caller's input nor the gradient given to backward is modified (symmetric uneven splits)."""
    _property(world, impl, backward=True, intact_only=True)


@a2a_check("a2a.group_is_honoured", min_world=2)
def group_is_honoured(world: WorldLike, impl: Implementation) -> None:
    """Over the even and the odd ranks' groups at once, each group exchanges within itself, by group rank."""
    _property(world, impl, backward=True, grouped=True)


#: Errors that say the target's own code broke on its way to refusing (a message built wrongly, say), not that it
#: refused the input: the input of these calls is well typed.
CRASHES = ("TypeError", "AttributeError", "NameError", "UnboundLocalError")


def _refused_everywhere(found: Sequence[tuple[str, str]], what: str) -> None:
    """Every rank raised, and no rank's error is a crash of the target's own code (:data:`CRASHES`)."""
    quiet = [r for r, (kind, _) in enumerate(found) if kind == "no error"]
    assert not quiet, (
        f"{what}; rank{'s' if len(quiet) > 1 else ''} {', '.join(map(str, quiet))} raised nothing:\n"
        f"{error_rows(found)}"
    )
    crashed = [r for r, (kind, _) in enumerate(found) if kind in CRASHES]
    assert not crashed, (
        f"{what}; rank{'s' if len(crashed) > 1 else ''} {', '.join(map(str, crashed))} raised "
        f"{found[crashed[0]][0]}, which a refusal of well-typed input is not: the target's own code broke on the "
        f"way:\n{error_rows(found)}"
    )


@a2a_check("a2a.mismatched_sizes_refused_on_every_rank", tier="extended", min_world=2)
def mismatched_sizes_refused_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """Split sizes, or row shapes, that disagree between ranks are an error the target raises on every rank (not a
    TypeError of its own code), never a hang or an abort."""
    call = caller(impl)
    if not call.both_splits:
        raise NotApplicable(f"{call.label} is not given both split sizes, so no call can make them disagree")
    matrix = [[1] * world.size for _ in range(world.size)]
    _refused_everywhere(world.run(ranks.refused, impl, matrix, "splits"),
                        "rank 0 expects 2 rows from rank 1, which sends it 1")
    _refused_everywhere(world.run(ranks.refused, impl, matrix, "rows"),
                        "rank 0's rows are 3 wide, every other rank's 2 (one row to each rank)")


@a2a_check("a2a.bad_destinations_refused_on_every_rank", tier="extended", min_world=2)
def bad_destinations_refused_on_every_rank(world: WorldLike, impl: Implementation) -> None:
    """A module's ``dispatch_tokens`` given a destination outside the group on one rank raises on every rank."""
    if module_function(impl, "dispatch_tokens") is None:
        raise NotSupported("the target has no dispatch_tokens (a module's, checked where it has it)")
    _refused_everywhere(world.run(ranks.misdirected, impl),
                        f"rank 0 sends a token to rank {world.size}, outside the group of {world.size}")


def _draw_tokens(data: st.DataObject, size: int) -> tuple[list[int], list[list[int]], int]:
    counts = data.draw(st.lists(st.integers(0, 4), min_size=size, max_size=size), label="tokens per rank")
    destinations = [
        data.draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n), label=f"rank {r}'s destinations")
        for r, n in enumerate(counts)
    ]
    return counts, destinations, data.draw(st.integers(0, 2**16), label="seed")


@a2a_check("a2a.dispatch_combine_round_trips")
def dispatch_combine_round_trips(world: WorldLike, impl: Implementation) -> None:
    """dispatch_tokens delivers each token to its destination in source rank order; combine_tokens puts every
    processed token back in its place; gradients flow through both."""
    if module_function(impl, "dispatch_tokens") is None or module_function(impl, "combine_tokens") is None:
        raise NotSupported("the target has no dispatch_tokens and combine_tokens (a module's, checked where it has "
                           "them)")

    def judge(counts: list[int], destinations: list[list[int]], seed: int) -> None:
        results: list[Dispatched] = world.run(ranks.dispatched, impl, counts, destinations, seed)
        tokens = [ranks.rows(seed, r, n, (3,), torch.float64) for r, n in enumerate(counts)]
        weights = [ranks.rows(seed, r, n, (3,), torch.float64, salt=1) for r, n in enumerate(counts)]
        for r, found in enumerate(results):
            where = f"tokens per rank {counts}, destinations {destinations}, rank {r}"
            arrived = torch.cat([tokens[s][[d == r for d in destinations[s]]] for s in range(world.size)])
            assert_same(found.received, arrived, f"{where}: tokens dispatched to it")
            scale = torch.tensor([d + 2 for d in destinations[r]], dtype=torch.float64).reshape(-1, 1)
            assert_same(found.combined, tokens[r] * scale, f"{where}: combined tokens")
            assert_same(found.grad, weights[r] * scale, f"{where}: tokens' gradient")

    @given(data=st.data())
    def prop(data: st.DataObject) -> None:
        judge(*_draw_tokens(data, world.size))

    for counts, destinations in edge_dispatches(world.size):
        judge(counts, destinations, 0)
    prop()


def edge_dispatches(size: int) -> list[tuple[list[int], list[list[int]]]]:
    """The dispatches every world of 2+ ranks runs before anything drawn: ``(tokens per rank, destinations)`` where
    rank 0 has no token (so sends none) while no token goes to the last rank, then (3+ ranks) every token to rank
    0."""
    if size < 2:
        return []
    counts = [0, *([2] * (size - 1))]
    found = [(counts, [[(r + t) % (size - 1) for t in range(n)] for r, n in enumerate(counts)])]
    return found + ([([2] * size, [[0, 0] for _ in range(size)])] if size > 2 else [])
