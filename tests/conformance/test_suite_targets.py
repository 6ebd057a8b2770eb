"""A suite's own component, declared to the engine
(:mod:`nemo_dist.conformance.engine.declarations`): layer 0, no process group.

The engine resolves a suite's options into the implementation without knowing
the suite: a component is checked when any of its fields is given, a preset
fills in what the suite declares for it, and the bundled run checks the
suite's reference. The declaration here is a stand-in (argument plumbing:
nothing distributed is tested).
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
    repeatable=("demo_names",),
    subject_fields=("demo", "demo_fn"),
)


@pytest.fixture
def demo_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(target.SUITE_TARGETS, "demo", _DEMO)
    monkeypatch.setattr(target, "_SUITE_FIELDS", (*target._SUITE_FIELDS, *_DEMO.fields))
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
def test_naming_an_engine_component_leaves_the_suite_unchecked() -> None:
    impl, components = target.resolve_implementation(config="nemo_dist.distributed.config")
    assert components == ("config",)
    assert impl.suite_options == ()


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
