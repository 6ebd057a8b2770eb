"""Check, in plain torch, transformers 5.25's expert parallelism against transformers issue 48687 (CPU, gloo).

    python scripts/hf_ep_issue_48687.py

Needs transformers (5.25) and accelerate (``from_pretrained`` with a ``distributed_config`` refuses without it,
even on the CPU); imports nothing of nemo_dist. Issue 48687 ("Wrong router gradient with
``experts_implementation="batched_mm"`` under expert parallelism", closed by PR 48689) reports that under EP the
loss is right while the router's gradient is wrong, also on CPU with gloo: the routes to another rank's experts
(sentinel slots, weight 0) kept a non-zero expert output, and the zero weight hid it in the forward but not in the
backward. Two gloo ranks here load a tiny saved ``Qwen3MoeForCausalLM`` (2 layers, 12 experts, top-2, float64,
nothing downloaded) through the public API, ``from_pretrained(folder, distributed_config=DistributedConfig(...))``,
in the issue's layout (``tp_size=2, ep_size=2, tp_plan={}``: both ranks hold the same batch), and compare the loss
and every parameter's gradient (experts: ``full_tensor()``) with one process loading the same folder:

1. ``ep_implementation="all_reduce"`` (``AllReduceEP``: each rank masks the routes to the other's experts, the
   sentinel slots of the issue) with ``batched_mm`` experts, the issue's configuration;
2. the same with the eager experts loop;
3. ``ep_implementation="auto"`` (in training, ``AllToAllEP``: the batch sliced over the TP group, tokens
   exchanged with all-to-all) with ``batched_mm``.

Each line printed says what was seen. It exits 0 when issue 48687 does not reproduce (every router gradient and
every other gradient equals one process's within 1e-10 relative, the loss too), 1 otherwise.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
TOLERANCE = 1e-10
CASES = (("all_reduce", "batched_mm"), ("all_reduce", "eager"), ("auto", "batched_mm"))


def _config() -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=4, num_experts=12, num_experts_per_tok=2,
        norm_topk_prob=True, initializer_range=0.3,
    )


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of a fixed batch (labels = inputs) and every parameter's whole gradient after its backward."""
    from torch.distributed.tensor import DTensor

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 32, (2, 7), generator=generator)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        grad = torch.zeros(param.shape, dtype=param.dtype) if param.grad is None else param.grad
        grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad
    return loss.detach(), grads


def _rank(rank: int, port: int, folder: str, results: dict) -> None:
    from transformers import Qwen3MoeForCausalLM
    from transformers.distributed import DistributedConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    warnings.simplefilter("ignore")
    if rank == 0:
        torch.manual_seed(0)
        Qwen3MoeForCausalLM(_config()).to(torch.float64).save_pretrained(folder)
    dist.barrier()
    for ep_implementation, experts in CASES:
        config = DistributedConfig(tp_size=WORLD, ep_size=WORLD, tp_plan={}, ep_implementation=ep_implementation)
        model = Qwen3MoeForCausalLM.from_pretrained(
            folder, dtype=torch.float64, experts_implementation=experts, distributed_config=config
        )
        model.train()
        loss, grads = _grads(model)
        sharded = sorted(n for n, p in model.named_parameters() if type(p).__name__ == "DTensor")
        if rank == 0:
            one = Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float64, experts_implementation=experts)
            one.train()
            want_loss, want = _grads(one)
            router = max(_relative(grads[n], want[n]) for n in want if n.endswith("mlp.gate.weight"))
            others = max(_relative(grads[n], want[n]) for n in want if not n.endswith("mlp.gate.weight"))
            norm = max(float(want[n].abs().max()) for n in want if n.endswith("mlp.gate.weight"))
            results[(ep_implementation, experts)] = dict(
                loss=_relative(loss, want_loss), router=router, others=others, router_norm=norm, sharded=sharded
            )
        dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    """Run both ranks; print each case's differences; 0 when no case shows issue 48687."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, folder, results), nprocs=WORLD)
        seen = dict(results)
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {WORLD} gloo ranks, CPU, float64")
    clean = True
    for number, case in enumerate(CASES, 1):
        found = seen[case]
        ok = max(found["loss"], found["router"], found["others"]) <= TOLERANCE
        clean = clean and ok and bool(found["sharded"])
        print(f"{number}. ep_implementation={case[0]!r}, experts_implementation={case[1]!r}: "
              f"{'agrees with' if ok else 'DIFFERS from'} one process: loss off by {found['loss']:.3g}, "
              f"router gradient by {found['router']:.3g} (its largest entry {found['router_norm']:.3g}), "
              f"every other gradient by at most {found['others']:.3g}; sharded: {', '.join(found['sharded'])}")
    print(f"issue 48687 (wrong router gradient, right loss) {'does NOT reproduce' if clean else 'REPRODUCES'}"
          f" (tolerance {TOLERANCE:g} relative)")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
