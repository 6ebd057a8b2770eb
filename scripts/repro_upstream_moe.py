"""Reproduce, in plain torch, the one difference the moe suite finds in nemo-automodel 0.7.0's expert parallelism.

    python scripts/repro_upstream_moe.py

Needs ``pip install --no-deps nemo-automodel==0.7.0`` and transformers; imports nothing of nemo_dist. Two gloo
ranks on this machine (CPU, a tiny float64 ``MoE``: 12 experts, top-2, nothing downloaded) run upstream's layer
under its own ``apply_ep`` and compare the gate's gradient (each rank's share, summed over both) with one process
running the unsharded layer on each rank's tokens:

1. Under expert parallelism the gate's gradient differs from one process's by about 1e-8 relative: more than
   float64's rounding, well within float32's.
2. The cause: on 2+ ranks ``GroupedExperts`` gathers the routing weights as ``weights.float()``, so they (and
   their gradient) pass through float32, which one process never does. One process whose experts are handed the
   same ``weights.float()`` agrees with the expert-parallel run to float64's rounding.

The outputs agree to float64's rounding in both comparisons. Each line it prints says what was seen; it exits 0
when both reproduce, 1 otherwise.
"""

from __future__ import annotations

import copy
import os
import socket
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOKENS = (5, 3)  # tokens per rank


def _layer() -> torch.nn.Module:
    from nemo_automodel.components.models.common.utils import BackendConfig
    from nemo_automodel.components.moe.config import MoEConfig
    from nemo_automodel.components.moe.layers import MoE

    config = MoEConfig(
        n_routed_experts=12, n_shared_experts=0, n_activated_experts=2, n_expert_groups=1, n_limited_groups=1,
        train_gate=True, gate_bias_update_factor=0.0, aux_loss_coeff=0.0, score_func="softmax", route_scale=1.0,
        dim=8, inter_dim=16, moe_inter_dim=16, norm_topk_prob=True, dtype=torch.float64,
    )
    torch.manual_seed(0)
    layer = MoE(config, BackendConfig(linear="torch", rms_norm="torch", experts="torch", dispatcher="torch"))
    with torch.no_grad():
        layer.init_weights(torch.device("cpu"), init_std=0.3)
    return layer


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    tokens = torch.randn(TOKENS[rank], 8, generator=generator, dtype=torch.float64)
    return tokens, torch.randn(TOKENS[rank], 8, generator=generator, dtype=torch.float64)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _one_process(layer: torch.nn.Module, *, weights_as_float32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's tokens through ``layer`` in this process: rank 0's output and the gate's whole gradient."""
    if weights_as_float32:
        experts_forward = layer.experts.forward
        layer.experts.forward = lambda x, mask, weights, indices: experts_forward(x, mask, weights.float(), indices)
    outputs = []
    for rank in range(len(TOKENS)):
        tokens, projection = _data(rank)
        out = layer(tokens)
        (out * projection).sum().backward()
        outputs.append(out.detach())
    return outputs[0], layer.gate.weight.grad.detach()


def _rank(rank: int, port: int, results: dict) -> None:
    from nemo_automodel.components.moe.parallelizer import apply_ep

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(TOKENS))
    from torch.distributed.device_mesh import init_device_mesh

    reference = _layer()
    holder = torch.nn.Module()  # upstream's apply_ep walks model.layers[i].mlp
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].mlp = copy.deepcopy(reference)
    apply_ep(holder, init_device_mesh("cpu", (len(TOKENS),)))
    sharded = holder.layers[0].mlp
    tokens, projection = _data(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.distributed.nn.functional.all_reduce, upstream's
        out = sharded(tokens)
        (out * projection).sum().backward()
    grad = sharded.gate.weight.grad.detach().clone()
    dist.all_reduce(grad)  # each rank holds its share of the replicated gate's gradient
    if rank == 0:
        plain_out, plain_grad = _one_process(copy.deepcopy(reference), weights_as_float32=False)
        cast_out, cast_grad = _one_process(copy.deepcopy(reference), weights_as_float32=True)
        results.update(
            plain_grad=_relative(grad, plain_grad), plain_out=_relative(out.detach(), plain_out),
            cast_grad=_relative(grad, cast_grad), cast_out=_relative(out.detach(), cast_out),
        )
    dist.destroy_process_group()


def main() -> int:
    """Run both ranks, print what each comparison saw; 0 when both findings reproduce."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, results), nprocs=len(TOKENS))
        seen = dict(results)
    float64 = 1e-12
    first = seen["plain_grad"] > float64 and seen["plain_grad"] < 1e-5 and seen["plain_out"] < float64
    second = seen["cast_grad"] < float64 and seen["cast_out"] < float64
    print(f"1. {'reproduced' if first else 'NOT reproduced'}: EP vs one process: gate gradient off by "
          f"{seen['plain_grad']:.3g}, output by {seen['plain_out']:.3g} (relative)")
    print(f"2. {'reproduced' if second else 'NOT reproduced'}: EP vs one process handed weights.float(): gate "
          f"gradient off by {seen['cast_grad']:.3g}, output by {seen['cast_out']:.3g}")
    return 0 if first and second else 1


if __name__ == "__main__":
    sys.exit(main())
