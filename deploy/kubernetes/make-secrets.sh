#!/usr/bin/env bash
# Writes the Kubernetes deployment's credentials and per-node manifests into a folder
# (default ./secrets beside this script, ignored by git):
#
#   pki/           everything, made by ../certs/make-dev-certs.sh (the CA and its key, every
#                  certificate and key, the node credential key, each node's credential) and
#                  the etcd passwords; applied to nothing
#   tokens.toml    three random bearer tokens: an admin, a service acting for users, and a
#                  user `alice` (an existing file is kept)
#   secrets.yaml   the Secrets, each holding only what its pods need:
#                    berth-etcd        ca.pem, etcd-N.pem/.key (serverAuth + clientAuth; SANs
#                                      etcd-N.etcd.berth.svc) for the etcd StatefulSet
#                    berth-etcd-init   ca.pem, root.pem/.key (CN root), root.password,
#                                      berth.password for the etcd-init Job
#                    berth-replicas    ca.pem, replica-N.pem/.key (serverAuth + clientAuth;
#                                      SANs replica-N.replica.berth.svc, berth.berth.svc),
#                                      tokens.toml, node-credential.key, etcd.password
#                    berth-node-<node> ca.pem, tls.pem/.key (serverAuth; SANs the node id and
#                                      berth-node-<node>.berth.svc), node.credential
#   nodes.yaml     ../node-agent.yaml.tmpl once per node: a headless Service and a
#                  one-pod Deployment pinned to that Kubernetes node
#
# Existing keys, certificates, passwords and tokens are kept, so running it again with one
# more node name adds that node to the same cluster (apply both files again).
#
#   deploy/kubernetes/make-secrets.sh OUT worker-1 worker-2 worker-3   # Kubernetes node names
#   kubectl apply -f deploy/kubernetes/00-namespace.yaml
#   kubectl apply -f OUT/secrets.yaml -f deploy/kubernetes/ -f OUT/nodes.yaml
#
# REPLICAS (default 3) is how many replica certificates there are: the StatefulSet `replica`
# can scale up to that many.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage="usage: make-secrets.sh OUT_DIR NODE_NAME... (the Kubernetes nodes that run a node agent)"
dir="${1:?$usage}"
shift
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
nodes=("$@")
count=${REPLICAS:-3}
[[ $count =~ ^[1-9][0-9]*$ ]] || { echo "make-secrets.sh: REPLICAS=$count is not a positive number" >&2; exit 2; }
replicas=() members=(etcd-0 etcd-1 etcd-2)
for ((i = 0; i < count; i++)); do replicas+=("replica-$i"); done

# A node's name in the objects made for it: a Kubernetes node name is a DNS subdomain, a
# Service name a DNS label (no dots, at most 63 characters with the berth-node- prefix).
slug_of() {
    local node=$1 slug
    if ! [[ $node =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || [[ $node == *..* ]]; then
        echo "make-secrets.sh: $node is not a Kubernetes node name (lowercase DNS subdomain)" >&2
        return 1
    fi
    slug=${node//./-}
    if [ ${#slug} -gt 52 ]; then
        echo "make-secrets.sh: node name $node is too long for a Service name (berth-node-$slug)" >&2
        return 1
    fi
    printf '%s' "$slug"
}
declare -A slugs=()
for node in "${nodes[@]}"; do
    slug=$(slug_of "$node")
    if [ -n "${slugs[$slug]:-}" ]; then
        echo "make-secrets.sh: nodes ${slugs[$slug]} and $node both become berth-node-$slug" >&2
        exit 2
    fi
    slugs[$slug]=$node
done

umask 077
mkdir -p "$dir/pki"
chmod 0700 "$dir"
# Each node with the Service name its certificate must hold (the first run also makes the
# CA, the replicas' and the etcd members' certificates). make-dev-certs.sh keeps what exists.
for node in "${nodes[@]}"; do
    slug=$(slug_of "$node")
    REPLICAS="${replicas[*]}" ETCD_MEMBERS="${members[*]}" \
        REPLICA_SANS='DNS:{name}.replica.berth.svc,DNS:{name}.replica,DNS:berth.berth.svc,DNS:berth' \
        ETCD_SANS='DNS:{name}.etcd.berth.svc,DNS:{name}.etcd' \
        NODE_SANS="DNS:berth-node-$slug.berth.svc,DNS:berth-node-$slug" \
        "$here/../certs/make-dev-certs.sh" "$dir/pki" "$node" >/dev/null
done
"$here/../certs/make-dev-secrets.sh" "$dir/tokens.toml" "$dir/pki/etcd-root.password" "$dir/pki/etcd-berth.password"

# secret NAME KEY:FILE...: a Secret holding each FILE (relative to $dir) under KEY.
secret() {
    local name=$1 pair
    shift
    printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: berth\n' "$name"
    printf '  labels:\n    app.kubernetes.io/part-of: berth\ntype: Opaque\ndata:\n'
    for pair in "$@"; do
        printf '  %s: %s\n' "${pair%%:*}" "$(base64 -w0 <"$dir/${pair#*:}")"
    done
}
{
    echo "# Made by deploy/kubernetes/make-secrets.sh; holds private keys and tokens: apply, do not commit."
    etcd=(ca.pem:pki/ca.pem)
    for member in "${members[@]}"; do etcd+=("$member.pem:pki/$member.pem" "$member.key:pki/$member.key"); done
    secret berth-etcd "${etcd[@]}"
    secret berth-etcd-init ca.pem:pki/ca.pem root.pem:pki/etcd-root.pem root.key:pki/etcd-root.key \
        root.password:pki/etcd-root.password berth.password:pki/etcd-berth.password
    replica_files=(ca.pem:pki/ca.pem tokens.toml:tokens.toml node-credential.key:pki/node-credential.key
        etcd.password:pki/etcd-berth.password)
    for replica in "${replicas[@]}"; do
        replica_files+=("$replica.pem:pki/$replica.pem" "$replica.key:pki/$replica.key")
    done
    secret berth-replicas "${replica_files[@]}"
    for node in "${nodes[@]}"; do
        secret "berth-node-$(slug_of "$node")" ca.pem:pki/ca.pem "tls.pem:pki/$node.pem" "tls.key:pki/$node.key" \
            "node.credential:pki/$node.credential"
    done
} >"$dir/secrets.yaml.new"
mv "$dir/secrets.yaml.new" "$dir/secrets.yaml"

{
    echo "# Made by deploy/kubernetes/make-secrets.sh from node-agent.yaml.tmpl, one agent per node."
    for node in "${nodes[@]}"; do
        echo "---"
        sed -e "s/@NODE@/$node/g" -e "s/@SLUG@/$(slug_of "$node")/g" "$here/node-agent.yaml.tmpl"
    done
} >"$dir/nodes.yaml.new"
chmod 0644 "$dir/nodes.yaml.new"
mv "$dir/nodes.yaml.new" "$dir/nodes.yaml"
echo "$dir: secrets.yaml (${#replicas[@]} replicas, ${#nodes[@]} nodes), nodes.yaml"
