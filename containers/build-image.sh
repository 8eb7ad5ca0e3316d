#!/usr/bin/env bash
# Builds the stand-in vLLM image (default localhost/fake-vllm:latest) with no network beyond
# the host's Debian mirror:
#   1. a Debian rootfs with python3 by mmdebstrap, from the host's own apt sources, cached in
#      build/fake-vllm/ under a hash of its inputs;
#   2. `podman import` of that rootfs as the base image (skipped when present);
#   3. `podman build` of containers/Containerfile on it, labelled with a hash of everything that
#      goes into the image; skipped when the image already carries that hash.
# Environment: PODMAN (default "podman"; e.g. "podman --root X --runroot Y"), FAKE_VLLM_IMAGE,
# FAKE_VLLM_BUILD_DIR, CONTAINERS_CONF (else one of our own with runc and low ulimits is used).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
read -r -a podman <<< "${PODMAN:-podman}"
image=${FAKE_VLLM_IMAGE:-localhost/fake-vllm:latest}
build_dir=${FAKE_VLLM_BUILD_DIR:-$repo/build/fake-vllm}
suite=bookworm
packages=python3
hash_label=io.dankserve.fake-vllm.content-hash
mkdir -p "$build_dir"

# Podman settings this machine needs (FACTS.md): runc, and ulimits at or below the host's.
if [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF=$build_dir/containers.conf
  cat > "$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
fi

# The host's enabled apt sources, passed as files: mmdebstrap copies them into the rootfs.
sources=()
for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$file" ] && sources+=("$file")
done
if [ ${#sources[@]} -eq 0 ]; then
  echo "build-image.sh: no apt sources found under /etc/apt; mmdebstrap needs the host's Debian mirror" >&2
  exit 3
fi
dpkg_options=(
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
)

rootfs_key=$(
  {
    echo "$suite essential $packages ${dpkg_options[*]} $(mmdebstrap --version 2>/dev/null || true)"
    cat "${sources[@]}"
  } | sha256sum | cut -c1-16
)
rootfs=$build_dir/rootfs-$rootfs_key.tar
if [ ! -s "$rootfs" ]; then
  echo "build-image.sh: creating the Debian $suite rootfs with $packages (mmdebstrap)"
  rm -f "$build_dir"/rootfs-*.tar
  mmdebstrap --quiet --variant=essential --include="$packages" "${dpkg_options[@]}" --format=tar \
    "$suite" "$rootfs.partial" "${sources[@]}"
  mv "$rootfs.partial" "$rootfs"
fi

base=localhost/fake-vllm-base:$rootfs_key
if ! "${podman[@]}" image exists "$base"; then
  echo "build-image.sh: importing the rootfs as $base"
  "${podman[@]}" import --quiet "$rootfs" "$base" > /dev/null
fi

program_files=$(cd "$here" && find fake-vllm -type f \( -name '*.py' -o -name '*.json' \) -not -path '*/__pycache__/*' | LC_ALL=C sort)
content_hash=$(
  {
    echo "$rootfs_key"
    cat "$here/Containerfile"
    for file in $program_files; do echo "$file"; cat "$here/$file"; done
  } | sha256sum | cut -c1-32
)
current=$("${podman[@]}" image inspect --format "{{ index .Labels \"$hash_label\" }}" "$image" 2>/dev/null || true)
if [ "$current" = "$content_hash" ]; then
  echo "build-image.sh: $image is up to date ($content_hash)"
  exit 0
fi

context=$(mktemp -d "$build_dir/context.XXXXXX")
trap 'rm -rf "$context"' EXIT
lib=$context/rootfs/usr/local/lib/fake-vllm
mkdir -p "$lib" "$context/rootfs/usr/local/bin" "$context/rootfs/vllm-workspace"
for file in $program_files; do
  mkdir -p "$lib/$(dirname "${file#fake-vllm/}")"
  cp "$here/$file" "$lib/${file#fake-vllm/}"
done
chmod 0755 "$lib/vllm.py"
ln -s ../lib/fake-vllm/vllm.py "$context/rootfs/usr/local/bin/vllm"
cp "$here/Containerfile" "$context/Containerfile"

previous=$("${podman[@]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
echo "build-image.sh: building $image"
"${podman[@]}" build --quiet --pull=never --network=none \
  --build-arg "BASE=$base" --label "$hash_label=$content_hash" \
  --file "$context/Containerfile" --tag "$image" "$context" > /dev/null
echo "build-image.sh: built $image ($content_hash)"

# Drop what this script built before and nothing else: the image the tag left (if now untagged and
# unused) and base images of older rootfs versions.
if [ -n "$previous" ] && [ -z "$("${podman[@]}" image inspect --format '{{.RepoTags}}' "$previous" 2>/dev/null | tr -d '[]')" ]; then
  "${podman[@]}" rmi "$previous" > /dev/null 2>&1 || true
fi
for old in $("${podman[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/fake-vllm-base); do
  [ "$old" = "$base" ] || "${podman[@]}" rmi "$old" > /dev/null 2>&1 || true
done
