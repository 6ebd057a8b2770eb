"""Layer 0 (no process group): the public surface matches the seed pages and ``__all__`` is honest."""

from __future__ import annotations

import importlib
import inspect
import logging
import subprocess
import sys

import pytest

PUBLIC_MODULES = [
    "nemo_dist",
    "nemo_dist.loss",
    "nemo_dist.loss.dist_utils",
    "nemo_dist.distributed",
    "nemo_dist.distributed.config",
    "nemo_dist.distributed.ddp",
    "nemo_dist.distributed.activation_checkpointing",
    "nemo_dist.distributed.fsdp2_config",
    "nemo_dist.distributed.mesh",
    "nemo_dist.distributed.fsdp2",
    "nemo_dist.distributed.pipeline_parallel",
    "nemo_dist.testing",
    "nemo_dist.conformance",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_names_exist_and_are_public(name: str) -> None:
    """Every name in a public module's __all__ exists and none is underscored (dunders aside)."""
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported, f"{name}.__all__ is empty"
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.__all__ names missing {attribute!r}"
        assert not attribute.startswith("_") or attribute.startswith("__"), f"{name}.__all__ exports {attribute!r}"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_functions_and_classes_have_docstrings(name: str) -> None:
    """Every exported function and class states its contract in a docstring."""
    module = importlib.import_module(name)
    for attribute in module.__all__:
        value = getattr(module, attribute)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name}.{attribute} has no docstring"


def test_gather_signatures_match_the_seed_page() -> None:
    """all_gather_with_grad(x), all_gather_no_grad(x) and _AllGatherWithGrad.forward/backward keep upstream's shape."""
    from nemo_dist.loss import dist_utils

    for function in (dist_utils.all_gather_with_grad, dist_utils.all_gather_no_grad):
        parameters = list(inspect.signature(function).parameters.values())
        assert parameters[0].name == "x"
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[1:]), function.__name__
    forward = inspect.signature(dist_utils._AllGatherWithGrad.forward).parameters
    assert list(forward)[:2] == ["ctx", "x"]
    backward = inspect.signature(dist_utils._AllGatherWithGrad.backward).parameters
    assert next(iter(backward)) == "ctx"
    assert any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in backward.values())


def test_ddp_manager_matches_the_seed_page() -> None:
    """DDPManager(config) with _setup_distributed(), parallelize(model) and a module logger."""
    from nemo_dist.distributed import ddp

    assert list(inspect.signature(ddp.DDPManager).parameters) == ["config"]
    assert list(inspect.signature(ddp.DDPManager.parallelize).parameters) == ["self", "model"]
    assert callable(ddp.DDPManager._setup_distributed)
    assert isinstance(ddp.logger, logging.Logger)
    assert ddp.logger.name == "nemo_dist.distributed.ddp"


def test_importing_the_package_emits_no_warning() -> None:
    """A fresh interpreter importing every public module with warnings as errors succeeds."""
    code = "; ".join(f"import {name}" for name in PUBLIC_MODULES)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
