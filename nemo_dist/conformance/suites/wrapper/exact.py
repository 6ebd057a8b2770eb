"""The exact training of the wrapper checks' linear model, in rationals: the comparison is exact where this is.

The model is one ``nn.Linear(IN, OUT)``, the loss the mean of its squared
outputs. :func:`exact_training` replays, with ``fractions.Fraction``, SGD on
the full batch as a data-parallel run computes it: per rank the local
gradient of its rows, then the sum over ranks (each divided by W under a
mean reduction, as DDP does before its all-reduce), then the step. It also
says whether float64 computes every value of that run exactly in any
order: every value dyadic (no division by a W or row count that is not a
power of two) and every sum's terms within 2^52 ulps of its finest term
(float64 adds such terms exactly whatever the order). Where it does, a
correct wrapper's parameters equal the rationals bit for bit; elsewhere the
checks compare within a stated tolerance.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["ExactRun", "exact_training"]

_LIMIT = 2**52


@dataclass
class ExactRun:
    """The exact parameters after each step (weight rows then bias, flattened) and whether float64 is exact."""

    params: list[list[Fraction]] = field(default_factory=list)
    exact: bool = True

    def _sum(self, terms: Iterable[Fraction]) -> Fraction:
        """The exact sum; marks the run inexact when float64 could round it in some order."""
        items = [t for t in terms if t != 0]
        if not items:
            return Fraction(0)
        finest = max(t.denominator for t in items)
        if any(t.denominator & (t.denominator - 1) for t in items):
            self.exact = False  # not dyadic: a division by 3, say
        elif sum(abs(t) for t in items) * finest >= _LIMIT:
            self.exact = False
        return sum(items, Fraction(0))


def _grads(run: ExactRun, weight: list[list[Fraction]], bias: list[Fraction], rows: Sequence[Sequence[Fraction]],
           scale: Fraction) -> tuple[list[list[Fraction]], list[Fraction]]:
    """Gradients of ``scale * mean(out ** 2)`` over ``rows`` (mean over rows and outputs)."""
    outs = [[run._sum([*(w * x for w, x in zip(weight[o], row, strict=True)), bias[o]]) for o in range(len(bias))]
            for row in rows]
    factor = scale * 2 / (len(rows) * len(bias))
    upstream = [[factor * out for out in row_out] for row_out in outs]
    grad_w = [[run._sum(upstream[i][o] * rows[i][j] for i in range(len(rows))) for j in range(len(weight[0]))]
              for o in range(len(bias))]
    grad_b = [run._sum(upstream[i][o] for i in range(len(rows))) for o in range(len(bias))]
    return grad_w, grad_b


def exact_training(
    weight: Sequence[Sequence[float]],
    bias: Sequence[float],
    batch: Sequence[Sequence[float]],
    world_size: int,
    steps: int,
    lr: float,
    reduction: str,
) -> ExactRun:
    """SGD of the linear model from ``weight``/``bias`` on ``batch`` (split in equal rank shares), exactly.

    Each rank's local loss is the mean over its rows; ``reduction`` "mean"
    divides each local gradient by ``world_size`` before the sum, "sum" does
    not (so its full-batch equivalent is W times the full-batch mean).
    """
    run = ExactRun()
    w = [[Fraction(v) for v in row] for row in weight]
    b = [Fraction(v) for v in bias]
    data = [[Fraction(v) for v in row] for row in batch]
    share = len(data) // world_size
    divisor = Fraction(world_size if reduction == "mean" else 1)
    rate = Fraction(lr)
    for _ in range(steps):
        local = [_grads(run, w, b, data[r * share : (r + 1) * share], 1 / divisor) for r in range(world_size)]
        grad_w = [[run._sum(g[0][o][j] for g in local) for j in range(len(w[0]))] for o in range(len(b))]
        grad_b = [run._sum(g[1][o] for g in local) for o in range(len(b))]
        w = [[run._sum([w[o][j], -rate * grad_w[o][j]]) for j in range(len(w[0]))] for o in range(len(b))]
        b = [run._sum([b[o], -rate * grad_b[o]]) for o in range(len(b))]
        run.params.append([v for row in w for v in row] + b)
    return run
