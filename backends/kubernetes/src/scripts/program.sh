# Checks that "$1" (ARGV[0]) can be started: a path must be an executable file, a name must
# be found on PATH.
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
