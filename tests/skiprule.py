# SPDX-License-Identifier: BSD-3-Clause
"""The suite's one rule for what cannot run (tests/skiprule.h is the same for
the C tests; tests/unit/check_skips.py enforces it):

- A test that cannot run its subject calls skip_test() before it has run any
  case: one line naming why, exit 77 (its add_test declares SKIP_RETURN_CODE
  77). With failures already recorded it exits 1 instead: a skip never hides
  what was already checked.
- A case that cannot run inside a test that otherwise runs is declared
  optional with what it needs (Skips.optional); whether it runs is decided
  from what this process has (capabilities, euid, the file system), never
  from the case's own failure, so a failing mount as root fails the test.
  SNAP_TEST_ALL=1 makes every optional case required (CI, as root).
- The summary line (Skips.summary) counts the cases skipped.
"""
import os
import sys

SKIP = 77


def can_mount():
    """Whether this process may mount(2): CAP_SYS_ADMIN in its effective set
    (read, not tried: a failed mount with it is a failure, not a skip)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)
    except OSError:
        pass
    return False


def is_root():
    return os.geteuid() == 0


def skip_test(test, why, failures=0):
    """Exits 77 naming why; exits 1 when failures were recorded before."""
    if failures:
        print(f"{test}: FAILED: {failures} failures recorded before deciding to skip ({why})", flush=True)
        sys.exit(1)
    print(f"{test}: SKIP (exit 77): {why}", flush=True)
    sys.exit(SKIP)


class Skips:
    """The optional cases a test did not run."""

    def __init__(self):
        self.names = []

    def optional(self, name, needs, have):
        """Whether the optional case runs: yes when have; otherwise counted,
        saying what it needs (with SNAP_TEST_ALL=1: a failure, exit 1)."""
        if have:
            return True
        if os.environ.get("SNAP_TEST_ALL") == "1":
            print(f"FAILED: case {name!r} cannot run (needs {needs}) and SNAP_TEST_ALL=1 requires it", flush=True)
            sys.exit(1)
        print(f"  optional case not run: {name} (needs {needs})", flush=True)
        self.names.append(name)
        return False

    def summary(self):
        """'N cases skipped' with their names, for the test's summary line."""
        if not self.names:
            return "0 cases skipped"
        return f"{len(self.names)} optional cases skipped ({', '.join(self.names)})"
