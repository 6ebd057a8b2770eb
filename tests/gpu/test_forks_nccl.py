"""Layer 4: the forks in NCCL worlds of 2 ranks get the core verdicts they get on gloo, or the reason why not.

The expectations are the gloo suite's own, imported, so the two cannot drift:
every broken fork's guarding check fails (``GUARDS`` of
``tests/conformance/test_forks.py``) with the exit status its tier gives;
every gallery gather gets the core exit status ``tests/conformance/
test_gallery.py`` promises; the upstream-faithful fork conforms on core.
``NCCL_DIFFERS`` names each fork whose verdict may take another form on NCCL
and why: NCCL does not compare sizes the way gloo does, so a mismatch may be a
HANG rather than an error, never a pass. Skipped without two GPUs (``pytest -m
gpu -ra`` lists the reason); nothing here has run on a GPU yet.
"""

from __future__ import annotations

import re

import pytest

from nemo_dist.conformance import Implementation, Report, format_report, load_checks, run_checks
from nemo_dist.conformance import select_checks as select
from nemo_dist.testing.plugin import WorldFactory
from tests.conformance._fork_guards import GUARDS
from tests.conformance.test_forks import TARGETS
from tests.conformance.test_gallery import CALLED_WITH, GALLERY

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group(name="nemo_dist_nccl_w2")]

#: Fork -> why its verdict on NCCL may differ in form from gloo's (it must still not pass).
NCCL_DIFFERS = {
    "broken_gather_uneven_hangs_or_garbage": (
        "NCCL moves mismatched row counts without an error (gloo raises): the mismatch check may be HANG "
        "instead of FAIL"
    ),
}


def _nccl_report(
    impl: Implementation,
    components: tuple[str, ...],
    world_factory: WorldFactory,
    tier: str = "all",
    sizes: tuple[int, ...] = (2,),
) -> tuple[Report, str]:
    """One run of the checks of ``components`` (real-model checks aside) in NCCL worlds of ``sizes``, and its table."""
    checks = [c for c in select(load_checks().values(), impl, tier, None, components) if "real_models" not in c.name]
    report = run_checks(
        checks,
        impl,
        sizes,
        backend="nccl",
        max_examples=5,
        worlds=lambda size: world_factory(size, backend="nccl"),
        components=components,
    )
    return report, format_report(report)


@pytest.mark.parametrize("fork", sorted(GUARDS))
def test_broken_fork_fails_its_guarding_check_on_nccl(fork: str, world_factory: WorldFactory) -> None:
    """As on gloo: the guarding check does not pass (FAIL naming the property; HANG where NCCL_DIFFERS says)."""
    impl, components, sizes = TARGETS[fork]
    # A fork whose bug needs a subgroup runs in a world of 3 (skipped with fewer GPUs), as on gloo.
    report, table = _nccl_report(impl, components, world_factory, sizes=(max(2, sizes[0]),))
    for check, message in GUARDS[fork]:
        guarded = [v for v in report.verdicts if v.check.split("[")[0] == check]
        assert guarded, f"{check} did not run\n{table}"
        assert all(v.failed for v in guarded), f"{check} passed on NCCL\n{table}"
        if fork not in NCCL_DIFFERS:
            assert any(re.search(message, v.message) for v in guarded), f"{check}: no message matches\n{table}"
    expected_exit = 1 if any(v.failed and v.tier == "core" for v in report.verdicts) else 0
    assert report.exit_code() == expected_exit, table


@pytest.mark.parametrize(("spec", "status"), [(spec, status) for spec, status, _ in GALLERY])
def test_gallery_gather_gets_its_core_status_on_nccl(spec: str, status: int, world_factory: WorldFactory) -> None:
    """Each gallery gather exits on core as it does on gloo (a correct one conforms, a wrong one fails)."""
    impl = Implementation(gather=None, gather_fn=spec, **CALLED_WITH.get(spec, {}))
    report, table = _nccl_report(impl, ("gather",), world_factory, "core")
    assert report.exit_code() == status, table


def test_a_gather_asserting_cuda_conforms_on_nccl(world_factory: WorldFactory) -> None:
    """The gallery gather that asserts ``x.is_cuda`` (a usage error on gloo) passes every core check on NCCL."""
    impl = Implementation(gather=None, gather_fn="tests.forks.gallery_gather_asserts_cuda:gather_on_cuda")
    report, table = _nccl_report(impl, ("gather",), world_factory, "core")
    assert report.exit_code() == 0, table


def test_upstream_faithful_fork_conforms_on_nccl(world_factory: WorldFactory) -> None:
    """The upstream-faithful gather, DDP and config pass every core check in an NCCL world of 2."""
    impl, components, _ = TARGETS["upstream_faithful"]
    report, table = _nccl_report(impl, components, world_factory, "core")
    assert report.exit_code() == 0, table
