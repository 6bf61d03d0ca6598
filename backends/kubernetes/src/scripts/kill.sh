# set -- NONCE: SIGKILLs the session of the process run.sh started for NONCE and every
# process whose environment carries BERTH_EXEC_ID=NONCE (a child that left the session
# keeps it), until a sweep finds none. Builtins only (no fork per process).
marker="BERTH_EXEC_ID=$1"
sid=
[ -r "$S/run/$1/pid" ] && read -r sid <"$S/run/$1/pid"
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
		if [ -n "$sid" ] && [ "$4" = "$sid" ]; then
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
