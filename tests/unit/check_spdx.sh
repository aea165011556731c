#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Fails naming every source file whose first two lines lack an
# SPDX-License-Identifier line (line 2 leaves room for a #! line).
# Source = C, headers, CUDA, CMake, Python, shell, linker maps, templates,
# and any other file that starts with #!. Usage: check_spdx.sh <source dir>
set -u
src=${1:?usage: check_spdx.sh <source dir>}
cd "$src" || exit 2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files > "$tmp/all"
else    # a source tarball: every file but build trees
    find . \( -name 'build*' -o -name .git \) -prune -o -type f -print | sed 's|^\./||' > "$tmp/all"
fi
: > "$tmp/src"
while IFS= read -r f; do
    [ -f "$f" ] || continue    # listed but deleted in the work tree
    case "$f" in
        *.c|*.h|*.cu|*.cuh|*.py|*.sh|*.cmake|*.in|*.map|CMakeLists.txt|*/CMakeLists.txt) ;;
        *.md|*.txt|*.json|*.gz|*.png|LICENSE|.gitignore) continue ;;
        *) [ "$(head -c 2 "$f")" = '#!' ] || continue ;;
    esac
    if [ -s "$f" ]; then printf '%s\n' "$f" >> "$tmp/src"
    else echo "$f" >> "$tmp/bad"; fi    # empty: awk would never see it
done < "$tmp/all"
n=$(($(wc -l < "$tmp/src") + $( [ -f "$tmp/bad" ] && wc -l < "$tmp/bad" || echo 0)))
if [ "$n" -eq 0 ]; then
    echo "no source files found under $src"; exit 1
fi
# One awk over every file (a process per file takes seconds on a loaded machine).
tr '\n' '\0' < "$tmp/src" | xargs -0 awk '
    FNR == 1 { if (cur != "" && !ok) print cur; cur = FILENAME; ok = 0 }
    FNR <= 2 && /SPDX-License-Identifier: / { ok = 1 }
    END { if (cur != "" && !ok) print cur }' >> "$tmp/bad"
sed 's/^/missing SPDX-License-Identifier in the first two lines: /' "$tmp/bad"
bad=$(wc -l < "$tmp/bad")
echo "$n source files checked, $bad without an SPDX line"
[ "$bad" -eq 0 ]
