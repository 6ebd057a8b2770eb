"""Rewrite the documentation's option tables from the conformance option table
(``nemo_dist.conformance.engine.options``).

    python scripts/render_option_tables.py [--check]

Every block between ``<!-- options:NAME -->`` and ``<!-- /options:NAME -->``
in README.md and docs/*.md is rendered afresh
(:func:`nemo_dist.conformance.frontends.option_docs.render_readme`). With ``--check``
nothing is written: exit 1 naming each page that differs, 0 when none does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The pages whose option tables are rendered: the front page and every page of docs/.
READMES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def main() -> int:
    """Render (or with ``--check``, compare) every page's marked option tables; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from nemo_dist.conformance.frontends.option_docs import render_readme

    stale = []
    for readme in READMES:
        text = readme.read_text()
        rendered = render_readme(text)
        if rendered == text:
            continue
        stale.append(readme)
        if not args.check:
            readme.write_text(rendered)
    for readme in stale:
        print(f"{readme.relative_to(ROOT)}: {'differs from' if args.check else 'rendered from'} the option table")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
