"""How the pp suite calls what it checks: the pipeline function, its mesh, its loss, its schedules.

The target is a function ``(model, pp_mesh, n_microbatches, loss_fn) ->
(schedule, stages)`` (``--pp-fn``), called on every rank with the same seeded
model, :class:`~nemo_dist.conformance.suites.pp.models.TinyPipelineLM` or the
``--pp-model`` factory's, in ``--pp-compute-dtype`` (float64), a 1-D
``DeviceMesh`` named ``("pp",)`` over the world, and the loss of the
declared convention (``--pp-loss``): a microbatch's mean cross entropy
(``mean``) or its sum over label tokens (``token_sum``). With
``--pp-schedule``, once per name, given ``schedule=NAME``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from nemo_dist.conformance.engine.errors import OptionError
from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.importing import resolve_callable
from nemo_dist.conformance.suites.ddp.expectations import COMPUTE_ROUNDINGS, unit_roundoff
from nemo_dist.conformance.suites.ddp.templates import manual_seed
from nemo_dist.conformance.suites.pp.models import VOCAB, TinyPipelineLM

__all__ = ["CONVENTIONS", "IGNORE", "KEYWORD", "SCHEDULES", "loss_fn", "one_process_loss", "pipeline",
           "schedule_step", "schedules", "takes_keyword", "token_sum", "validate"]

#: ``--pp-loss``'s values.
CONVENTIONS = ("mean", "token_sum")
#: The schedule names ``--pp-schedule`` accepts (torch's, by ``get_schedule_class``'s names).
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
#: ``--pp-compute-dtype``'s values.
DTYPES = ("float64", "float32")
#: How far the loss and gradients of a float64 pipeline may be from one process, relative to max(1, max |expected|):
#: the same sums in another order (the largest measured with 2 to 4 microbatches is 9e-16; a real bug about 1e-3).
FLOAT64_TOLERANCE = 1e-12
#: The label value the losses ignore (torch's cross entropy default).
IGNORE = -100
#: The keyword input the keyword check passes to ``schedule.step`` (packed sequences' positions).
KEYWORD = "position_ids"


def takes_keyword(fn: Any, name: str = KEYWORD, *, named: bool = False) -> bool:
    """Whether ``fn`` can be called with keyword ``name``: a parameter of that name (not positional-only) or, unless
    ``named``, a ``**kwargs``; True where its signature cannot be read (calling it is then the only test)."""
    import inspect

    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any((p.kind == p.VAR_KEYWORD and not named) or (p.name == name and p.kind != p.POSITIONAL_ONLY)
               for p in parameters)


def token_sum(impl: Implementation) -> bool:
    """Whether the declared convention is upstream's token sum (``--pp-loss token_sum``)."""
    return impl.suite_option("pp_loss") == "token_sum"


def _mean(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, -2), target.flatten(), ignore_index=IGNORE)


def _summed(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, -2), target.flatten(), ignore_index=IGNORE, reduction="sum")


def dtype(impl: Implementation) -> torch.dtype:
    """The dtype the model is built and computed in (``--pp-compute-dtype``, float64 by default)."""
    found: torch.dtype = getattr(torch, impl.suite_option("pp_compute_dtype") or "float64")
    return found


def tolerance(impl: Implementation) -> float:
    """The loss's and gradients' tolerance: :data:`FLOAT64_TOLERANCE`, or 32 roundings of a lower dtype."""
    found = dtype(impl)
    return FLOAT64_TOLERANCE if found == torch.float64 else COMPUTE_ROUNDINGS * unit_roundoff(found)


def build_model(impl: Implementation, seed: int, tied: bool = False) -> tuple[torch.nn.Module, int]:
    """``(model, vocabulary)``: the ``--pp-model`` factory's model or the suite's (``tied``: its head tied to its
    embedding), seeded, in :func:`dtype`."""
    manual_seed(seed)
    factory = impl.suite_option("pp_model")
    model = resolve_callable(factory)() if factory and not tied else TinyPipelineLM(tie=tied)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or next(
        (m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)), VOCAB)
    return model.to(dtype(impl)), int(vocab)


def logits(output: Any) -> torch.Tensor:
    """The logits of a model's output: its ``logits`` (a Hugging Face output), a tuple's first, or itself."""
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    found: torch.Tensor = output
    return found


def loss_fn(impl: Implementation) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The ``loss_fn`` the target is given: a microbatch's mean cross entropy, or under ``token_sum`` its sum."""
    return _summed if token_sum(impl) else _mean


def schedules(impl: Implementation) -> tuple[str | None, ...]:
    """The schedules a run checks: each ``--pp-schedule`` name, else ``(None,)`` (the function's own)."""
    names = tuple(n.strip() for n in (impl.suite_option("pp_schedule") or "").split(",") if n.strip())
    return names or (None,)


def pipeline(impl: Implementation, model: torch.nn.Module, mesh: Any, microbatches: int,
             schedule: str | None, dp_mesh: Any = None) -> tuple[Any, list[Any]]:
    """``(schedule, stages)`` from the target (``schedule=`` passed where a name is given, ``dp_mesh=`` where one
    is); stages as a list."""
    keywords: dict[str, Any] = {"schedule": schedule} if schedule is not None else {}
    if dp_mesh is not None:
        keywords["dp_mesh"] = dp_mesh
    found = resolve_callable(impl.suite_option("pp_fn"))(model, mesh, microbatches, loss_fn(impl), **keywords)
    if not isinstance(found, (tuple, list)) or len(found) != 2:
        raise TypeError(f"the pipeline function returned {type(found).__name__}, not (schedule, stages)")
    made, stages = found
    stages = list(stages) if isinstance(stages, (tuple, list)) else [stages]
    if not stages or not all(hasattr(s, "submod") for s in stages):
        raise TypeError("the pipeline function's stages are not PipelineStage objects (each with a submod)")
    return made, stages


def schedule_step(made: Any, stages: list[Any], ids: torch.Tensor, labels: torch.Tensor, losses: list[torch.Tensor],
                  keywords: Mapping[str, torch.Tensor] | None = None) -> None:
    """``made.step`` as every rank calls it: the inputs where the rank holds the first stage, labels and ``losses``
    where it holds the last, ``keywords`` on every rank (torch hands a step's keyword inputs to each stage of that
    rank). Gradients are left as they are."""
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    made.step(*((ids,) if first else ()), target=labels if last else None, losses=losses if last else None,
              **(keywords or {}))


def one_process_loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, summed: bool = False,
                     keywords: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """One process's cross entropy of the batch ``ids`` (``keywords`` given to the model): the mean over its label
    tokens, or (``summed``) their sum."""
    return (_summed if summed else _mean)(logits(model(ids, **(keywords or {}))), labels)


def train_step(impl: Implementation, made: Any, stages: list[Any], ids: torch.Tensor, labels: torch.Tensor,
               losses: list[torch.Tensor], keywords: Mapping[str, torch.Tensor] | None = None, *,
               divisor: float | None = None, dp_mesh: Any = None) -> None:
    """One step's forward and backward on the batch (every rank of a pipeline holds it): ``--pp-step``'s function,
    else the suite's: gradients zeroed, the schedule's step (inputs where the rank holds the first stage, labels
    and ``losses`` where it holds the last, ``keywords`` on every rank: torch hands a step's keyword inputs to
    each stage of that rank), and under ``token_sum`` every gradient divided by ``divisor`` (default: the label
    tokens of ``labels``). ``--pp-step``'s function gets ``keywords`` as keyword arguments, and ``dp_mesh=``
    where one is given (composed with data parallelism: ``ids`` and ``labels`` are then this rank's rows)."""
    declared = impl.suite_option("pp_step")
    if declared is not None:
        extra = {} if dp_mesh is None else {"dp_mesh": dp_mesh}
        resolve_callable(declared)(made, stages, ids, labels, losses, **(keywords or {}), **extra)
        return
    params = [p for stage in stages for p in stage.submod.parameters()]
    for param in params:
        param.grad = None
    schedule_step(made, stages, ids, labels, losses, keywords)
    if token_sum(impl):
        tokens = divisor if divisor is not None else int((labels != IGNORE).sum().item())
        for param in params:
            if param.grad is not None:
                param.grad.div_(tokens)


def validate(impl: Implementation) -> None:
    """Import what the pp options name, check ``--pp-loss`` and ``--pp-schedule``'s names (in the parent, before any
    world starts; nothing where no pp option is given); ``OptionError`` naming the option."""
    spec = impl.suite_option("pp_fn")
    if spec is not None:
        try:
            resolve_callable(spec, "my_project.pp:build_pipeline", "a function")
        except OptionError as exc:
            raise OptionError(f"{{opt:pp_fn}}: {exc.template}") from None
    if impl.suite_option("pp_step") is not None:
        try:
            resolve_callable(impl.suite_option("pp_step"), "my_project.train:pp_step", "a function")
        except OptionError as exc:
            raise OptionError(f"{{opt:pp_step}}: {exc.template}") from None
    if impl.suite_option("pp_model") is not None:
        try:
            resolve_callable(impl.suite_option("pp_model"), "my_project.models:tiny_llama", "a model factory")
        except OptionError as exc:
            raise OptionError(f"{{opt:pp_model}}: {exc.template}") from None
    if (name := impl.suite_option("pp_compute_dtype")) is not None and name not in DTYPES:
        raise OptionError(f"{{opt:pp_compute_dtype}} expects one of {', '.join(DTYPES)}; got {name!r}")
    convention = impl.suite_option("pp_loss")
    if convention is not None and convention not in CONVENTIONS:
        raise OptionError(f"{{opt:pp_loss}} expects one of {', '.join(CONVENTIONS)}; got {convention!r}")
    known = {name.lower() for name in SCHEDULES}
    for name in schedules(impl):
        if name is not None and name.lower() not in known:
            raise OptionError(f"{{opt:pp_schedule}}: unknown schedule {name!r}; expected some of {','.join(SCHEDULES)}")
