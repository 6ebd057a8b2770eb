"""NeMo AutoModel 0.7.0's own expert parallelism, as a real target: its ``MoE`` layer (``Gate`` plus the default
``GroupedExperts``: tokens all-gathered, local experts, an autograd all-reduce) under its own ``apply_ep``
(``ExpertParallel``: every expert weight ``Shard(0)`` on the 1-D mesh), nothing re-expressed.

``--moe-layer tests.forks.gallery_moe_upstream:layer --moe-fn tests.forks.gallery_moe_upstream:apply_ep
--moe-compute-dtype float32``: on 2+ ranks ``GroupedExperts`` gathers the routing weights as ``weights.float()``
(and adds the experts' outputs up in float32), so it is judged within float32's rounding
(``scripts/repro_upstream_moe.py``). Needs nemo-automodel (``--no-deps``) and transformers; the suite's package
never imports either.

The layer is built tiny (12 experts of width 8 and hidden 16, top-2 of a softmax gate, a load-balance loss with
coefficient 0.01) and returns the output alone: its auxiliary loss reaches the gate through an autograd hook on
the routing weights (``MoEAuxLossAutoScaler``), per rank on its local tokens. Two things here are this
adapter's, not upstream's: the blocks upstream's ``apply_ep`` walks (``model.layers[i].mlp``), and a batch of
no tokens in one process, which upstream's layer cannot take unsharded (its expert loop indexes token 0) and
which this adapter answers with no rows. An expert-parallel layer always calls upstream's forward: the ranks'
collectives must meet.

Upstream's composition, as its ``parallelize_model`` and training recipe run it without tp, is ``composed`` (on
``composed_layer``) with ``scale_grads`` after backward, checked as ``--moe-mesh edp,ep --moe-reduction sum
--moe-loss-scale @dp --moe-aux-reduction mean``:

- ``apply_ep`` over the ep dim, ``apply_fsdp`` with the dense parameters sharded over the world and the experts
  over edp (upstream's ``ep_shard``: ``Shard(1)``);
- the recipe multiplies each rank's loss by the data-parallel size (FSDP2 averages), and
  ``scale_grads_and_clip_grad_norm`` divides expert gradients by dp / ep_shard;
- the auxiliary loss's gradient is injected at the recipe's scale (1 for one microbatch), outside the loss
  multiplier, so the data-parallel average leaves it averaged over the ranks: hence ``--moe-aux-reduction mean``.

A rank with no tokens needs this adapter where no rank of its ep group has any (upstream's expert loop indexes
token 0 of the gathered tokens): there it runs the block on one zero token without the auxiliary loss and returns
no rows, so that FSDP2's and the ep group's collectives meet and nothing reaches a gradient.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tests.forks._experts import OneBlock

#: The suite's layer's shape: 12 experts (whole on 1, 2, 3, 4 or 6 ranks), top-2.
EXPERTS, TOP_K, DIM, HIDDEN = 12, 2, 8, 16
#: Upstream initialises with std 0.02; a wider start makes the routing far from uniform.
INIT_STD = 0.3


class UpstreamMoE(OneBlock):
    """One block holding upstream's ``MoE`` as its ``mlp``, where upstream's ``apply_ep`` looks for it."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Upstream's ``MoE`` on ``tokens`` ``[T, dim]``; no rows for no tokens in one process."""
        moe = self.mlp
        if tokens.shape[0] == 0 and not isinstance(moe.experts.gate_and_up_projs, DTensor):
            return tokens + 0 * sum(p.sum() for p in moe.parameters())  # no rows, every parameter in the graph
        return moe(tokens)


def _moe() -> nn.Module:
    """Upstream's ``MoE``, tiny, float64, on the CPU, initialised by its own ``init_weights`` (in training mode)."""
    config = importlib.import_module("nemo_automodel.components.moe.config")
    layers = importlib.import_module("nemo_automodel.components.moe.layers")
    common = importlib.import_module("nemo_automodel.components.models.common.utils")
    moe_config = config.MoEConfig(
        n_routed_experts=EXPERTS, n_shared_experts=0, n_activated_experts=TOP_K, n_expert_groups=1,
        n_limited_groups=1, train_gate=True, gate_bias_update_factor=0.0, aux_loss_coeff=0.01,
        score_func="softmax", route_scale=1.0, dim=DIM, inter_dim=HIDDEN, moe_inter_dim=HIDDEN,
        norm_topk_prob=True, dtype=torch.float64,
    )
    backend = common.BackendConfig(linear="torch", rms_norm="torch", experts="torch", dispatcher="torch")
    moe = layers.MoE(moe_config, backend)
    with torch.no_grad():
        moe.init_weights(torch.device("cpu"), init_std=INIT_STD)
    return moe


def layer() -> nn.Module:
    """Upstream's ``MoE`` (:func:`_moe`) in a model of one block, called directly."""
    return UpstreamMoE(_moe())


class _Block(nn.Module):
    """A transformer block holding only its ``mlp``: what upstream's ``apply_fsdp`` shards and calls."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The block's ``mlp`` on ``tokens``."""
        return self.mlp(tokens)


class ComposedMoE(UpstreamMoE):
    """:class:`UpstreamMoE` whose block is called as a module, so that FSDP2's hooks on it run."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__(mlp)
        self.layers = nn.ModuleList([_Block(mlp)])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The block on ``tokens``. No tokens: no rows in one process (as :class:`UpstreamMoE`). Upstream's layer
        takes a rank with no tokens only where another rank of its ep group has some (its expert loop indexes
        token 0 of the gathered tokens); where no rank of the group has any, or FSDP2 shards experts that expert
        parallelism does not, the block runs (its collectives must meet the other ranks') on one zero token
        without the auxiliary loss, and no rows come out: nothing reaches a gradient."""
        experts = self.mlp.experts.gate_and_up_projs
        if not isinstance(experts, DTensor):
            return super().forward(tokens)
        names = experts.device_mesh.mesh_dim_names or ()
        count = torch.tensor([tokens.shape[0]])
        if "ep" in names:  # every rank of the ep group, on every call
            dist.all_reduce(count, group=experts.device_mesh["ep"].get_group())
        if int(count):
            return self.layers[0](tokens)
        gate, coeff = self.mlp.gate, self.mlp.gate.aux_loss_coeff
        gate.aux_loss_coeff = 0.0
        try:
            return self.layers[0](tokens.new_zeros(1, tokens.shape[1]))[:0]
        finally:
            gate.aux_loss_coeff = coeff


def composed_layer() -> nn.Module:
    """Upstream's ``MoE`` in a model of one callable block, for :func:`composed`."""
    return ComposedMoE(_moe())


def apply_ep(model: nn.Module, ep_mesh: Any) -> nn.Module:
    """Upstream's ``apply_ep`` over ``ep_mesh``; in a world of one, nothing (upstream asserts a mesh of 2+)."""
    if ep_mesh.size() > 1:
        importlib.import_module("nemo_automodel.components.moe.parallelizer").apply_ep(model, ep_mesh)
    return model


_SCALING_MESHES: dict[tuple[int, int], Any] = {}


def composed(model: nn.Module, mesh: Any) -> nn.Module:
    """Upstream's composition on the suite's ``("edp", "ep")`` mesh, as its ``parallelize_model`` builds it without
    tp: ``apply_ep`` over ``mesh["ep"]`` (ep of 2+), then ``apply_fsdp`` with the dense parameters sharded over
    the world (the data-parallel mesh, ``mesh`` flattened) and the experts over ``mesh["edp"]`` (upstream's
    ``ep_shard``), no mixed precision (float64 throughout)."""
    parallelizer = importlib.import_module("nemo_automodel.components.moe.parallelizer")
    fsdp = importlib.import_module("torch.distributed.fsdp")
    edp, ep = mesh["edp"].size(), mesh["ep"].size()
    if ep > 1:
        parallelizer.apply_ep(model, mesh["ep"])
    parallelizer.apply_fsdp(
        model, mesh._flatten("dp"), ep_enabled=ep > 1, ep_shard_enabled=ep > 1 and edp > 1,
        ep_shard_mesh=mesh["edp"], mp_policy=fsdp.MixedPrecisionPolicy(), wrap_outer_model=False,
    )
    return model


def scale_grads(model: nn.Module, mesh: Any) -> None:
    """Upstream's recipe step after backward: ``scale_grads_and_clip_grad_norm`` with its expert-parallel scaling
    (expert gradients divided by dp / ep_shard), no clipping. Its ``moe_mesh`` names the suite's dims as upstream
    does (``("ep_shard", "ep")``), made once per layout on every rank."""
    utils = importlib.import_module("nemo_automodel.components.training.utils")
    edp, ep = mesh["edp"].size(), mesh["ep"].size()
    if (edp, ep) not in _SCALING_MESHES:
        device_mesh = importlib.import_module("torch.distributed.device_mesh")
        _SCALING_MESHES[edp, ep] = device_mesh.init_device_mesh("cpu", (edp, ep), mesh_dim_names=("ep_shard", "ep"))
    utils.scale_grads_and_clip_grad_norm(
        None, [model], moe_mesh=_SCALING_MESHES[edp, ep], ep_axis_name="ep", dp_group_size=edp * ep,
    )
