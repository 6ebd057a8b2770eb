"""Fixtures shared by the harness's pytester tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def keep_hypothesis_profile() -> Iterator[None]:
    """Restore the outer session's hypothesis profile after an in-process run."""
    from hypothesis import settings

    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)

