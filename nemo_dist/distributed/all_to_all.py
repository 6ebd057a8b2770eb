"""An autograd all-to-all with uneven splits, and the token dispatch and combine that mixture-of-experts layers use.

:func:`all_to_all_with_grad` sends ``input_split_sizes[j]`` rows of a
tensor, in order, to rank ``j`` of the group and returns, in group rank
order, the rows every rank addressed to this one. Its backward is the
inverse all-to-all: the gradient of each received row goes back to the rank
and the position it came from, the split sizes swapped. Every call checks
its split sizes against every other rank's (one small all-gather), so sizes
that do not match are a ``ValueError`` raised on every rank, never a hang or
a process aborted by the backend.

:func:`dispatch_tokens` sends each token to the rank its ``destinations``
entry names (counts exchanged, so a receiver need not know them) and returns
what arrived with the :class:`TokenRoute` it took; :func:`combine_tokens`
sends processed rows back along it and puts every token in its original
place. Gradients flow through both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["TokenRoute", "all_to_all_with_grad", "combine_tokens", "dispatch_tokens"]


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _group_size(group: Any) -> int:
    return dist.get_world_size(group) if _initialized() else 1


def _packet_device(tensor: torch.Tensor, group: Any) -> torch.device:
    """Where the collectives' small integer tensors live: the CPU under gloo, the tensor's device under NCCL."""
    return tensor.device if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _as_sizes(name: str, sizes: Sequence[int] | torch.Tensor | None, size: int) -> list[int] | None:
    """``sizes`` as a list of ints (None stays None); ``ValueError`` for anything but non-negative integers."""
    if sizes is None:
        return None
    values = sizes.tolist() if isinstance(sizes, torch.Tensor) else list(sizes)
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ValueError(f"{name} must be a sequence of ints; got {values!r}")
    return values


def _split_table(
    rows: int, row_numel: int, sent: list[int] | None, received: list[int] | None, size: int, group: Any,
    device: torch.device,
) -> torch.Tensor:
    """Every rank's ``[valid, rows, row_numel, sent x size, received x size]`` (-1 where not given), gathered."""
    valid = all(s is None or (len(s) == size and min(s, default=0) >= 0) for s in (sent, received))
    body = [
        *(sent if valid and sent is not None else [-1] * size),
        *(received if valid and received is not None else [-1] * size),
    ]
    mine = torch.tensor([int(valid), rows, row_numel, *body], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).cpu()


def _agreed_splits(
    tensor: torch.Tensor, sent: list[int] | None, received: list[int] | None, group: Any
) -> tuple[list[int], list[int]]:
    """This rank's (sent, received) split sizes once every rank's agree; the same ``ValueError`` on every rank else.

    A missing ``sent`` is an equal split of the rows; a missing ``received``
    is what the others send here.
    """
    size = _group_size(group)
    rows = tensor.shape[0] if tensor.dim() else 0
    table = _split_table(rows, tensor[0].numel() if tensor.dim() and rows else -1, sent, received, size, group,
                         _packet_device(tensor, group))
    me = dist.get_rank(group)
    problems: list[str] = []
    sends: list[list[int] | None] = []
    for r in range(size):
        valid, r_rows, _, *body = table[r].tolist()
        if not valid:
            problems.append(f"rank {r}'s split sizes are not {size} non-negative ints (one per rank of the group)")
            sends.append(None)
            continue
        r_sent = body[:size]
        if r_sent[0] < 0:
            if r_rows % size:
                problems.append(f"rank {r} has {r_rows} rows, which do not split equally over {size} ranks; "
                                "pass input_split_sizes")
                sends.append(None)
                continue
            r_sent = [r_rows // size] * size
        elif sum(r_sent) != r_rows:
            problems.append(f"rank {r}'s input_split_sizes {r_sent} sum to {sum(r_sent)}, not its {r_rows} rows")
        sends.append(r_sent)
    numels = {int(n) for n in table[:, 2].tolist() if n >= 0}
    if len(numels) > 1:
        problems.append(f"the ranks' rows differ in size ({sorted(numels)} elements per row): trailing shapes "
                        "must match")
    if not problems:
        for r in range(size):
            r_received = table[r].tolist()[3 + size:]
            if r_received[0] < 0:
                continue
            for s in range(size):
                s_sent = sends[s]
                assert s_sent is not None  # every rank's sizes were valid: no problems so far
                if r_received[s] != s_sent[r]:
                    problems.append(f"rank {r} expects {r_received[s]} rows from rank {s}, which sends it {s_sent[r]}")
    if problems:
        raise ValueError("all_to_all_with_grad: split sizes do not agree across the group: " + "; ".join(problems))
    agreed = [s for s in sends if s is not None]
    return agreed[me], [agreed[s][me] for s in range(size)]


def _exchange(tensor: torch.Tensor, received: list[int], sent: list[int], group: Any) -> torch.Tensor:
    """The raw all-to-all: ``sent[j]`` rows of ``tensor`` to rank j, ``received[i]`` rows from rank i, in order."""
    out = tensor.new_empty((sum(received), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.contiguous(), received, sent, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Forward: the all-to-all of agreed splits. Backward: the inverse all-to-all, splits swapped."""

    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, received: list[int], sent: list[int], group: Any
    ) -> torch.Tensor:
        ctx.received, ctx.sent, ctx.group = received, sent, group
        return _exchange(tensor, received, sent, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, ctx.sent, ctx.received, ctx.group), None, None, None


def all_to_all_with_grad(
    tensor: torch.Tensor,
    output_split_sizes: Sequence[int] | torch.Tensor | None = None,
    input_split_sizes: Sequence[int] | torch.Tensor | None = None,
    group: Any = None,
) -> torch.Tensor:
    """Rows of ``tensor`` exchanged between the ranks of ``group`` (None: the whole world), differentiably.

    ``input_split_sizes[j]`` consecutive rows go to rank ``j`` (None: dim 0
    split equally); ``output_split_sizes[i]`` rows come from rank ``i``
    (None: whatever it sends). The result holds them in group rank order,
    each rank's rows in the order it sent them, with ``tensor``'s dtype and
    trailing shape. The gradient of each sent row is the gradient of the row
    it became (the inverse all-to-all). Split sizes that disagree between
    ranks, or that do not add up to a rank's rows, are a ``ValueError`` on
    every rank. Outside a process group, or in a group of one, it returns
    ``tensor`` itself (splits still checked). ``tensor`` is never modified.
    """
    size = _group_size(group)
    sent = _as_sizes("input_split_sizes", input_split_sizes, size)
    received = _as_sizes("output_split_sizes", output_split_sizes, size)
    if size == 1:
        rows = tensor.shape[0] if tensor.dim() else 0
        for name, sizes in (("input_split_sizes", sent), ("output_split_sizes", received)):
            if sizes is not None and list(sizes) != [rows]:
                raise ValueError(f"all_to_all_with_grad: {name} {sizes} in a group of one must be [{rows}]")
        return tensor
    sent, received = _agreed_splits(tensor, sent, received, group)
    return _AllToAll.apply(tensor, received, sent, group)


@dataclass(frozen=True)
class TokenRoute:
    """How :func:`dispatch_tokens` moved tokens: their order by destination, the rows sent to and received from
    each rank, and the group. :meth:`dispatch` moves another tensor of the same tokens the same way."""

    order: torch.Tensor
    sent: tuple[int, ...]
    received: tuple[int, ...]
    group: Any

    def dispatch(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (one row per dispatched token) sent where its tokens went, differentiably."""
        if tensor.shape[0] != self.order.numel():
            tensor = tensor.new_empty((0, *tensor.shape[1:]))  # refused below, on every rank, by the split check
        return all_to_all_with_grad(tensor[self.order] if tensor.shape[0] else tensor, self.received, self.sent,
                                    self.group)


def dispatch_tokens(
    tokens: torch.Tensor, destinations: torch.Tensor, group: Any = None
) -> tuple[torch.Tensor, TokenRoute]:
    """Send row ``t`` of ``tokens`` to rank ``destinations[t]`` of ``group``; the rows that arrived and the route.

    The rows that arrive are in source rank order, each source's in its
    original order. Counts are exchanged, so no rank needs to know what it
    will receive; a destination outside ``[0, group size)`` on any rank is a
    ``ValueError`` on every rank. Differentiable in ``tokens``.
    """
    size = _group_size(group)
    destinations = destinations.reshape(-1)
    rows = tokens.shape[0] if tokens.dim() else 0
    bad = destinations.shape[0] != rows or bool(((destinations < 0) | (destinations >= size)).any())
    counts = torch.bincount(destinations.clamp(0, size - 1).cpu(), minlength=size).tolist()
    order = torch.sort(destinations, stable=True).indices
    if size == 1:
        if bad:
            raise ValueError(f"dispatch_tokens: {destinations.shape[0]} destinations for {rows} tokens, each in "
                             "[0, 1) in a group of one")
        return tokens[order], TokenRoute(order, tuple(counts), tuple(counts), group)
    table = _count_table(counts, bad, group, _packet_device(tokens, group))
    if table[:, size].any():
        ranks = [r for r in range(size) if table[r, size]]
        raise ValueError(f"dispatch_tokens: rank(s) {ranks} give destinations outside [0, {size}) or not one per "
                         "token")
    me = dist.get_rank(group)
    route = TokenRoute(order, tuple(counts), tuple(int(table[s, me]) for s in range(size)), group)
    return route.dispatch(tokens), route


def _count_table(counts: list[int], bad: bool, group: Any, device: torch.device) -> torch.Tensor:
    """Every rank's token counts per destination and its bad-destination flag, gathered: ``[size, size + 1]``."""
    mine = torch.tensor([*counts, int(bad)], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(len(counts))]
    dist.all_gather(every, mine, group=group)
    return torch.stack(every).cpu()


def combine_tokens(processed: torch.Tensor, route: TokenRoute) -> torch.Tensor:
    """The rows :func:`dispatch_tokens` delivered, processed, sent back and put in their tokens' original order.

    ``processed`` has one row per row that arrived (any trailing shape);
    the result one per original token. Differentiable in ``processed``; a
    row count that is not what arrived is a ``ValueError`` on every rank.
    """
    back = all_to_all_with_grad(processed, route.sent, route.received, route.group)
    inverse = torch.empty_like(route.order)
    inverse[route.order] = torch.arange(route.order.numel(), device=route.order.device)
    return back[inverse]
