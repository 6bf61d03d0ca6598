#!/usr/bin/env bash
# Makes a development PKI for Berth with the openssl CLI (P-256 keys, 1 year):
#   ca.pem / ca.key            the cluster CA
#   replica.pem / replica.key  client certificate replicas present to node agents (mTLS)
#   <node>.pem / <node>.key    server certificate per node agent (SAN: the name, localhost,
#                              127.0.0.1), also usable for a replica's public --tls-cert
#
# Usage: deploy/certs/make-dev-certs.sh OUT_DIR [NODE_NAME...]   (default node name: node)
#
#   berth node-agent --tls-cert OUT/node.pem --tls-key OUT/node.key --client-ca-cert OUT/ca.pem ...
#   berth control-plane --node-ca-cert OUT/ca.pem \
#       --node-client-cert OUT/replica.pem --node-client-key OUT/replica.key ...
#
# Development only: the CA key sits next to the certificates, unencrypted.
set -euo pipefail
out=${1:?usage: make-dev-certs.sh OUT_DIR [NODE_NAME...]}
shift
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(node)
mkdir -p "$out"
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 365 -subj "/CN=berth-dev-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# issue NAME EXTENSIONS: a key and a certificate signed by the CA.
issue() {
  local name=$1 extensions=$2
  key "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "/CN=$name" 2>/dev/null
  printf '%b\n' "$extensions" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.pem" -days 365 \
    -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

issue replica "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\nsubjectAltName=DNS:replica"
for node in "${nodes[@]}"; do
  issue "$node" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:$node,DNS:localhost,IP:127.0.0.1"
done
rm -f ca.srl
echo "dev certificates in $(pwd): ca.pem replica.pem ${nodes[*]/%/.pem}"
