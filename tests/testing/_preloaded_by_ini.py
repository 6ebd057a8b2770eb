"""A module only the ``dist_preload`` ini value of a pytester run imports first: it records the process that did."""

from __future__ import annotations

import os

#: The pid of the process that executed this module.
IMPORTED_BY = os.getpid()
