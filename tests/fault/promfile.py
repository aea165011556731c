# SPDX-License-Identifier: BSD-3-Clause
"""A value in snapsmp's metrics file (--metrics-file: Prometheus' text
format, rewritten whole by a rename, so a read sees one version)."""
import re


def prom_value(path, name, labels):
    """The value of metric `name` whose labels begin with `labels` (as
    written, e.g. 'job="a"'), or None while the file or the line is not
    there yet."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    m = re.search(rf'^{name}{{{re.escape(labels)}[^}}]*}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None
