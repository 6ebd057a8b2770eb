"""Layer 0: the mutation script's scoring and the docs/mutation.md row it writes (no mutant is run here)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_score", ROOT / "scripts" / "mutation_score.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_cuda_only_explanations_are_their_own_class_not_equivalence() -> None:
    """Every CUDA-only reason starts with the marker the script sorts by; no other reason does."""
    script = _script()
    cuda = [reason for reason in script.EXPLAINED.values() if "CUDA" in reason.split(":")[0]]
    assert cuda
    assert all(reason.startswith(script.CPU_UNOBSERVABLE) for reason in cuda)


def test_the_table_row_of_a_module_is_replaced_and_the_others_kept(tmp_path: Path) -> None:
    """--write-table replaces the module's row between the markers, adds a new module's, keeps the rest."""
    script = _script()
    begin, end = script.TABLE_MARKERS
    page = tmp_path / "mutation.md"
    header = "| module | mutants |\n|---|---|"
    page.write_text(f"intro\n{begin}\n{header}\n| `a.py` | old |\n| `b.py` | kept |\n{end}\nafter\n")
    args = argparse.Namespace(seed=7, world_sizes="1,2,3")
    counts = {"killed": 8, "survived": 1, "unjudged": 1, "equivalent": 2, "cpu": 3}
    row = script.table_row("a.py", 40, counts, args, 12.4)
    assert row == "| `a.py` | 40 | 7 | 1,2,3 | 8 / 10 | 1 | 2 | 3 | 12 s |"
    script.write_table_row(page, "a.py", row)
    script.write_table_row(page, "c.py", row.replace("a.py", "c.py"))
    text = page.read_text()
    assert text.startswith("intro\n")
    assert text.endswith(f"{end}\nafter\n")
    assert "| `a.py` | old |" not in text
    assert text.count("| `a.py` | 40 |") == 1
    assert "| `b.py` | kept |" in text
    assert "| `c.py` | 40 |" in text


def test_the_table_the_script_writes_is_on_its_page() -> None:
    """docs/mutation.md holds the markers the script writes between, once each."""
    script = _script()
    text = script.TABLE_PAGE.read_text()
    assert [text.count(marker) for marker in script.TABLE_MARKERS] == [1, 1]
