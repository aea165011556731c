#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# install.demo: the README's quick start, scripts/demo.sh, as a user runs it
# (it builds build/gcc in the source tree, a no-op where that build is up to
# date): it exits 0 and every one of its 4 ranks reports the same step
# restored and verified bit-exact after the kill -9.
# usage: check_demo.sh SOURCE_DIR
set -euo pipefail
out=$(bash "$1/scripts/demo.sh" 2>&1) || { echo "$out"; echo "FAIL: scripts/demo.sh exited $?"; exit 1; }
echo "$out"
steps=$(grep -oE 'rank [0-3]: restored step [0-9]+ \(verified bit-exact\)' <<<"$out" | awk '{print $5}' | sort -u)
n=$(grep -cE 'rank [0-3]: restored step [0-9]+ \(verified bit-exact\)' <<<"$out" || true)
[ "$n" -eq 4 ] || { echo "FAIL: $n of 4 ranks reported a verified restore"; exit 1; }
[ "$(wc -l <<<"$steps")" -eq 1 ] || { echo "FAIL: the ranks restored different steps: $steps"; exit 1; }
echo "install.demo: 4 ranks restored step $steps, verified bit-exact"
