#!/usr/bin/env bash
# The runtime image's base where no image registry is reachable: Debian bookworm's own Python 3.11
# (python3, its venv module, the CA certificates) from a Debian mirror with mmdebstrap, imported
# into the local image storage of $BUILDER (buildah by default; docker and podman import it too).
# images/build.sh --base debian calls it.
#
#   [BUILDER=buildah|docker|podman] images/base.sh [TAG]     prints the tag (progress: stderr)
#
# The default tag, localhost/sublimate-base:bookworm-<digest of this script>, names the recipe: a
# machine that already has it (CI on an unchanged script) reuses it at no cost, and any change here
# builds a new one. Debian's security updates do not change the tag: remove the image to pick
# them up (buildah rmi TAG). Needs root (or mmdebstrap's unshare mode).
set -euo pipefail
builder="${BUILDER:-buildah}"
recipe_digest="$(sha256sum "$0" | cut -c1-12)"
tag="${1:-localhost/sublimate-base:bookworm-$recipe_digest}"
case "$builder" in
  buildah) exists=(buildah inspect --type image "$tag") ;;
  docker|podman) exists=("$builder" image inspect "$tag") ;;
  *) echo "base: BUILDER must be buildah, docker or podman, not '$builder'" >&2; exit 2 ;;
esac
if "${exists[@]}" >/dev/null 2>&1; then
  echo "base: $tag exists, reused" >&2
  echo "$tag"
  exit 0
fi
for tool in mmdebstrap "$builder"; do
  command -v "$tool" >/dev/null || {
    echo "base: $tool is not installed (apt-get install $tool)" >&2
    exit 2
  }
done
started=$SECONDS
work="$(mktemp -d)"
container=""
cleanup() {
  [[ -z "$container" ]] || buildah rm "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# minbase: Debian's essential packages (useradd included) plus apt; documentation, manual pages
# and translations are left out (only the licences are kept), as the slim python image does.
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  bookworm "$work/rootfs.tar" >&2

if [[ "$builder" == buildah ]]; then
  container="$(buildah from scratch)"
  buildah add --quiet "$container" "$work/rootfs.tar" / >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd '["python3"]' "$container"
  buildah commit --quiet --rm "$container" "$tag" >/dev/null
  container=""
else
  "$builder" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$tag" >/dev/null
fi
echo "base: built $tag in $((SECONDS - started))s" >&2
echo "$tag"
