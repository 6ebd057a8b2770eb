"""What a ``--ddp-fn`` wrapper is: :class:`DDPWrapper`, the plain data every rank rebuilds the call from.

How options become one and how it is validated is :mod:`.wrapping`; the rank side that calls it is
:mod:`nemo_dist.conformance.suites.ddp.wrapped`. The ddp suite's implementation holds one in its ``ddp_wrapper``
field, which replaces the ddp module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_dist.conformance.adapters.symbols import value_of
from nemo_dist.conformance.engine.errors import OptionError

if TYPE_CHECKING:
    from nemo_dist.conformance.engine.implementation import Implementation

__all__ = ["DDPWrapper", "ddp_label", "resolve_ddp"]


@dataclass(frozen=True)
class DDPWrapper:
    """A ``--ddp-fn`` callable and how the checks call it and step through it (:mod:`.wrapping`).

    ``kwargs`` are ``(name, Python literal)`` pairs kept as text (the object
    stays hashable and pickles as its strings; :meth:`call_kwargs` evaluates them;
    ``@mesh`` stays a :class:`~nemo_dist.conformance.adapters.symbols.Symbol` the rank fills).
    ``start`` is ``"identical"`` when the user declares that the wrapper expects
    identical weights on every rank (``--ddp-start identical``); ``mesh`` the
    ``(R, S)`` of ``--ddp-mesh RxS`` (``@mesh`` then 2-D), None for a 1-D ``@mesh``;
    ``compute_dtype`` the dtype the wrapper is declared to compute in
    (``--ddp-compute-dtype``, mixed precision; None: the model's own);
    ``reduce_dtype`` the lowest precision it may reduce gradients in
    (``--ddp-reduce-dtype``, float32 unless declared). Dtypes are torch's
    names without ``torch.`` (``"bfloat16"``).
    """

    fn: str
    method: str | None = None
    kwargs: tuple[tuple[str, str], ...] = ()
    output: int | None = None
    reduction: str = "mean"
    buffers: str | None = None
    after_backward: str | None = None
    grad_attr: str | None = None
    zero_grad: str | None = None
    start: str | None = None
    mesh: tuple[int, int] | None = None
    compute_dtype: str | None = None
    reduce_dtype: str = "float32"

    def call_kwargs(self) -> dict[str, Any]:
        """The ``kwargs`` with their values evaluated: a literal, or a ``Symbol`` for ``@name`` (filled by the rank)."""
        return {name: value_of(value) for name, value in self.kwargs}

    @property
    def identical_start(self) -> bool:
        """Whether the user declared that the wrapper expects identical weights on every rank."""
        return self.start == "identical"

    @property
    def step_protocol(self) -> bool:
        """Whether a step needs more than backward and ``param.grad`` (an after-backward call, a gradient attribute)."""
        return any(v is not None for v in (self.after_backward, self.grad_attr, self.zero_grad))

    @property
    def label(self) -> str:
        """How reports name the wrapper: ``fn(model, k=v)``, ``fn(k=v).method(model)``, ``[i]`` for a picked output."""
        keywords = ", ".join(f"{name}={value}" for name, value in self.kwargs)
        if self.method is not None:
            call = f"{self.fn}({keywords}).{self.method}(model)"
        elif self.kwargs:
            call = f"{self.fn}(model, {keywords})"
        else:
            call = self.fn
        return call if self.output is None else f"{call}[{self.output}]"


def resolve_ddp(given: dict[str, Any]) -> dict[str, Any]:
    """The fields the ddp options hold: a ``--ddp-fn`` wrapper (``ddp_wrapper``) replaces the module.

    Raises ``OptionError`` when both a module and a wrapper are named.
    """
    if given.get("ddp_wrapper") is None:
        return given
    if given.get("ddp") is not None:
        raise OptionError("{opt:ddp} names a module and {opt:ddp_fn} a wrapper; give one of them")
    return {**given, "ddp": None}


def ddp_label(impl: Implementation) -> str | None:
    """How reports name the DDP target: the wrapper's call, else the module."""
    wrapper = impl.ddp_wrapper
    return impl.ddp if wrapper is None else wrapper.label
