"""A module only imported by a World's ``preload``: it records the process that imported it."""

from __future__ import annotations

import os

#: The pid of the process that executed this module.
IMPORTED_BY = os.getpid()
