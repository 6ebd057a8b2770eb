"""Layers 0 and 2: the pipeline-parallel component's split, placement and refusals, and its loss contract in gloo
worlds of 2 and 4 ranks against one process.

The split and the refusals are plain functions (no process group). In the
worlds, every rank builds the same seeded float64 model, runs
:func:`build_pipeline` under each schedule with upstream's token-sum loss,
divides by the label tokens after the step, and compares the loss and every
gradient of its stages with one process's token mean on the whole batch, the
microbatches holding different numbers of label tokens (where a mean of
microbatch means is off by about 1e-2). Tolerance 1e-12: the same sums in
another order (the largest measured difference is below 1e-15).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nemo_dist.conformance.suites.pp.models import TinyPipelineLM
from nemo_dist.distributed import pipeline_parallel as pp
from nemo_dist.testing.plugin import WorldFactory

TOLERANCE = 1e-12


@pytest.mark.parametrize(("layers", "stages"), [(n, s) for n in range(1, 13) for s in range(1, n + 1)])
def test_every_layer_is_in_exactly_one_stage_in_order(layers: int, stages: int) -> None:
    found = pp.split_layers(layers, stages)
    assert len(found) == stages
    assert [i for r in found for i in r] == list(range(layers))
    sizes = [len(r) for r in found]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_five_layers_over_two_stages_put_the_extra_layer_first() -> None:
    assert pp.split_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert pp.split_layers(5, 4) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]


@pytest.mark.parametrize(("layers", "stages", "match"), [
    (3, 4, r"cannot split 3 layers over 4 pipeline stages: every stage needs at least one layer"),
    (0, 1, r"cannot split 0 layers over 1 pipeline stages"),
    (4, 0, r"a pipeline needs at least one stage; got 0"),
])
def test_an_impossible_split_is_a_value_error_naming_both_counts(layers: int, stages: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pp.split_layers(layers, stages)


def test_schedules_by_name_any_case_and_an_unknown_one_names_them_all() -> None:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

    assert pp.schedule_class("1f1b") is Schedule1F1B
    assert pp.schedule_class("interleaved1F1B") is ScheduleInterleaved1F1B
    with pytest.raises(ValueError, match=r"unknown pipeline schedule 'PipeDream'; expected one of GPipe, 1F1B"):
        pp.schedule_class("PipeDream")


def test_stages_are_placed_round_robin_or_in_a_v() -> None:
    assert [pp.stage_indices(r, 2, 2) for r in range(2)] == [[0, 2], [1, 3]]
    assert [pp.stage_indices(r, 4, 2, "v") for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    with pytest.raises(ValueError, match="a V placement holds two stages per rank; got 3"):
        pp.stage_indices(0, 2, 3, "v")


def test_a_stage_keeps_its_layers_and_parts_under_the_model_s_names() -> None:
    model = TinyPipelineLM(layers=5)
    first = pp.stage_module(model, range(0, 3), first=True, last=False)
    last = pp.stage_module(model, range(3, 5), first=False, last=True)
    names = {n for n, _ in model.named_parameters()}
    held = [{n for n, _ in s.named_parameters()} for s in (first, last)]
    assert held[0] | held[1] == names
    assert not held[0] & held[1]
    assert (first.norm, first.output, last.tok_embeddings) == (None, None, None)
    assert list(last.layers.keys()) == ["3", "4"]
    assert len(model.layers) == 5  # the model itself is unchanged


def test_a_stage_is_a_copy_of_its_share_and_the_model_keeps_every_part() -> None:
    """A stage's parameters are copies equal to the model's (none shared), the model keeps every layer and part
    afterwards, and a dropped part that a kept layer also reaches is copied there, not lost."""
    model = TinyPipelineLM(layers=4)
    model.layers["2"].embedding_seen = model.tok_embeddings  # a kept layer also reaches a part the stage drops
    parts = (model.tok_embeddings, model.norm, model.output)
    middle = pp.stage_module(model, range(1, 3), first=False, last=False)
    assert (model.tok_embeddings, model.norm, model.output) == parts
    assert list(model.layers.keys()) == ["0", "1", "2", "3"]
    assert (middle.tok_embeddings, middle.norm, middle.output) == (None, None, None)
    assert list(middle.layers.keys()) == ["1", "2"]
    own = dict(model.named_parameters())
    for name, param in middle.named_parameters(remove_duplicate=False):
        assert param is not own[name.replace("layers.2.embedding_seen.", "tok_embeddings.")]
        assert torch.equal(param, own[name.replace("layers.2.embedding_seen.", "tok_embeddings.")])
    assert isinstance(middle.layers["2"].embedding_seen, torch.nn.Embedding)


def test_tied_embeddings_are_refused_naming_both_parts() -> None:
    with pytest.raises(ValueError, match=r"tied embeddings are not supported by pipeline parallelism: output.weight "
                                         r"is tok_embeddings.weight"):
        pp.refuse_tied_embeddings(TinyPipelineLM(tie=True))
    pp.refuse_tied_embeddings(TinyPipelineLM())


def test_a_layer_list_that_is_not_a_module_dict_is_refused() -> None:
    model = TinyPipelineLM()
    model.layers = torch.nn.ModuleList(model.layers.values())  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"'layers' must be an nn.ModuleDict keyed by layer index \(got ModuleList\)"):
        pp.stage_module(model, range(0, 1), first=True, last=False)


def test_no_label_token_is_refused_by_the_scaling() -> None:
    with pytest.raises(ValueError, match="the batch holds 0 label tokens"):
        pp.scale_grads_by_tokens([TinyPipelineLM()], 0)


def _batch(microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels, 2 rows a microbatch; later microbatches hold fewer label tokens (the rest ignored)."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 16, (2 * microbatches, 6), generator=generator)
    labels = torch.randint(0, 16, (2 * microbatches, 6), generator=generator)
    for m in range(microbatches):
        labels[2 * m:2 * m + 2, 6 - m:] = -100
    return ids, labels


def _against_one_process(schedule: str, microbatches: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(5)
    model = TinyPipelineLM().to(torch.float64)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("pp",))
    made, stages = pp.build_pipeline(model, mesh, microbatches, pp.token_sum_loss, schedule=schedule)
    ids, labels = _batch(microbatches)
    losses: list[torch.Tensor] = []
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    made.step(*((ids,) if first else ()), target=labels if last else None, losses=losses if last else None)
    tokens = pp.count_label_tokens(labels)
    pp.scale_grads_by_tokens(stages, tokens)
    loss = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())  # one process: the token mean
    loss.backward()
    reference = dict(model.named_parameters())
    grads = {name: (p.grad - reference[name].grad).abs().max().item()
             for s in stages for name, p in s.submod.named_parameters()}
    found_loss = (sum(losses) / tokens - loss).abs().item() if last else None
    return {"grads": grads, "loss": found_loss, "stages": [s.stage_index for s in stages]}


@pytest.mark.parametrize(("schedule", "microbatches"), [
    ("GPipe", 1), ("GPipe", 4), ("1F1B", 2), ("1F1B", 4), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 4),
    ("LoopedBFS", 2),
])
def test_token_sum_contract_equals_one_process_on_uneven_label_tokens(
    schedule: str, microbatches: int, world_factory: WorldFactory
) -> None:
    """Every schedule at pp 2, label tokens uneven over the microbatches: loss and every gradient within 1e-12."""
    found = world_factory(2).run(_against_one_process, schedule, microbatches)
    held = sorted(name for f in found for name in f["grads"])
    assert held == sorted({n for n, _ in TinyPipelineLM().named_parameters()}), held
    for rank, f in enumerate(found):
        assert max(f["grads"].values()) <= TOLERANCE, (rank, f["grads"])
    assert next(f["loss"] for f in found if f["loss"] is not None) <= TOLERANCE


def test_four_stages_of_five_layers_equal_one_process(world_factory: WorldFactory) -> None:
    """pp 4 under 1F1B, 4 microbatches: each rank one stage, every gradient within 1e-12 of one process's."""
    found = world_factory(4).run(_against_one_process, "1F1B", 4)
    assert [f["stages"] for f in found] == [[0], [1], [2], [3]]
    assert all(max(f["grads"].values()) <= TOLERANCE for f in found), found
    assert found[3]["loss"] <= TOLERANCE


def _refused_tied() -> str:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("pp",))
    try:
        pp.build_pipeline(TinyPipelineLM(tie=True).to(torch.float64), mesh, 2, pp.token_sum_loss)
    except ValueError as exc:
        return str(exc)
    return "built"


def test_tied_embeddings_are_refused_on_every_rank(world_factory: WorldFactory) -> None:
    found = world_factory(2).run(_refused_tied)
    assert all(text.startswith("tied embeddings are not supported by pipeline parallelism") for text in found), found


def _composed_with_fsdp2(schedule: str) -> dict[str, Any]:
    """pp 2 x dp 2: each dp rank steps its half of the rows, then the post-step division by the batch's label tokens
    over the dp size; every full gradient against one process on every row."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    torch.manual_seed(5)
    model = TinyPipelineLM().to(torch.float64)
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("pp", "dp"))
    dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    made, stages = pp.build_pipeline(model, mesh["pp"], 4, pp.token_sum_loss, schedule=schedule, dp_mesh=mesh["dp"])
    ids, labels = _batch(4 * dp)
    mine = slice(dp_rank * 8, (dp_rank + 1) * 8)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    made.step(*((ids[mine],) if first else ()), target=labels[mine] if last else None)
    pp.scale_grads_by_tokens(stages, pp.count_label_tokens(labels), dp)
    F.cross_entropy(model(ids).flatten(0, 1), labels.flatten()).backward()
    reference = dict(model.named_parameters())
    grads = {name: (p.grad.full_tensor() - reference[name].grad).abs().max().item()
             for s in stages for name, p in s.submod.named_parameters()}
    units = sorted(path for s in stages for path, m in s.submod.named_modules() if isinstance(m, FSDPModule))
    return {"grads": grads, "units": units}


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_composed_with_fsdp2_over_dp_every_gradient_equals_one_process(
    schedule: str, world_factory: WorldFactory
) -> None:
    """pp 2 x dp 2, each stage sharded with FSDP2 over its dp group (a unit per layer, then the stage's root), label
    tokens uneven over the microbatches: every full gradient within 1e-12 of one process's on every dp rank's rows."""
    found = world_factory(4).run(_composed_with_fsdp2, schedule)
    for rank, f in enumerate(found):
        assert max(f["grads"].values()) <= TOLERANCE, (rank, f["grads"])
        assert "" in f["units"], f["units"]
        assert any(unit.startswith("layers.") for unit in f["units"]), f["units"]


def _two_dim_dp_mesh() -> str:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    try:
        pp.build_pipeline(TinyPipelineLM().to(torch.float64), mesh["pp"], 2, pp.token_sum_loss, dp_mesh=mesh)
    except ValueError as exc:
        return str(exc)
    return "built"


def test_a_dp_mesh_of_two_dims_is_refused_on_every_rank(world_factory: WorldFactory) -> None:
    found = world_factory(4).run(_two_dim_dp_mesh)
    assert all(text.startswith("dp_mesh must be a 1-D mesh over the data-parallel ranks") for text in found), found
