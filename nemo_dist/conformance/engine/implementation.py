"""What a conformance run checks: an :class:`Implementation` (module paths, or one gather callable) and its wrapper.

An :class:`Implementation` names modules (``gather``, ``ddp``, ``config``)
or, for the gather component, one callable found anywhere (``gather_fn``, a
``module:name``); a :class:`DDPWrapper` names a ``--ddp-fn`` callable that
replaces the ddp module. Only strings travel to the ranks; each rank imports
what they name itself. Both are plain frozen data: how options become them
is :mod:`.target` (:func:`~nemo_dist.conformance.engine.target.resolve_implementation`),
:mod:`.callables` and :mod:`.wrapping`, all above this module; below it are
only :mod:`.errors` and :mod:`.symbols`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from nemo_dist.conformance.engine.errors import NotSupported
from nemo_dist.conformance.engine.symbols import value_of

__all__ = ["DDP_APIS", "FSDP2_APIS", "GROUP_PARAMETERS", "DDPWrapper", "Implementation"]

#: The two upstream DDP entry points, in the order their checks run.
DDP_APIS: tuple[str, ...] = ("parallelize_ddp", "DDPManager")
#: The FSDP2 entry points a fsdp2 module may define; the checks use the first one it has.
FSDP2_APIS: tuple[str, ...] = ("FSDP2Manager", "fsdp2_strategy_parallelize")

#: Parameter names taken to be a process group (the checks pass it, as they pass ``uneven=``).
GROUP_PARAMETERS: tuple[str, ...] = ("group", "process_group", "pg")


@dataclass(frozen=True)
class DDPWrapper:
    """A ``--ddp-fn`` callable and how the checks call it and step through it (:mod:`.wrapping`).

    ``kwargs`` are ``(name, Python literal)`` pairs kept as text (the object
    stays hashable and pickles as its strings; :meth:`call_kwargs` evaluates them;
    ``@mesh`` stays a :class:`~nemo_dist.conformance.engine.symbols.Symbol` the rank fills).
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


#: The fields of :class:`Implementation` holding the module of one of the engine's own components.
_MODULE_FIELDS = frozenset({"gather", "ddp", "config", "fsdp2"})


@dataclass(frozen=True)
class Implementation:
    """What to check: module paths of the components, or one gather callable.

    ``gather``, ``ddp``, ``config`` are module paths (``None``: not named).
    ``gather_fn`` (``"module:name"``) replaces the gather module by a single
    callable, a function or a ``torch.autograd.Function`` subclass, whose output
    is the concatenation, a W-tuple or a stacked tensor (``gather_form``);
    ``no_grad_fn`` is its no-grad counterpart (default: ``gather_fn`` under
    ``torch.no_grad()``). ``gather_kwargs`` are ``(name, Python literal)``
    pairs passed as keywords on every call of either callable (kept as text
    so the object stays hashable; :meth:`gather_call_kwargs` evaluates them;
    ``@name`` is a symbol each call fills, see
    :data:`~nemo_dist.conformance.engine.symbols.SYMBOLS`);
    ``gather_output`` picks the gathered value out of a tuple or list return
    (``None``: the return is the gathered value). ``gather_init`` are the
    same pairs for a class built once per rank before it is called
    (``--gather-init``). ``ddp_api`` pins the DDP entry point the rank
    functions use (``"parallelize_ddp"`` or ``"DDPManager"``; ``None``: the
    manager when the module has one). ``ddp_wrapper`` replaces the ddp module by a
    ``--ddp-fn`` wrapper (:class:`DDPWrapper`). ``fsdp2`` is the module of the
    FSDP2 component (``FSDP2Config`` and an entry point of :data:`FSDP2_APIS`);
    ``fsdp2_sync_ctx`` (``"module:name"``) its ``get_sync_ctx`` where the module
    does not define one (upstream keeps it in ``components/distributed/utils.py``).
    ``suite_options`` are the values of the options a suite declares for a
    component of its own (:mod:`~nemo_dist.conformance.engine.declarations`): ``(field,
    value)`` pairs, each value a text or a tuple of texts (:meth:`suite_option`).
    The object pickles as its strings.
    """

    gather: str | None = "nemo_dist.loss.dist_utils"
    ddp: str | None = "nemo_dist.distributed.ddp"
    config: str | None = "nemo_dist.distributed.config"
    gather_fn: str | None = None
    no_grad_fn: str | None = None
    gather_form: str = "auto"
    ddp_api: str | None = None
    gather_kwargs: tuple[tuple[str, str], ...] = ()
    gather_output: int | None = None
    gather_init: tuple[tuple[str, str], ...] = ()
    ddp_wrapper: DDPWrapper | None = None
    fsdp2: str | None = "nemo_dist.distributed.fsdp2"
    fsdp2_sync_ctx: str | None = None
    suite_options: tuple[tuple[str, Any], ...] = ()

    def suite_option(self, field: str, default: Any = None) -> Any:
        """The value a suite's option ``field`` holds here (``default`` when not given)."""
        return dict(self.suite_options).get(field, default)

    def module(self, component: str) -> ModuleType:
        """Import and return the module of ``component`` ("gather", "ddp", "config", "fsdp2" or a suite's field).

        A name that is no field of the class is a suite's module field, read
        from ``suite_options``. Raises ``NotSupported`` when that component is
        not part of this implementation.
        """
        path = getattr(self, component) if component in _MODULE_FIELDS else self.suite_option(component)
        if path is None:
            raise NotSupported(f"no {component} module was named")
        return importlib.import_module(path)

    @property
    def gather_named(self) -> bool:
        """Whether the gather component is checked (a module or a callable is named)."""
        return self.gather is not None or self.gather_fn is not None

    @property
    def gather_label(self) -> str:
        """How reports name the gather target: the callable (with its keywords and output index), else the module."""
        if self.gather_fn is None:
            return self.gather or "-"
        if not self.gather_kwargs and self.gather_output is None and not self.gather_init:
            return self.gather_fn
        keywords = "".join(f", {name}={value}" for name, value in self.gather_kwargs)
        built = f"({', '.join(f'{name}={value}' for name, value in self.gather_init)})" if self.gather_init else ""
        picked = "" if self.gather_output is None else f"[{self.gather_output}]"
        return f"{self.gather_fn}{built}(x{keywords}){picked}"

    @property
    def ddp_label(self) -> str | None:
        """How reports name the DDP target: the wrapper's call, else the module."""
        return self.ddp if self.ddp_wrapper is None else self.ddp_wrapper.label

    def gather_call_kwargs(self) -> dict[str, Any]:
        """The keywords ``gather_kwargs`` names, their values evaluated (a literal, or a ``Symbol`` for ``@name``)."""
        return {name: value_of(value) for name, value in self.gather_kwargs}

    def gather_init_kwargs(self) -> dict[str, Any]:
        """The constructor keywords ``gather_init`` names, evaluated as :meth:`gather_call_kwargs` does."""
        return {name: value_of(value) for name, value in self.gather_init}

    def ddp_apis(self) -> tuple[str, ...]:
        """The DDP entry points the ddp module defines (``ddp_api`` alone when pinned), in :data:`DDP_APIS` order."""
        if self.ddp_api is not None:
            return (self.ddp_api,)
        if self.ddp_wrapper is not None:
            return ()
        module = self.module("ddp")
        return tuple(api for api in DDP_APIS if hasattr(module, api))

    def with_ddp_api(self, api: str) -> Implementation:
        """This implementation with the DDP entry point pinned to ``api``."""
        return replace(self, ddp_api=api)

    def resolved_ddp_api(self) -> str:
        """The entry point rank functions use: the pinned one, else ``DDPManager`` when present."""
        if self.ddp_api is not None:
            return self.ddp_api
        apis = self.ddp_apis()
        if not apis:
            raise NotSupported(f"{self.ddp} defines neither parallelize_ddp nor DDPManager")
        return "DDPManager" if "DDPManager" in apis else apis[0]
