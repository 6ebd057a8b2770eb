"""The command line front end: ``nemo-dist-conformance`` (also ``python -m nemo_dist.conformance``).

Exit status: 0 when every core check passes (``--strict``: every check run
passes), 1 when one fails, 2 on a usage error. Run under ``torchrun`` it
checks inside the torchrun world instead of starting its own worlds. The
options and the parsing of their values are :mod:`nemo_dist.conformance.frontends.arguments`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from nemo_dist.conformance import load_checks
from nemo_dist.conformance.adapters.wrapping import check_mesh_world_sizes, wrapper_from_options
from nemo_dist.conformance.engine.json_report import write_json
from nemo_dist.conformance.engine.junit import write_junit_xml
from nemo_dist.conformance.engine.registry import TIERS, Check, select_checks
from nemo_dist.conformance.engine.report import format_progress, format_report
from nemo_dist.conformance.engine.runner import run_checks
from nemo_dist.conformance.engine.target import Implementation, OptionError, implementation_from_options, variants_of
from nemo_dist.conformance.engine.verdicts import Report, Verdict
from nemo_dist.conformance.frontends import arguments
from nemo_dist.conformance.frontends.arguments import DEFAULT_WORLD_SIZES, UsageError, option_name, reproduce_command
from nemo_dist.testing import gpus, options

__all__ = ["fitting_world_sizes", "main"]


def _exact_check(checks: list[Check], impl: Implementation, name: str) -> tuple[list[Check], Implementation]:
    """The check ``--check NAME`` names among ``checks``, and ``impl`` pinned to its DDP entry point if it names one."""
    base, bracket, api = name.partition("[")
    found = [c for c in checks if c.name == base]
    if not found:
        raise UsageError(
            f"--check {name!r} names no check of the selected tier and components; use a name from the first "
            "column of the table, such as --check gather.forward_matches_cat"
        )
    if not bracket:
        return found, impl
    api = api.removesuffix("]")
    runs = dict(found[0].runs(impl)) if variants_of(found[0].component, impl) is not None else {}
    if name not in runs:
        choices = ", ".join(runs) or base
        raise UsageError(f"--check {name!r}: no entry point {api!r} for this check; use {choices}")
    return found, runs[name]


def _selected(
    args: argparse.Namespace, impl: Implementation, components: tuple[str, ...]
) -> tuple[list[Check], Implementation]:
    """The checks ``--tier``, ``-k`` and ``--check`` select, and ``impl`` (pinned by ``--check NAME[api]``)."""
    checks = select_checks(load_checks().values(), impl, args.tier, args.select, components)
    if args.check and checks:
        return _exact_check(checks, impl, args.check)
    return checks, impl


def fitting_world_sizes(sizes: Sequence[int], gpus_visible: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The sizes an NCCL run can start with ``gpus_visible`` GPUs (one per rank), and a note per size left out."""
    fit = tuple(s for s in sizes if s <= gpus_visible)
    notes = tuple(
        f"world size {s} not run: an NCCL world of {s} needs {s} GPUs, {gpus_visible} visible"
        for s in sizes
        if s > gpus_visible
    )
    return fit, notes


def _nccl_sizes(sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The sizes that fit the visible GPUs and notes on the others; a usage error when CUDA or every size is missing."""
    try:
        visible = gpus.visible_gpu_count()
    except options.BadOptionValue as exc:
        raise UsageError(f"{gpus.FAKE_GPU_COUNT_ENV} expects an int >= 0; got {exc.value!r}") from None
    if visible == 0:
        raise UsageError("--backend nccl needs CUDA, and torch.cuda.is_available() is False here; use --backend gloo")
    fit, notes = fitting_world_sizes(sizes, visible)
    if not fit:
        raise UsageError(
            f"--world-sizes {','.join(map(str, sizes))}: none fits the {visible} visible GPU(s) (an NCCL world "
            f"needs one GPU per rank); choose sizes of at most {visible}, such as --world-sizes 1"
        )
    return fit, notes


def _options(
    args: argparse.Namespace,
) -> tuple[Implementation, tuple[str, ...], tuple[int, ...], int, float, tuple[str, ...]]:
    if args.tier not in TIERS:
        raise UsageError(f"--tier expects one of {', '.join(TIERS)}; got {args.tier!r}")
    if args.backend not in ("gloo", "nccl"):
        raise UsageError(f"--backend expects gloo or nccl; got {args.backend!r}")
    sizes = arguments.world_sizes(args.world_sizes)
    max_examples = arguments.positive_int("--max-examples", args.max_examples, "25")
    timeout = arguments.timeout(args.timeout)
    notes: tuple[str, ...] = ()
    if args.backend == "nccl":
        sizes, notes = _nccl_sizes(sizes)
    try:
        wrapper = wrapper_from_options(lambda field: getattr(args, field))
        check_mesh_world_sizes(wrapper, sizes, "--world-sizes")
        impl, components = implementation_from_options(lambda field: getattr(args, field), {"ddp_wrapper": wrapper})
    except OptionError as exc:
        raise UsageError(exc.worded(option_name)) from None
    return impl, components, sizes, max_examples, timeout, notes


def _emit(report: Report, args: argparse.Namespace) -> int:
    sys.stdout.write(format_report(report, args.strict))
    sys.stdout.flush()
    if args.junit_xml:
        write_junit_xml(report, args.junit_xml, args.strict)
    if args.json:
        write_json(report, args.json, args.strict)
    return report.exit_code(args.strict)


def _version() -> str:
    """``nemo-dist-conformance`` and the versions its verdicts depend on (what ``--version`` prints)."""
    import torch  # noqa: F401  (its __version__ names the build)

    from nemo_dist.conformance.engine.versions import run_versions

    return "nemo-dist-conformance " + "  ".join(f"{name} {version}" for name, version in run_versions().items())


def _list(checks: list[Check], impl: Implementation) -> str:
    """One line per check a run of ``checks`` would make: name (with its DDP entry points), component, tier, the
    one-line promise; then their count."""
    rows = [(name, c.component, c.tier, c.description) for c in checks for name, _ in c.runs(impl)]
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {component:<10}  {tier:<8}  {promise}" for name, component, tier, promise in rows]
    return "\n".join([*lines, f"{len(rows)} checks"]) + "\n"


def _print_progress(verdict: Verdict) -> None:
    print(format_progress(verdict), file=sys.stderr, flush=True)


def _progress(args: argparse.Namespace, rank: int = 0) -> Callable[[Verdict], None] | None:
    """Per-verdict progress printer for stderr (rank 0 only; none with -q)."""
    return None if args.quiet or rank != 0 else _print_progress


def _run_in_torchrun(
    args: argparse.Namespace,
    checks: list[Check],
    impl: Implementation,
    components: tuple[str, ...],
    max_examples: int,
    hypothesis_db: Path | None,
    rank: int,
) -> int:
    """Run ``checks`` in torchrun's world; this rank's exit status (rank 0 prints the report)."""
    from nemo_dist.conformance.frontends.inworld import run_in_world

    try:
        report = run_in_world(
            checks,
            impl,
            backend=args.backend,
            tier=args.tier,
            max_examples=max_examples,
            on_verdict=_progress(args, rank),
            components=components,
            hypothesis_db=hypothesis_db,
        )
    except OptionError as exc:  # every rank's first call of the callable lacked a parameter
        if rank == 0:
            print(f"nemo-dist-conformance: error: {exc.worded(option_name)}", file=sys.stderr, flush=True)
        return 2
    if args.world_sizes != ",".join(map(str, DEFAULT_WORLD_SIZES)):
        report = report.with_notes("--world-sizes is ignored under torchrun: the world is torchrun's")
    report = dataclasses.replace(report, command=_torchrun_command(args), command_sets_world=True)
    return _emit(report, args) if rank == 0 else report.exit_code(args.strict)


def _torchrun_command(args: argparse.Namespace) -> str:
    """The torchrun launch of this run's world (one node: ``--standalone``) with its options, as a Reproduce prefix.

    Several nodes also need the user's rendezvous options, which a rank does
    not know: the line then names ``--nnodes`` and leaves those to the user.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = max(1, world // max(1, local))
    launch = ["torchrun", "--standalone" if nodes == 1 else f"--nnodes {nodes}", f"--nproc-per-node {local}"]
    return reproduce_command(args, " ".join([*launch, "-m nemo_dist.conformance"]))


def _main_torchrun(args: argparse.Namespace) -> int:
    """Check inside torchrun's world; ends the process with the status (``os._exit``) after a run."""
    from nemo_dist.conformance.frontends.inworld import init_from_env

    rank = int(os.environ.get("RANK", "0"))
    try:
        impl, components, _, max_examples, timeout, _ = _options(args)
        checks, impl = _selected(args, impl, components)
        hypothesis_db = arguments.hypothesis_db(args.hypothesis_db)
    except UsageError as exc:
        if rank == 0:
            print(f"nemo-dist-conformance: error: {exc}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    init_from_env(args.backend, timeout)
    try:
        code = _run_in_torchrun(args, checks, impl, components, max_examples, hypothesis_db, rank)
        codes: list[int | None] = [None] * dist.get_world_size()
        dist.all_gather_object(codes, code)
        status = max(c or 0 for c in codes)
    finally:
        dist.destroy_process_group()
    # After a run with DDP, a normal interpreter exit sometimes aborts in a C++
    # destructor ("terminate called without an active exception", SIGABRT),
    # turning a verdict into a crash; leave without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Under torchrun a completed run ends the process itself with the status
    (see ``_main_torchrun``); usage errors still return 2.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # `--gather tests.forks.x` imports from the checkout; ranks inherit sys.path
    args = arguments.parser().parse_args(argv)
    if args.version:
        print(_version())
        return 0
    from nemo_dist.conformance.frontends.inworld import in_torchrun

    if in_torchrun():
        return _main_torchrun(args)
    try:
        impl, components, sizes, max_examples, timeout, size_notes = _options(args)
        min_deadline = arguments.min_deadline(args.min_deadline)
        seed = arguments.seed(args.seed)
        hypothesis_db = arguments.hypothesis_db(args.hypothesis_db)
    except UsageError as exc:
        print(f"nemo-dist-conformance: error: {exc}", file=sys.stderr)
        return 2
    try:
        checks, impl = _selected(args, impl, components)
    except UsageError as exc:
        print(f"nemo-dist-conformance: error: {exc}", file=sys.stderr)
        return 2
    if not checks:
        print(
            "nemo-dist-conformance: error: no check selected (tier "
            f"{args.tier!r}, select {args.select!r}); widen --tier or -k",
            file=sys.stderr,
        )
        return 2
    if args.list_checks:
        sys.stdout.write(_list(checks, impl))
        return 0
    # What is imported by now (torch, the suites, the targets) lives as long as the command: frozen, the full
    # collections that the checks' hypothesis runs trigger (and hypothesis's own, once per thread) skip it.
    gc.freeze()
    try:
        report = run_checks(
            checks,
            impl,
            sizes,
            backend=args.backend,
            tier=args.tier,
            max_examples=max_examples,
            timeout=timeout,
            min_deadline=min_deadline,
            on_verdict=_progress(args),
            components=components,
            seed=seed,
            hypothesis_db=hypothesis_db,
        )
    except OptionError as exc:  # found by running: a parameter the callable's first call lacked
        print(f"nemo-dist-conformance: error: {exc.worded(option_name)}", file=sys.stderr)
        return 2
    report = dataclasses.replace(report, command=reproduce_command(args))
    return _emit(report.with_notes(*size_notes) if size_notes else report, args)
