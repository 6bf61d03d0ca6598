#!/usr/bin/env bash
# Writes the compose cluster's credentials into a folder (default ./secrets beside this
# script, ignored by git), one sub-folder per service holding only what that service needs:
#
#   pki/                       everything, made by ../certs/make-dev-certs.sh (the CA and its
#                              key, every certificate and key, the node credential key, each
#                              node's credential) and the etcd passwords; mounted by nobody
#   tokens.toml                three random bearer tokens: an admin, a service acting for
#                              users, and a user `alice` (an existing file is kept)
#   replicaN/                  ca.pem, tls.pem/.key (serverAuth + clientAuth, SAN replicaN),
#                              node-credential.key, tokens.toml, etcd.password (etcd user berth)
#   nodeN/                     ca.pem, tls.pem/.key (serverAuth, SAN nodeN), node.credential
#   etcdN/                     ca.pem, tls.pem/.key (serverAuth + clientAuth, SAN etcdN)
#   etcd-init/                 ca.pem, root.pem/.key (CN root), root.password, berth.password
#
# Existing keys, certificates, passwords and tokens are kept, so running it twice changes
# nothing; the per-service folders are copied again from pki/ each run.
#
# Usage: deploy/compose/make-secrets.sh [DIR [NODE_ID...]]   (default nodes: node1 … node5)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:-$here/secrets}"
shift || true
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(node1 node2 node3 node4 node5)
replicas=(replica1 replica2 replica3)
members=(etcd1 etcd2 etcd3)
umask 077
mkdir -p "$dir/pki"
chmod 0700 "$dir"

# Keeps the CA and what it issued; nodes named for the first time are issued by it, so an
# added node joins the running cluster.
REPLICAS="${replicas[*]}" ETCD_MEMBERS="${members[*]}" "$here/../certs/make-dev-certs.sh" "$dir/pki" "${nodes[@]}" >/dev/null
"$here/../certs/make-dev-secrets.sh" "$dir/tokens.toml" "$dir/pki/etcd-root.password" "$dir/pki/etcd-berth.password"

# folder NAME SOURCE:TARGET...: a fresh per-service folder holding copies of exactly these.
folder() {
    local name=$1 pair
    shift
    rm -rf "${dir:?}/$name"
    mkdir -p "$dir/$name"
    for pair in "$@"; do
        cp "$dir/${pair%%:*}" "$dir/$name/${pair##*:}"
    done
}
for replica in "${replicas[@]}"; do
    folder "$replica" pki/ca.pem:ca.pem "pki/$replica.pem:tls.pem" "pki/$replica.key:tls.key" \
        pki/node-credential.key:node-credential.key tokens.toml:tokens.toml pki/etcd-berth.password:etcd.password
done
for node in "${nodes[@]}"; do
    folder "$node" pki/ca.pem:ca.pem "pki/$node.pem:tls.pem" "pki/$node.key:tls.key" "pki/$node.credential:node.credential"
done
for member in "${members[@]}"; do
    folder "$member" pki/ca.pem:ca.pem "pki/$member.pem:tls.pem" "pki/$member.key:tls.key"
done
folder etcd-init pki/ca.pem:ca.pem pki/etcd-root.pem:root.pem pki/etcd-root.key:root.key \
    pki/etcd-root.password:root.password pki/etcd-berth.password:berth.password
# The containers run as root and read these through read-only bind mounts; on the host they
# stay private to their owner.
echo "$dir"
