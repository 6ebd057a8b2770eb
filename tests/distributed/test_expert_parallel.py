"""Layer 0, no process group: how :func:`parallelize_experts` refuses a mesh it cannot use.

What it does to numbers, on the 1-D mesh and composed with data parallelism
on the ``("edp", "ep")`` mesh, is proven in gloo worlds by the moe conformance
suite (the bundled run, and ``tests/conformance/test_gallery_moe.py``'s
``bundled`` rows).
"""

from __future__ import annotations

import pytest

from nemo_dist.conformance.suites.moe.layer import TinyMoE
from nemo_dist.distributed.expert_parallel import parallelize_experts


class _Mesh:
    """What parallelize_experts reads of a mesh before any collective: its dims, their names, a dim's size
    (argument plumbing, no process group)."""

    def __init__(self, sizes: tuple[int, ...], names: tuple[str, ...]) -> None:
        self.ndim, self.mesh_dim_names, self._sizes = len(sizes), names, dict(zip(names, sizes, strict=True))

    def __getitem__(self, name: str) -> _Mesh:
        return _Mesh((self._sizes[name],), (name,))

    def size(self) -> int:
        return next(iter(self._sizes.values())) if self.ndim == 1 else 0


@pytest.mark.parametrize(
    ("sizes", "names"), [((2, 2), ("dp", "tp")), ((1, 2, 2), ("pp", "edp", "ep")), ((2, 2), ("ep", "edp"))]
)
def test_a_mesh_neither_one_dimensional_nor_named_edp_ep_is_refused_naming_its_dims(
    sizes: tuple[int, ...], names: tuple[str, ...]
) -> None:
    layer = TinyMoE()
    with pytest.raises(ValueError, match=rf"a 2-D one named \('edp', 'ep'\); got {len(sizes)} dims named"):
        parallelize_experts(layer, _Mesh(sizes, names))
    assert not hasattr(layer.experts, "ep_group")  # refused before anything changed


@pytest.mark.parametrize(("sizes", "names"), [((5,), ("ep",)), ((2, 5), ("edp", "ep"))])
def test_experts_that_do_not_split_over_ep_are_refused_naming_both(
    sizes: tuple[int, ...], names: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match=r"12 experts do not split over an expert-parallel mesh of 5"):
        parallelize_experts(TinyMoE(), _Mesh(sizes, names))
