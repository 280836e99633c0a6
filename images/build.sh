#!/usr/bin/env bash
# Build the runtime image (images/Dockerfile) with whatever this machine has, and tag it with the
# name the rendered manifests use (components/base/runtime.py DEFAULT_IMAGE) plus localhost/sublimate.
#
#   images/build.sh [--builder auto|docker|buildah|podman] [--base auto|debian|IMAGE]
#                   [--torch auto|URL|DIR] [--ca auto|none|FILE] [--tag NAME]...
#                   [-- BUILDER-ARGS...]
#
#   --builder  auto: docker when its engine answers, else buildah (chroot isolation: the one that
#              works without a container runtime), else podman (chroot isolation too).
#   --base     auto: the Dockerfile's registry image (python:3.11-slim-bookworm) when it is here or
#              can be pulled, else `debian`: a base built from Debian's own packages by
#              images/base.sh (no registry needed; reused while that script is unchanged).
#   --torch    where torch comes from: a package index URL (PyTorch's CPU index by default; a
#              CUDA build: https://download.pytorch.org/whl/cu126) or a folder of wheels (mounted
#              into the build; buildah and podman only). auto: a folder of pip's find-links
#              that holds the lock's torch as a +cpu wheel, else PyTorch's CPU index.
#   --ca       a CA bundle the build's pip must trust (a network that inspects TLS), mounted over
#              the base's own for the RUN steps (buildah and podman). auto: pip's `cert` setting.
#   --tag      replaces the two default names (repeatable).
# Everything but torch comes from the package index pip reaches by default (PyPI), pinned by
# images/requirements.lock. Layers are cached: a rebuild after a code change redoes only the last
# one, and one with nothing changed takes about a second. The image a rebuild replaces is removed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build: $*" >&2; exit 2; }

builder=auto base=auto torch=auto ca=auto
tags=()
while (($#)); do
  case "$1" in
    --builder|--base|--torch|--ca|--tag)
      (($# >= 2)) || die "$1 needs a value"
      case "$1" in
        --builder) builder="$2" ;;
        --base) base="$2" ;;
        --torch) torch="$2" ;;
        --ca) ca="$2" ;;
        --tag) tags+=("$2") ;;
      esac
      shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

# Every argument is checked before anything is pulled or built.
case "$builder" in
  auto|docker|buildah|podman) ;;
  *) die "--builder must be auto, docker, buildah or podman, not '$builder'" ;;
esac
[[ -n "$base" ]] || die "--base needs a value: auto, debian or an image"
if [[ "$torch" != auto && "$torch" != *://* && ! -d "$torch" ]]; then
  die "--torch $torch: no such folder (give a folder of wheels or a package index URL)"
fi
if [[ "$ca" == auto ]]; then
  ca="${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}"
elif [[ "$ca" != none && ! -f "$ca" ]]; then
  die "--ca $ca: no such file"
fi

# The names and versions are read from where they are decided, never repeated here.
default_image="$(sed -n 's/^DEFAULT_IMAGE = "\(.*\)"$/\1/p' components/base/runtime.py)"
registry_base="$(sed -n 's/^ARG BASE_IMAGE=//p' images/Dockerfile)"
torch_version="$(sed -n 's/^torch==//p' images/requirements.lock)"
[[ -n "$default_image" && -n "$registry_base" && -n "$torch_version" ]] ||
  die "cannot read DEFAULT_IMAGE, the Dockerfile's BASE_IMAGE or the lock's torch pin"
((${#tags[@]})) || tags=("$default_image" "localhost/sublimate:${default_image##*:}")

engine_answers() { command -v "$1" >/dev/null && "$1" info >/dev/null 2>&1; }
if [[ "$builder" == auto ]]; then
  if engine_answers docker; then builder=docker
  elif command -v buildah >/dev/null; then builder=buildah
  elif command -v podman >/dev/null; then builder=podman
  else die "no image builder: install docker, buildah or podman (apt-get install buildah)"
  fi
fi
command -v "$builder" >/dev/null || die "--builder $builder: not installed"

# torch: a wheel folder is bind-mounted read-only where the RUN step looks for it.
wheels_mount=/run/torch-wheels
volume_args=()
if [[ "$torch" == auto ]]; then
  torch=""
  find_links="${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true)"
  for folder in $find_links; do
    folder="${folder#file://}"
    if compgen -G "$folder/torch-${torch_version}+cpu-*.whl" >/dev/null; then
      torch="$folder"
      break
    fi
  done
fi
torch_args=()
if [[ "$torch" == *://* ]]; then
  torch_args=(--build-arg "TORCH_SOURCE=$torch")
elif [[ -n "$torch" ]]; then
  [[ "$builder" != docker ]] || die "--torch $torch: docker cannot mount a folder into a" \
    "build step; use --builder buildah or podman, or a package index URL"
  volume_args+=(--volume "$(realpath "$torch"):$wheels_mount:ro")
  torch_args=(--build-arg "TORCH_SOURCE=$wheels_mount")
fi
# The CA bundle: over the base's own, which the Dockerfile's PIP_CERT names.
if [[ -n "$ca" && "$ca" != none ]]; then
  if [[ "$builder" == docker ]]; then
    echo "build: docker cannot mount $ca into a build step; the base's CA store is used" >&2
  else
    volume_args+=(--volume "$(realpath "$ca"):/etc/ssl/certs/ca-certificates.crt:ro")
  fi
fi

image_id() {
  case "$builder" in
    buildah) buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true ;;
    *) "$builder" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true ;;
  esac
}
if [[ "$base" == auto ]]; then
  if [[ -n "$(image_id "$registry_base")" ]] || timeout 120 "$builder" pull "$registry_base" >&2
  then
    base="$registry_base"
  else
    echo "build: $registry_base cannot be pulled; building the base from Debian's packages" >&2
    base=debian
  fi
fi
if [[ "$base" == debian ]]; then
  base="$(BUILDER="$builder" images/base.sh)"
fi

# A context of only what the Dockerfile copies: the repository's own folder also holds virtual
# environments and build output that docker would otherwise send to its engine. Timestamps are
# kept, so unchanged files keep hitting the layer cache.
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/images"
cp -p images/Dockerfile images/requirements.lock "$context/images/"
cp -p pyproject.toml README.md "$context/"
cp -rp pipelines components "$context/"
find "$context" -name __pycache__ -prune -exec rm -rf {} +

build=("$builder" build)
case "$builder" in
  buildah) build=(buildah bud --isolation chroot --layers --force-rm) ;;
  podman) build+=(--isolation chroot --layers --force-rm) ;;
esac
tag_args=()
for tag in "${tags[@]}"; do tag_args+=(--tag "$tag"); done
previous="$(image_id "${tags[0]}")"
echo "build: $builder, base $base, torch $torch_version from ${torch:-the PyTorch CPU index}" >&2
started=$SECONDS
"${build[@]}" --file "$context/images/Dockerfile" --build-arg "BASE_IMAGE=$base" \
  --build-arg "TORCH_VERSION=$torch_version" "${torch_args[@]}" "${volume_args[@]}" \
  "${tag_args[@]}" "$@" "$context" >&2
echo "build: ${tags[*]} built in $((SECONDS - started))s" >&2
# The build these tags named before, unless something still uses it (a container, another tag):
# without this, every code change would leave a dangling image of the project's size behind.
if [[ -n "$previous" && "$previous" != "$(image_id "${tags[0]}")" ]]; then
  "$builder" rmi "$previous" >/dev/null 2>&1 || true
fi
"$builder" images "${tags[0]}" >&2
printf '%s\n' "${tags[@]}"
