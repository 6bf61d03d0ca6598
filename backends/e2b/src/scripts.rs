//! The shell scripts run through envd: the wrapper of every spawned process and the kill
//! sweep. Arguments are always positional (never spliced into a script).

/// `sh -c SPAWN berth-spawn NONCE GENERATION GENERATION_FILE ARGV...`: refuses when the
/// sandbox's recorded generation is newer than this handle's (a newer gateway adopted it),
/// checks that ARGV[0] can be found, reports `NONCE ok PID` (or `NONCE fail KIND`) as the
/// first line on stderr, and execs ARGV as the leader of a new session (`setsid`, which
/// does not fork: envd's process is no group leader), so the process keeps envd's pid and
/// its session is what a kill sweeps. The cwd was resolved inside the root by the caller.
pub const SPAWN: &str = r#"nonce=$1
gen=$2
genfile=$3
shift 3
berth_fail() {
	printf '%s fail %s\n' "$nonce" "$1" >&2
	exit 127
}
held=
[ -r "$genfile" ] && read -r held <"$genfile"
case $held in
'' | *[!0-9]*) ;;
*) [ "$held" -le "$gen" ] || berth_fail "fenced $held" ;;
esac
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
read -r stat </proc/$$/stat
rest=${stat##*) }
rest=${rest#* }
rest=${rest#* }
pgrp=${rest%% *}
printf '%s ok %s\n' "$nonce" "$$" >&2
if [ "$pgrp" != "$$" ] && command -v setsid >/dev/null 2>&1; then
	exec setsid "$@"
fi
exec "$@"
"#;

/// `sh -c SECRET berth-secret NONCE GENERATION GENERATION_FILE PIN ARGV...`: a secret
/// holder, run as root through envd: a fresh 0700 directory under `/tmp` becomes its
/// `HOME` and cwd; with a PIN (hex SHA-256, `-` for none) ARGV[0] — an absolute path the
/// caller resolved inside the workspace — is copied there, checked against the pin
/// (`NONCE fail pin` on a mismatch) and run as that copy, which the agent cannot write.
/// Without a pin ARGV[0] is a system program (the caller refused workspace paths).
pub const SECRET: &str = r#"nonce=$1
gen=$2
genfile=$3
pin=$4
shift 4
berth_fail() {
	printf '%s fail %s
' "$nonce" "$1" >&2
	exit 127
}
held=
[ -r "$genfile" ] && read -r held <"$genfile"
case $held in
'' | *[!0-9]*) ;;
*) [ "$held" -le "$gen" ] || berth_fail "fenced $held" ;;
esac
umask 077
dir=$(mktemp -d /tmp/berth-secret.XXXXXXXX) || berth_fail noprogram
if [ "$pin" != - ]; then
	[ -f "$1" ] || berth_fail noprogram
	cp -- "$1" "$dir/program" || berth_fail noprogram
	sum=$(sha256sum -- "$dir/program") || berth_fail noprogram
	[ "${sum%% *}" = "$pin" ] || berth_fail pin
	chmod 0700 -- "$dir/program" || berth_fail noprogram
	shift
	set -- "$dir/program" "$@"
else
	command -v -- "$1" >/dev/null 2>&1 || berth_fail noprogram
fi
cd -- "$dir" || berth_fail noprogram
HOME=$dir
export HOME
read -r stat </proc/$$/stat
rest=${stat##*) }
rest=${rest#* }
rest=${rest#* }
pgrp=${rest%% *}
printf '%s ok %s
' "$nonce" "$$" >&2
if [ "$pgrp" != "$$" ] && command -v setsid >/dev/null 2>&1; then
	exec setsid "$@"
fi
exec "$@"
"#;

/// `sh -c KILL berth-kill SID MARKER`: SIGKILLs every process of session SID and every
/// process whose environment carries `BERTH_EXEC_ID=MARKER` (a child that left the session
/// keeps it), until a sweep finds none. Builtins only (no fork per process).
pub const KILL: &str = r#"sid=$1
marker="BERTH_EXEC_ID=$2"
self=$$
round=0
while [ "$round" -lt 100 ]; do
	round=$((round + 1))
	found=0
	for entry in /proc/[0-9]*; do
		pid=${entry#/proc/}
		[ "$pid" != "$self" ] || continue
		{ read -r stat <"$entry/stat"; } 2>/dev/null || continue
		set -f
		set -- ${stat##*) }
		set +f
		[ "$1" != Z ] || continue
		hit=
		if [ "$4" = "$sid" ]; then
			hit=1
		elif [ -r "$entry/environ" ]; then
			case "$(tr '\0' '\n' <"$entry/environ" 2>/dev/null)" in
			*"$marker"*) hit=1 ;;
			esac
		fi
		if [ -n "$hit" ] && kill -9 "$pid" 2>/dev/null; then
			found=1
		fi
	done
	[ "$found" = 0 ] && exit 0
done
exit 1
"#;

/// Prints a symlink's target exactly (a trailing newline of the target survives).
pub const READLINK: &str = r#"readlink -- "$1" && printf ."#;
