#!/usr/bin/env bash
# Unpacks the Quadlet generator of Debian 13's podman package (5.4) under DIR, installing nothing and
# leaving this host's apt sources alone (a private apt state under DIR, on the mirror this host's apt
# uses), so tests/runtime/test_podman_quadlet.py can run `quadlet -dryrun` on a Debian 12 host:
#   scripts/fetch-quadlet.sh DIR
#   DANKSERVE_TEST_QUADLET=DIR/root/usr/libexec/podman/quadlet .venv/bin/python -m pytest tests/runtime/test_podman_quadlet.py
set -euo pipefail
dir=$(realpath -m "${1:?usage: scripts/fetch-quadlet.sh DIR}")
uri=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}' || true)
[ -n "$uri" ] || uri=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$uri" ] || { echo "fetch-quadlet.sh: no Debian mirror in this host's apt sources" >&2; exit 3; }
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri trixie main" > "$dir/apt/sources.list"
opts=(-qq -o Dir::Etc::SourceList="$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" -o APT::Sandbox::User=root)
apt-get "${opts[@]}" update
(cd "$dir/apt" && apt-get "${opts[@]}" download podman)
dpkg-deb -x "$(ls "$dir"/apt/podman_*.deb | head -1)" "$dir/root"
echo "quadlet $("$dir/root/usr/libexec/podman/quadlet" -version): $dir/root/usr/libexec/podman/quadlet"
