"""Conformance check of upstream's structural discovery of layer groups: which container holds a group's blocks.

A model that neither declares ``parallel_layer_groups`` nor is named in
upstream's table gets its groups by structure (nemo-automodel 0.7.0,
``_discover_layer_groups``): every non-empty ``ModuleList`` (or digit-keyed
``ModuleDict``) is a candidate of the group the words of its path name, and
each group takes its longest candidate, the shallower on equal length and
the first in module order on a full tie. The hand-made model of the other
checkpointing checks has one container per group, so it cannot tell these
rules apart; :class:`DiscoveryModel` can:

* ``language_model.adapters`` (1 block) comes before ``language_model.layers``
  (3 blocks): the longer one is the language group, not the first seen;
* ``visual.blocks`` and ``visual.extra_blocks`` (2 blocks each, same depth):
  the first is the vision group;
* ``audio_tower.layers`` holds one block: a one-block tower is a group too.

Under full checkpointing of scope "all", exactly the blocks of the chosen
containers run their attention and MLP again in backward, and the gradients
equal those of the model wrapped without checkpointing.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.registry import WorldLike, check
from nemo_dist.conformance.suites.ddp.checkpoint_rules import CheckpointingFailure, explained
from nemo_dist.conformance.suites.ddp.entry_point import device_of, dtype_of, grads_of, local_rows, parallelizer, seeded
from nemo_dist.conformance.suites.ddp.expectations import TOLERANCE_TIGHT, assert_close_lists, tolerance_for
from nemo_dist.conformance.suites.ddp.messages import DiscoveryRun
from nemo_dist.conformance.suites.ddp.models import DIM, _Block

__all__ = ["CHOSEN", "DiscoveryModel", "checkpointing_follows_structural_discovery", "discovery_recompute"]

#: The containers structural discovery must choose, one per group.
CHOSEN = ("language_model.layers", "visual.blocks", "audio_tower.layers")


class _Stack(nn.Module):
    """Containers of blocks, run one after the other in the order given."""

    def __init__(self, depths: dict[str, int], dim: int) -> None:
        super().__init__()
        for name, depth in depths.items():
            setattr(self, name, nn.ModuleList(_Block(dim) for _ in range(depth)))
        self.names = tuple(depths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            for block in getattr(self, name):
                x = block(x)
        return x


class DiscoveryModel(nn.Module):
    """Three towers whose block containers only upstream's discovery rules tell apart (see the module docstring)."""

    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.language_model = _Stack({"adapters": 1, "layers": 3}, dim)
        self.visual = _Stack({"blocks": 2, "extra_blocks": 2}, dim)
        self.audio_tower = _Stack({"layers": 1}, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.language_model(x) + self.visual(x) + self.audio_tower(x))


def _blocks(model: DiscoveryModel) -> dict[str, _Block]:
    """Every block by its container's path and index ("visual.extra_blocks.1"), taken before wrapping."""
    found: dict[str, _Block] = {}
    for tower in ("language_model", "visual", "audio_tower"):
        stack = getattr(model, tower)
        for name in stack.names:
            for index, block in enumerate(getattr(stack, name)):
                found[f"{tower}.{name}.{index}"] = block
    return found


def discovery_recompute(impl: Implementation, global_x: torch.Tensor) -> DiscoveryRun:
    """Rank side: full checkpointing of scope "all" on :class:`DiscoveryModel`; per block, its reruns in backward.

    Beside them the gradients, and those of the same model wrapped without checkpointing.
    """
    plain = seeded(DiscoveryModel, 13)
    plain_wrapped = parallelizer(impl, {}).parallelize(plain)
    x = local_rows(global_x, device_of(plain)).to(dtype_of(plain))
    plain_wrapped(x).square().mean().backward()
    model = seeded(DiscoveryModel, 13)
    # The counted sub-modules as built: an implementation may replace a block's children by wrappers.
    parts = {name: (b.attn, b.mlp) for name, b in _blocks(model).items()}
    config = {"activation_checkpointing": True, "activation_checkpointing_scope": "all"}
    wrapped = parallelizer(impl, config).parallelize(model)
    loss = wrapped(x.to(device_of(model), dtype_of(model))).square().mean()
    before = {name: (attn.calls, mlp.calls) for name, (attn, mlp) in parts.items()}
    loss.backward()
    return DiscoveryRun(
        recomputed={
            name: (attn.calls - before[name][0], mlp.calls - before[name][1]) for name, (attn, mlp) in parts.items()
        },
        grads=grads_of(model),
        plain_grads=grads_of(plain),
        dtype=str(dtype_of(model)),
    )


@check("ddp.checkpointing_follows_structural_discovery", tier="core", component="ddp")
def checkpointing_follows_structural_discovery(world: WorldLike, impl: Implementation) -> None:
    """Found by structure, each group is its longest container (shallower, then first, on ties), one block or more."""
    generator = torch.Generator().manual_seed(14)
    global_x = torch.randn(2 * world.size, DIM, generator=generator, dtype=torch.float64)
    results: list[DiscoveryRun] = world.run(discovery_recompute, impl, global_x)
    for rank, got in enumerate(results):
        for block, (attention, mlp) in got.recomputed.items():
            chosen = block.rsplit(".", 1)[0] in CHOSEN
            ok = attention > 0 and mlp > 0 if chosen else attention == 0 and mlp == 0
            if ok:
                continue
            raise CheckpointingFailure(
                f"activation_checkpointing=True, scope 'all', rank {rank}: {block} ran attention {attention}x and "
                f"MLP {mlp}x during backward; expected "
                + (
                    "at least once each: its container is its group's by structural discovery"
                    if chosen
                    else "no recompute: its group's blocks are those of "
                    + next(c for c in CHOSEN if c.split(".")[0] == block.split(".")[0])
                )
                + " (each group: its longest container, the shallower and then the first on equal length)",
                "not_checkpointed" if chosen else "wrong_block",
            )
        with explained("gradients"):
            assert_close_lists(
                got.grads,
                got.plain_grads,
                f"activation_checkpointing=True, scope 'all', rank {rank}: gradients vs no checkpointing",
                tolerance_for(got.dtype, TOLERANCE_TIGHT),
            )
