# sh -c SCRIPT berth-kill SID MARKER: SIGKILLs every process of session SID and every
# process whose environment carries BERTH_EXEC_ID=MARKER (a child that left the session
# keeps it), until a sweep finds none. Prints berth-killed when done.
sid=$1
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
	if [ "$found" = 0 ]; then
		echo berth-killed
		exit 0
	fi
done
echo berth-kill-incomplete
exit 1
