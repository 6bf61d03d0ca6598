# Secret holder (its own container: another uid, no workspace): set -- NONCE DIR NENV
# NAME=VALUE... ARGV... DIR is the private directory a pinned program was staged in
# (stage.sh), or "-" for a fresh one (ARGV[0] is then a program of the image). DIR becomes
# HOME and the cwd.
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
umask 077
if [ "$dir" = - ]; then
	dir=$(mktemp -d /tmp/berth-secret.XXXXXXXX) || berth_fail private
fi
cd -- "$dir" || berth_fail private
HOME=$dir
export HOME
