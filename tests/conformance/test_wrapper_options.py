"""Layer 0 (no process group): ``--ddp-fn`` and its options, and the exact arithmetic the wrapper checks rely on.

Usage errors run in this process through ``main(argv)``: each exits 2
before any world starts, saying what is wrong and how to fix it. Then how a
wrapper is called (where the model goes, which DDP fields it can take) and
the claim of :mod:`nemo_dist.conformance.suites.wrapper.exact`: where it says
float64 is exact, one process's float64 training equals it bit for bit.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.distributed import ProcessGroup

from nemo_dist.conformance import NotSupported
from nemo_dist.conformance.adapters.wrapping import call_arguments, parse_wrapper
from nemo_dist.conformance.frontends.cli import main
from nemo_dist.conformance.suites.ddp.wrapped import field_keywords
from nemo_dist.conformance.suites.wrapper import ranks
from nemo_dist.conformance.suites.wrapper.checks import FIXED_EXAMPLES, STEPS
from nemo_dist.conformance.suites.wrapper.exact import exact_training

G = "tests.forks.gallery_ddp_"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ddp-fn", G + "lightning"], "--ddp-fn expects MODULE:NAME, such as --ddp-fn "
         "torch.nn.parallel:DistributedDataParallel"),
        (["--ddp-fn", "tests.forks.no_such:wrap"], "--ddp-fn: module 'tests.forks.no_such' does not import"),
        (["--ddp-fn", "math:pi"], "--ddp-fn: 'math:pi' is a float, not a function or a class"),
        (["--ddp", "nemo_dist.distributed.ddp", "--ddp-fn", G + "yolov5:smart_DDP"], "give one of them"),
        (["--ddp-method", "setup_module"], "--ddp-method applies to a --ddp-fn wrapper only"),
        (["--ddp-reduction", "sum"], "--ddp-reduction applies to a --ddp-fn wrapper only"),
        (["--ddp-fn", G + "yolov5:smart_DDP", "--ddp-method", "setup_module"],
         "tests.forks.gallery_ddp_yolov5:smart_DDP is a function, not a class"),
        (["--ddp-fn", G + "lightning:DDPStrategy", "--ddp-method", "setup"],
         "--ddp-method setup: tests.forks.gallery_ddp_lightning:DDPStrategy has no method 'setup'"),
        (["--ddp-fn", G + "fairseq:DistributedFairseqModel"],
         "has required parameter 'args' that no option fills; pass it on every call with --ddp-kwarg args=VALUE"),
        (["--ddp-fn", G + "yolov5:smart_DDP", "--ddp-kwarg", "fp16=True"],
         "--ddp-kwarg fp16=...: tests.forks.gallery_ddp_yolov5:smart_DDP takes no parameter 'fp16'"),
        (["--ddp-fn", G + "detectron2:create_ddp_model", "--ddp-kwarg", "static_graph=True"],
         "the ddp field checks pass static_graph= themselves"),
        (["--ddp-fn", G + "detectron2:create_ddp_model", "--ddp-kwarg", "fp16_compression=yes"],
         "'yes' is not a Python literal"),
        (["--ddp-fn", G + "detectron2:create_ddp_model", "--ddp-kwarg", "fp16_compression"],
         "--ddp-kwarg expects NAME=VALUE"),
        (["--ddp-fn", G + "colossalai:TorchDDPPlugin", "--ddp-method", "configure", "--ddp-output", "first"],
         "--ddp-output expects the index (>= 0) of the wrapped model"),
        (["--ddp-fn", G + "summed:DataParallel", "--ddp-reduction", "avg"],
         "--ddp-reduction expects one of mean, sum; got 'avg'"),
        (["--ddp-fn", G + "summed:DataParallel", "--ddp-buffers", "shared"],
         "--ddp-buffers expects one of synced, local; got 'shared'"),
        (["--ddp-fn", G + "megatron:DistributedDataParallel", "--ddp-kwarg", "ddp_config={}",
          "--ddp-after-backward", "finish_sync"],
         "--ddp-after-backward finish_sync: tests.forks.gallery_ddp_megatron:DistributedDataParallel has no method"),
        (["--ddp-fn", G + "megatron:DistributedDataParallel", "--ddp-grad-attr", "main grad"],
         "--ddp-grad-attr expects a name, such as --ddp-grad-attr main_grad"),
        (["--ddp-fn", G + "yolov5:smart_DDP", "--check", "ddp.bucket_cap_mb[DDPManager]"],
         "no entry point 'DDPManager' for this check; use ddp.bucket_cap_mb"),
        (["--ddp-fn", G + "device_strategy:DDPStrategy", "--ddp-method", "setup_module", "--ddp-kwarg",
          "cluster_environment=tests.forks.no_such:make()"],
         "--ddp-kwarg 'cluster_environment=tests.forks.no_such:make()': module 'tests.forks.no_such' does not import"),
        (["--ddp-fn", G + "device_strategy:DDPStrategy", "--ddp-method", "setup_module", "--ddp-kwarg",
          "cluster_environment=math:pi()"],
         "--ddp-kwarg 'cluster_environment=math:pi()': 'math:pi' is a float, not a factory"),
        (["--ddp-fn", G + "device_strategy:DDPStrategy", "--ddp-method", "setup_module", "--ddp-kwarg",
          "parallel_devices=@gpus"],
         "'@gpus' is no symbol; the symbols are @mesh, @device, @devices, @rank, @world_size"),
    ],
    ids=["no-colon", "unimportable", "not-callable", "ddp-and-ddp-fn", "method-alone", "reduction-alone",
         "method-of-a-function", "no-such-method", "required-parameter", "kwarg-not-taken", "kwarg-a-ddp-field",
         "kwarg-not-a-literal", "kwarg-without-value", "output-not-an-index", "reduction", "buffers",
         "after-backward-missing", "grad-attr-not-a-name", "check-entry-point", "factory-unimportable",
         "factory-not-callable", "unknown-symbol"],
)
def test_ddp_fn_usage_errors_exit_two_saying_what_and_how(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad --ddp-fn command line exits 2 before any world starts, with a message naming the problem."""
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _f(args: dict[str, Any], model: Any, flag: bool = False) -> None: ...


def _g(module: Any, *, k: int = 0) -> None: ...


def _h(*, model: Any) -> None: ...


@pytest.mark.parametrize(
    ("fn", "keywords", "expected"),
    [
        (_f, {"args": {}}, ([], {"model": "M", "args": {}})),
        (_g, {"k": 1}, (["M"], {"k": 1})),
        (_h, {}, ([], {"model": "M"})),
        (print, {}, (["M"], {})),
    ],
    ids=["model-after-a-keyword", "module-first", "keyword-only-model", "variadic"],
)
def test_the_model_goes_to_its_parameter_by_position_only_when_first(
    fn: Any, keywords: dict[str, Any], expected: tuple[list[Any], dict[str, Any]]
) -> None:
    """The model goes to ``model``/``module`` (else the first free positional parameter), by keyword unless first."""
    parameters = tuple(inspect.signature(fn).parameters.values())
    assert call_arguments(parameters, "M", keywords) == expected


def test_ddp_fields_reach_a_wrapper_by_name_or_kwargs_and_are_refused_naming_the_keyword() -> None:
    """A DDP field goes through **kwargs; nemo_dist's own fields only by name (off values left out), else named."""
    kwargs_wrapper = parse_wrapper(ddp_fn=G + "detectron2:create_ddp_model")
    assert kwargs_wrapper is not None
    fields = {"static_graph": True, "bucket_cap_mb": None, "activation_checkpointing": False}
    assert field_keywords(kwargs_wrapper, fields) == {"static_graph": True}
    with pytest.raises(NotSupported, match=r"needs activation_checkpointing=: .* takes no activation_checkpointing="):
        field_keywords(kwargs_wrapper, {"activation_checkpointing": True})
    fixed = parse_wrapper(ddp_fn=G + "yolov5:smart_DDP")
    assert fixed is not None
    with pytest.raises(NotSupported, match=r"needs broadcast_buffers=: .*gallery_ddp_yolov5:smart_DDP takes"):
        field_keywords(fixed, {"broadcast_buffers": False})


def _one_process(seed: int, kind: str, batch: torch.Tensor, scale: float) -> list[torch.Tensor]:
    """SGD of the linear model on ``batch`` in this process, loss ``scale * mean(out ** 2)``; params per step."""
    model = ranks.Linear(seed, kind)
    found = []
    for _ in range(STEPS):
        (scale * model(batch).square().mean()).backward()
        with torch.no_grad():
            for p in model.parameters():
                assert p.grad is not None
                p.sub_(ranks.LR * p.grad)
                p.grad = None
        found.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return found


@pytest.mark.parametrize("size", [1, 2, 4])
def test_the_fixed_integer_example_is_exact_and_equals_float64_training(size: int) -> None:
    """Where exact_training says float64 is exact, one process's float64 training equals the rationals bit for bit."""
    kind, seed, rows = FIXED_EXAMPLES[0]
    batch = ranks.batch(seed, kind, rows * size)
    weight, bias = ranks.initial_weights(seed, kind)
    for reduction, scale in (("mean", 1.0), ("sum", float(size))):
        run = exact_training(weight.tolist(), bias.tolist(), batch.tolist(), size, STEPS, ranks.LR, reduction)
        assert run.exact
        exact = [torch.tensor([float(v) for v in step], dtype=torch.float64) for step in run.params]
        got = _one_process(seed, kind, batch, scale)
        assert all(torch.equal(a, b) for a, b in zip(got, exact, strict=True)), (reduction, got, exact)


def test_a_mean_over_three_ranks_is_not_claimed_exact() -> None:
    """Dividing by a world size of 3 is not exact in float64: the checks then compare within their tolerance."""
    kind, seed, rows = FIXED_EXAMPLES[0]
    weight, bias = ranks.initial_weights(seed, kind)
    run = exact_training(weight.tolist(), bias.tolist(), ranks.batch(seed, kind, rows * 3).tolist(), 3, STEPS,
                         ranks.LR, "mean")
    assert not run.exact


def test_a_factory_value_is_made_once_per_rank_for_gather_and_wrapper_calls() -> None:
    """``MODULE:NAME()`` is stored as text, then called once per process: every call gets the same object."""
    from nemo_dist.conformance.adapters.symbols import Factory, value_of
    from nemo_dist.conformance.adapters.wrapper_spec import DDPWrapper
    from nemo_dist.conformance.suites.ddp.wrapped import filled_keywords
    from nemo_dist.conformance.suites.gather.calls import filled

    text = G + "device_strategy:LocalEnvironment()"
    assert value_of(text) == Factory(G + "device_strategy:LocalEnvironment")
    assert value_of(repr(text)) == text  # a quoted string stays a string
    wrapper = DDPWrapper(fn=G + "device_strategy:DDPStrategy", method="setup_module",
                         kwargs=(("cluster_environment", text),))
    first, second = filled_keywords(wrapper), filled_keywords(wrapper)
    gathered = filled({"environment": value_of(text)}, None, None)
    assert type(first["cluster_environment"]).__name__ == "LocalEnvironment"
    assert first["cluster_environment"] is second["cluster_environment"] is gathered["environment"]


def _takes_group(model: Any, group: ProcessGroup | None = None, pg: Any = None) -> None: ...


def _takes_devices(model: Any, devices: list[torch.device] | None = None, mesh: Any = None, other: Any = None) -> None:
    ...


@pytest.mark.parametrize(
    ("fn", "name", "form"),
    [
        (_takes_group, "group", "group"),
        (_takes_group, "pg", "group"),
        (_takes_devices, "devices", "devices"),
        (_takes_devices, "mesh", "mesh"),
        (_takes_devices, "other", "mesh"),
        (torch.nn.parallel.DistributedDataParallel, "process_group", "group"),
    ],
)
def test_mesh_takes_the_form_the_receiving_parameter_wants(fn: Any, name: str, form: str) -> None:
    """@mesh becomes a process group or a device list where the annotation (or else the name) asks for one."""
    from nemo_dist.conformance.suites.ddp.mesh import mesh_form

    parameter = inspect.signature(fn).parameters.get(name)
    assert mesh_form(name, parameter) == form
