#!/usr/bin/env bash
# Builds and installs CRIU 4.2.1 (snapshots, issue 41; docs/snapshots.md) from Debian's source
# package, because Debian 12's criu 3.17 fails `criu check` on current kernels and 4.1 cannot dump
# a TCP socket on kernels >= 6.16 (SO_PASSCRED). The source comes from sid through a private apt
# state under build/criu, on the mirror this host's apt already uses (this host's sources are left
# alone), pinned by version and by the upstream tarball's sha256 (the one the .dsc lists; only the
# upstream source is built: `make criu` needs no Debian patch). Built once: cached in build/criu/criu.
#   scripts/build-criu.sh [PREFIX]      (PREFIX defaults to /usr/local; installs PREFIX/sbin/criu)
# Skipped when a criu >= 4.2 is already on PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version=4.2.1
debian_version=4.2.1-1
orig_sha256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
prefix=${1:-/usr/local}
dir="$root/build/criu"
build_deps=(build-essential libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  python3-protobuf libnl-3-dev libcap-dev libnet1-dev libgnutls28-dev pkg-config libbsd-dev
  libaio-dev uuid-dev libnftables-dev xz-utils)

have=$(command -v criu 2>/dev/null || true)
if [ -n "$have" ]; then
  v=$("$have" --version 2>/dev/null | awk '/^Version:/{print $2; exit}')
  if [ -n "$v" ] && [ "$(printf '%s\n4.2\n' "$v" | sort -V | head -1)" = "4.2" ]; then
    exit 0
  fi
fi

if [ ! -x "$dir/criu" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "build-criu.sh: CRIU >= 4.2 is missing and building it needs root (build deps, install): run as root" >&2
    exit 3
  fi
  missing=()
  for pkg in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "build-criu.sh: installing CRIU's build dependencies: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  uri=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}' || true)
  [ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$uri" ] || { echo "build-criu.sh: no Debian mirror in this host's apt sources" >&2; exit 3; }
  src="$dir/src"
  rm -rf "$src" && mkdir -p "$src" "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri sid main" > "$dir/apt/sources.list"
  opts=(-qq -o Dir::Etc::SourceList="$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update
  # apt verifies the files it fetches against the signed Sources index; the pin below is the
  # guarantee either way. A Debian-only file the mirror lacks does not stop the build.
  (cd "$src" && apt-get "${opts[@]}" source --download-only "criu=$debian_version") || true
  orig="$src/criu_$version.orig.tar.xz"
  [ -f "$orig" ] || { echo "build-criu.sh: could not fetch criu_$version.orig.tar.xz (criu=$debian_version) from $uri" >&2; exit 3; }
  got=$(sha256sum "$orig" | awk '{print $1}')
  if [ "$got" != "$orig_sha256" ]; then
    echo "build-criu.sh: $orig has sha256 $got, expected $orig_sha256: refusing to build it" >&2
    exit 3
  fi
  mkdir -p "$src/tree" && tar -xJf "$orig" -C "$src/tree" --strip-components=1
  make -C "$src/tree" -j"$(nproc)" criu >"$dir/build.log" 2>&1 || {
    echo "build-criu.sh: building CRIU failed; the last lines of $dir/build.log:" >&2
    tail -20 "$dir/build.log" >&2
    exit 3
  }
  install -m 0755 "$src/tree/criu/criu" "$dir/criu"
  rm -rf "$src"
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "build-criu.sh: CRIU $version is built ($dir/criu); installing it to $prefix/sbin needs root" >&2
  exit 3
fi
install -D -m 0755 "$dir/criu" "$prefix/sbin/criu"
echo "installed CRIU $("$prefix/sbin/criu" --version | awk '/^Version:/{print $2}') to $prefix/sbin/criu"
