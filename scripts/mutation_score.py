"""Mutation score of one component module: a seeded sample of cosmic-ray's mutants, each judged by conformance.

    python scripts/mutation_score.py nemo_dist/distributed/config.py [--sample 25] [--seed 0]

The mutants are cosmic-ray's (its core operators, at every site they apply
to in the module; ``pip install -e '.[mutation]'``). A seeded sample of them
is drawn; each is written into a private copy of the package, and the
conformance command of the module's component runs on that copy, strictly
(``--tier all --strict``, world sizes 1-3 by default, so the subgroup
checks run): any failing, hanging or unsupported check, or a check not
applicable by the code's own choice, kills the mutant. Printed per mutant:

* KILLED (the checks that failed);
* SURVIVED (with its diff);
* UNJUDGED: the run ended in a usage error (exit 2) or a timeout, so no
  check judged the mutant; it is not a kill, and it counts against the run
  as a survivor does;
* EQUIVALENT (with the reason: a mutant that changes only a type annotation,
  which ``from __future__ import annotations`` never evaluates, is found
  here; the others are listed in ``EXPLAINED`` below, each with why it cannot
  change behaviour);
* NOT OBSERVABLE ON CPU (with why): an ``EXPLAINED`` entry whose reason starts
  with :data:`CPU_UNOBSERVABLE` (a CUDA-only path); the gpu tests are where
  such a mutant is judged.

A mutant that does not compile is killed without a run (nothing imports it).
Then the totals and the time taken, and with ``--write-table`` the module's
row of the table in docs/mutation.md is rewritten from them. Exit 0 when every mutant
was killed or explained, 1 otherwise, 2 on a usage error.

The checkout's own files are never modified.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Module (relative to the checkout) -> the conformance options that check its component.
COMPONENT_OPTIONS: dict[str, tuple[str, ...]] = {
    "nemo_dist/loss/dist_utils.py": ("--gather", "nemo_dist.loss.dist_utils"),
    "nemo_dist/distributed/ddp.py": ("--ddp", "nemo_dist.distributed.ddp", "--config", "nemo_dist.distributed.config"),
    "nemo_dist/distributed/config.py": (
        "--ddp", "nemo_dist.distributed.ddp", "--config", "nemo_dist.distributed.config",
    ),
    "nemo_dist/distributed/_process_group.py": (
        "--ddp", "nemo_dist.distributed.ddp", "--config", "nemo_dist.distributed.config",
    ),
    "nemo_dist/distributed/activation_checkpointing.py": (
        "--ddp", "nemo_dist.distributed.ddp", "--config", "nemo_dist.distributed.config",
    ),
    "nemo_dist/distributed/fsdp2.py": ("--fsdp2", "nemo_dist.distributed.fsdp2"),
    # Qwen3's per-head norms are what reaches ReplicatedGradientSum (needs transformers: the models extra).
    "nemo_dist/distributed/tensor_parallel.py": (
        "--tp", "nemo_dist.distributed.tensor_parallel", "--tp-arch", "Qwen3ForCausalLM",
    ),
    "nemo_dist/distributed/all_to_all.py": ("--a2a", "nemo_dist.distributed.all_to_all"),
    # The bundled expert parallelism dispatches through all_to_all: both are checked through --moe-fn too.
    "nemo_dist/distributed/expert_parallel.py": (
        "--moe-fn", "nemo_dist.distributed.expert_parallel:parallelize_experts",
    ),
    # The bundled pipeline's contract (upstream's token-sum loss) on the schedules of the bundled run and a V one,
    # so that the V placement is built too.
    "nemo_dist/distributed/pipeline_parallel.py": (
        "--pp-fn", "nemo_dist.distributed.pipeline_parallel:build_pipeline", "--pp-loss", "token_sum",
        "--pp-schedule", "GPipe,1F1B,Interleaved1F1B,ZBVZeroBubble",
    ),
}

#: How an EXPLAINED reason says the mutant changes only what a CPU run cannot observe.
CPU_UNOBSERVABLE = "CUDA only (not observable on CPU)"
#: The page holding the table the script writes (``--write-table``), and the table's markers: one row per module.
TABLE_PAGE = ROOT / "docs" / "mutation.md"
TABLE_MARKERS = ("<!-- mutation-table -->", "<!-- /mutation-table -->")

_CUDA_INDEX = "CUDA only (not observable on CPU): the GPU index of an NCCL rank with CUDA; the gpu tests check it"

#: Mutants that survive for a reason, keyed by (module, operator, original line, mutated line), both lines stripped.
EXPLAINED: dict[tuple[str, str, str, str], str] = {
    (
        "nemo_dist/distributed/fsdp2.py",
        "core/ReplaceComparisonOperator_Lt_NotEq",
        "self.shard(unit, flag if flag is not None else index < len(units) - 1)",
        "self.shard(unit, flag if flag is not None else index != len(units) - 1)",
    ): "index runs over range(len(units)), so index < len(units) - 1 and index != len(units) - 1 agree",
    (
        "nemo_dist/distributed/config.py",
        "core/ReplaceComparisonOperator_Gt_NotEq",
        'if "all" in names and len(set(names)) > 1:',
        'if "all" in names and len(set(names)) != 1:',
    ): "with 'all' among the names there is at least one distinct name, so > 1 and != 1 agree",
    (
        "nemo_dist/loss/dist_utils.py",
        "core/ReplaceUnaryOperator_USub_UAdd",
        "meta = torch.full((_META_LEN,), -1, dtype=torch.int64)",
        "meta = torch.full((_META_LEN,), +1, dtype=torch.int64)",
    ): "the fill of the shape slots past a tensor's own dims is never read: each rank's shape is cut to its ndim",
    (
        "nemo_dist/distributed/activation_checkpointing.py",
        "core/ReplaceComparisonOperator_Eq_LtE",
        "if not _is_block_container(module) or len(module) == 0:",
        "if not _is_block_container(module) or len(module) <= 0:",
    ): "a container's length is never negative, so == 0 and <= 0 agree",
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceComparisonOperator_Eq_Is",
        '"device_ids": [device] if device.type == "cuda" else None,',
        '"device_ids": [device] if device.type is "cuda" else None,',
    ): "CUDA only (not observable on CPU): on CPU both sides are False; on CUDA `is` compares identity and "
    "device_ids would go missing; the gpu tests' ddp.parallelize_wraps_and_places checks device_ids",
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceAndWithOr",
        'if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():',
        'if "nccl" in str(dist.get_backend()) or torch.cuda.is_available():',
    ): "CUDA only (not observable on CPU): without CUDA, and on gloo, both sides are False",
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_BitOr",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() | torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_Mul",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() * torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_LShift",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() << torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_Pow",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() ** torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_Add",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() + torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_Sub",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() - torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_Div",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() / torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_FloorDiv",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() // torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_RShift",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() >> torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_BitAnd",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() & torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceBinaryOperator_Mod_BitXor",
        "index = dist.get_rank() % torch.cuda.device_count()",
        "index = dist.get_rank() ^ torch.cuda.device_count()",
    ): _CUDA_INDEX,
    (
        "nemo_dist/distributed/ddp.py",
        "core/ReplaceComparisonOperator_Eq_GtE",
        '"device_ids": [device] if device.type == "cuda" else None,',
        '"device_ids": [device] if device.type >= "cuda" else None,',
    ): "the same for the devices the entry point places a model on (cpu: False, cuda: True); only a device= of a "
    "type sorting after 'cuda' (xpu, mps) differs, which DDP cannot run on a CPU machine",
    (
        "nemo_dist/distributed/activation_checkpointing.py",
        "core/ReplaceComparisonOperator_Eq_Lt",
        "if not _is_block_container(module) or len(module) == 0:",
        "if not _is_block_container(module) or len(module) < 0:",
    ): "an empty container, no longer skipped, loses to any non-empty one of its group, and where it is a "
    "group's only container it adds a group of no block: the same blocks are checkpointed",
}


@dataclass(frozen=True)
class Mutant:
    """One cosmic-ray mutation of the module: its operator, occurrence, and the module's source after it."""

    operator: str
    occurrence: int
    source: str

    def diff(self, original: str, module: str) -> str:
        """The unified diff from ``original`` to this mutant."""
        lines = difflib.unified_diff(
            original.splitlines(), self.source.splitlines(), f"a/{module}", f"b/{module}", lineterm="", n=1
        )
        return "\n".join(lines)

    def changed_lines(self, original: str) -> tuple[str, str]:
        """The first changed line before and after, stripped."""
        before, after = original.splitlines(), self.source.splitlines()
        for old, new in zip(before, after, strict=False):
            if old != new:
                return old.strip(), new.strip()
        return "", ""


def _without_annotations(source: str) -> str:
    """The AST of ``source`` dumped with every annotation removed."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
        elif isinstance(node, ast.AnnAssign):
            node.annotation = ast.Constant(None)
    return ast.dump(tree)


def compiles(source: str) -> bool:
    """Whether ``source`` is valid Python (some operators make, say, ``f(x, +, y)`` of a bare ``*``)."""
    try:
        compile(source, "<mutant>", "exec")
    except SyntaxError:
        return False
    return True


def equivalence(module: str, original: str, mutant: Mutant) -> str:
    """Why ``mutant`` cannot change behaviour ("" when it can, as far as this script knows; it compiles)."""
    if "from __future__ import annotations" in original and _without_annotations(
        original
    ) == _without_annotations(mutant.source):
        return "changes only a type annotation, which `from __future__ import annotations` never evaluates"
    return EXPLAINED.get((module, mutant.operator, *mutant.changed_lines(original)), "")


def mutants(source: str) -> list[Mutant]:
    """Every mutant cosmic-ray's core operators make of ``source``, in operator and occurrence order."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.mutating import mutate_code

    found: list[Mutant] = []
    tree = get_ast(source)
    for name in cosmic_ray.plugins.operator_names():
        operator_class = cosmic_ray.plugins.get_operator(name)
        if operator_class.arguments():  # operators that need arguments (variable insertion) are not configured
            continue
        operator = operator_class()
        sites = sum(1 for node in ast_nodes(tree) for _ in operator.mutation_positions(node))
        for occurrence in range(sites):
            mutated = mutate_code(source, operator, occurrence)
            if mutated is not None and mutated != source:
                found.append(Mutant(name, occurrence, mutated))
    return found


def _failed_checks(stdout: str) -> list[str]:
    """The check rows of a verdict table that did not pass."""
    rows = re.findall(r"^(\S+)\s+(\d+|-)\s+(core|extended)\s+(FAIL|HANG|NOT SUPPORTED)", stdout, re.M)
    return [f"{check} w{size} {verdict}" for check, size, _, verdict in rows]


def judge(copy: Path, options: tuple[str, ...], world_sizes: str, max_examples: int, timeout: float) -> str:
    """Run the component's conformance in ``copy``; "" when it conforms, else what killed the mutant."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(copy)
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        sys.executable, "-m", "nemo_dist.conformance", *options, "--tier", "all", "--strict", "-q",
        "--world-sizes", world_sizes, "--max-examples", str(max_examples), "--hypothesis-db", "none",
    ]
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"TIMEOUT: the command did not finish within {timeout:g} s"
    if done.returncode == 0:
        return ""
    if done.returncode == 2:
        return "USAGE ERROR: " + (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    failed = _failed_checks(done.stdout)
    return "; ".join(failed[:4]) + (f" (+{len(failed) - 4} more)" if len(failed) > 4 else "") or (
        f"exit {done.returncode}: " + (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help=f"the module to mutate: one of {', '.join(COMPONENT_OPTIONS)}")
    parser.add_argument("--sample", type=int, default=25, help="mutants drawn (default 25; 0: every mutant)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--world-sizes", default="1,2,3", help="world sizes of each conformance run (default 1,2,3)")
    parser.add_argument("--write-table", action="store_true", help="rewrite the module's row in docs/mutation.md")
    parser.add_argument("--max-examples", type=int, default=10, help="hypothesis examples per check (default 10)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one conformance run may take")
    parser.add_argument("--list", action="store_true", help="list the sample's mutants (with diffs) and run nothing")
    args = parser.parse_args(argv)
    args.module = str(Path(args.module).resolve().relative_to(ROOT)) if Path(args.module).exists() else args.module
    if args.module not in COMPONENT_OPTIONS:
        parser.error(f"{args.module!r} is not a component module; give one of {', '.join(COMPONENT_OPTIONS)}")
    if args.sample < 0:
        parser.error(f"--sample expects a number >= 0; got {args.sample}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Draw, run and report the sample; the exit status (see the module docstring)."""
    args = _parse(argv)
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print("cosmic-ray is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    original = (ROOT / args.module).read_text()
    every = mutants(original)
    drawn = every
    if 0 < args.sample < len(every):
        drawn = random.Random(args.seed).sample(every, args.sample)
    print(f"{args.module}: {len(every)} mutants; {len(drawn)} drawn with seed {args.seed}")
    if args.list:
        for index, mutant in enumerate(drawn, 1):
            print(f"\n#{index:02d} {mutant.operator} (occurrence {mutant.occurrence})")
            print(mutant.diff(original, args.module))
        return 0
    start = time.monotonic()
    counts = {"killed": 0, "survived": 0, "unjudged": 0, "equivalent": 0, "cpu": 0}
    with tempfile.TemporaryDirectory(prefix="nemo_dist_mutant_") as tmp:
        copy = Path(tmp)
        shutil.copytree(ROOT / "nemo_dist", copy / "nemo_dist", ignore=shutil.ignore_patterns("__pycache__"))
        target = copy / args.module
        for index, mutant in enumerate(drawn, 1):
            label = f"#{index:02d} {mutant.operator} (occurrence {mutant.occurrence})"
            if not compiles(mutant.source):
                counts["killed"] += 1
                print(f"{label}: KILLED without a run: the module no longer compiles (nothing imports it)", flush=True)
                continue
            reason = equivalence(args.module, original, mutant)
            if reason:
                kind = "cpu" if reason.startswith(CPU_UNOBSERVABLE) else "equivalent"
                counts[kind] += 1
                title = "NOT OBSERVABLE ON CPU" if kind == "cpu" else "EQUIVALENT"
                print(f"{label}: {title}: {reason}\n{mutant.diff(original, args.module)}", flush=True)
                continue
            target.write_text(mutant.source)
            began = time.monotonic()
            try:
                killed = judge(copy, COMPONENT_OPTIONS[args.module], args.world_sizes, args.max_examples, args.timeout)
            finally:
                target.write_text(original)
            took = f"{time.monotonic() - began:.0f} s"
            if killed.startswith(("TIMEOUT", "USAGE ERROR")):
                counts["unjudged"] += 1
                print(f"{label}: UNJUDGED in {took} ({killed})\n{mutant.diff(original, args.module)}", flush=True)
            elif killed:
                counts["killed"] += 1
                print(f"{label}: KILLED in {took} by {killed}", flush=True)
            else:
                counts["survived"] += 1
                print(f"{label}: SURVIVED ({killed or 'conforms'}, {took})\n{mutant.diff(original, args.module)}",
                      flush=True)
    scored = counts["killed"] + counts["survived"] + counts["unjudged"]
    seconds = time.monotonic() - start
    print(
        f"\n{args.module}: {counts['killed']} of {scored} judged mutants killed, "
        f"{counts['survived']} survived, {counts['unjudged']} unjudged, {counts['equivalent']} equivalent, "
        f"{counts['cpu']} not observable on CPU; {seconds:.0f} s for {len(drawn)} mutants (seed {args.seed}, "
        f"world sizes {args.world_sizes})"
    )
    row = table_row(args.module, len(every), counts, args, seconds)
    print(row)
    if args.write_table:
        write_table_row(TABLE_PAGE, args.module, row)
    return 1 if counts["survived"] or counts["unjudged"] else 0


def table_row(module: str, mutants_found: int, counts: dict[str, int], args: argparse.Namespace, seconds: float) -> str:
    """The table's row of one run."""
    judged = counts["killed"] + counts["survived"] + counts["unjudged"]
    return (
        f"| `{module}` | {mutants_found} | {args.seed} | {args.world_sizes} | {counts['killed']} / {judged} | "
        f"{counts['unjudged']} | {counts['equivalent']} | {counts['cpu']} | {seconds:.0f} s |"
    )


def write_table_row(page: Path, module: str, row: str) -> None:
    """Replace ``module``'s row of the table between :data:`TABLE_MARKERS` in ``page`` (or add it)."""
    text = page.read_text()
    begin, end = TABLE_MARKERS
    head, found, rest = text.partition(begin)
    table, closed, tail = rest.partition(end)
    if not (found and closed):
        raise SystemExit(f"{page}: no table between {begin} and {end}")
    lines = table.strip("\n").splitlines()
    kept = [line for line in lines if not line.startswith(f"| `{module}` |")]
    page.write_text(f"{head}{begin}\n" + "\n".join([*kept, row]) + f"\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
