"""Layer 2: a gloo world of 4. The FSDP2 component's tensor-parallel path, judged by the tp suite.

``nemo_dist.distributed.fsdp2.fsdp2_strategy_parallelize`` applies tensor
parallelism over its mesh's ``tp`` dim (the TP component's plan) and then
FSDP2 over the data-parallel dims, as upstream's does; the tp suite calls it
through ``--tp nemo_dist.distributed.fsdp2`` on ``(dp, tp)`` meshes of
upstream's layout: tp 4, and dp 2 x tp 2 with the component's own FSDP2.
"""

from __future__ import annotations

from nemo_dist.conformance import load_checks, run_checks, select_checks
from nemo_dist.conformance.engine.report import format_report
from nemo_dist.conformance.engine.target import resolve_implementation, validate_implementation
from nemo_dist.testing.plugin import WorldFactory


def test_fsdp2_component_with_tp_trains_like_one_process_on_a_dp_tp_mesh(world_factory: WorldFactory) -> None:
    """Every core tp check that applies in a world of 4 passes through the FSDP2 component's entry point."""
    impl, components = resolve_implementation(suite_options={"tp": "nemo_dist.distributed.fsdp2"})
    validate_implementation(impl, components)
    checks = select_checks(load_checks().values(), impl, "core", None, components)
    report = run_checks(checks, impl, (4,), worlds=world_factory, components=components)
    table = format_report(report)
    assert report.exit_code() == 0, table
    passed = {v.check for v in report.verdicts if v.outcome == "pass"}
    assert {"tp.fsdp2_on_a_dp_tp_mesh_trains_like_one_process", "tp.forward_equals_unsharded",
            "tp.trains_like_one_process"} <= passed, table
    assert "tp=nemo_dist.distributed.fsdp2" in table, table
