#!/usr/bin/env bash
# Writes the compose cluster's secrets into a folder (default ./secrets beside this script,
# ignored by git): node.secret (shared by replicas and node agents) and tokens.toml with
# three random bearer tokens — an admin, a service acting for users, and a user `alice`.
# Existing files are kept, so running it twice changes nothing.
#
# Usage: deploy/compose/make-secrets.sh [DIR]
set -euo pipefail
dir="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/secrets}"
mkdir -p "$dir"
chmod 0755 "$dir"
random() { head -c 32 /dev/urandom | base64 | tr -d '/+=' | head -c 40; }
if [ ! -s "$dir/node.secret" ]; then
    random >"$dir/node.secret"
fi
if [ ! -s "$dir/tokens.toml" ]; then
    cat >"$dir/tokens.toml" <<TOML
[[token]]
secret = "$(random)"
admin = true
name = "ops"

[[token]]
secret = "$(random)"
service = "agent-platform"
act_for_users = true

[[token]]
secret = "$(random)"
user = "alice"
TOML
fi
# Read by root inside the containers through a read-only bind mount.
chmod 0644 "$dir/node.secret" "$dir/tokens.toml"
echo "$dir"
