# sh -c SCRIPT berth-generation GENFILE GENERATION ROOT: the adoption of a sandbox at
# GENERATION. Refuses ("berth-fenced HELD") when the record holds a newer one; otherwise
# records GENERATION (atomically), makes sure the workspace root exists and prints
# "berth-ok".
genfile=$1
held=
[ -r "$genfile" ] && read -r held <"$genfile"
case $held in
'' | *[!0-9]*) ;;
*)
	if [ "$held" -gt "$2" ]; then
		echo "berth-fenced $held"
		exit 0
	fi
	;;
esac
mkdir -p -- "${genfile%/*}" "$3" || exit 1
printf '%s\n' "$2" >"$genfile.tmp.$$" && mv -f -- "$genfile.tmp.$$" "$genfile" || exit 1
echo berth-ok
