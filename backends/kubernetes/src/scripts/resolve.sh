# berth_resolve REL CREATE: resolves REL (a clean relative path) below $W inside the
# container, following symlinks hop by hop the way the host backends do through cap-std:
# an absolute link target, a `..` above the root or more than 40 hops is an escape. Sets R
# to the resolved relative path ("" for the root). With CREATE=1, missing intermediate
# directories are created and remembered for berth_rollback. Calls berth_fail KIND on error.
# W (the mount point) is set by the line Rust puts before this file.
ncreated=0
berth_resolve() {
	todo=$1
	create=$2
	cur=
	hops=0
	while [ -n "$todo" ]; do
		case $todo in
		*/*)
			comp=${todo%%/*}
			todo=${todo#*/}
			;;
		*)
			comp=$todo
			todo=
			;;
		esac
		case $comp in
		'' | .) continue ;;
		..)
			[ -n "$cur" ] || berth_fail escape
			case $cur in
			*/*) cur=${cur%/*} ;;
			*) cur= ;;
			esac
			continue
			;;
		esac
		next=${cur:+$cur/}$comp
		if [ -L "$W/$next" ]; then
			hops=$((hops + 1))
			[ "$hops" -le 40 ] || berth_fail escape
			link=$(readlink -- "$W/$next") || berth_fail notfound
			case $link in /*) berth_fail escape ;; esac
			todo=$link${todo:+/$todo}
			continue
		fi
		if [ -n "$todo" ] && [ ! -d "$W/$next" ]; then
			[ ! -e "$W/$next" ] || berth_fail notdir
			[ "$create" = 1 ] || berth_fail notfound
			mkdir -- "$W/$next" || berth_fail io
			ncreated=$((ncreated + 1))
			eval "created_$ncreated=\$next"
		fi
		cur=$next
	done
	R=$cur
}

# Removes the directories berth_resolve created, innermost first (only while empty).
berth_rollback() {
	while [ "$ncreated" -gt 0 ]; do
		eval "rmdir -- \"\$W/\$created_$ncreated\"" 2>/dev/null
		ncreated=$((ncreated - 1))
	done
}
