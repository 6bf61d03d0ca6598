# Run as the sandbox's root at every provision (create or adoption), idempotent:
# set -- AGENT_UID AGENT_GID HOLDER_UID HOLDER_GID
# Makes the workspace root (owned by the agent user) and Berth's state directory: `stage`
# (root's uploads, 0711: the agent may read a file it is told the name of, never list,
# create or replace one) and one private run directory per user (0700).
set -e
[ ! -L "$W" ] || { echo "berth-error escape" >&2; exit 86; }
mkdir -p -- "$W"
chown -h "$1:$2" -- "$W"
mkdir -p -- "$S/stage"
chown -h 0:0 -- "$S" "$S/stage"
chmod 0755 -- "$S"
chmod 0711 -- "$S/stage"
for user in "$1:$2" "$3:$4"; do
	run=$S/run-${user%%:*}
	mkdir -p -- "$run"
	chown -h "$user" -- "$run"
	chmod 0700 -- "$run"
done
