#!/bin/sh
# check_layers.sh TABLE OBJ... — enforces libwaste's layering on compiled objects.
#
# TABLE is native/README.md: the rows between the lines "```layers" and "```", each
# "name: callee callee ...", where name is a source file without ".c" or several joined
# by "+" (one component, e.g. kernels+kernels_x86). From the objects' symbol tables (nm) it
# finds which component each undefined symbol belongs to and fails when
#   - an object is not on any row (a new file needs a row),
#   - a component calls one that its row does not list (a waste_* function of api.c
#     counts as a call into api: nothing inside the library calls the public API),
#   - the rows contain a cycle.
# Prints one line per violation and exits 1; prints a summary and exits 0 when clean.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 TABLE OBJ..." >&2; exit 2; }
table=$1; shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

awk '/^```layers[[:space:]]*$/ {on = 1; next} on && /^```/ {on = 0} on && NF' "$table" >"$tmp/rows"
[ -s "$tmp/rows" ] || { echo "check_layers: no \`\`\`layers table in $table" >&2; exit 2; }

# file -> component, and component -> allowed callees
awk -F: '{ n = split($1, f, "+"); gsub(/[[:space:]]/, "", f[1]);
           for (i = 1; i <= n; i++) { gsub(/[[:space:]]/, "", f[i]); print f[i], f[1] } }' "$tmp/rows" >"$tmp/comp"
awk -F: '{ split($1, f, "+"); gsub(/[[:space:]]/, "", f[1]); m = split($2, d, " ");
           for (i = 1; i <= m; i++) print f[1], d[i] }' "$tmp/rows" >"$tmp/allowed"

fail=0
: >"$tmp/defs"; : >"$tmp/uses"
for o in "$@"; do
    f=$(basename "$o" .o)
    if ! awk -v f="$f" '$1 == f {found = 1} END {exit !found}' "$tmp/comp"; then
        echo "check_layers: $f.c has no row in the layer table of $table"; fail=1
    fi
    nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 {print $3, f}' >>"$tmp/defs"
    nm -u "$o" | awk -v f="$f" '{print f, $NF}' >>"$tmp/uses"
done

# uses: caller-file symbol -> caller-comp callee-comp symbol, for symbols defined in the objects
awk 'FILENAME == ARGV[1] {comp[$1] = $2; next}
     FILENAME == ARGV[2] {def[$1] = $2; next}
     ($2 in def) { c = ($1 in comp) ? comp[$1] : $1; d = def[$2]; d = (d in comp) ? comp[d] : d;
                   if (c != d) print c, d, $2 }' "$tmp/comp" "$tmp/defs" "$tmp/uses" | sort -u >"$tmp/calls"

awk 'FILENAME == ARGV[1] {ok[$1 " " $2] = 1; next}
     !(($1 " " $2) in ok) {
         if ($3 ~ /^waste_/) printf "check_layers: %s calls the public %s (use the internal function)\n", $1, $3
         else printf "check_layers: %s calls %s (%s), which its row does not allow\n", $1, $2, $3
         bad = 1 }
     END {exit bad}' "$tmp/allowed" "$tmp/calls" || fail=1

if ! tsort "$tmp/allowed" >/dev/null 2>"$tmp/tsort"; then
    echo "check_layers: the layer table has a cycle:"; sed 's/^/  /' "$tmp/tsort"; fail=1
fi

[ $fail -eq 0 ] || exit 1
echo "check_layers: $# objects, $(cut -d' ' -f1,2 "$tmp/calls" | sort -u | wc -l) component calls, all allowed by the table; no cycle"
