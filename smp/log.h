/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * log.h - snapsmp's log: one line per event on stderr, "snapsmp[pid]: msg",
 * with "node N: " after the pid for the mesh's lines. Two levels: INFO is
 * what --quiet silences; WARN (warnings and errors) is always written, since
 * an operator must see what was refused, lost or damaged.
 */
#ifndef SNAP_SMP_LOG_H
#define SNAP_SMP_LOG_H

#include <stdarg.h>

#include "snap/base.h" /* SNAP_PRINTF */

enum smp_log_level { SMP_LOG_INFO, SMP_LOG_WARN };

/* Who logs. quiet: --quiet; node: the mesh rank that prefixes each line, -1 for none. */
struct smp_log {
	int quiet;
	int node;
};

/* "snapsmp[pid]: msg" (the store's log callback). */
void snap_smp_log(const char *msg);
/* Always written, no node prefix (same as smp_logf(NULL, SMP_LOG_WARN, ...)). */
void snap_smp_logf(const char *fmt, ...) SNAP_PRINTF(1, 2);
/* lg NULL: not quiet, no node. */
void smp_logf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, ...) SNAP_PRINTF(3, 4);
void smp_vlogf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, va_list ap);

#endif
