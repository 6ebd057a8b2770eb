"""The gather suite: conformance checks of an all-gather (a dist_utils module or one callable).

Importing it registers its checks (core: :mod:`.checks`, extended:
:mod:`.extended`), its worlds' setup (a first gather with autograd, see
:func:`.ranks.warm_up`) and its suite step: for a callable checked with ``--gather-fn``
and ``--gather-form auto``, the output form is detected from a first call on
every rank of each world.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nemo_dist.conformance.deadlines import warm_up
from nemo_dist.conformance.gather import checks, extended, ranks
from nemo_dist.conformance.registry import Suite, register_suite
from nemo_dist.conformance.target import Implementation

__all__ = ["checks", "detect_output_form", "extended"]


def detect_output_form(world: Any, impl: Implementation, notes: list[str]) -> Implementation:
    """``impl`` with a callable's output form fixed from its first call when every rank saw the same form.

    Adds a note naming the form detected. An implementation that names a
    module, or a form, comes back as it is.
    """
    if impl.gather_fn is None or impl.gather_form != "auto":
        return impl
    forms = warm_up(world, ranks.output_form, impl)
    if len(set(forms)) == 1 and forms[0] is not None:
        notes.append(f"{impl.gather_fn}: output form {forms[0]!r}, detected from its first call")
        return dataclasses.replace(impl, gather_form=forms[0])
    return impl


register_suite(Suite("gather", world_setup=ranks.warm_up, prepare=detect_output_form))
