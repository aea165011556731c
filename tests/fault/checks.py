# SPDX-License-Identifier: BSD-3-Clause
"""A test script's tally of checks (the newer scripts; the older ones keep a
check() of their own)."""
import shutil

from procstat import compare


class Checks:
    """A test script's tally: check(cond, what) counts and prints failures."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAILED: {what}", flush=True)
        return cond

    def growth(self, name, who, a, b, steps, allow, unit="steps"):
        """compare() printed and each of its problems failed."""
        line, problems = compare(who, a, b, steps, allow, unit)
        print(f"{name}: {line}" if name else line, flush=True)
        self(not problems, f"{name}: {'; '.join(problems)}" if name else "; ".join(problems))

    def result(self, *logs):
        """The tally printed; the logs removed when every check passed (they
        stay to be read otherwise); the script's exit code."""
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        if not self.failed:
            for d in logs:
                shutil.rmtree(d, ignore_errors=True)
        return 1 if self.failed else 0
