# Prelude of an agent process: set -- NONCE CWD INPUT LIMIT ARGV... (LIMIT: bytes of each
# output stream worth encoding, -1 for all)
# Resolves CWD inside the workspace and checks that ARGV[0] can be found (else reports
# "berth-NONCE fail KIND" on stderr and exits 127); run.sh does the rest.
nonce=$1
dir=$2
input=$3
limit=$4
shift 4
berth_fail() {
	printf 'berth-%s fail %s\n' "$nonce" "$1" >&2
	exit 127
}
berth_resolve "$dir" 0
if [ ! -d "$W/$R" ]; then
	[ ! -e "$W/$R" ] || berth_fail notdir
	berth_fail notfound
fi
cd -- "$W/$R" || berth_fail notfound
case $1 in
*/*)
	[ -f "$1" ] && [ -x "$1" ] || berth_fail noprogram
	;;
*)
	found=
	set -f
	IFS=:
	for entry in $PATH; do
		if [ -f "${entry:-.}/$1" ] && [ -x "${entry:-.}/$1" ]; then
			found=1
			break
		fi
	done
	unset IFS
	set +f
	[ -n "$found" ] || berth_fail noprogram
	;;
esac
