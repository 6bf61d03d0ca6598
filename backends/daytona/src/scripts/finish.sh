# sh -c SCRIPT berth-finish TEMP TARGET MODE: publishes an uploaded temp file (absolute
# paths the caller resolved with write.sh): its mode, then a rename over the target.
chmod "$3" -- "$1" || exit 1
mv -f -T -- "$1" "$2" || exit 1
echo berth-ok
