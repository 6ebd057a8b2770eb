"""Reproduce, in plain torch, nemo-automodel 0.7.0's AutoPipeline reusing the first microbatch's causal mask.

    python scripts/repro_autopipeline_packed_mask.py

Needs ``pip install --no-deps nemo-automodel==0.7.0`` and transformers; imports nothing of nemo_dist. Two gloo
ranks on this machine (CPU) build upstream's pipeline as its recipe does, ``AutoPipeline(world_mesh=...,
pp_axis_name="pp", pp_schedule="1f1b", pp_microbatch_size=2, pp_batch_size=8, device=cpu,
scale_grads_in_schedule=False).build(model, loss_fn=...)``, over a tiny Llama built from a ``LlamaConfig`` (4
layers, 2 a stage, eager attention, nothing downloaded), in float32: a later stage accepts an incoming hidden
state only in float16, bfloat16 or float32, so AutoPipeline refuses float64 there. The loss is summed over label
tokens and the gradients divided by them afterwards (upstream's training loop). One step on 4 microbatches of 2
rows, packed sequences given as ``schedule.step(ids, target=labels, losses=..., position_ids=positions)`` on both
ranks (torch 2.13 splits a step's keyword inputs into microbatches and hands them to every stage of the rank):
row r holds a document of ``2 + r % 3`` tokens, then the next from position 0 again, so microbatches differ in
their packing. One process runs the same model on the whole batch with the same positions and ``use_cache=False``
(training mode: with a cache transformers ignores the packing when it builds its mask).

The cause, read in ``nemo_automodel/components/distributed/pipelining/hf_utils.py``,
``_build_or_reuse_pp_causal_mask``: every patched stage forward (``create_pipeline_forward_inner``) called without
``causal_mask_mapping`` builds its mask there; when no ``attention_mask`` is given (packed training) it caches the
mask on the stage's module in ``_pp_causal_mask_cache``, keyed only on ``(inputs_embeds.shape[1],
inputs_embeds.dtype, inputs_embeds.device)``: sequence length, dtype and device, not ``position_ids``. The first
microbatch's mask (which transformers' ``create_causal_mask`` made block-diagonal from that microbatch's
positions) is then reused for every later microbatch and every later step; the rotary embeddings do take each
microbatch's own positions.

1. With the packing differing between microbatches, the pipeline's loss and gradients differ from one process's
   given the same positions by far more than float32's rounding.
2. One process run microbatch by microbatch, each with its own positions but microbatch 0's mask, agrees with
   the pipeline to float32's rounding: the stale mask is the whole difference.
3. Control: with the same packing in every row (every microbatch's mask is microbatch 0's), the pipeline agrees
   with one process.

Each line it prints says what was seen; it exits 0 when all three reproduce, 1 otherwise.
"""

from __future__ import annotations

import copy
import os
import socket
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

MICROBATCHES, ROWS, SEQ, VOCAB = 4, 2, 6, 16
#: Loss within this relative difference, gradients within GRAD_ROUNDING of their largest: float32's rounding.
LOSS_ROUNDING, GRAD_ROUNDING = 1e-5, 1e-4


def _model() -> Any:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, max_position_embeddings=32, tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.float32)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(23)
    ids = torch.randint(0, VOCAB, (MICROBATCHES * ROWS, SEQ), generator=generator)
    return ids, torch.randint(0, VOCAB, (MICROBATCHES * ROWS, SEQ), generator=generator)


def _packed(same: bool) -> torch.Tensor:
    """Positions of packed rows: a document of ``2 + r % 3`` tokens (3 in every row when ``same``), then the next."""
    found = torch.empty(MICROBATCHES * ROWS, SEQ, dtype=torch.long)
    for row in range(len(found)):
        cut = 3 if same else 2 + row % 3
        found[row] = torch.cat([torch.arange(cut), torch.arange(SEQ - cut)])
    return found


def _summed(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum")


def _one_process(model: Any, ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor,
                 first_mask: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """One process's mean loss and gradients: the whole batch with its positions, or (``first_mask``) microbatch
    by microbatch, each with its own positions and microbatch 0's mask, built as upstream's stages build it."""
    from transformers.masking_utils import create_causal_mask

    model.config.use_cache = False
    if not first_mask:
        loss = F.cross_entropy(model(ids, position_ids=positions, use_cache=False).logits.flatten(0, 1),
                               labels.flatten())
    else:
        embeds = torch.zeros(ROWS, SEQ, model.config.hidden_size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # past_key_values=None, as upstream's stages call it
            mask = create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                                      past_key_values=None, position_ids=positions[:ROWS])
        loss = sum(_summed(model(ids[rows], position_ids=positions[rows], attention_mask=mask,
                                 use_cache=False).logits, labels[rows])
                   for rows in (slice(m * ROWS, (m + 1) * ROWS) for m in range(MICROBATCHES))) / labels.numel()
    loss.backward()
    return loss.item(), {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}


def _largest(held: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest over held parameters of ``max |got - want| / max |want|``; inf for a name one process lacks."""
    worst = 0.0
    for name, got in held.items():
        if name not in want:
            return float("inf")
        worst = max(worst, float((got - want[name]).abs().max()) / max(float(want[name].abs().max()), 1e-30))
    return worst


def _case(mesh: Any, same: bool) -> dict[str, Any]:
    """Step upstream's pipeline once on packed positions; this rank's view next to both one-process runs."""
    from nemo_automodel.components.distributed.pipelining import AutoPipeline

    ids, labels = _batch()
    positions = _packed(same)
    model = _model()
    true_loss, true_grads = _one_process(copy.deepcopy(model), ids, labels, positions, first_mask=False)
    stale_loss, stale_grads = _one_process(copy.deepcopy(model), ids, labels, positions, first_mask=True)
    built = AutoPipeline(
        world_mesh=mesh, pp_axis_name="pp", dp_axis_names=None, pp_schedule="1f1b", pp_microbatch_size=ROWS,
        pp_batch_size=ROWS * MICROBATCHES, device=torch.device("cpu"), scale_grads_in_schedule=False,
    ).build(model, loss_fn=_summed)
    schedule, stages = built.info.schedule, built.info.stages
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses: list[torch.Tensor] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # upstream's create_causal_mask(past_key_values=None, ...)
        schedule.step(*((ids,) if first else ()), target=labels if last else None,
                      losses=losses if last else None, position_ids=positions)
    held = {n: p.grad.detach() / labels.numel() for s in stages for n, p in s.submod.named_parameters()
            if p.grad is not None}
    cached = [(s.stage_index, getattr(m, "_pp_causal_mask_cache", None)) for s in stages for m in s.submod.modules()]
    caches = [f"stage {index}: {len(cache)} mask keyed {', '.join(str(tuple(map(str, k))) for k in cache)}"
              for index, cache in cached if isinstance(cache, dict)]
    return {
        "loss": torch.stack(losses).sum().item() / labels.numel() if losses else None,
        "true_loss": true_loss, "stale_loss": stale_loss, "held": len(held),
        "true_grad": _largest(held, true_grads), "stale_grad": _largest(held, stale_grads), "caches": caches,
    }


def _rank(rank: int, port: int, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    for same in (False, True):
        results[(same, rank)] = _case(mesh, same)
    dist.destroy_process_group()


def _merge(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Both ranks' views of one case: the last stage's loss, the largest gradient differences, every cache."""
    loss = next(r["loss"] for r in per_rank if r["loss"] is not None)
    merged = {**per_rank[0], "loss": loss, "held": sum(r["held"] for r in per_rank),
              "caches": [c for r in per_rank for c in r["caches"]]}
    for key in ("true_grad", "stale_grad"):
        merged[key] = max(r[key] for r in per_rank)
    merged["true_rel"] = abs(loss - merged["true_loss"]) / abs(merged["true_loss"])
    merged["stale_rel"] = abs(loss - merged["stale_loss"]) / abs(merged["stale_loss"])
    return merged


def main() -> int:
    """Run both ranks, print what each comparison saw; 0 when all three findings reproduce."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(port, results), nprocs=2)
        seen = dict(results)
    packed, control = (_merge([seen[(same, rank)] for rank in (0, 1)]) for same in (False, True))
    first = packed["true_rel"] > 10 * LOSS_ROUNDING and packed["true_grad"] > 10 * GRAD_ROUNDING
    second = packed["stale_rel"] < LOSS_ROUNDING and packed["stale_grad"] < GRAD_ROUNDING
    third = control["true_rel"] < LOSS_ROUNDING and control["true_grad"] < GRAD_ROUNDING
    print(f"torch {torch.__version__}; AutoPipeline 1f1b on 2 ranks, {MICROBATCHES} microbatches of {ROWS} rows, "
          f"packing 2 + r % 3 tokens; {packed['held']} gradients compared")
    print(f"   after the step, {'; '.join(packed['caches'])} (sequence length, dtype, device: not the positions)")
    print(f"1. {'reproduced' if first else 'NOT reproduced'}: pipeline loss {packed['loss']:.7f} vs one process "
          f"with the true positions {packed['true_loss']:.7f} (relative {packed['true_rel']:.3g}); largest relative "
          f"gradient difference {packed['true_grad']:.3g}")
    print(f"2. {'reproduced' if second else 'NOT reproduced'}: pipeline loss {packed['loss']:.7f} vs one process "
          f"with microbatch 0's mask in every microbatch {packed['stale_loss']:.7f} (relative "
          f"{packed['stale_rel']:.3g}); largest relative gradient difference {packed['stale_grad']:.3g}")
    print(f"3. {'reproduced' if third else 'NOT reproduced'}: control, 3 + 3 tokens in every row: pipeline loss "
          f"{control['loss']:.7f} vs one process {control['true_loss']:.7f} (relative {control['true_rel']:.3g}); "
          f"largest relative gradient difference {control['true_grad']:.3g}")
    return 0 if first and second and third else 1


if __name__ == "__main__":
    sys.exit(main())
