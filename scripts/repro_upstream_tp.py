"""Reproduce, in plain torch, the tensor-parallel findings the tp suite reports on nemo-automodel 0.7.0.

    python scripts/repro_upstream_tp.py

Needs ``pip install --no-deps nemo-automodel==0.7.0`` and transformers; imports nothing of nemo_dist. Two gloo
ranks on this machine (CPU, float64, tiny configs, nothing downloaded) shard with upstream's
``fsdp2_strategy_parallelize`` on its mesh (dp 1, tp 2) and compare with the unsharded model:

1. Qwen3: after backward the per-head ``q_norm``/``k_norm`` gradients differ from the unsharded model's (each rank
   holds its own heads' part); after upstream's ``synchronize_tp_replica_gradients`` they match.
2. Olmo2: its forward raises (the default plan splits the query projection, while ``q_norm`` spans all heads).
3. ``get_hf_tp_shard_plan`` on a Mistral raises on transformers 5's style name ``embedding_rowwise``.

Each line it prints says what was seen; it exits 0 when all three reproduce, 1 otherwise.
"""

from __future__ import annotations

import copy
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

TINY = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "pad_token_id": 0}


def _model(name: str) -> torch.nn.Module:
    import transformers

    cls = getattr(transformers, name)
    config = cls.config_class(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return cls(config).to(torch.float64)


def _mesh() -> object:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 1, 1, 1, 2), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    for name, dims in {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp"),
                       "dp_cp": ("dp_replicate", "dp_shard", "cp")}.items():
        mesh[dims]._flatten(name)
    return mesh


def _norm_gradient_error(mesh: object, sync: bool) -> float:
    from nemo_automodel.components.distributed.parallelizer import fsdp2_strategy_parallelize
    from nemo_automodel.components.distributed.tp_replicas import synchronize_tp_replica_gradients
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    reference = _model("Qwen3ForCausalLM")
    model = fsdp2_strategy_parallelize(copy.deepcopy(reference), mesh, mp_policy=MixedPrecisionPolicy())
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    logits = model(input_ids=ids).logits
    with loss_parallel():
        F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    F.cross_entropy(reference(input_ids=ids).logits.flatten(0, 1), ids.flatten()).backward()
    if sync:
        synchronize_tp_replica_gradients([model], mesh)
    expected = dict(reference.named_parameters())
    worst = 0.0
    for name, param in model.named_parameters():
        if "q_norm" in name or "k_norm" in name:
            grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
            worst = max(worst, (grad - expected[name].grad).abs().max().item())
    return worst


def _rank(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = _mesh()
    seen = {
        "qwen3_without_sync": _norm_gradient_error(mesh, False), "qwen3_with_sync": _norm_gradient_error(mesh, True)
    }
    from nemo_automodel.components.distributed.parallelizer import fsdp2_strategy_parallelize, get_hf_tp_shard_plan
    from torch.distributed.fsdp import MixedPrecisionPolicy

    try:
        olmo = fsdp2_strategy_parallelize(_model("Olmo2ForCausalLM"), mesh, mp_policy=MixedPrecisionPolicy())
        olmo(input_ids=torch.zeros(2, 8, dtype=torch.long))
        seen["olmo2"] = "ran"
    except RuntimeError as exc:
        seen["olmo2"] = f"RuntimeError: {exc}"
    try:
        get_hf_tp_shard_plan(_model("MistralForCausalLM"))
        seen["mistral_plan"] = "translated"
    except ValueError as exc:
        seen["mistral_plan"] = f"ValueError: {exc}"
    if rank == 0:
        results.update(seen)
    dist.destroy_process_group()


def main() -> int:
    """Run the two ranks, print what they saw, exit 0 when every finding reproduced."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(port, results), nprocs=2)
    print(f"Qwen3 q_norm/k_norm gradients, no replica sync: off by {results['qwen3_without_sync']:.3g}")
    print(f"Qwen3 q_norm/k_norm gradients, after synchronize_tp_replica_gradients: off by "
          f"{results['qwen3_with_sync']:.3g}")
    print(f"Olmo2 forward: {results['olmo2']}")
    print(f"get_hf_tp_shard_plan(MistralForCausalLM): {results['mistral_plan']}")
    reproduced = (
        results["qwen3_without_sync"] > 1e-4 and results["qwen3_with_sync"] < 1e-12
        and results["olmo2"].startswith("RuntimeError") and "embedding_rowwise" in results["mistral_plan"]
    )
    print("all three findings reproduce" if reproduced else "not every finding reproduced")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
