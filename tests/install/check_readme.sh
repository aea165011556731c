#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# install.readme: the README's examples are what a user gets.
#  1. The C and Python blocks of README.md are, line for line, inside the
#     example files that say they are them (integration/examples/readme_*),
#     so the README cannot drift from code that is compiled and run here.
#  2. The C example, built by CMake from that file, and the Python example
#     run twice each with no snapsmp started by hand (the first run
#     autostarts one, as the README says): the second run of each resumes
#     after the first run's last step.
#  3. The daemon they started is stopped by pid (found by its store), and
#     it exits cleanly on SIGTERM.
# usage: check_readme.sh SOURCE_DIR BUILD_DIR [SANITIZER_RUNTIME]
#   (a sanitized build: the runtime Python must preload before libsnap.so)
set -euo pipefail
src=$1 build=$2 asan_rt=${3:-}
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$src" <<'PY' || exit 1
import sys, re, pathlib
src = pathlib.Path(sys.argv[1])
readme = (src / "README.md").read_text()
def blocks(lang):
    return re.findall(r"```" + lang + r"\n(.*?)```", readme, re.S)
def norm(text):
    return [l.strip() for l in text.splitlines() if l.strip()]
for lang, path, marker in (("c", "integration/examples/readme_example.c", "snap_open(&cfg, &ctx)"),
                           ("python", "integration/examples/readme_torch.py", "Checkpointer(")):
    mine = [b for b in blocks(lang) if marker in b]
    if len(mine) != 1:
        sys.exit(f"FAIL: README.md has {len(mine)} {lang} blocks with {marker!r}, expected 1")
    have = norm((src / path).read_text())
    # Each paragraph of the block, in order, in the file; the file may add
    # lines between paragraphs (its includes, main(), the model the Python
    # block leaves out) and prints inside one, but drop or change none.
    paras = [norm(p) for p in re.split(r"\n\s*\n", mine[0]) if p.strip()]
    want, j = sum(paras, []), 0
    for para in paras:
        while j < len(have) and have[j] != para[0]:
            j += 1
        for line in para:
            while j < len(have) and have[j] != line and re.match(r"(printf|print)\(", have[j]):
                j += 1
            if j == len(have) or have[j] != line:
                sys.exit(f"FAIL: README.md's {lang} example is not in {path} as it stands: {line!r} missing, "
                         "changed or out of order")
            j += 1
    print(f"README {lang} block: {len(want)} lines, found in {path}")
PY

work=$(mktemp -d /tmp/snap-readme.XXXXXX)
store=$work/store
stop_daemon() {
	local pids
	pids=$(grep -l -s -F -- "$store" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3 || true)
	for p in $pids; do
		[ "$(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)" != "" ] || continue
		kill -TERM "$p" 2>/dev/null || true
		timeout 120 tail --pid="$p" -f /dev/null || fail "snapsmp $p did not exit on SIGTERM"
	done
}
trap 'stop_daemon; rm -rf "$work"' EXIT
export SNAP_STORE=$store SNAP_JOB=readme SNAP_AUTOSTART=1 SNAPSMP=$build/smp/snapsmp
unset SNAP_SOCKET

ex=$build/integration/readme_example
[ -x "$ex" ] || fail "$ex was not built"
out1=$("$ex") || fail "first run of readme_example: exit $?"
out2=$("$ex") || fail "second run of readme_example: exit $?"
echo "C example: '$(head -1 <<<"$out1")' then '$(head -1 <<<"$out2")'"
grep -q '^starting after step 0$' <<<"$out1" || fail "first C run did not start fresh: $out1"
grep -q '^starting after step 100$' <<<"$out2" || fail "second C run did not resume after step 100: $out2"
pgrep -f -- "--store $store" >/dev/null || fail "no autostarted snapsmp serves $store"

export SNAP_JOB=readme-torch PYTHONPATH=$src/integration/python SNAP_LIBRARY=$build/libsnap/libsnap.so
py_env=()
[ -z "$asan_rt" ] || py_env=(env LD_PRELOAD="$asan_rt" ASAN_OPTIONS=detect_leaks=0)
py1=$("${py_env[@]}" /usr/bin/python3 "$src/integration/examples/readme_torch.py") || fail "first Python run: exit $?"
py2=$("${py_env[@]}" /usr/bin/python3 "$src/integration/examples/readme_torch.py") || fail "second Python run: exit $?"
echo "Python example: '$py1' then '$py2'"
grep -q '^steps 1-50,' <<<"$py1" || fail "first Python run: $py1"
grep -q '^steps 51-100,' <<<"$py2" || fail "second Python run did not resume: $py2"
echo "install.readme: both README examples match their files, ran, and resumed"
