#!/usr/bin/env bash
# GPU checks, in one go, for a machine with one or more NVIDIA GPUs: every paradigm (sync, async,
# bmuf, easgd) trains digits end to end with `sublimate run` on 1 node x all GPUs and on 2
# simulated nodes, then each resumes on the GPU after a fault. One PASS/FAIL/SKIP line per check;
# the exit status is non-zero when any check failed (2: the machine cannot run them at all).
#
#   benchmarks/gpu_check.sh          # about 4-6 minutes on one H200 (16 cores)
#
# The machine may have no network: nothing is installed here. Run it with the environment that
# has torch (a CUDA build, torch==2.13.0) and this package installed (`pip install -e .`)
# active, or first on PATH: the script uses `python3` from PATH and nothing else.
#
# Settings (environment):
#   GPU_CHECK_ONLY=REGEX      run only the checks whose name matches (e.g. 'bmuf|easgd')
#   GPU_CHECK_RUN_TIMEOUT=S   seconds one `sublimate run` may take (default 240)
#   GPU_CHECK_KEEP=1          keep the scratch folder (run folders, logs) for a look afterwards
#   GPU_CHECK_ON_CPU=1        check this script itself on a CPU machine: gloo, no GPU, "GPUs"
#                             simulated as CPU workers (GPU_CHECK_CPU_GPUS of them, default 2;
#                             1 takes the one-GPU branches); proves nothing about GPUs
set -uo pipefail  # not -e: one failed check must not stop the others
cd "$(dirname "$0")/.." || exit 2

ONLY=${GPU_CHECK_ONLY:-.}
RUN_TIMEOUT=${GPU_CHECK_RUN_TIMEOUT:-240}
ON_CPU=${GPU_CHECK_ON_CPU:-0}
EPOCHS=20          # the default run: 20 epochs of digits
BATCH=64           # the default global batch, rounded up to a multiple of the workers
FAIL_AT_STEP=130   # resume checks: a worker is killed here, after the checkpoint at step 100
CHECKPOINT_EVERY=50
MIN_ACCURACY=0.8   # the default run reaches ~0.97; below this it did not really train
GPU_MEMORY_MIB=100 # a GPU counts as used when a run raised its memory by this much

started=$SECONDS
failures=0
checks=0
scratch=$(mktemp -d "${TMPDIR:-/tmp}/sublimate-gpu-check.XXXXXX")
sampler=""
cleanup() {
    [[ -n $sampler ]] && kill "$sampler" 2>/dev/null
    if [[ ${GPU_CHECK_KEEP:-0} == 1 ]]; then
        echo "scratch folder kept: $scratch"
    else
        rm -rf "$scratch"
    fi
}
trap cleanup EXIT
export SUBLIMATE_HOME="$scratch/home" PYTHONUNBUFFERED=1

pass() { checks=$((checks + 1)); echo "PASS $1${2:+ ($2)}"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }
wanted() { [[ $1 =~ $ONLY ]]; }

# --- the machine ---------------------------------------------------------------------------

if ! command -v python3 >/dev/null; then
    echo "FAIL preflight: no python3 on PATH (activate the environment with torch and sublimate)"
    exit 2
fi
if ! probe=$(python3 - 2>&1 <<'EOF'
import torch

import sublimate.pipelines  # noqa: F401  (installed: pip install -e .)

print(torch.__version__, torch.version.cuda, int(torch.cuda.is_available()),
      torch.cuda.device_count() if torch.cuda.is_available() else 0)
EOF
); then
    echo "FAIL preflight: $(command -v python3) cannot import torch and sublimate:"
    echo "$probe" | tail -5
    exit 2
fi
read -r torch_version cuda_version cuda_available torch_gpus <<<"$(echo "$probe" | tail -1)"
echo "python3: $(command -v python3); torch $torch_version (CUDA $cuda_version)"

if [[ $ON_CPU == 1 ]]; then
    echo "GPU_CHECK_ON_CPU=1: checking the script on the CPU (gloo); nothing here tests a GPU"
    gpus=${GPU_CHECK_CPU_GPUS:-2}
    backend=gloo
else
    if [[ $cuda_available != 1 ]]; then
        echo "FAIL preflight: torch $torch_version sees no GPU (torch.cuda.is_available() is" \
             "False: a CPU-only wheel (CUDA $cuda_version), no driver, or CUDA_VISIBLE_DEVICES" \
             "hides them); install the CUDA build of torch==2.13.0 in this environment"
        exit 2
    fi
    # The launcher divides the host's GPUs among simulated nodes by what nvidia-smi lists.
    smi_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [[ $smi_gpus != "$torch_gpus" ]]; then
        echo "FAIL preflight: nvidia-smi lists ${smi_gpus:-0} GPUs, torch sees $torch_gpus" \
             "(the launcher assigns GPUs by nvidia-smi's count; is nvidia-smi on PATH?)"
        exit 2
    fi
    gpus=$torch_gpus
    backend=nccl
    nvidia-smi -L
fi
if [[ $torch_version == 2.13.0* ]]; then
    pass "torch version" "$torch_version"
else
    fail "torch version" "$torch_version, the project pins torch==2.13.0 (checks go on)"
fi

train_examples=$(python3 -c 'from sublimate.components.data.datasets import digits_splits
print(len(digits_splits()["train"].y))') || { echo "FAIL preflight: no digits dataset"; exit 2; }

# --- one run and what it must show ---------------------------------------------------------

# The GPUs' memory use, sampled while a run trains: per GPU, the most seen (MiB).
start_sampler() {
    [[ $ON_CPU == 1 ]] && return
    local out=$1
    (while :; do
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2>/dev/null
        sleep 0.3
    done) >"$out" &
    sampler=$!
}
stop_sampler() {
    [[ -z $sampler ]] && return
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    sampler=""
}
# Memory per GPU now (baseline), one "index used" line each.
gpu_memory_now() {
    [[ $ON_CPU == 1 ]] && return
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits 2>/dev/null
}

# run NAME ENV -- PARAMETERS...: `sublimate run` of the train pipeline with run-id NAME (results
# in $SUBLIMATE_HOME/volumes/sublimate-data/runs/NAME); ENV is "" or "VAR=value VAR=value".
# Leaves $scratch/NAME.{json,err,gpu,base}.
run() {
    local name=$1 env=$2 pair
    shift 3
    # ENV's variables reach the steps only when passed: the shell's own do not
    local passed=()
    # shellcheck disable=SC2086  # ENV is word-split on purpose
    for pair in $env; do passed+=(--env "$pair"); done
    gpu_memory_now >"$scratch/$name.base"
    start_sampler "$scratch/$name.gpu"
    timeout "$RUN_TIMEOUT" python3 -m sublimate.pipelines run -q -o json \
        -p run-id="$name" ${passed[@]+"${passed[@]}"} "$@" >"$scratch/$name.json" \
        2>"$scratch/$name.err"
    local code=$?
    stop_sampler
    end_leftovers "$name"
    return $code
}

# A run that ended must leave none of its processes behind (seen on the CPU: a SIGTERM to
# `sublimate run` just after an async job was submitted left its trainers running). Any found
# are a failed check of their own, and are ended here so that they hold no GPU for the next.
end_leftovers() {
    local name=$1 pids
    pids=$(pgrep -f -- "$SUBLIMATE_HOME/volumes/sublimate-data/runs/$1( |/|\$)") || return 0
    sleep 5  # a cancel in progress
    pids=$(pgrep -f -- "$SUBLIMATE_HOME/volumes/sublimate-data/runs/$1( |/|\$)") || return 0
    fail "$name-leftovers" "processes of the ended run still running: $(echo "$pids" | xargs)"
    # shellcheck disable=SC2086  # one pid a word
    kill $pids 2>/dev/null
    sleep 3
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null
}

# verify NAME KIND [KEY=VALUE...]: the run's status, summary and logs against what KIND expects;
# prints nothing and succeeds, or prints why not (one line) and fails.
verify() {
    python3 - "$scratch" "$SUBLIMATE_HOME" "$@" <<'EOF'
import json
import math
import sys
from pathlib import Path

scratch, home, name, kind, *pairs = sys.argv[1:]
want = dict(pair.split("=", 1) for pair in pairs)
runs = Path(home) / "volumes" / "sublimate-data" / "runs"


def fail(why: str) -> None:
    print(why)
    sys.exit(1)


def log_tail() -> str:
    text = Path(scratch, f"{name}.err").read_text()
    return " | ".join(text.strip().splitlines()[-4:])[-600:]


try:
    status = json.loads(Path(scratch, f"{name}.json").read_text())
except (OSError, ValueError):
    fail(f"no status from sublimate run (timed out or crashed): {log_tail()}")
if kind == "refused":  # the run must fail before training, with the launcher's one message
    text = Path(scratch, f"{name}.err").read_text() + json.dumps(status)
    if status.get("phase") == "Succeeded":
        fail("it ran, although the host has too few GPUs for nccl")
    if want["message"] not in text:
        fail(f"no '{want['message']}' in its output: {log_tail()}")
    sys.exit(0)
if status.get("phase") != "Succeeded":
    fail(f"phase {status.get('phase')}: {log_tail()}")
outputs = {node["display_name"]: node for node in status["nodes"]}
accuracy = float(outputs["evaluate"]["outputs"]["parameters"]["accuracy"])
if accuracy < float(want.get("min_accuracy", 0)):
    fail(f"test accuracy {accuracy:.4f} < {want['min_accuracy']}: it did not train")
summary = json.loads((runs / name / "train-summary.json").read_text())
workers, epochs = int(want["workers"]), int(want["epochs"])
steps_per_epoch = int(want["train_examples"]) // int(want["batch"])
facts = [f"accuracy {accuracy:.4f}"]
if kind == "async":
    updates = workers * steps_per_epoch * epochs
    if summary["updates_applied"] != updates or summary["pushes_per_trainer"] != [
            steps_per_epoch * epochs] * workers:
        fail(f"{summary['updates_applied']} updates applied, pushes "
             f"{summary['pushes_per_trainer']}: want {updates} ({workers} trainers x "
             f"{steps_per_epoch * epochs})")
    resumed = int(want.get("resumed_from_update", 0))
    if summary["resumed_from_update"] != resumed:
        fail(f"resumed from update {summary['resumed_from_update']}, want {resumed}")
    facts.append(f"{updates} updates, staleness max {summary['staleness_max']}")
else:
    if summary["world_size"] != workers or summary["steps"] != steps_per_epoch * epochs:
        fail(f"world {summary['world_size']}, {summary['steps']} steps: want {workers} "
             f"workers, {steps_per_epoch * epochs} steps")
    if summary["backend"] != want["backend"]:
        fail(f"backend {summary['backend']}, want {want['backend']} (fell back to the CPU?)")
    facts.append(f"{summary['steps']} steps on {summary['backend']}")
    if "killed_at" in want:  # a worker was killed and torchrun restarted the workers
        killed_at = int(want["killed_at"])
        logs = "".join(p.read_text(errors="replace")
                       for p in (runs / name / "logs").rglob("*.log"))
        if "fault injection: killing rank" not in logs:
            fail("no worker was killed (fault injection did not fire)")
        first = summary["resumed_from_step"]
        if not 0 < first < killed_at:
            fail(f"resumed from step {first}: want a checkpoint before the kill at {killed_at}")
        facts.append(f"killed at {killed_at}, resumed from {first}")
gpus_used = int(want.get("gpus", 0))
if gpus_used:  # every GPU the layout gives a worker must have held that worker's memory
    base = {}
    for line in Path(scratch, f"{name}.base").read_text().splitlines():
        index, used = (int(v) for v in line.split(","))
        base[index] = used
    peak = dict.fromkeys(base, 0)
    for line in Path(scratch, f"{name}.gpu").read_text().splitlines():
        try:
            index, used = (int(v) for v in line.split(","))
        except ValueError:
            continue
        peak[index] = max(peak.get(index, 0), used)
    busy = [i for i in base if peak.get(i, 0) - base[i] >= int(want["gpu_memory_mib"])]
    if len(busy) < gpus_used:
        fail(f"only GPUs {busy} held memory during the run, want {gpus_used} "
             f"(peak {peak}, before {base}): did the workers train on the CPU?")
    facts.append(f"GPUs {','.join(map(str, busy))} in use")
print("; ".join(facts))
EOF
}

# check NAME KIND ENV WORKERS EPOCHS GPUS_USED KILLED_AT -- PARAMETERS...
check() {
    local name=$1 kind=$2 env=$3 workers=$4 epochs=$5 used=$6 killed_at=$7
    shift 8
    wanted "$name" || return 0
    local batch=$(( workers * ( (BATCH + workers - 1) / workers ) ))
    local t0=$SECONDS verdict extra=()
    [[ $killed_at != - ]] && extra=("killed_at=$killed_at")
    [[ $kind == async-resumed ]] && extra=("resumed_from_update=$(( workers * (train_examples / batch) * epochs / 2 ))")
    run "$name" "$env" -- -p epochs="$epochs" -p global-batch-size="$batch" -p backend="$backend" "$@"
    if verdict=$(verify "$name" "${kind%-resumed}" workers="$workers" epochs="$epochs" \
            batch="$batch" train_examples="$train_examples" backend="$backend" \
            gpus="$used" gpu_memory_mib="$GPU_MEMORY_MIB" min_accuracy="$MIN_ACCURACY" \
            "${extra[@]}"); then
        pass "$name" "$verdict; $((SECONDS - t0))s"
    else
        fail "$name" "$verdict ($((SECONDS - t0))s; log: $scratch/$name.err)"
    fi
}

# --- the checks ----------------------------------------------------------------------------
# Layouts. Collective paradigms: one node with every GPU (one worker per GPU), and 2 nodes with
# half each. Async: one trainer per GPU (gpus-per-node is per trainer there), the server on the
# CPU. On the CPU (script check) "GPUs" are CPU workers.
if [[ $ON_CPU == 1 ]]; then gpn() { echo 0; }; else gpn() { echo "$1"; }; fi
half=$(( gpus / 2 ))

for algorithm in sync bmuf easgd async; do
    kind=collective
    [[ $algorithm == async ]] && kind=async
    if [[ $kind == async ]]; then per_node_1=$(gpn 1); per_node_2=$(gpn 1); else
        per_node_1=$(gpn "$gpus"); per_node_2=$(gpn "$half"); fi
    used=$gpus
    [[ $ON_CPU == 1 ]] && used=0

    check "$algorithm-1node-x$gpus" "$kind" "" "$gpus" "$EPOCHS" "$used" - -- \
        -p algorithm="$algorithm" -p nodes=1 -p procs-per-node="$gpus" \
        -p gpus-per-node="$per_node_1"

    if (( half >= 1 )); then
        check "$algorithm-2nodes-x$half" "$kind" "" $(( 2 * half )) "$EPOCHS" \
            $(( ON_CPU == 1 ? 0 : 2 * half )) - -- \
            -p algorithm="$algorithm" -p nodes=2 -p procs-per-node="$half" \
            -p gpus-per-node="$per_node_2"
    elif wanted "$algorithm-2nodes"; then
        # NCCL refuses two ranks on one GPU, so 2 simulated nodes need 2 GPUs. What one GPU
        # can check: the launcher refuses up front with its one message, rather than hang.
        if [[ $kind == collective ]]; then
            name="$algorithm-2nodes-refused"
            run "$name" "" -- -p algorithm="$algorithm" -p nodes=2 -p gpus-per-node=1 \
                -p backend=nccl -p epochs=1
            if verdict=$(verify "$name" refused message="NCCL refuses two ranks on one GPU"); then
                pass "$name" "1 GPU: the launcher refuses 2 nccl nodes with one message"
            else
                fail "$name" "$verdict"
            fi
        fi
        skip "$algorithm-2nodes" "2 simulated nodes need 2 GPUs (NCCL: one rank per GPU); this host has 1"
    fi

    # Resume on the GPU. Collective: a worker is SIGKILLed at step $FAIL_AT_STEP and torchrun
    # restarts the workers from the checkpoint at step 100. Async has no in-job restart (a lost
    # trainer fails the app): its run is resubmitted with the same run-id and twice the epochs,
    # and the server resumes from its checkpoint, trainers' positions and all.
    if [[ $kind == collective ]]; then
        check "$algorithm-resume-x$gpus" collective \
            "SUBLIMATE_FAIL_AT_STEP=$FAIL_AT_STEP SUBLIMATE_FAIL_RANK=$(( gpus > 1 ? 1 : 0 ))" \
            "$gpus" "$EPOCHS" "$used" "$FAIL_AT_STEP" -- \
            -p algorithm="$algorithm" -p nodes=1 -p procs-per-node="$gpus" \
            -p gpus-per-node="$per_node_1" -p max-restarts=1 \
            -p checkpoint-every="$CHECKPOINT_EVERY"
    elif wanted "async-resume"; then
        name="async-resume-x$gpus"
        batch=$(( gpus * ( (BATCH + gpus - 1) / gpus ) ))
        t0=$SECONDS
        if run "$name" "" -- -p algorithm=async -p nodes=1 -p procs-per-node="$gpus" \
                -p gpus-per-node="$per_node_1" -p epochs=$(( EPOCHS / 2 )) \
                -p global-batch-size="$batch" -p backend="$backend" \
                && verify "$name" async workers="$gpus" epochs=$(( EPOCHS / 2 )) \
                    batch="$batch" train_examples="$train_examples" >/dev/null; then
            check "$name" async-resumed "" "$gpus" "$EPOCHS" "$used" - -- \
                -p algorithm=async -p nodes=1 -p procs-per-node="$gpus" \
                -p gpus-per-node="$per_node_1"
        else
            fail "$name" "the first half did not finish: $(verify "$name" async workers="$gpus" \
                epochs=$(( EPOCHS / 2 )) batch="$batch" train_examples="$train_examples") \
                ($((SECONDS - t0))s)"
        fi
    fi
done

echo "$checks checks, $failures failed, in $((SECONDS - started))s"
(( failures == 0 ))
