"""The frame of the tensor-parallel gallery (``gallery_tp_*``): what several of its plans share.

- :func:`local_heads`: an attention that reads its head counts in forward
  (the suite's model) made to count one rank's heads;
- :func:`megatron`: Megatron-LM's hand-written tensor parallelism, weights
  held as DTensor shards and the compute done on their local tensors
  between the two autograd functions ``f`` (identity forward, all-reduce of
  the input gradient backward) and ``g`` (all-reduce forward, identity
  backward); its flags break either one;
- :class:`PartialRowwise`: torch's ``RowwiseParallel`` that hands its output
  on as each rank's partial sum (no all-reduce);
- :func:`retie`: a tied head given the embedding's weight again;
- :func:`tiny_model`: the suite's tiny Llama with other sizes or biases, for
  ``--tp-model`` factories.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import RowwiseParallel

from nemo_dist.conformance.suites.tp.models import TinyConfig, TinyLlamaForCausalLM

__all__ = ["PartialRowwise", "local_heads", "megatron", "retie", "tiny_model"]

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def local_heads(model: nn.Module, size: int) -> None:
    """Every attention's ``num_heads``/``num_key_value_heads`` divided by ``size`` (one rank's heads)."""
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "num_heads"):
            module.num_heads //= size
            module.num_key_value_heads //= size


def retie(model: nn.Module) -> nn.Module:
    """The head given the embedding's weight again where the model's config ties them (parallelize_module unties)."""
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return model


def _all_reduced(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """A copy of ``tensor`` summed over ``group`` (the caller's tensor untouched)."""
    out = tensor.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


class _CopyToRegion(torch.autograd.Function):
    """Megatron's ``f``: identity forward; backward all-reduces the input gradient (unless told not to)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, reduce_backward: bool) -> torch.Tensor:
        ctx.group, ctx.reduce = group, reduce_backward
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return (_all_reduced(grad, ctx.group) if ctx.reduce else grad), None, None


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward; identity backward (or, broken, another all-reduce)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, reduce_backward: bool) -> torch.Tensor:
        ctx.group, ctx.reduce = group, reduce_backward
        return _all_reduced(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return (_all_reduced(grad, ctx.group) if ctx.reduce else grad), None, None


def _shard(linear: nn.Linear, mesh: Any, dim: int) -> None:
    linear.weight = nn.Parameter(distribute_tensor(linear.weight.detach(), mesh, [Shard(dim)]))


def megatron(model: nn.Module, tp_mesh: Any, *, f_reduces: bool = True, g_reduces_again: bool = False) -> nn.Module:
    """Attention and MLP of every layer split Megatron's way over ``tp_mesh``; embedding and head left whole.

    ``f_reduces=False``: no all-reduce of the input gradient before a
    column-parallel layer; ``g_reduces_again=True``: the all-reduce after a
    row-parallel layer reduces its gradient again in backward.
    """
    group = tp_mesh.get_group()
    for module in list(model.modules()):
        for name in COLUMN + ROW:
            linear = getattr(module, name, None)
            if not isinstance(linear, nn.Linear) or linear.bias is not None:
                continue
            column = name in COLUMN
            _shard(linear, tp_mesh, 0 if column else 1)

            def forward(x: torch.Tensor, linear: nn.Linear = linear, column: bool = column) -> torch.Tensor:
                weight = linear.weight.to_local() if isinstance(linear.weight, DTensor) else linear.weight
                if column:
                    return F.linear(_CopyToRegion.apply(x, group, f_reduces), weight)
                return _ReduceFromRegion.apply(F.linear(x, weight), group, g_reduces_again)

            linear.forward = forward  # type: ignore[method-assign]
    local_heads(model, tp_mesh.size())
    return model


class PartialRowwise(RowwiseParallel):
    """``RowwiseParallel`` whose output is each rank's partial sum, handed on without its all-reduce."""

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: Any) -> Any:
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs


def tiny_model(**sizes: Any) -> TinyLlamaForCausalLM:
    """The suite's tiny Llama with ``sizes`` (TinyConfig's fields), float64."""
    return TinyLlamaForCausalLM(TinyConfig(**sizes)).to(torch.float64)
