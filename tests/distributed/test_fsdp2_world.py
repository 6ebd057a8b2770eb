"""Layer 2: gloo worlds of 1, 2 and 4 ranks. The FSDP2 component by behaviour: mesh, sharding, training, sync.

What the conformance suite proves of it field by field (``fsdp2.*``, run on
the bundled component by ``tests/conformance/test_every_check.py``:
resharding choices, prefetch chains, checkpointing, CPU offload, the default
policy's dtypes, deferred sync) is not repeated here; these tests prove what
that suite takes as given or leaves out: the mesh this component builds
(the suite builds its own, as upstream does), sizes that do not fit, tied
embeddings inside a layer list, a model without one, the world of one's
sync contexts, and the comparison with released upstream.

One call per property into the session's persistent worlds. Every rank
starts from the same seeded model (``fully_shard`` broadcasts nothing);
parameters are compared through ``full_tensor()``; training runs in float64,
mixed precision off, against one process stepping the whole batch. The
upstream comparison is ``thorough`` (each rank imports nemo_automodel). FSDP
modules are imported where used (about a second), not at collection.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nemo_dist.distributed.mesh import MESH_DIM_NAMES, ParallelismSizes, create_fsdp2_device_mesh, get_flat_mesh
from nemo_dist.testing.plugin import WorldFactory
from tests import targets

VOCAB, WIDTH, LAYERS, PER_RANK, STEPS = 10, 8, 3, 3, 3
#: A float64 difference this small is reduction order, not a wrong rule.
TOLERANCE = 1e-12
FLAT = ("dp", "dp_shard_cp", "dp_cp")


class _Net(nn.Module):
    """Token ids -> embedding -> a list of layers -> head -> scale, with Hugging Face's embedding getters."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, dtype=dtype)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH, dtype=dtype) for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 2, dtype=dtype)
        self.scale = nn.Parameter(torch.ones(2, dtype=dtype))  # the root unit's own parameter

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x) * self.scale


_MESHES: dict[tuple[int, int], Any] = {}


def _mesh(replicas: int) -> Any:
    """This world's FSDP2 mesh (HSDP with ``replicas`` > 1), built once per world."""
    key = (id(dist.group.WORLD), replicas)
    if key not in _MESHES:
        _MESHES[key] = create_fsdp2_device_mesh(ParallelismSizes(dp_replicate_size=replicas if replicas > 1 else None))
    return _MESHES[key]


def _model(dtype: torch.dtype) -> _Net:
    torch.manual_seed(0)
    return _Net(dtype)


def _off(**options: Any) -> Any:
    """``FSDP2Config(**options)`` with mixed precision off."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    return FSDP2Config(mp_policy=MixedPrecisionPolicy(), **options)


def _manager(config: Any, mesh: Any) -> Any:
    from nemo_dist.distributed.fsdp2 import FSDP2Manager

    return FSDP2Manager(config, mesh)


def _batches() -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's full batch (token ids, targets), the same on every rank."""
    generator = torch.Generator().manual_seed(1)
    size = PER_RANK * dist.get_world_size()
    # One token per sample: a Linear on a 2-D input returns no view (FSDP2 warns about views).
    tokens = torch.randint(0, VOCAB, (STEPS, size), generator=generator)
    return tokens, torch.randn(STEPS, size, 2, generator=generator, dtype=torch.float64)


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((model(tokens) - targets) ** 2).mean()


def _local(batch: torch.Tensor) -> torch.Tensor:
    start = dist.get_rank() * PER_RANK
    return batch[start : start + PER_RANK]


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _full(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [t.full_tensor() if _is_dtensor(t) else t.detach().clone() for t in tensors]


def _max_diff(mine: Iterable[torch.Tensor], theirs: Iterable[torch.Tensor]) -> float:
    return max((a - b).abs().max().item() for a, b in zip(_full(mine), _full(theirs), strict=True))


def _resharded(model: nn.Module) -> dict[str, bool]:
    """Per FSDP unit: are the parameters it manages sharded DTensors again (resharded), between forward and backward?"""
    from torch.distributed.fsdp import FSDPModule

    found = {}
    for name, unit in model.named_modules():
        if isinstance(unit, FSDPModule):
            nested = [m for m in unit.modules() if m is not unit and isinstance(m, FSDPModule)]
            inner = {id(p) for m in nested for p in m.parameters()}
            managed = [p for p in unit.parameters() if id(p) not in inner]
            assert managed, f"unit {name!r} manages no parameter"
            found[name] = all(_is_dtensor(p) for p in managed)
    return found


@contextlib.contextmanager
def _recording_prefetch(model: nn.Module) -> Iterator[list[tuple[str, str, list[str]]]]:
    """Record every prefetch chain set on ``model``'s units (direction, unit, targets), through the public setters."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(module): name for name, module in model.named_modules()}
    calls: list[tuple[str, str, list[str]]] = []
    originals = {way: getattr(FSDPModule, f"set_modules_to_{way}_prefetch") for way in ("forward", "backward")}

    def recorder(way: str) -> Any:
        def record(unit: Any, modules: list[Any]) -> None:
            calls.append((way, names[id(unit)], [names[id(m)] for m in modules]))
            originals[way](unit, modules)

        return record

    try:
        for way in originals:
            setattr(FSDPModule, f"set_modules_to_{way}_prefetch", recorder(way))
        yield calls
    finally:
        for way, original in originals.items():
            setattr(FSDPModule, f"set_modules_to_{way}_prefetch", original)


def _sharded_training(replicas: int) -> dict[str, Any]:
    """Rank side: shard, read the layout, train 3 SGD steps next to one process stepping the full batch."""
    mesh = _mesh(replicas)
    reference = _model(torch.float64)
    model = copy.deepcopy(reference)
    _manager(_off(), mesh).parallelize(model)
    found: dict[str, Any] = {
        "mesh": (mesh.mesh_dim_names, tuple(mesh.shape), mesh.device_type),
        "flat": {name: get_flat_mesh(mesh, name).size() for name in FLAT},
        "placements": {
            (tuple(repr(p) for p in param.placements), param.device_mesh.mesh_dim_names)
            for param in model.parameters()
        },
        "full_equal": all(
            torch.equal(*pair) for pair in zip(_full(model.parameters()), reference.parameters(), strict=True)
        ),
    }
    tokens, targets = _batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(STEPS):
        out = model(_local(tokens[step]))
        if step == 0:
            found["resharded"] = _resharded(model)
        ((out - _local(targets[step])) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        _loss(reference, tokens[step], targets[step]).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    found["max_diff"] = _max_diff(model.parameters(), reference.parameters())
    found["shards"] = [param.to_local().detach().clone() for param in model.parameters()]
    return found


#: Upstream's heuristic: the layers but the last, and the input embedding, reshard; the output embedding and the
#: root do not.
RESHARDED = {"": False, "embed": True, "layers.0": True, "layers.1": True, "layers.2": False, "head": False}


def test_fsdp_shards_every_parameter_and_trains_like_one_process(world_factory: WorldFactory) -> None:
    """World of 2: the FSDP mesh, Shard(0) DTensors on dp_shard, full tensors intact, the reshard heuristic,
    3 SGD steps equal to one process on the full batch."""
    for rank, found in enumerate(world_factory(2).run(_sharded_training, 1)):
        assert found["mesh"] == (MESH_DIM_NAMES, (1, 1, 2, 1, 1), "cpu"), rank
        assert found["flat"] == {"dp": 2, "dp_shard_cp": 2, "dp_cp": 2}, rank
        assert found["placements"] == {(("Shard(dim=0)",), ("dp_shard",))}, rank
        assert found["full_equal"], f"rank {rank}: a full tensor differs from the unsharded model's"
        assert found["resharded"] == RESHARDED, rank
        assert found["max_diff"] <= TOLERANCE, f"rank {rank}: {found['max_diff']}"


def test_hsdp_2x2_replicates_shards_and_trains_like_one_process(world_factory: WorldFactory) -> None:
    """World of 4, dp_replicate_size=2: (Replicate, Shard(0)) on (dp_replicate, dp_shard), training equal to one
    process on the whole batch (the mean over all 4 ranks), the two replicas' shards bit-identical."""
    results = world_factory(4).run(_sharded_training, 2)
    for rank, found in enumerate(results):
        assert found["mesh"] == (MESH_DIM_NAMES, (1, 2, 2, 1, 1), "cpu"), rank
        assert found["flat"] == {"dp": 4, "dp_shard_cp": 2, "dp_cp": 4}, rank
        assert found["placements"] == {(("Replicate()", "Shard(dim=0)"), ("dp_replicate", "dp_shard"))}, rank
        assert found["full_equal"], rank
        assert found["max_diff"] <= TOLERANCE, f"rank {rank}: {found['max_diff']}"
    for rank in (0, 1):  # ranks r and r + 2 hold the same shard in the two replicas
        for mine, other in zip(results[rank]["shards"], results[rank + 2]["shards"], strict=True):
            assert torch.equal(mine, other), f"ranks {rank} and {rank + 2} differ"


class _TiedNet(nn.Module):
    """A language model's shape with the output projection tied to the input embedding."""

    def __init__(self, layers: Any = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, dtype=torch.float64)
        self.layers = layers if layers is not None else nn.ModuleList(_linear() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False, dtype=torch.float64)
        self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _linear() -> nn.Linear:
    return nn.Linear(WIDTH, WIDTH, dtype=torch.float64)


def _tied() -> dict[str, Any]:
    """Rank side: a tied model shards with both embeddings in the root unit and trains like one process; tied
    embedding modules inside a layer list are refused."""
    torch.manual_seed(0)
    reference = _TiedNet()
    model = copy.deepcopy(reference)
    _manager(_off(), _mesh(1)).parallelize(model)
    tokens, _ = _batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(STEPS):
        out = model(_local(tokens[step]))
        if step == 0:
            resharded = _resharded(model)
        ((out - 1) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ((reference(tokens[step]) - 1) ** 2).mean().backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    inside = _TiedNet(nn.ModuleList([_linear()]))
    inside.layers.append(inside.head)
    try:
        _manager(_off(), _mesh(1)).parallelize(inside)
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {
        "resharded": resharded,
        "tied": model.head.weight is model.embed.weight,
        "max_diff": _max_diff(model.parameters(), reference.parameters()),
        "refused": refused,
    }


def test_tied_embeddings_stay_in_the_root_unit_and_train_like_one_process(world_factory: WorldFactory) -> None:
    """World of 2: tied input/output embeddings get no unit of their own and stay one parameter; training equals
    one process on the full batch; tied embedding modules inside a layer list raise ValueError, as upstream."""
    for rank, found in enumerate(world_factory(2).run(_tied)):
        assert found["resharded"] == {"": False, "layers.0": True, "layers.1": False}, f"rank {rank}"
        assert found["tied"], f"rank {rank}: the tie was broken"
        assert found["max_diff"] <= TOLERANCE, f"rank {rank}: {found['max_diff']}"
        assert "tied input/output embedding modules inside a ModuleList" in found["refused"], f"rank {rank}"


def _no_layer_list() -> tuple[dict[str, bool], bool]:
    """Rank side: a model with no ModuleList; which units it gets, whether every parameter is sharded."""
    torch.manual_seed(0)
    model = nn.Sequential(_linear(), nn.Tanh(), _linear())
    _manager(_off(), _mesh(1)).parallelize(model)
    sharded = all(_is_dtensor(p) for p in model.parameters())
    model(torch.ones(PER_RANK, WIDTH, dtype=torch.float64))
    return _resharded(model), sharded


def test_a_model_without_layer_lists_is_one_root_unit(world_factory: WorldFactory) -> None:
    """World of 2, beyond upstream (whose layer discovery raises ValueError there): the root is the one unit."""
    assert world_factory(2).run(_no_layer_list) == [({"": False}, True)] * 2


def _sizes_error(options: dict[str, Any]) -> tuple[str, str]:
    """Rank side: build the mesh from bad sizes; the error's type and message (the world stays healthy)."""
    try:
        create_fsdp2_device_mesh(ParallelismSizes(**options))
    except Exception as error:
        return type(error).__name__, str(error)
    return "no error", ""


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        pytest.param({"dp_replicate_size": 3}, r"dp_replicate_size=3 must divide dp_size=2", id="not-dividing"),
        pytest.param({"dp_replicate_size": 2}, r"dp_replicate_size=2 must be less than dp_size=2", id="replicas-only"),
        pytest.param({"dp_size": 4}, r"dp_size=4 does not fit a world of 2 ranks", id="sizes-not-the-world"),
    ],
)
def test_sizes_that_do_not_fit_the_world_raise_on_every_rank(
    world_factory: WorldFactory, options: dict[str, Any], pattern: str
) -> None:
    """World of 2: sizes that cannot make the mesh raise ValueError naming the field, on every rank, no hang."""
    for rank, (kind, message) in enumerate(world_factory(2).run(_sizes_error, options)):
        assert kind == "ValueError", f"rank {rank}: {kind}: {message}"
        assert re.search(pattern, message), f"rank {rank}: {message!r}"


def _single_rank() -> dict[str, Any]:
    """Rank side, world of 1: the default (bf16) config shards and casts nothing."""
    from nemo_dist.distributed.fsdp2 import fsdp2_sharding_enabled, get_sync_ctx
    from nemo_dist.distributed.fsdp2_config import FSDP2Config

    mesh = _mesh(1)
    model = _model(torch.float32)
    parallelized = _manager(FSDP2Config(), mesh).parallelize(model)
    tokens, _ = _batches()
    with get_sync_ctx(parallelized, False):
        out = parallelized(tokens[0])
    ddp = torch.nn.parallel.DistributedDataParallel(nn.Linear(1, 1))
    with get_sync_ctx(ddp, False):  # a DDP model gets its no_sync()
        ddp_syncs = ddp.require_backward_grad_sync
    return {
        "ddp_syncs": ddp_syncs,
        "mesh": (mesh.mesh_dim_names, tuple(mesh.shape)),
        "enabled": fsdp2_sharding_enabled(mesh),
        "same": parallelized is model,
        "type": type(parallelized).__name__,
        "plain": not any(_is_dtensor(p) for p in model.parameters()),
        "dtypes": {p.dtype for p in model.parameters()} | {out.dtype},
    }


def test_world_of_one_shards_and_casts_nothing(world_factory: WorldFactory) -> None:
    """World of 1: a one-element mesh of the five dims; the model comes back itself, plain float32 tensors,
    computing in float32 even under the bf16 default policy (upstream's behaviour); get_sync_ctx gives it a
    no-op context and a DDP model its no_sync()."""
    (found,) = world_factory(1).run(_single_rank)
    assert found == {
        "ddp_syncs": False,
        "mesh": (MESH_DIM_NAMES, (1, 1, 1, 1, 1)),
        "enabled": False,
        "same": True,
        "type": "_Net",
        "plain": True,
        "dtypes": {torch.float32},
    }


def _ranks_per_dim(mesh: Any) -> dict[str, list[int]]:
    return {name: dist.get_process_group_ranks(get_flat_mesh(mesh, name).get_group()) for name in MESH_DIM_NAMES + FLAT}


def _against_upstream(replicas: int) -> dict[str, Any]:
    """Rank side: upstream's mesh and fsdp2_strategy_parallelize next to ours, on the same model and batches."""
    from nemo_automodel.components.distributed import mesh as upstream_mesh
    from nemo_automodel.components.distributed import mesh_utils, parallelizer
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    from nemo_dist.distributed.fsdp2 import fsdp2_strategy_parallelize

    # Upstream's sharding patches FSDPParam process-wide; this rank serves later tests, so it is put back.
    original_guard = FSDPParam.to_accumulated_grad_if_needed
    try:
        sizes = upstream_mesh.ParallelismSizes(dp_replicate_size=replicas if replicas > 1 else None)
        theirs, _ = mesh_utils._create_fsdp2_device_mesh(sizes, world_size=dist.get_world_size())
        ours = _mesh(replicas)
        meshes = (ours, theirs)
        found: dict[str, Any] = {
            "mesh": [(tuple(m.mesh_dim_names), tuple(m.shape), m.device_type, _ranks_per_dim(m)) for m in meshes]
        }
        tokens, targets = _batches()
        entry_points = {"ours": fsdp2_strategy_parallelize, "upstream": parallelizer.fsdp2_strategy_parallelize}
        for label, parallelize in entry_points.items():
            model = _model(torch.float64)
            with _recording_prefetch(model) as prefetch:
                returned = parallelize(model, ours, mp_policy=MixedPrecisionPolicy())  # prefetch on by default
            placements = [tuple(repr(p) for p in getattr(param, "placements", ())) for param in model.parameters()]
            model(_local(tokens[0]))
            resharded = _resharded(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(STEPS):
                _loss(model, _local(tokens[step]), _local(targets[step])).backward()
                optimizer.step()
                optimizer.zero_grad()
            found[label] = {
                "layout": (returned is model, type(returned).__name__, placements, resharded, prefetch),
                "final": _full(model.parameters()),
            }
    finally:
        FSDPParam.to_accumulated_grad_if_needed = original_guard
    return found


@pytest.mark.thorough
@pytest.mark.upstream
@pytest.mark.parametrize(("size", "replicas"), [(1, 1), (2, 1), (4, 2)], ids=["w1", "w2", "hsdp-w4"])
def test_same_mesh_units_resharding_and_training_as_released_upstream(
    world_factory: WorldFactory, size: int, replicas: int
) -> None:
    """Against nemo-automodel 0.7.0 in the same world: the same mesh (dims, shape, every dim's ranks), the same
    FSDP units, placements, reshard-after-forward choices and prefetch chains, bit-identical parameters after
    3 steps; at world size 1 both return the model itself, unsharded."""
    targets.import_target("nemo_automodel.components.distributed.parallelizer")
    for rank, found in enumerate(world_factory(size).run(_against_upstream, replicas)):
        assert found["mesh"][0] == found["mesh"][1], f"rank {rank}"
        assert found["ours"]["layout"] == found["upstream"]["layout"], f"rank {rank}"
        for mine, theirs in zip(found["ours"]["final"], found["upstream"]["final"], strict=True):
            assert torch.equal(mine, theirs), f"rank {rank}"
