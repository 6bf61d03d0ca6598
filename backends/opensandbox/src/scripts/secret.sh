# Prelude of a secret-holding process (SpawnRole::SecretHolder), run as the secret-holder
# user, never the workspace user: set -- NONCE CWD INPUT LIMIT PIN ARGV...
# Makes a private directory (0700, a fresh random name under /tmp: mkdir fails on a name the
# agent squatted) for HOME and cwd. With a PIN (64 hex digits; "-" for none), ARGV[0] is a
# workspace path relative to CWD: it is copied into the private directory, the copy's
# SHA-256 checked against PIN and the copy run, so a program swapped after the check is
# never run. Without one, ARGV[0] must resolve outside the workspace to a file that it and
# every directory above are owned by root and writable by no one else; the resolved path is
# run (through a link in the private directory that keeps ARGV[0]'s name for busybox
# applets), never ARGV[0] again, so a symlink re-pointed after the check is moot. Fails like
# spawn.sh ("berth-NONCE fail KIND"); run.sh runs ARGV.
nonce=$1
dir=$2
input=$3
limit=$4
pin=$5
shift 5
umask 077
berth_fail() {
	[ -z "${home:-}" ] || rm -rf -- "$home"
	printf 'berth-%s fail %s\n' "$nonce" "$1" >&2
	exit 127
}
# Private directories of earlier servers that are gone: the name carries the server's pid
# (this shell's, kept by exec), so a directory is never without its owner's pid, even while
# another start is making it. Only our own are touched; a symlink the agent planted is
# removed as a link, never followed.
for old in /tmp/berth-secret.*; do
	[ -d "$old" ] && [ ! -L "$old" ] && [ -O "$old" ] || continue
	oldpid=${old#/tmp/berth-secret.}
	oldpid=${oldpid%%.*}
	[ -d "/proc/$oldpid" ] || rm -rf -- "$old"
done
home=$(mktemp -d "/tmp/berth-secret.$$.XXXXXX") || berth_fail private
chmod 0700 "$home" || berth_fail private
if [ "$pin" != - ]; then
	case $1 in
	/*) berth_fail noprogram ;;
	esac
	berth_resolve "$dir" 0
	base=$R
	berth_resolve "${base:+$base/}$1" 0
	[ -f "$W/$R" ] || berth_fail noprogram
	# The copy is what runs: what the agent does to the original from now on is moot.
	cp -- "$W/$R" "$home/program" 2>/dev/null || berth_fail noprogram
	sum=$(sha256sum "$home/program") || berth_fail noprogram
	# The digest of a wrong copy is never printed (it could be of a file holding secrets).
	[ "${sum%% *}" = "$pin" ] || berth_fail pinmismatch
	chmod 0500 "$home/program" || berth_fail private
	# A noexec /tmp (a read-only root's tmpfs made without `exec`) would fail at exec.
	[ -x "$home/program" ] || berth_fail noexec
	shift
	set -- "$home/program" "$@"
else
	program=
	case $1 in
	/*) program=$1 ;;
	*/*) berth_fail inworkspace ;;
	*)
		set -f
		IFS=:
		for entry in $PATH; do
			case $entry in /*) ;; *) continue ;; esac
			if [ -f "$entry/$1" ] && [ -x "$entry/$1" ]; then
				program=$entry/$1
				break
			fi
		done
		unset IFS
		set +f
		;;
	esac
	[ -n "$program" ] && [ -f "$program" ] && [ -x "$program" ] || berth_fail noprogram
	real=$(readlink -f -- "$program") || berth_fail noprogram
	case $real in
	"$W" | "$W"/*) berth_fail inworkspace ;;
	esac
	# A system program: the file and every directory above it owned by root and writable
	# by no one else (the agent can write /tmp, and a directory it owns anywhere outside
	# the workspace), so nothing can be swapped in between this check and the exec.
	path=$real
	while :; do
		owner=$(stat -c '%u %A' -- "${path:-/}") || berth_fail noprogram
		case $owner in
		'0 '?????w???? | '0 '????????w?) berth_fail notsystem ;;
		'0 '*) ;;
		*) berth_fail notsystem ;;
		esac
		[ -n "$path" ] || break
		path=${path%/*}
	done
	# What runs is the checked path, never the name given (a symlink the agent can
	# re-point): a link to it in the private directory keeps the name, which multi-call
	# binaries (busybox) read to pick their applet.
	mkdir -- "$home/bin" || berth_fail private
	ln -s -- "$real" "$home/bin/${program##*/}" || berth_fail private
	shift
	set -- "$home/bin/${program##*/}" "$@"
fi
cd -- "$home" || berth_fail private
export HOME="$home"
export TMPDIR="$home"
