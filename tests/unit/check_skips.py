#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The suite keeps its own skip rule (tests/skiprule.h, tests/skiprule.py):

  - every registered test has a label (`ctest -L COMPONENT` selects it);
  - a test that declares SKIP_RETURN_CODE 77 has a source that can exit 77
    (else the property is a promise nobody keeps); one whose sources can
    exit 77 without declaring it is listed (a 77 there reads as a failure:
    strict, e.g. train_trials.py's CPU runs, which never may skip);
  - no source prints SKIP without exiting 77 right there (a skipped case
    reported as a pass): skipped cases go through skiprule's optional(),
    which counts them in the summary line;
  - no `except ImportError: pass` (a check dropped without a word);
  - no test reads a path outside the clone (such as a data folder beside it).

The tests are read from `ctest --show-only=json-v1` of the build (what is
registered, with its properties), the sources from the tree.
usage: check_skips.py SOURCE_DIR BUILD_DIR CTEST
"""
import json
import os
import re
import subprocess
import sys

src, build, ctest = sys.argv[1:4]
tests_dir = os.path.join(src, "tests")
fails = []

# What counts as exiting 77 in a source, and as printing a skip.
EXIT77 = re.compile(r"\b(return|exit|_exit)\s*\(?\s*77\b|sys\.exit\(\s*(77|SKIP)\s*\)|"
                    r"\bskip_test\(|\bskiprule_skip_test\(|^\s*exit 77\b")
PRINTS_SKIP = re.compile(r"""(printf|print|echo|puts|fprintf)\b.*["'][^"']*\bSKIP""")
OUTSIDE = re.compile(r"""\.\./shared|\.\.[/\\]\.\.[/\\]shared|["']shared["']\s*,\s*["']data["']""")
SOURCE_EXT = (".c", ".h", ".py", ".sh")
RULE_FILES = {os.path.join(tests_dir, "skiprule.h"), os.path.join(tests_dir, "skiprule.py"),
              os.path.abspath(__file__)}


def sources():
    for root, _, files in os.walk(tests_dir):
        for f in files:
            if f.endswith(SOURCE_EXT) or f == "CMakeLists.txt":
                yield os.path.join(root, f)


def read(path):
    with open(path, errors="replace") as f:
        return f.read().splitlines()


exits77 = {}
for path in sources():
    lines = read(path)
    rel = os.path.relpath(path, src)
    exits77[path] = path != os.path.abspath(__file__) and any(EXIT77.search(line) for line in lines)
    if path in RULE_FILES:
        continue
    for i, line in enumerate(lines):
        if PRINTS_SKIP.search(line) and not any(EXIT77.search(x) for x in lines[i:i + 4]):
            fails.append(f"{rel}:{i + 1}: prints SKIP without exiting 77 there (use skiprule's optional()): "
                         f"{line.strip()}")
        if re.match(r"\s*except\s+ImportError\b.*:\s*(pass)?\s*$", line):
            body = line.split(":", 1)[1].strip() or next((x.strip() for x in lines[i + 1:] if x.strip()), "")
            if body == "pass":
                fails.append(f"{rel}:{i + 1}: `except ImportError: pass` drops a check without a word")
        if OUTSIDE.search(line) and not line.lstrip().startswith(("#", "*", "/*", "//")):
            fails.append(f"{rel}:{i + 1}: reads a path outside the clone: {line.strip()}")

# A test's own sources: the files named in its command, and the test
# program's C source (an executable named after tests/**/NAME.c).
by_stem = {}
for path in exits77:
    if path.endswith(".c"):
        by_stem.setdefault(os.path.splitext(os.path.basename(path))[0], []).append(path)


def test_sources(cmd):
    found = []
    for arg in cmd:
        for word in re.split(r"[\s'\"]+", arg):
            if word in exits77:
                found.append(word)
            elif os.path.isabs(word) and os.path.basename(word) in by_stem and not word.startswith(tests_dir):
                found += by_stem[os.path.basename(word)]
    return found


shown = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, capture_output=True, text=True)
if shown.returncode:
    sys.exit(f"FAIL: ctest --show-only=json-v1 in {build}: {shown.stderr}")
tests = json.loads(shown.stdout)["tests"]
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    name = t["name"]
    if not props.get("LABELS"):
        fails.append(f"test {name}: no label")
    srcs = test_sources(t.get("command", []))
    declares = str(props.get("SKIP_RETURN_CODE", "")) == "77"
    can77 = [os.path.relpath(p, src) for p in srcs if exits77[p]]
    if can77 and not declares:
        print(f"note: test {name}: {', '.join(can77)} can exit 77; without SKIP_RETURN_CODE 77 that is a failure")
    if declares and srcs and not can77:
        fails.append(f"test {name}: declares SKIP_RETURN_CODE 77 but {', '.join(os.path.relpath(p, src) for p in srcs)}"
                     f" never exits 77")

for m in fails:
    print("FAIL:", m)
print(f"check_skips: {len(tests)} tests, {len(exits77)} sources read, {len(fails)} failures")
sys.exit(1 if fails else 0)
