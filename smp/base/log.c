/* SPDX-License-Identifier: BSD-3-Clause */
/* snapsmp's log; see log.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"

/* Set once by smp_log_open before the daemon's threads start; read-only after. */
static int log_level = SMP_LOG_INFO;
static int log_fd = STDERR_FILENO;
static int log_syslog;

static const char *const level_name[] = { "error", "warn", "info", "debug" };

int smp_log_open(int level, const char *dest, char *err, size_t errlen)
{
	log_level = level < SMP_LOG_ERROR ? SMP_LOG_ERROR : level > SMP_LOG_DEBUG ? SMP_LOG_DEBUG : level;
	if (!dest || !dest[0])
		return 0;
	if (!strcmp(dest, "syslog")) {
		openlog("snapsmp", LOG_PID | LOG_NDELAY, LOG_DAEMON);
		log_syslog = 1;
		return 0;
	}
	int fd = open(dest, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0) {
		snap_fmt(err, errlen, "--log %s: %s", dest, strerror(errno));
		return SNAP_EIO;
	}
	log_fd = fd;
	return 0;
}

void smp_log_close(void)
{
	if (log_syslog)
		closelog();
	if (log_fd != STDERR_FILENO)
		close(log_fd);
	log_syslog = 0;
	log_fd = STDERR_FILENO;
}

int smp_log_enabled(enum smp_log_level level)
{
	return (int)level <= log_level;
}

static void emit(enum smp_log_level level, const char *msg)
{
	if (log_syslog) {
		static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
		syslog(prio[level], "%s", msg);
		return;
	}
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	/* One write per line: lines of several threads, or of several nodes
	 * appending to one file, never interleave. */
	char line[1024 + 256 + 96];
	int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s snapsmp[%d]: %s\n",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ts.tv_nsec / 1000000, level_name[level], (int)getpid(), msg);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {   /* cut, but still one line */
		n = (int)sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(log_fd, line + off, (size_t)(n - off));
		if (w > 0)
			off += w;
		else if (w < 0 && errno == EINTR)
			continue;
		else
			return;   /* nowhere left to say it */
	}
}

void snap_smp_log(const char *msg)
{
	if (smp_log_enabled(SMP_LOG_INFO))
		emit(SMP_LOG_INFO, msg);
}

void smp_vlogf(const struct smp_log *lg, enum smp_log_level level, const char *fmt, va_list ap)
{
	/* Counted whatever the level writes: an alert needs no log. */
	if (level == SMP_LOG_WARN)
		smp_metrics_count(SMP_CNT_LOG_WARN, NULL);
	else if (level == SMP_LOG_ERROR)
		smp_metrics_count(SMP_CNT_LOG_ERROR, NULL);
	if (!smp_log_enabled(level) || (level >= SMP_LOG_INFO && lg && lg->quiet))
		return;
	/* Room for the longest message built anywhere (MESH_ERRLEN) and the prefix. */
	char msg[1024 + 256];
	int n = lg && lg->node >= 0 ? snprintf(msg, sizeof(msg), "node %d: ", lg->node) : 0;
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	emit(level, msg);
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
