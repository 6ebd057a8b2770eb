"""Rank side of the tp suite: shard a seeded model with the target, train it next to the unsharded copy, report.

Every rank builds the same model from the same seed (the suite's
:class:`~nemo_dist.conformance.suites.tp.models.TinyLlamaForCausalLM`, a
``--tp-model`` factory's, or a transformers class from a tiny config), keeps
an unsharded copy, and gets the same batch; a data-parallel rank of a
``(dp, tp)`` mesh takes its rows of it, and the copy sees the whole batch.
:func:`run` parallelizes with the target (:mod:`.target`), then compares
logits, the loss, every parameter's full gradient and, after SGD and Adam
steps, every full parameter with the copy's, and reports placements,
replicated parameters' bytes (to compare across ranks), ties and head
counts. Results are cached per spec: the checks of one run share it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nemo_dist.conformance.adapters.target_raised import TargetRaised, run_once
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.suites.ddp.sharded import whole_grad
from nemo_dist.conformance.suites.ddp.templates import fresh_copy, manual_seed
from nemo_dist.conformance.suites.fsdp2 import calls
from nemo_dist.conformance.suites.tp import target
from nemo_dist.conformance.suites.tp.messages import Difference, Heads, Placed, TPRun, UnbuiltModel

__all__ = ["run", "tp_replicated"]

_RUNS: dict[Any, TPRun | UnbuiltModel | TargetRaised] = {}
_SEED = 11
_BATCH_PER_DP_RANK = 2


def _full(tensor: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _local(tensor: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _difference(got: torch.Tensor, want: torch.Tensor) -> Difference:
    """(max |got - want|, max(1, max |want|), got's least-squares multiple of want); shapes that differ: (inf, ...)."""
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    if got.shape != want.shape:
        return float("inf"), scale, float("nan")
    norm = (want * want).sum().item()
    ratio = (got * want).sum().item() / norm if norm else float("nan")
    return ((got - want).abs().max().item() if got.numel() else 0.0), scale, ratio


def _gradient_difference(param: Any, reference: torch.Tensor) -> Difference | None:
    """:func:`_difference` of the gradients; None where the parameter has none and the reference's is nonzero."""
    grad = whole_grad(param, param.grad)  # every rank joins a DTensor's collective, with a gradient or without
    if grad is None or param.grad is None:
        return None if reference.grad is not None and bool(reference.grad.any()) else (0.0, 1.0, 1.0)
    want = reference.grad if reference.grad is not None else torch.zeros_like(reference)
    return _difference(grad, want)


def _loss(logits: Any, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy: under ``loss_parallel()`` for logits sharded on the last dim, else on the full logits."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    if isinstance(logits, DTensor) and any(isinstance(p, Shard) and p.dim in (-1, logits.ndim - 1)
                                           for p in logits.placements):
        with loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return F.cross_entropy(_full(logits).flatten(0, 1), labels.flatten())


def _backward(loss: torch.Tensor, logits: Any) -> None:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    if isinstance(logits, DTensor):
        with loss_parallel():
            loss.backward()
    else:
        loss.backward()


def _placements(model: nn.Module) -> dict[str, Placed]:
    from torch.distributed.tensor import DTensor

    found = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if isinstance(param, DTensor):
            found[name] = Placed([repr(p) for p in param.placements], tuple(param.to_local().shape),
                                 tuple(param.shape), list(param.device_mesh.mesh_dim_names or ()))
        else:
            found[name] = Placed([], tuple(param.shape), tuple(param.shape), [])
    return found


def _heads(model: nn.Module) -> list[Heads]:
    """Per attention module with head counts of its own: its counts and the local query and key widths."""
    found = []
    for name, module in model.named_modules():
        if hasattr(module, "q_proj") and isinstance(getattr(module, "num_heads", None), int):
            found.append(Heads(
                name=name, num_heads=module.num_heads,
                num_key_value_heads=getattr(module, "num_key_value_heads", module.num_heads),
                head_dim=getattr(module, "head_dim", None), q_width=_local(module.q_proj.weight).shape[0],
                k_width=_local(module.k_proj.weight).shape[0] if hasattr(module, "k_proj") else None,
            ))
    return found


def tp_replicated(info: Placed) -> bool:
    """Whether a parameter, as :func:`_placements` reports it, is whole on every tensor-parallel rank.

    Plain, or ``Replicate`` on the mesh's ``tp`` dim (a 1-D mesh without names is the tp mesh).
    """
    on_tp = [p for p, dim in zip(info.placements, info.mesh or ["tp"], strict=False) if dim == "tp"]
    return all(p == "Replicate()" for p in on_tp)


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha1(tensor.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def _tied(model: nn.Module) -> bool | None:
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None or get_out() is None:
        return None
    return get_in().weight is get_out().weight


def _optimizer(kind: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.Adam(params, lr=0.01, foreach=False)


def run(impl: Implementation, spec: dict[str, Any]) -> TPRun | UnbuiltModel:
    """Shard and train as ``spec`` says (model, sequence_parallel, dp, seq, steps); the report described above.

    A target that raises raises :class:`TargetRaised`. A run is made once per target and spec on a rank, its
    report or its raise kept for the next check.
    """
    return run_once(_RUNS, (impl, tuple(sorted((k, str(v)) for k, v in spec.items()))), lambda: _run(impl, spec))


def _run(impl: Implementation, spec: dict[str, Any]) -> TPRun | UnbuiltModel:
    dp, seq = spec.get("dp", 1), spec.get("seq", 8)
    tp = dist.get_world_size() // dp
    try:
        built = target.build_model(impl, spec["model"], _SEED)
    except Exception as exc:  # the suite's tiny config does not fit this class: no verdict on the target
        return UnbuiltModel(f"{type(exc).__name__}: {exc}", tp, dp)
    device = calls.device()
    reference = built.model.to(device)
    model = fresh_copy(reference)
    tied_before = _tied(model)
    mesh = calls.mesh(1, tp)  # (1, 1, dp, 1, tp): dp is the world over tp
    where = "parallelizing"
    try:
        model = target.parallelize(impl, model, mesh, bool(spec.get("sp")), dp, bool(spec.get("explicit")))
        placements, heads, tied_after = _placements(model), _heads(model), _tied(model)
        where = "in forward"
        generator = torch.Generator().manual_seed(_SEED + 1)
        inputs = target.inputs(impl, reference, dp * _BATCH_PER_DP_RANK, seq, generator).to(device)
        labels = torch.randint(0, built.vocab, (dp * _BATCH_PER_DP_RANK, seq), generator=generator).to(device)
        rows = slice(mesh["dp_shard"].get_local_rank() * _BATCH_PER_DP_RANK,
                     (mesh["dp_shard"].get_local_rank() + 1) * _BATCH_PER_DP_RANK)
        # Every name, a tied weight under both: a plan that unties them is compared name by name.
        own = dict(model.named_parameters(remove_duplicate=False))
        ref = dict(reference.named_parameters(remove_duplicate=False))
        if set(own) != set(ref):
            raise ValueError(
                "the sharded model's parameters are not the unsharded model's (compared by name): "
                f"added {sorted(set(own) - set(ref))}, missing {sorted(set(ref) - set(own))}"
            )
        steps = [kind for kind, count in spec.get("steps", ()) for _ in range(count)]
        optimizers = {kind: (_optimizer(kind, list(model.parameters())), _optimizer(kind, list(reference.parameters())))
                      for kind in set(steps)}
        for step in range(max(1, len(steps))):
            # The same random state for both forwards: a model with dropout draws the same masks on every rank
            # and in the unsharded copy (a plan must not change that: per-rank seeds inside a group are a bug).
            manual_seed(_SEED + 100 + step)
            logits = target.logits(model(inputs[rows]))
            manual_seed(_SEED + 100 + step)
            expected = target.logits(reference(inputs))
            if tuple(_full(logits).shape) != tuple(expected[rows].shape):
                raise ValueError(f"logits of shape {tuple(_full(logits).shape)} where the unsharded model gives "
                                 f"{tuple(expected[rows].shape)}")
            loss = _loss(logits, labels[rows])
            ref_loss = F.cross_entropy(expected.flatten(0, 1), labels.flatten())
            if step == 0:
                first_logits = _difference(_full(logits), expected[rows].detach())
                digest = _digest(_full(logits))
                form = type(logits).__name__ + (
                    f" {[repr(p) for p in logits.placements]}" if hasattr(logits, "placements") else "")
                first_loss = (_full(loss).item(), ref_loss.item())
            where = "in backward"
            _backward(loss, logits)
            ref_loss.backward()
            target.after_backward(impl, model, mesh)
            if step == 0:
                grads = {name: _gradient_difference(p, ref[name]) for name, p in own.items()}
            if steps:
                where = f"in optimizer step {step + 1} ({steps[step]})"
                mine, theirs = optimizers[steps[step]]
                mine.step()
                theirs.step()
                for opt in (mine, theirs):
                    opt.zero_grad(set_to_none=True)
                where = "in forward"
        return TPRun(
            placements=placements, heads=heads, tied_before=tied_before, tied_after=tied_after, tp=tp, dp=dp,
            tolerance=built.tolerance, tp_rank=mesh["tp"].get_local_rank(), logits=first_logits,
            logits_digest=digest, logits_form=form, loss=first_loss, grads=grads,
            params={name: _difference(_full(p).detach(), ref[name].detach()) for name, p in own.items()},
            replicated={name: _digest(_local(p)) for name, p in own.items() if tp_replicated(placements[name])},
            tied_trained=_tied(model), steps=tuple(spec.get("steps", ())),
        )
    except Exception as exc:  # the parent judges a raising target (run_reports)
        raise TargetRaised(f"{where}: {type(exc).__name__}: {exc}") from exc
