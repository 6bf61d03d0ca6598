#!/usr/bin/env bash
# The random secrets of a development cluster, beside make-dev-certs.sh's certificates:
#   TOKENS_FILE      three bearer tokens for --tokens-file: an admin (`ops`), a service
#                    acting for users (`agent-platform`) and a user `alice`
#   PASSWORD_FILE…   one random password each (e.g. etcd users')
# A file that exists and is not empty is kept, so running it again changes nothing.
#
# Usage: deploy/certs/make-dev-secrets.sh TOKENS_FILE [PASSWORD_FILE...]
set -euo pipefail
tokens=${1:?usage: make-dev-secrets.sh TOKENS_FILE [PASSWORD_FILE...]}
shift
umask 077

random() { head -c 32 /dev/urandom | base64 | tr -d '/+=' | head -c 40; }

for password in "$@"; do
    [ -s "$password" ] || random >"$password"
done
if [ ! -s "$tokens" ]; then
    cat >"$tokens" <<TOML
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
