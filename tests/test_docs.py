"""Layer 0 (no process): the documentation's links and paths are true, it names nothing outside the repository,
and its pages stay short enough to read.

The pages checked are every markdown file a user reads: README.md and those under docs/, conformance/ and
benchmarks/. Fenced code blocks are skipped when links and inline paths are read (commands there are exercised
elsewhere); headings inside them are not anchors.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Every markdown page of the repository a user reads.
PAGES = sorted(
    [ROOT / "README.md"]
    + [page for folder in ("docs", "conformance", "benchmarks") for page in (ROOT / folder).rglob("*.md")]
)
#: Where a backticked path may point: the repository's own top-level folders.
_PATH = re.compile(r"(?<![\w./$~-])((?:docs|benchmarks|scripts|tests|nemo_dist|conformance|\.ci|\.github)/[\w./*-]*)")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_MAX_README_LINES = 200  # README.md has fewer
_MAX_PAGE_LINES = 400  # each page of docs/ has at most this many


def _prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return _FENCE.sub("", page.read_text())


def _slug(heading: str) -> str:
    """The anchor a heading gets where markdown is rendered: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(match) for match in re.findall(r"^#{1,6} (.+)$", _prose(page), re.M)}


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_relative_link_reaches_a_file_of_the_repository_and_its_heading(page: Path) -> None:
    """A relative link resolves to a file or folder inside the repository; a ``#anchor`` to a heading of it."""
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # a URL, not a file of the repository
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: {_id(resolved)} has no heading with that anchor")
    assert not broken, f"{_id(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_backticked_repository_path_exists(page: Path) -> None:
    """A path of the repository named in inline code (`docs/x.md`, `scripts/...`, `tests/forks/*.py`) exists."""
    missing = []
    for span in _CODE_SPAN.findall(_prose(page)):
        for path in _PATH.findall(span):
            path = path.rstrip(".")
            found = list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
            if not found:
                missing.append(path)
    assert not missing, f"{_id(page)} names paths that do not exist: {missing}"


def test_no_page_or_source_names_a_file_outside_the_repository() -> None:
    """The contract is docs/contract.md: no page and no package source names the workspace's SPEC or shared files."""
    sources = [*PAGES, *sorted((ROOT / "nemo_dist").rglob("*.py"))]
    named = [_id(path) for path in sources if re.search(r"SPEC\.md|\.\./shared", path.read_text())]
    assert not named


def test_the_contract_is_in_the_repository() -> None:
    """docs/contract.md exists and holds DDPConfig's table of defaults (config.defaults_match_spec points there)."""
    text = (ROOT / "docs" / "contract.md").read_text()
    assert "| field | default |" in text


def test_readme_is_a_front_page() -> None:
    """README.md stays under 200 lines and links every page of docs/."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < _MAX_README_LINES
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in _LINK.findall(_prose(ROOT / "README.md"))}
    unlinked = [_id(page) for page in sorted((ROOT / "docs").glob("*.md")) if page.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=_id)
def test_each_docs_page_has_at_most_400_lines(page: Path) -> None:
    """A page of docs/ is one topic: at most 400 lines (split it where it grows past)."""
    assert len(page.read_text().splitlines()) <= _MAX_PAGE_LINES
