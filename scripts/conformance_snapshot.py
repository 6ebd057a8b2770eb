"""Record what users see of the conformance command and its pytest mode, normalised for diffing.

Used to prove that a restructuring changes nothing for users: run it before and
after, then ``diff -r BEFORE AFTER``. For each target (the bundled reference,
upstream's release when installed, every fork under ``tests/forks/``, a set of
bad command lines) it runs ``python -m nemo_dist.conformance`` in a subprocess
(with ``--seed N``: every run draws its examples from seed N, with no example
database) and writes the exit
status, stdout and stderr with timings, addresses and source line numbers
replaced by placeholders. For the pytest mode it records the collected test ids
of ``pytest conformance/`` and, for the reference at world size 2, each test's
outcome.

    python scripts/conformance_snapshot.py OUTDIR [--seed N] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs the command with a derandomized hypothesis profile loaded first.
_LAUNCH = (
    "import runpy, sys\n"
    "from hypothesis import settings\n"
    "settings.register_profile('snapshot', derandomize=True)\n"
    "settings.load_profile('snapshot')\n"
    "sys.argv = ['nemo-dist-conformance', *sys.argv[1:]]\n"
    "runpy.run_module('nemo_dist.conformance', run_name='__main__', alter_sys=True)\n"
)

GALLERY = {
    "gallery_gather_layer_own_grad": "GatherLayer",
    "gallery_gather_layer_summed": "GatherLayer",
    "gallery_gather_layer_averaged": "GatherLayer",
    "gallery_gather_layer_times_world": "GatherLayer",
    "gallery_gather_features_local_slot": "gather_features",
    "gallery_chunk_own_rows": "AllGatherCat",
    "gallery_reversed_order": "gather_reversed",
    "gallery_stacked_global_rank": "AllGather",
    "gallery_subgroup_guard_hangs": "GroupGather",
}

#: Targets users name most, beyond the forks: a wrapper, a tensor-parallel architecture, an all-to-all callable.
NAMED = {
    "ddp_fn_torch": ["--ddp-fn", "torch.nn.parallel:DistributedDataParallel", "--ddp-buffers", "synced"],
    "tp_arch_qwen3": ["--tp-arch", "Qwen3ForCausalLM"],
    "a2a_fn_torch": ["--a2a-fn", "torch.distributed.nn.functional:all_to_all_single"],
}

USAGE_ERRORS = {
    "bad_tier": ["--tier", "bogus"],
    "bad_world_sizes": ["--world-sizes", "0"],
    "bad_timeout": ["--timeout", "-1"],
    "bad_max_examples": ["--max-examples", "x"],
    "bad_gather_form": ["--gather-fn", "tests.forks.gallery_reversed_order:gather_reversed", "--gather-form", "x"],
    "no_grad_without_fn": ["--no-grad-fn", "a:b"],
    "gather_and_fn": ["--gather", "a", "--gather-fn", "a:b"],
    "missing_module": ["--gather", "no.such.module"],
    "missing_names": ["--gather", "tests.forks.independent_config"],
    "ddp_without_entry_point": ["--ddp", "tests.forks.independent_config"],
    "bad_callable": ["--gather-fn", "tests.forks.gallery_reversed_order:nothing_here"],
    "bad_preset": ["--preset", "nope"],
    "nccl_without_cuda": ["--backend", "nccl"],
    "bad_backend": ["--backend", "mpi"],
    "nothing_selected": ["-k", "no check has this name"],
}


def _component(module: str) -> str | None:
    """The engine component a fork module provides (None: a suite's own fork, named by that suite's options)."""
    fork = importlib.import_module(module)
    for component, names in (
        ("gather", ("all_gather_with_grad",)),
        ("ddp", ("DDPManager", "parallelize_ddp")),
        ("config", ("DDPConfig",)),
    ):
        if any(hasattr(fork, n) for n in names):
            return component
    return None


def targets() -> dict[str, list[str]]:
    """Target name -> command-line arguments."""
    found: dict[str, list[str]] = {"reference": [], "reference_strict_core": ["--tier", "core", "--strict"]}
    try:
        importlib.import_module("nemo_automodel.components.loss.dist_utils")
        found["upstream_all"] = ["--preset", "nemo_automodel", "--tier", "all", "--world-sizes", "1,2"]
        found["upstream_all_w1234"] = ["--preset", "nemo_automodel", "--tier", "all", "--world-sizes", "1,2,3,4"]
    except ImportError:
        pass
    found.update(NAMED)
    for path in sorted((ROOT / "tests" / "forks").glob("*.py")):
        stem = path.stem
        if stem.startswith("_"):
            continue
        if stem.startswith("gallery_"):
            if stem not in GALLERY:  # another suite's gallery, run by its own test module
                continue
            found[stem] = ["--gather-fn", f"tests.forks.{stem}:{GALLERY[stem]}", "--world-sizes", "2,3",
                           "--max-examples", "5", "--timeout", "20"]
            continue
        component = _component(f"tests.forks.{stem}")
        if component is None:
            continue
        found[stem] = [f"--{component}", f"tests.forks.{stem}", "--world-sizes", "1,2", "--max-examples", "5"]
    for name, args in USAGE_ERRORS.items():
        found[f"usage_{name}"] = args
    return found


_NORMALISE = [
    (re.compile(r'File "[^"]*?(nemo_dist|tests|torch|hypothesis)/'), r'File "<\1>/'),
    (re.compile(r'File "<(nemo_dist|tests)>/[^"]*", line \d+'), r'File "<\1>/...", line N'),
    (re.compile(r", line \d+"), ", line N"),
    (re.compile(r"\b\d+\.\d+"), "N.N"),
    (re.compile(r"0x[0-9a-f]+"), "0xADDR"),
    (re.compile(r"pid \d+"), "pid N"),
    (re.compile(r"port \d+"), "port N"),
    (re.compile(r"\bseed[= ](\d+)"), "seed=N"),  # a run's own seed, drawn anew each run unless --seed is given
    (re.compile(r"--seed \d+"), "--seed N"),
]


def normalise(text: str) -> str:
    """Timings, addresses and file positions replaced by placeholders."""
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def snapshot_command(name: str, args: list[str], out: Path, seed: int | None = None) -> None:
    """Run the command on ``args`` (with ``--seed``, where given); write NAME.txt with its status, stdout and
    stderr (normalised)."""
    # No example database either: one replays the failing examples earlier runs saved.
    seeded = [] if seed is None or name.startswith("usage_") else ["--seed", str(seed), "--hypothesis-db", "none"]
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH, "-q", *args, *seeded], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=900, check=False,
    )
    text = (
        f"$ nemo-dist-conformance -q {' '.join(args)}\nexit {done.returncode}\n"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )
    (out / f"{name}.txt").write_text(normalise(text))
    print(f"{name}: exit {done.returncode}", flush=True)


PYTEST_MODES = {
    "pytest_ids_reference": [],
    "pytest_ids_core": ["--conformance-tier", "core"],
    "pytest_ids_upstream": ["--conformance-preset", "nemo_automodel"],
    "pytest_ids_gather_fork": ["--conformance-gather", "tests.forks.independent_gather"],
    "pytest_ids_gather_fn": ["--conformance-gather-fn", "tests.forks.gallery_reversed_order:gather_reversed"],
    "pytest_ids_bad_module": ["--conformance-gather", "no.such.module"],
    "pytest_ids_bad_tier": ["--conformance-tier", "x"],
}


def snapshot_pytest(name: str, args: list[str], out: Path) -> None:
    """``pytest conformance/ --collect-only -q`` with ``args``: the ids (or the usage error)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if not re.search(r"\bin \d", line)]
    (out / f"{name}.txt").write_text(normalise(f"exit {done.returncode}\n" + "\n".join(lines) + "\n"))
    print(f"{name}: exit {done.returncode}", flush=True)


def snapshot_pytest_outcomes(out: Path) -> None:
    """Each test's outcome of ``pytest conformance/`` on the reference at world size 2 (junit XML)."""
    import xml.etree.ElementTree as ET

    xml = out / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider", "--dist-world-sizes=2",
         "--conformance-max-examples=3", f"--junitxml={xml}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False,
    )
    rows = [f"exit {done.returncode}"]
    for case in ET.parse(xml).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        detail = next((child.get("message", "") for child in case if child.tag in ("skipped", "failure")), "")
        rows.append(f"{case.get('classname')}::{case.get('name')} {kinds[0] if kinds else 'passed'} {detail}")
    xml.unlink()
    (out / "pytest_outcomes_reference_w2.txt").write_text(normalise("\n".join(rows) + "\n"))
    print(f"pytest outcomes: exit {done.returncode}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=None,
                        help="every command run draws from this seed (the command's own runs are random, drawn from "
                        "a seed of their own each run: two snapshots compare example for example only with one)")
    parser.add_argument("--only", action="append", default=[],
                        help="only targets whose name contains this (repeatable: any of them)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    def wanted(name: str) -> bool:
        return not args.only or any(part in name for part in args.only)

    for name, argv in targets().items():
        if wanted(name):
            snapshot_command(name, argv, args.out, args.seed)
    for name, argv in PYTEST_MODES.items():
        if wanted(name):
            snapshot_pytest(name, argv, args.out)
    if wanted("pytest_outcomes"):
        snapshot_pytest_outcomes(args.out)


if __name__ == "__main__":
    main()
