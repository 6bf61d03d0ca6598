#!/usr/bin/env bash
# Makes a development PKI and node credentials for Berth with the openssl CLI (P-256 keys,
# 1 year):
#   ca.pem / ca.key              the cluster CA
#   <replica>.pem / .key         per replica (REPLICAS, default "replica"): serverAuth for its
#                                public --tls-cert and clientAuth for mutual TLS towards
#                                node agents; SAN the name, localhost, 127.0.0.1
#   <node>.pem / .key            per node agent: serverAuth only (so a node's certificate is
#                                no client certificate for another node); SAN the node id,
#                                localhost, 127.0.0.1
#   <member>.pem / .key          per etcd member (ETCD_MEMBERS, default none): serverAuth and
#                                clientAuth (members are each other's peers over TLS); SAN the
#                                name, localhost, 127.0.0.1
#   etcd-root.pem / .key         with ETCD_MEMBERS: clientAuth only, CN "root" — etcd maps a
#                                client certificate's CN to its user, so this is etcd's root for
#                                the step that turns authentication on; nobody else holds it
#   node-credential.key          the replicas' node credential key (kept if present)
#   <node>.credential            that node's own credential, derived from the key exactly as
#                                `berth node-credential --key-file node-credential.key
#                                --node-id <node>` does
#
# Usage: [REPLICAS="replica1 replica2"] [ETCD_MEMBERS="etcd1 etcd2"] \
#          deploy/certs/make-dev-certs.sh OUT_DIR [NODE_ID...]
#        (default node id: node)
#   REPLICA_SANS, NODE_SANS, ETCD_SANS   more subjectAltName entries for the certificates of
#        that kind issued by this run, comma-separated, `{name}` standing for the replica,
#        node or member (e.g. REPLICA_SANS='DNS:{name}.replica.berth.svc,DNS:berth'): the
#        names a Kubernetes Service or a load balancer gives them
#
#   berth control-plane --tls-cert OUT/replica.pem --tls-key OUT/replica.key \
#       --node-credential-key-file OUT/node-credential.key --node-ca-cert OUT/ca.pem \
#       --node-client-cert OUT/replica.pem --node-client-key OUT/replica.key ...
#   berth node-agent --node-id node --node-credential-file OUT/node.credential \
#       --tls-cert OUT/node.pem --tls-key OUT/node.key --client-ca-cert OUT/ca.pem \
#       --control-plane-ca-cert OUT/ca.pem ...
#
# Give each node only its own <node>.credential, <node>.key, <node>.pem and ca.pem; the
# key, ca.key and the replicas' keys stay with the replicas (ca.key with nobody).
# Development only: the CA key sits next to the certificates, unencrypted, and the node
# credential key passes through openssl's command line while the credentials are made.
set -euo pipefail
out=${1:?usage: make-dev-certs.sh OUT_DIR [NODE_ID...]}
shift
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(node)
read -r -a replicas <<<"${REPLICAS:-replica}"
read -r -a members <<<"${ETCD_MEMBERS:-}"
mkdir -p "$out"
cd "$out"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# A CA already in OUT_DIR is kept, and so is every certificate it issued there: running the
# script again with another node id adds that node to the same cluster.
if [ ! -s ca.pem ] || [ ! -s ca.key ]; then
  key ca.key
  openssl req -x509 -new -key ca.key -out ca.pem -days 365 -subj "/CN=berth-dev-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# issue NAME EXTENSIONS [CN]: a key and a certificate signed by the CA (CN defaults to NAME).
issue() {
  local name=$1 extensions=$2 cn=${3:-$1}
  [ -s "$name.pem" ] && [ -s "$name.key" ] && return
  key "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "/CN=$cn" 2>/dev/null
  printf '%b\n' "$extensions" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.pem" -days 365 \
    -extfile "$name.ext" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

# sans NAME EXTRA: the subjectAltName value for NAME, with EXTRA's {name} replaced by it.
sans() {
  local name=$1 extra=${2:-}
  printf 'DNS:%s,DNS:localhost,IP:127.0.0.1%s' "$name" "${extra:+,${extra//\{name\}/$name}}"
}
for replica in "${replicas[@]}"; do
  issue "$replica" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=$(sans "$replica" "${REPLICA_SANS:-}")"
done
for node in "${nodes[@]}"; do
  issue "$node" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=$(sans "$node" "${NODE_SANS:-}")"
done
for member in "${members[@]}"; do
  issue "$member" "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=$(sans "$member" "${ETCD_SANS:-}")"
done
if [ ${#members[@]} -gt 0 ]; then
  issue etcd-root "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth" root
fi
rm -f ca.srl

# The node credential key (64 hex digits) and each node's credential:
# berth-node.<id>.<hex HMAC-SHA256(key, "berth-node/v1/<id>")>.
[ -s node-credential.key ] || openssl rand -hex 32 >node-credential.key
credential_key=$(tr -d '[:space:]' <node-credential.key)
for node in "${nodes[@]}"; do
  mac=$(printf '%s' "berth-node/v1/$node" | openssl dgst -sha256 -hmac "$credential_key" | awk '{print $NF}')
  printf 'berth-node.%s.%s\n' "$node" "$mac" >"$node.credential"
done
# Readable by the test and compose users that mount them; keys stay private to the owner.
chmod 0644 ca.pem ./*.pem
echo "dev certificates in $(pwd): ca.pem ${replicas[*]/%/.pem} ${nodes[*]/%/.pem}${members:+ ${members[*]/%/.pem} etcd-root.pem}; node-credential.key ${nodes[*]/%/.credential}"
