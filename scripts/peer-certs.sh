#!/usr/bin/env bash
# Certificates for the peer plane's mutual TLS (railyardd --peer_tls_cert/--peer_tls_key/
# --peer_tls_ca), made with the openssl CLI: for tests, benchmarks and trying a cluster out.
#
#   scripts/peer-certs.sh OUTDIR NODE[=IP,...]...
#
# OUTDIR gets a cluster CA (ca.pem, ca-key.pem) unless it has one already, and per NODE a
# certificate NODE.pem and key NODE-key.pem signed by it: EC P-256, subjectAltName DNS:NODE plus
# IP:127.0.0.1 (or the IPs given after '='), extendedKeyUsage serverAuth+clientAuth, valid 30
# days, keys mode 0600. A NODE may be a wildcard ('*.example.com': files '_.example.com.pem').
# Idempotent: an existing node certificate is kept when the CA verifies it and it names NODE and
# the IPs; otherwise it is made again. Two OUTDIRs are two unrelated CAs.
set -euo pipefail

die() {
  echo "peer-certs.sh: $*" >&2
  exit 2
}

command -v openssl >/dev/null 2>&1 ||
  die "the openssl command is missing (Debian: apt-get install openssl)"
[ $# -ge 2 ] || die "usage: peer-certs.sh OUTDIR NODE[=IP,...]... (at least one NODE)"

out=$1
shift
mkdir -p "$out"
umask 077
days=30

if [ ! -s "$out/ca.pem" ] || [ ! -s "$out/ca-key.pem" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca-key.pem.tmp" 2>/dev/null ||
    die "openssl could not make the CA key in $out"
  openssl req -new -x509 -key "$out/ca-key.pem.tmp" -out "$out/ca.pem.tmp" -days "$days" \
    -subj "/CN=railyard peer CA $(basename "$out") $$" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null ||
    die "openssl could not make the CA certificate in $out"
  chmod 0600 "$out/ca-key.pem.tmp"
  chmod 0644 "$out/ca.pem.tmp"
  mv "$out/ca-key.pem.tmp" "$out/ca-key.pem"
  mv "$out/ca.pem.tmp" "$out/ca.pem"
fi

for spec in "$@"; do
  node=${spec%%=*}
  ips=127.0.0.1
  [ "$spec" != "$node" ] && ips=${spec#*=}
  [ -n "$node" ] || die "empty node name in '$spec'"
  [[ "$node" =~ ^(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] ||
    die "'$node' is not a DNS name (letters, digits, '-', '.'; or '*.' then one)"
  file=${node//\*/_}
  san="DNS:$node"
  IFS=, read -ra iplist <<<"$ips"
  for ip in "${iplist[@]}"; do
    [ -n "$ip" ] && san="$san,IP:$ip"
  done
  cert="$out/$file.pem" key="$out/$file-key.pem"
  if [ -s "$cert" ] && [ -s "$key" ] &&
    openssl verify -CAfile "$out/ca.pem" "$cert" >/dev/null 2>&1 &&
    openssl x509 -in "$cert" -noout -ext subjectAltName 2>/dev/null |
    tr -d ' \n' | grep -qxF "X509v3SubjectAlternativeName:${san//IP:/IPAddress:}"; then
    continue # already there, as asked
  fi
  openssl ecparam -name prime256v1 -genkey -noout -out "$key.tmp" 2>/dev/null ||
    die "openssl could not make the key of $node"
  openssl req -new -key "$key.tmp" -out "$out/$file.csr" -subj "/CN=$node" 2>/dev/null ||
    die "openssl could not make the request of $node"
  cat >"$out/$file.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EOF
  openssl x509 -req -in "$out/$file.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
    -CAcreateserial -out "$cert.tmp" -days "$days" -sha256 -extfile "$out/$file.ext" \
    2>/dev/null || die "openssl could not sign the certificate of $node ($san)"
  rm -f "$out/$file.csr" "$out/$file.ext"
  chmod 0600 "$key.tmp"
  chmod 0644 "$cert.tmp"
  mv "$key.tmp" "$key"
  mv "$cert.tmp" "$cert"
done
