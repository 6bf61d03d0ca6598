# Agent process: set -- NONCE CWD NENV NAME=VALUE... ARGV... (NENV pairs of env)
# Resolves CWD inside the workspace, checks that ARGV[0] can be found (else reports
# "berth-NONCE fail KIND" on stderr and exits 127), then run.sh runs it.
nonce=$1
dir=$2
nenv=$3
shift 3
berth_fail() {
	printf 'berth-%s fail %s\n' "$nonce" "$1" >&2
	exit 127
}
while [ "$nenv" -gt 0 ]; do
	export "$1" || berth_fail env
	shift
	nenv=$((nenv - 1))
done
berth_resolve "$dir" 0
if [ ! -d "$W/$R" ]; then
	[ ! -e "$W/$R" ] || berth_fail notdir
	berth_fail notfound
fi
cd -- "$W/$R" || berth_fail notfound
