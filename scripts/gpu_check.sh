#!/usr/bin/env bash
# One prepared check of nemo_dist on a GPU host.
#
# Usage (from the repository root):  bash scripts/gpu_check.sh OUTDIR
#
# Steps, each under its own `timeout`, all within GPU_CHECK_BUDGET_S seconds
# (default 470, under 8 minutes); a failing step does not stop the next:
#   install                 the README's test install into $VENV (skipped with SKIP_INSTALL=1)
#   host                    nvidia-smi and torch's CUDA/NCCL facts -> OUTDIR/host.txt
#   gpu-tests               pytest -m gpu --dist-require-gpu --dist-max-gpus=<visible GPUs>
#                           -> OUTDIR/gpu-tests.{xml,log} (worlds larger than the host skipped, named)
#   conformance-reference   nemo-dist-conformance --backend nccl -> OUTDIR/conformance-reference.{xml,log}
#   conformance-upstream    ... --preset nemo_automodel --tier core -> OUTDIR/conformance-upstream.{xml,log}
#   benchmark               benchmarks/gather.py --backend nccl -> OUTDIR/bench-nccl.{json,log}
#                           (skipped with a note below 2 visible GPUs)
# It ends with a summary of every step (stdout and OUTDIR/summary.txt).
#
# Environment:
#   VENV=.venv                the virtual environment to create and use; its python is
#                             used when present, else python3 from PATH
#   TORCH_SPEC=torch==2.13.0  the torch requirement installed (must be a CUDA build on a GPU host)
#   PIP_EXTRA_INDEX_URL       read by pip itself: point it at a CUDA torch wheel index
#   SKIP_INSTALL=1            use the environment as it is
#   GPU_CHECK_BUDGET_S=470    the whole run's time budget
#
# Exit status: 0 every step passed or was skipped by design; 1 a step failed
# (a failure wins over "no GPU"); 2 usage error; 3 no GPU here (CUDA not
# available in the venv's torch, or nvidia-smi missing): the GPU steps are
# recorded as "not run: no GPU" and the summary is still written.
set -u

usage() {
    echo "usage: bash scripts/gpu_check.sh OUTDIR   (run from the repository root)" >&2
}

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
    usage
    exit 2
fi
if [ ! -f pyproject.toml ] || [ ! -f benchmarks/gather.py ]; then
    echo "gpu_check: run from the repository root (no pyproject.toml or benchmarks/gather.py in $PWD)" >&2
    usage
    exit 2
fi

OUTDIR=$1
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
SKIP_INSTALL=${SKIP_INSTALL:-0}
BUDGET_S=${GPU_CHECK_BUDGET_S:-470}
mkdir -p "$OUTDIR" || exit 2

STEP_NAMES=()
STEP_STATUS=()
ANY_FAILED=0

record() {  # record NAME STATUS
    STEP_NAMES+=("$1")
    STEP_STATUS+=("$2")
    case "$2" in
        failed*) ANY_FAILED=1 ;;
    esac
}

pick_python() {
    if [ -x "$VENV/bin/python" ]; then
        PY="$VENV/bin/python"
    else
        PY=python3
    fi
}

# run_step NAME TIMEOUT_S LOGFILE CMD...: runs CMD under timeout, its output to
# stdout and LOGFILE, and records passed / failed with the reason.
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$((BUDGET_S - SECONDS - 5))
    if [ "$left" -lt 15 ]; then
        record "$name" "failed: not run, the ${BUDGET_S}s budget is spent"
        return 1
    fi
    if [ "$limit" -gt "$left" ]; then
        limit=$left
    fi
    local shown="$*"
    shown=${shown//$'\n'/ }
    [ "${#shown}" -le 160 ] || shown="${shown:0:157}..."
    echo
    echo "=== $name (timeout ${limit}s): $shown"
    local start=$SECONDS rc
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local took=$((SECONDS - start))
    if [ "$rc" -eq 0 ]; then
        record "$name" "passed (${took}s)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        record "$name" "failed: timed out after ${limit}s (log: $log)"
    else
        record "$name" "failed: exit $rc after ${took}s (log: $log)"
    fi
    return "$rc"
}

# --- install -----------------------------------------------------------------
if [ "$SKIP_INSTALL" = "1" ]; then
    record install "skipped (SKIP_INSTALL=1)"
else
    if [ -n "${PIP_EXTRA_INDEX_URL:-}" ]; then
        echo "gpu_check: PIP_EXTRA_INDEX_URL is set; pip takes torch ($TORCH_SPEC) from it as well"
    fi
    # shellcheck disable=SC2016  # $1 and $2 expand in the inner bash, on purpose
    run_step install 240 "$OUTDIR/install.log" bash -c '
        python3 -m venv "$1" &&
        "$1/bin/pip" install -q "$2" -e ".[test,dev,models]" &&
        "$1/bin/pip" install -q --no-deps nemo-automodel==0.7.0' install "$VENV" "$TORCH_SPEC"
fi
pick_python
echo "gpu_check: python is $PY"

# --- host --------------------------------------------------------------------
HOST_PY='
import torch
print("torch:", torch.__version__)
print("torch.version.cuda:", torch.version.cuda)
available = torch.cuda.is_available()
print("cuda_available:", available)
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if available else "n/a (no CUDA)"
except Exception as exc:  # a CPU build or a broken install: report, do not fail the host step
    nccl = f"n/a ({type(exc).__name__}: {exc})"
print("torch.cuda.nccl.version:", nccl)
print("device_count:", torch.cuda.device_count() if available else 0)
for i in range(torch.cuda.device_count() if available else 0):
    print(f"  cuda:{i}:", torch.cuda.get_device_name(i))
'
HOST_TXT="$OUTDIR/host.txt"
SMI_NOTE=""
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "hostname: $(hostname 2>/dev/null || echo unknown)"
    echo "python: $PY ($("$PY" --version 2>&1))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "nvidia-smi:"
        if ! timeout 30 nvidia-smi --query-gpu=index,name,driver_version,compute_mode,memory.total --format=csv; then
            echo "nvidia-smi failed"
        fi
    else
        echo "nvidia-smi: not found"
    fi
} 2>&1 | tee "$HOST_TXT"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    SMI_NOTE="nvidia-smi not found"
elif grep -q '^nvidia-smi failed' "$HOST_TXT"; then
    SMI_NOTE="nvidia-smi failed"
fi
TORCH_TXT="$OUTDIR/host-torch.log"
if run_step host 60 "$TORCH_TXT" "$PY" -c "$HOST_PY"; then
    TORCH_OK=1
else
    TORCH_OK=0
fi
cat "$TORCH_TXT" >>"$HOST_TXT"
rm -f "$TORCH_TXT"

CUDA_AVAILABLE=$(sed -n 's/^cuda_available: //p' "$HOST_TXT")
GPU_COUNT=$(sed -n 's/^device_count: //p' "$HOST_TXT")
GPU_COUNT=${GPU_COUNT:-0}
NO_GPU_REASON=""
if [ "$TORCH_OK" -ne 1 ]; then
    NO_GPU_REASON="torch did not run in $PY"
elif [ "$CUDA_AVAILABLE" != "True" ] || [ "$GPU_COUNT" -lt 1 ]; then
    NO_GPU_REASON="$(sed -n 's/^torch: /torch /p' "$HOST_TXT"), torch.version.cuda $(sed -n 's/^torch.version.cuda: //p' "$HOST_TXT")"
fi
if [ -n "$SMI_NOTE" ]; then
    NO_GPU_REASON="${NO_GPU_REASON:+$NO_GPU_REASON; }$SMI_NOTE"
fi

# --- GPU steps ---------------------------------------------------------------
GPU_STEPS=(gpu-tests conformance-reference conformance-upstream benchmark)
if [ -n "$NO_GPU_REASON" ]; then
    echo
    echo "no GPU here: CUDA is not available ($NO_GPU_REASON)"
    for step in "${GPU_STEPS[@]}"; do
        record "$step" "not run: no GPU"
    done
else
    if [ -x "$VENV/bin/nemo-dist-conformance" ]; then
        CONFORMANCE=("$VENV/bin/nemo-dist-conformance")
    else
        CONFORMANCE=("$PY" -m nemo_dist.conformance)
    fi
    # Required: CUDA and every world that fits the visible GPUs; a larger world
    # (8 ranks on a one-GPU host) is skipped, named, rather than failed.
    run_step gpu-tests 150 "$OUTDIR/gpu-tests.log" \
        "$PY" -m pytest -m gpu --dist-require-gpu --dist-max-gpus "$GPU_COUNT" -ra \
        --junitxml "$OUTDIR/gpu-tests.xml"
    STEP_STATUS[-1]="${STEP_STATUS[-1]}; NCCL worlds of at most $GPU_COUNT ranks ($GPU_COUNT GPUs visible)"
    run_step conformance-reference 90 "$OUTDIR/conformance-reference.log" \
        "${CONFORMANCE[@]}" --backend nccl --junit-xml "$OUTDIR/conformance-reference.xml"
    run_step conformance-upstream 90 "$OUTDIR/conformance-upstream.log" \
        "${CONFORMANCE[@]}" --preset nemo_automodel --tier core --backend nccl \
        --junit-xml "$OUTDIR/conformance-upstream.xml"
    BENCH_SIZE=$GPU_COUNT
    if [ "$BENCH_SIZE" -gt 8 ]; then
        BENCH_SIZE=8
    fi
    if [ "$BENCH_SIZE" -lt 2 ]; then
        echo
        echo "benchmark skipped: an all-gather needs at least 2 GPUs, $GPU_COUNT visible"
        record benchmark "skipped: needs 2 GPUs, $GPU_COUNT visible"
    else
        run_step benchmark 60 "$OUTDIR/bench-nccl.log" \
            "$PY" benchmarks/gather.py --backend nccl --world-size "$BENCH_SIZE" --json "$OUTDIR/bench-nccl.json"
    fi
fi

# --- summary -----------------------------------------------------------------
if [ "$ANY_FAILED" -eq 1 ]; then
    STATUS=1
    VERDICT="FAILED"
elif [ -n "$NO_GPU_REASON" ]; then
    STATUS=3
    VERDICT="NO GPU"
else
    STATUS=0
    VERDICT="OK"
fi
{
    echo
    echo "gpu_check summary (${SECONDS}s, outputs in $OUTDIR):"
    for i in "${!STEP_NAMES[@]}"; do
        printf '  %-22s %s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}"
    done
    echo "gpu_check: $VERDICT (exit $STATUS)"
} | tee "$OUTDIR/summary.txt"
exit "$STATUS"
