/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * log.h - snapsmp's log: one line per event, "TIME LEVEL snapsmp[pid]: msg"
 * (TIME in UTC with milliseconds, LEVEL error/warn/info/debug), with
 * "node N: " after the pid for the mesh's lines, on stderr, in a file
 * (appended, one write per line) or to syslog (facility daemon; syslog adds
 * its own time and pid). Levels, most severe first: ERROR (fatal: the
 * daemon stops), WARN (refused, lost or damaged: always worth an operator's
 * look), INFO (state changes: serving, connections, each step flushed,
 * persisted, protected, verified; the default), DEBUG (the effective
 * settings). --log-level (SNAP_LOG_LEVEL) writes that level and the more
 * severe ones; --quiet is --log-level warn.
 */
#ifndef SNAP_SMP_LOG_H
#define SNAP_SMP_LOG_H

#include <stdarg.h>
#include <stddef.h>

#include "snap/base.h" /* SNAP_PRINTF */
#include "snap/smp_config.h" /* SNAP_SMP_LOG_* */

enum smp_log_level {
	SMP_LOG_ERROR = SNAP_SMP_LOG_ERROR,
	SMP_LOG_WARN = SNAP_SMP_LOG_WARN,
	SMP_LOG_INFO = SNAP_SMP_LOG_INFO,
	SMP_LOG_DEBUG = SNAP_SMP_LOG_DEBUG,
};

/* Who logs. quiet: --quiet (INFO off whatever the level); node: the mesh
 * rank that prefixes each line, -1 for none. */
struct smp_log {
	int quiet;
	int node;
};

/*
 * Where and how much the process logs (before any thread starts): level
 * one of SMP_LOG_*, dest "" for stderr, "syslog", or a file path (created
 * 0640, appended). Without a call: stderr at INFO. 0, or SNAP_EIO with a
 * message naming the file.
 */
int smp_log_open(int level, const char *dest, char *err, size_t errlen);
void smp_log_close(void);
/* Whether a line of this level would be written. */
int smp_log_enabled(enum smp_log_level level);

/* An INFO line "snapsmp[pid]: msg" (the store's log callback). */
void snap_smp_log(const char *msg);
/* A WARN line, no node prefix (same as smp_logf(NULL, SMP_LOG_WARN, ...)). */
void snap_smp_logf(const char *fmt, ...) SNAP_PRINTF(1, 2);
/* lg NULL: not quiet, no node. */
void smp_logf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, ...) SNAP_PRINTF(3, 4);
void smp_vlogf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, va_list ap);

#endif
