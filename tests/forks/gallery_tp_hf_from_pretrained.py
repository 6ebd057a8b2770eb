"""Hugging Face's own tensor parallelism: the unsharded model saved with ``save_pretrained`` to a folder and
loaded back with ``from_pretrained(folder, tp_plan="auto")``, as transformers' TP loading does (it needs
``accelerate``; nothing is downloaded). transformers builds its own mesh over the whole world (a ``device_mesh=``
is ignored), which is the tensor-parallel group of every 1-D check.

A real target, not a re-expression: each architecture's verdict is in docs/tp.md.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def plan(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """The model as transformers loads it back sharded by its own plan (``tp_plan="auto"``), float64, eager.

    transformers saves on the main process only, so rank 0 saves into a folder every rank then loads from.
    """
    folder = [tempfile.mkdtemp(prefix="nemo_dist_tp_") if dist.get_rank() == 0 else ""]
    dist.broadcast_object_list(folder, src=0)
    try:
        saved = [""]
        if dist.get_rank() == 0:
            try:
                model.save_pretrained(folder[0])
            except Exception as exc:  # every rank must hear of it, or the others wait for a folder forever
                saved = [f"{type(exc).__name__}: {exc}"]
        dist.broadcast_object_list(saved, src=0)
        if saved[0]:
            raise RuntimeError(f"save_pretrained failed on rank 0: {saved[0]}")
        loaded = type(model).from_pretrained(
            folder[0], tp_plan="auto", device_mesh=tp_mesh, dtype=torch.float64, attn_implementation="eager"
        )
        dist.barrier()  # rank 0 removes the folder once every rank has read it
    finally:
        if dist.get_rank() == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    return loaded


def _factory(name: str) -> Any:
    def build_it() -> nn.Module:
        from tests.forks.gallery_tp_hf_plan import build

        return build(name)

    build_it.__doc__ = f"A tiny {name} (the gallery's tiny config)."
    return build_it


#: A ``--tp-model`` factory per architecture checked: ``gallery_tp_hf_from_pretrained:qwen3`` and so on.
llama, mistral, qwen2, qwen3, gemma3, phi3, olmo2 = (
    _factory(name)
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Gemma3ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM")
)
