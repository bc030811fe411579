#!/usr/bin/env bash
# Makes throwaway certificates for the TLS tests in DIR (EC P-256, valid 1 day):
#   ca.pem / ca.key                 a test CA
#   server.pem / server.key         signed by it, for localhost and 127.0.0.1
#   client.pem / client.key         signed by it, a client certificate
#   other-ca.pem, rogue.pem / .key  another CA and a client certificate signed by it
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
ec() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
ca() {  # ca NAME SUBJECT
  ec "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 1 -out "$1.pem" 2>/dev/null
}
leaf() {  # leaf NAME CA SUBJECT EXTENSIONS
  ec "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "fedlearn test CA"
ca other-ca "some other CA"
leaf server ca localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client ca "agent-1" "extendedKeyUsage=clientAuth"
leaf rogue other-ca "agent-x" "extendedKeyUsage=clientAuth"
