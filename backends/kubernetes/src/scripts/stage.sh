# set -- NONCE: copies stdin into a fresh private staging file under $S/stage and prints
# its path (the first half of a write; write.sh is the second, stdin ending early leaves
# only the staged file, which the gateway removes).
umask 077
mkdir -p -m 0700 -- "$S/stage" 2>/dev/null
f=$S/stage/$1
set -C
cat >"$f" || { rm -f -- "$f"; exit 86; }
