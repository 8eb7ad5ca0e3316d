#!/bin/sh
# Certificates for a multi-host group's cluster API (docs/MULTI-HOST.md, "TLS between hosts").
#
#   scripts/cluster-certs.sh DIR ADDRESS...
#
# Creates in DIR (once) the group's CA, ca.pem + ca.key (keep ca.key on this machine only, or
# offline), then for each ADDRESS (a host's [cluster] listen address, IP or DNS name, without
# the port) ADDRESS.pem + ADDRESS.key: a certificate signed by the CA naming that address, good
# for both ends of a connection (the leader shows its own to followers). Copy ca.pem,
# ADDRESS.pem and ADDRESS.key to that host (mode 0600 for the key) and name them in its
# [cluster] table as tls_ca_file, tls_cert_file, tls_key_file. Run again with new addresses to
# add hosts; an existing CA is reused.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR ADDRESS..." >&2; exit 2; }
dir=$1; shift
command -v openssl >/dev/null || { echo "openssl is missing: apt-get install openssl" >&2; exit 3; }
umask 077
mkdir -p "$dir"
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=dankserve group CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for address in "$@"; do
  case "$address" in
    *[!0-9.]* ) case "$address" in *:*) san="IP:$address" ;; *) san="DNS:$address" ;; esac ;;
    * ) san="IP:$address" ;;
  esac
  ext=$(mktemp)
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' "$san" > "$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$address" \
    -keyout "$dir/$address.key" -out "$dir/$address.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$address.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 1825 -extfile "$ext" -out "$dir/$address.pem" 2>/dev/null
  rm -f "$ext" "$dir/$address.csr"
  echo "$dir/$address.pem $dir/$address.key ($san)"
done
