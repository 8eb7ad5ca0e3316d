#!/usr/bin/env bash
# Installs the Debian packages listed in scripts/apt-packages.txt that are missing.
# As root on Debian it runs apt-get; otherwise it names what is missing and fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
missing=()
while read -r pkg; do
  case "$pkg" in ''|'#'*) continue ;; esac
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done < "$here/apt-packages.txt"
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "missing system packages: ${missing[*]}" >&2
  echo "install them (e.g. sudo apt-get install ${missing[*]}) and run again" >&2
  exit 3
fi
