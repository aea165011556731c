/* SPDX-License-Identifier: BSD-3-Clause */
/* snapsmp's log; see log.h. */
#include <stdio.h>
#include <unistd.h>

#include "log.h"

void snap_smp_log(const char *msg)
{
	fprintf(stderr, "snapsmp[%d]: %s\n", (int)getpid(), msg);
}

void smp_vlogf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, va_list ap)
{
	if (level == SMP_LOG_INFO && lg && lg->quiet)
		return;
	/* Room for the longest message built anywhere (MESH_ERRLEN) and the prefix. */
	char msg[1024 + 256];
	int n = lg && lg->node >= 0 ? snprintf(msg, sizeof(msg), "node %d: ", lg->node) : 0;
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	snap_smp_log(msg);
}

void smp_logf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	smp_vlogf(lg, level, fmt, ap);
	va_end(ap);
}

void snap_smp_logf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	smp_vlogf(NULL, SMP_LOG_WARN, fmt, ap);
	va_end(ap);
}
