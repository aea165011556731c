# SPDX-License-Identifier: BSD-3-Clause
"""The parts of scripts/bench_train.py (see its docstring)."""
