#!/usr/bin/env bash
# Prove the runtime image: run the default pipeline (stage-data -> train -> evaluate) inside it,
# as its unprivileged user 10001, against a new host folder mounted at the shared volume's path
# (/mnt/sublimate), and check what the run left in that folder from the host's side.
#
#   images/prove.sh [IMAGE] [-- SUBLIMATE-RUN-ARGS...]
#
# IMAGE defaults to localhost/sublimate:<version> (what images/build.sh tags). docker runs it when
# its engine answers, else buildah (chroot isolation). MIN_ACCURACY (default 0.95, which the
# default digits run always passes: it reaches ~0.967) is the test accuracy the run must reach.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "prove: $*" >&2; exit 2; }

default_image="$(sed -n 's/^DEFAULT_IMAGE = "\(.*\)"$/\1/p' components/base/runtime.py)"
image="localhost/sublimate:${default_image##*:}"
if (($#)) && [[ "$1" != -- ]]; then image="$1"; shift; fi
if (($#)); then [[ "$1" == -- ]] || die "unknown argument '$1'"; shift; fi
min_accuracy="${MIN_ACCURACY:-0.95}"
volume_path=/mnt/sublimate  # components/base/runtime.py SHARED_VOLUME_PATH
user=10001:10001            # the image's USER and the WorkflowTemplate's securityContext

shared="$(mktemp -d)"
container=""
cleanup() {
  [[ -z "$container" ]] || buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$shared"
}
trap cleanup EXIT
# The folder is the volume: the image's user must own it, as a ReadWriteMany claim's fsGroup does.
chown "$user" "$shared" 2>/dev/null || chmod 0777 "$shared"

result="$shared/.result.json"
started=$SECONDS
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  runner=docker
  docker run --rm --user "$user" --volume "$shared:$volume_path" "$image" \
    sublimate run -o json "$@" > "$result"
elif command -v buildah >/dev/null; then
  runner=buildah
  container="$(buildah from --pull-never "$image")"
  # --uts host: buildah names the container's host after its id without adding that name to
  # /etc/hosts, and torchrun's rendezvous must resolve the host it runs on (docker and
  # Kubernetes add the pod's name themselves).
  buildah run --isolation chroot --uts host --user "$user" --volume "$shared:$volume_path" \
    "$container" -- sublimate run -o json "$@" > "$result"
else
  die "neither a docker engine nor buildah is available to run $image"
fi
seconds=$((SECONDS - started))

# Checked from the host: the outputs name the volume's path, and the files behind them are in the
# mounted folder, written by the image's user, with the accuracy the run reported.
python3 - "$result" "$shared" "$volume_path" "$user" "$min_accuracy" <<'EOF'
import json
import os
import sys
from pathlib import Path

result_file, shared, volume_path, user, min_accuracy = sys.argv[1:]
result = json.loads(Path(result_file).read_text())
assert result["phase"] == "Succeeded", f"the run ended {result['phase']}: {result.get('message')}"
outputs = result["outputs"]["parameters"]
name = result["name"]
assert outputs["results"] == f"{volume_path}/runs/{name}", outputs
run_dir = Path(shared, "runs", name)
metrics = json.loads((run_dir / "metrics.json").read_text())
accuracy = float(outputs["accuracy"])
assert abs(metrics["accuracy"] - accuracy) < 1e-6, (metrics, outputs)
assert accuracy >= float(min_accuracy), f"accuracy {accuracy} < {min_accuracy}"
owners = {f"{s.st_uid}:{s.st_gid}" for s in map(os.stat, [run_dir, run_dir / "model.pt"])}
assert owners == {user}, f"files owned by {owners}, not the image's user {user}"
print(f"accuracy={accuracy} run={name}")
EOF
echo "prove: $image ran the default pipeline with $runner as $user on a folder mounted at" \
  "$volume_path in ${seconds}s" >&2
