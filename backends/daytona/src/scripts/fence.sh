# berth_fence GENERATION GENFILE: fails with "fenced HELD" when the sandbox's recorded
# generation is newer than this handle's (a newer gateway adopted the sandbox).
berth_fence() {
	held=
	[ -r "$2" ] && read -r held <"$2"
	case $held in
	'' | *[!0-9]*) ;;
	*) [ "$held" -le "$1" ] || berth_fail "fenced $held" ;;
	esac
}
