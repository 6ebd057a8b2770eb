"""pytest plugin of nemo_dist (work in progress: fixtures follow)."""

from __future__ import annotations

__all__: list[str] = []
