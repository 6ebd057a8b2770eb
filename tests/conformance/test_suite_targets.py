"""A suite's component, declared to the engine
(:mod:`nemo_dist.conformance.engine.declarations`): layer 0, no process group.

The engine resolves every component from its suite's declaration alone: a
component is checked when any of its fields is given, a preset fills in what
the suite declares for it, the bundled run checks the suite's reference, a
field not given holds the suite's default, and a component with variants runs
each check once per variant its module defines. The declaration here is a
stand-in (argument plumbing: nothing distributed is tested).
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance.engine import target
from nemo_dist.conformance.engine.declarations import SuiteTarget

_DEMO = SuiteTarget(
    component="demo",
    fields=("demo", "demo_fn", "demo_names"),
    module_field="demo",
    required=("thing",),
    reference={"demo": "nemo_dist.distributed.config"},
    presets={"nemo_automodel": {"demo": "json"}},
    label_fields=("demo_fn", "demo"),
    subject_fields=("demo", "demo_fn"),
)


@pytest.fixture
def demo_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(target.SUITE_TARGETS, "demo", _DEMO)
    monkeypatch.setattr(target, "COMPONENTS", (*target.COMPONENTS, "demo"))


@pytest.mark.usefixtures("demo_suite")
def test_a_given_suite_field_checks_that_component_alone() -> None:
    impl, components = target.resolve_implementation(suite_options={"demo_fn": "pkg:fn", "demo_names": []})
    assert components == ("demo",)
    assert impl.suite_options == (("demo_fn", "pkg:fn"),)
    assert impl.suite_option("demo_fn") == "pkg:fn"
    assert impl.suite_option("demo") is None
    assert "demo" in target.checked_components(impl)


@pytest.mark.usefixtures("demo_suite")
def test_a_preset_fills_the_suite_fields_the_user_did_not_give() -> None:
    impl, components = target.resolve_implementation(preset="nemo_automodel", suite_options={"demo_names": ["a", "b"]})
    assert "demo" in components
    assert impl.suite_option("demo") == "json"
    assert impl.suite_option("demo_names") == ("a", "b")


@pytest.mark.usefixtures("demo_suite")
def test_a_suite_module_without_its_required_names_is_an_option_error() -> None:
    impl, components = target.resolve_implementation(suite_options={"demo": "json"})
    with pytest.raises(target.OptionError, match=r"module 'json' has no thing; a demo module must define thing"):
        target.validate_implementation(impl, components)


@pytest.mark.usefixtures("demo_suite")
def test_naming_another_component_leaves_the_suite_unchecked() -> None:
    impl, components = target.resolve_implementation(config="nemo_dist.distributed.config")
    assert components == ("config",)
    assert impl.suite_options == (("config", "nemo_dist.distributed.config"),)
    assert impl.suite_option("demo") is None


@pytest.mark.usefixtures("demo_suite")
def test_naming_a_suite_by_its_other_fields_checks_the_reference_subject() -> None:
    impl, components = target.resolve_implementation(suite_options={"demo_names": ["a"]})
    assert components == ("demo",)
    assert impl.suite_option("demo") == "nemo_dist.distributed.config"
    assert impl.suite_option("demo_names") == ("a",)


def test_every_suite_validates_an_implementation_that_names_none_of_its_options() -> None:
    """Validating every component (the default) of an implementation naming no suite option raises nothing: a
    suite's validation judges only what its options name (the pp suite's once refused every run that named no
    pipeline, ddp galleries included)."""
    from nemo_dist.conformance.engine.declarations import suite_targets
    from nemo_dist.conformance.engine.implementation import Implementation

    assert [t.component for t in suite_targets() if t.validate], "no suite declares a validation"
    target.validate_implementation(Implementation())


def test_an_implementation_holds_the_declared_defaults_and_refuses_undeclared_fields() -> None:
    """A field not given reads as its suite's default (the bundled module); an undeclared keyword is a TypeError;
    the object is immutable, compares by what every field holds, and pickles as its values."""
    import pickle

    from nemo_dist.conformance.engine.implementation import Implementation

    fork = Implementation(gather="my.fork")
    assert (fork.gather, fork.ddp, fork.gather_form, fork.tp_plan) == (
        "my.fork", "nemo_dist.distributed.ddp", "auto", None
    )
    assert Implementation(ddp="nemo_dist.distributed.ddp") == Implementation()  # the default, given or not
    assert pickle.loads(pickle.dumps(fork)) == fork
    assert fork.replaced(ddp_api="DDPManager").ddp_api == "DDPManager"
    with pytest.raises(TypeError, match="unexpected keyword arguments gahter"):
        Implementation(gahter="my.fork")
    with pytest.raises(AttributeError, match="immutable"):
        fork.gather = "other"  # type: ignore[misc]


def test_a_check_runs_once_per_variant_its_module_defines_and_once_for_a_wrapper() -> None:
    """The ddp suite declares entry points as variants: a module defining both gets two runs, each pinned; a
    ``--ddp-fn`` wrapper replacing the module one run; a module defining neither none, with the reason."""
    from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
    from nemo_dist.conformance.engine.implementation import Implementation
    from nemo_dist.conformance.engine.registry import Check, cases

    ddp_check = Check("ddp.demo", "core", "ddp", lambda world, impl: None)
    runs = ddp_check.runs(Implementation())
    assert [(name, impl.ddp_api) for name, impl in runs] == [
        ("ddp.demo[parallelize_ddp]", "parallelize_ddp"), ("ddp.demo[DDPManager]", "DDPManager")
    ]
    wrapped = Implementation(ddp=None, ddp_wrapper=DDPWrapper(fn="torch.nn.parallel:DistributedDataParallel"))
    assert [name for name, _ in ddp_check.runs(wrapped)] == ["ddp.demo"]
    (case,) = cases([ddp_check], Implementation(ddp="nemo_dist.distributed.config"), [2])
    assert case.impl is None
    assert case.missing == "nemo_dist.distributed.config defines none of parallelize_ddp, DDPManager"


def test_a_companion_components_checks_run_only_while_its_field_holds_a_value() -> None:
    """The wrapper checks (the ddp suite's companion) have no case against modules, and run against a wrapper."""
    from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
    from nemo_dist.conformance.engine.implementation import Implementation
    from nemo_dist.conformance.engine.registry import Check, cases

    wrapper_check = Check("wrapper.demo", "core", "wrapper", lambda world, impl: None)
    assert cases([wrapper_check], Implementation(), [2]) == []
    wrapped = Implementation(ddp=None, ddp_wrapper=DDPWrapper(fn="torch.nn.parallel:DistributedDataParallel"))
    assert [c.name for c in cases([wrapper_check], wrapped, [2])] == ["wrapper.demo"]
    assert target.checked_components(wrapped)[-1] == "wrapper"


def test_the_fork_server_imports_the_bundled_modules_named_and_no_user_module() -> None:
    """``own_modules`` names the modules of this package an implementation holds (the module of a
    ``module:name`` too), the ones the ranks' fork server imports once for every rank; a user's module is
    left for each rank to import, as it may start threads or touch an accelerator when imported."""
    bundled = target.own_modules(target.Implementation())
    assert {"nemo_dist.loss.dist_utils", "nemo_dist.distributed.ddp", "nemo_dist.distributed.fsdp2"} <= set(bundled)
    assert all(name.startswith("nemo_dist.") and ":" not in name for name in bundled)

    forked = target.own_modules(
        target.Implementation(
            gather="tests.forks.gather_detached",
            suite_options=[("moe_fn", "nemo_dist.distributed.expert_parallel:parallelize_experts")],
        )
    )
    assert "nemo_dist.loss.dist_utils" not in forked
    assert not any(name.startswith("tests.") for name in forked)
    assert "nemo_dist.distributed.expert_parallel" in forked
