"""The registry: the one list of conformance checks, and what each suite adds to a run.

The command, ``pytest conformance/`` and the project's tests all expand it the
same way, through :func:`cases`.

A check is a parent-side function ``fn(world, impl)``: it draws inputs with
hypothesis, runs rank-side functions through ``world.run`` and asserts on the
per-rank results.  It raises ``AssertionError`` (or the harness's errors) when
the implementation breaks the contract, ``NotSupported`` when the
implementation lacks what the check needs, and ``NotApplicable`` when the
check cannot apply to what the implementation did.  A check registered with
``needs_world=False`` runs once, in the parent, with ``world`` None.  A
check of a component with variants (entry points its suite declares, the ddp
module's ``parallelize_ddp`` and ``DDPManager``) runs once per variant it
exercises (``variants``) that the module defines.

``world`` is anything with ``size``, ``backend`` and ``run(fn, *args, **kwargs)``
returning per-rank results in rank order: a ``nemo_dist.testing.World``, or
the in-world adapter used under torchrun.

A suite (one subpackage per component) registers its checks with
:func:`check` and, with :func:`register_suite`, what a run needs besides them:
a rank-side function run when a world starts, and a parent-side step run once
per world before the checks (the gather suite detects a callable's output form
there). The engine calls these without importing any suite.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from nemo_dist.conformance.engine.implementation import Implementation
from nemo_dist.conformance.engine.target import SUITE_TARGETS, checked_components, variants_of

__all__ = [
    "CHECKS",
    "SUITES",
    "TIERS",
    "Case",
    "Check",
    "Suite",
    "WorldLike",
    "WorldRule",
    "cases",
    "check",
    "failure",
    "register_suite",
    "select_checks",
    "thorough",
    "thoroughness",
    "with_likely_cause",
]

Tier = Literal["core", "extended"]

#: Accepted values of ``tier`` when selecting checks.
TIERS: tuple[str, ...] = ("core", "extended", "all")
#: A component a suite declares (:mod:`~nemo_dist.conformance.engine.declarations`), or a companion of one.
Component = str
#: Companion components (their checks run only while a field holds a value) -> that field, as suites declare them.
_COMPANIONS: dict[str, str] = {c: f for t in SUITE_TARGETS.values() for c, f in t.companions.items()}


class WorldLike(Protocol):
    """What a check needs of a world."""

    @property
    def size(self) -> int: ...

    @property
    def backend(self) -> str: ...

    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]: ...


@dataclass(frozen=True)
class WorldRule:
    """A condition on a world's size beyond a check's range: ``fits(size)``, and ``reason`` (``{size}`` filled in),
    what a report says of a world that does not fit (a model whose heads a world of 3 cannot split, say)."""

    fits: Callable[[int], bool]
    reason: str


@dataclass(frozen=True)
class Check:
    """One named property of the contract, runnable against any implementation."""

    name: str
    tier: Tier
    component: Component
    fn: Callable[[Any, Implementation], None]
    min_world: int = 1
    max_world: int | None = None
    #: False: the check needs no process group and runs once, in the parent.
    needs_world: bool = True
    #: The variants of its component it exercises (each one the module defines gets a run); None: every one.
    variants: tuple[str, ...] | None = None
    #: Modules the check's rank side imports (``transformers``' modeling modules): imported once for every rank.
    preload: tuple[str, ...] = ()
    #: True: what it checks does not depend on the world's size beyond its range, so a run checks it once, in the
    #: smallest of its world sizes the check fits (:func:`cases`).
    once: bool = False
    #: True: the check runs in every world, its whole matrix in the world of one and in the run's smallest world of
    #: two ranks or more, a sample of it in the others (the check asks :func:`thorough`).
    sampled: bool = False
    #: A condition on the world's size beyond ``min_world``/``max_world`` (None: none).
    rule: WorldRule | None = None

    @property
    def description(self) -> str:
        """The check's promise: the first sentence of its function's docstring, on one line (its name without
        one)."""
        paragraph = " ".join((self.fn.__doc__ or self.name).strip().split("\n\n")[0].split())
        end = paragraph.find(". ")
        return paragraph if end < 0 else paragraph[: end + 1]

    def applies_to(self, world_size: int) -> bool:
        """Whether this check runs in a world of ``world_size`` ranks (a world-less check: in none)."""
        if not self.needs_world:
            return False
        in_range = world_size >= self.min_world and (self.max_world is None or world_size <= self.max_world)
        return in_range and (self.rule is None or self.rule.fits(world_size))

    def runs(self, impl: Implementation) -> list[tuple[str, Implementation]]:
        """``(name, implementation)`` for each run of this check against ``impl``.

        One run for a component without variants (or whose module a wrapper
        replaces); otherwise one per variant of :attr:`variants` the module
        defines (:func:`~nemo_dist.conformance.engine.target.variants_of`),
        named ``check[variant]`` and pinned to it. Empty when it defines none of them.
        """
        found = variants_of(self.component, impl)
        if found is None:
            return [(self.name, impl)]
        field = SUITE_TARGETS[self.component].variant_field or ""
        wanted = self.variants or found
        return [(f"{self.name}[{name}]", impl.replaced(**{field: name})) for name in found if name in wanted]

    @property
    def variant_names(self) -> tuple[str, ...]:
        """The variants this check exercises, by name (its component's every one where it names none)."""
        target = SUITE_TARGETS.get(self.component)
        return self.variants or (target.variant_names if target else ())

    def __call__(self, world: WorldLike | None, impl: Implementation) -> None:
        for suite in SUITES.values():
            if suite.screen is not None:
                suite.screen(self, impl)
        self.fn(world, impl)


def failure(message: str, cause: str) -> AssertionError:
    """An ``AssertionError`` carrying its own likely cause (``likely_cause``, which the runner shows first)."""
    exc = AssertionError(message)
    exc.likely_cause = cause  # type: ignore[attr-defined]
    return exc


def with_likely_cause(run: Callable[[Any, Implementation], None], cause: str) -> Callable[[Any, Implementation], None]:
    """``run`` whose ``AssertionError`` carries ``cause`` as its ``likely_cause`` where it carries none of its own.

    A suite's registrar wraps each check with the cause a failure of it most
    likely has (the runner shows ``exc.likely_cause`` first).
    """

    @functools.wraps(run)
    def explained(world: Any, impl: Implementation) -> None:
        try:
            run(world, impl)
        except AssertionError as exc:
            if not getattr(exc, "likely_cause", ""):
                exc.likely_cause = cause  # type: ignore[attr-defined]
            raise

    return explained


#: Every registered check by name, in registration order.
CHECKS: dict[str, Check] = {}


def check(
    name: str,
    *,
    tier: Tier,
    component: Component,
    min_world: int = 1,
    max_world: int | None = None,
    needs_world: bool = True,
    variants: tuple[str, ...] | None = None,
    preload: tuple[str, ...] = (),
    once: bool = False,
    sampled: bool = False,
    rule: WorldRule | None = None,
) -> Callable[[Callable[[Any, Implementation], None]], Check]:
    """Register the decorated function as the check ``name``; returns the ``Check``.

    Names are unique (a second registration raises ``ValueError``). ``preload``
    names modules the check's rank side imports, which a World whose ranks are
    forked imports once for all of them (see ``nemo_dist.testing.World``).
    ``once``: a run checks it in one world only, the smallest it fits.
    ``sampled``: a run checks its whole matrix in two worlds, a sample in the others (:func:`thorough`).
    ``rule``: a condition on the world's size beyond the range (:class:`WorldRule`).
    """

    def register(fn: Callable[[Any, Implementation], None]) -> Check:
        if name in CHECKS:
            raise ValueError(f"conformance check {name!r} is registered twice")
        CHECKS[name] = Check(
            name, tier, component, fn, min_world, max_world, needs_world, variants, preload, once, sampled, rule
        )
        return CHECKS[name]

    return register


@dataclass(frozen=True)
class Case:
    """One run of a check: its name (``check[variant]`` for an entry point), the pinned implementation, a world size.

    ``world_size`` is 0 for a check that needs no process group. ``applies``
    says whether the check runs in a world of that size (the runner reports
    the others as not applicable, with ``elsewhere`` as the reason where the
    check runs once, in another world of the run). ``impl`` is None when the
    implementation defines none of the entry points the check exercises
    (``missing`` says so).
    """

    name: str
    check: Check
    impl: Implementation | None
    world_size: int
    applies: bool = True
    missing: str = ""
    elsewhere: str = ""
    #: False where a ``sampled`` check runs a sample of its matrix (:func:`thorough` while it runs).
    thorough: bool = True


def cases(checks: Iterable[Check], impl: Implementation, world_sizes: Sequence[int]) -> list[Case]:
    """Every run of ``checks`` against ``impl``: per check, per variant, per world size, in that order.

    A check that needs no process group gives one case of world size 0; any
    other check one case per size of ``world_sizes`` (``applies`` False where
    its range excludes the size). A check runs once per variant of its
    component the module defines (:meth:`Check.runs`); where it defines none of the check's, one case per size
    with ``impl`` None and the reason in ``missing``. A companion component's
    checks (a ``--ddp-fn`` wrapper's) run only while its field holds a value,
    with no case otherwise. A ``once``
    check applies only in the smallest of ``world_sizes`` it fits. A
    ``sampled`` check is thorough in a world of one and in the smallest of
    ``world_sizes`` of two ranks or more it fits, and samples in the others.
    """
    found: list[Case] = []
    for c in checks:
        if c.component in _COMPANIONS and impl.value(_COMPANIONS[c.component]) is None:
            continue  # a companion's checks (a --ddp-fn wrapper's behaviour) have nothing to check without it
        sizes = [0] if not c.needs_world else list(world_sizes)
        fits = [size for size in sizes if size and c.applies_to(size)]
        only = min(fits) if c.once and fits else None
        several = [size for size in fits if size >= 2]
        sampled_in = {size for size in several if size != min(several)} if c.sampled else set()
        elsewhere = (
            ""
            if only is None
            else (
                f"checked once per run, in the world of {only} rank{'s' if only > 1 else ''}: what it checks does not "
                "depend on the world's size"
            )
        )
        variants = c.runs(impl)
        if not variants:
            reason = f"{impl.value(SUITE_TARGETS[c.component].module_field or '')} defines none of " + ", ".join(
                c.variant_names
            )
            found += [Case(c.name, c, None, size, c.applies_to(size), reason) for size in sizes]
            continue
        for name, variant in variants:
            for size in sizes:
                applies = size == 0 or (c.applies_to(size) and only in (None, size))
                ran_elsewhere = not applies and size != 0 and c.applies_to(size)
                found.append(
                    Case(
                        name, c, variant, size, applies,
                        elsewhere=elsewhere if ran_elsewhere else "", thorough=size not in sampled_in,
                    )
                )
    return found


#: Whether the check running in this thread is thorough (see :func:`thorough`).
_THOROUGH: contextvars.ContextVar[bool] = contextvars.ContextVar("nemo_dist_thorough", default=True)


def thorough() -> bool:
    """Whether the ``sampled`` check running now checks its whole matrix (True) or a sample of it (False).

    True outside :func:`thoroughness`: a check called directly is thorough.
    """
    return _THOROUGH.get()


@contextlib.contextmanager
def thoroughness(case: Case) -> Iterator[None]:
    """Run the body with :func:`thorough` saying what ``case`` is (per thread: the runner's lanes are threads)."""
    token = _THOROUGH.set(case.thorough)
    try:
        yield
    finally:
        _THOROUGH.reset(token)


@dataclass(frozen=True)
class Suite:
    """What a component's suite adds to a run besides its checks.

    ``world_setup``: a rank-side function run on every rank when a world
    starts (its first imports paid in the background), used when a check of
    the suite that needs a world is selected. ``prepare``: a parent-side step
    ``prepare(world, impl, notes) -> impl`` run once per world before the
    checks, which may refine the implementation (and add notes to the report).
    ``screen``: ``screen(check, impl)``, called before every check of any
    suite runs, raising ``NotApplicable`` or ``NotSupported`` when that check
    cannot apply to ``impl`` (the ddp checks of the contract's entry points
    against a ``--ddp-fn`` wrapper, say).
    """

    component: str
    world_setup: Callable[[], None] | None = None
    prepare: Callable[[Any, Implementation, list[str]], Implementation] | None = None
    screen: Callable[[Check, Implementation], None] | None = None


#: The registered suites by component.
SUITES: dict[str, Suite] = {}


def register_suite(suite: Suite) -> Suite:
    """Register ``suite`` for its component (a second registration of a component replaces the first)."""
    SUITES[suite.component] = suite
    return suite


def select_checks(
    checks: Iterable[Check],
    impl: Implementation,
    tier: str = "all",
    select: str | None = None,
    components: Iterable[str] | None = None,
) -> list[Check]:
    """The checks of ``tier`` and of the checked components, in the given order.

    ``tier`` is "core", "extended" or "all"; ``select`` keeps only checks whose
    name contains it ("not TEXT": only those whose name does not);
    ``components`` defaults to those ``impl`` names (not ``None``). Raises
    ``ValueError`` for an unknown tier.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}; got {tier!r}")
    wanted = set(checked_components(impl) if components is None else components)
    return [c for c in checks if (tier == "all" or c.tier == tier) and c.component in wanted and _selected(c, select)]


def _selected(check: Check, select: str | None) -> bool:
    if not select:
        return True
    if select.startswith("not "):
        return select[4:].strip() not in check.name
    return select in check.name
