/* SPDX-License-Identifier: BSD-3-Clause */
/* snapsmp's settings: defaults, SNAP_* overrides, checks; see snap/smp_config.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snap/smp_config.h"
#include "snap/base.h"

int snap_smp_flush_codec_parse(const char *s, int *codec)
{
	if (!strcmp(s, "none"))
		*codec = 0;
	else if (!strcmp(s, "lz4"))
		*codec = 1;
	else
		return SNAP_EINVAL;
	return 0;
}

static const char *const log_levels[] = { "error", "warn", "info", "debug" };

int snap_smp_log_level_parse(const char *s, int *level)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, log_levels[i])) {
			*level = i;
			return 0;
		}
	return SNAP_EINVAL;
}

const char *snap_smp_log_level_name(int level)
{
	return level >= 0 && level < 4 ? log_levels[level] : NULL;
}

int snap_smp_flush_mode_parse(const char *s, unsigned *mode)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 8);
	/* The daemon must be able to write and read back what it flushes. */
	if (errno || end == s || *end || v > 0777 || (v & 0600) != 0600)
		return SNAP_EINVAL;
	*mode = (unsigned)v;
	return 0;
}

int snap_smp_config_init(struct snap_smp_config *cfg)
{
	if (!cfg)
		return SNAP_EINVAL;
	memset(cfg, 0, sizeof(*cfg));
	snap_config_init(&cfg->client);
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	cfg->mem_limit = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 4 : (1ull << 30);
	cfg->slots = 2;
	cfg->flush_keep = 2;
	cfg->flush_mode = 0600;
	cfg->flush_files = 1;
	cfg->flush_direct = 1;
	cfg->log_level = SNAP_SMP_LOG_INFO;
	cfg->metrics_interval = 10;
	cfg->scrub_rate = 16ull << 20;
	return 0;
}

/* The daemon's variables go through common's parsers (the messages name them). */
static int smp_env_int(const char *name, int *out, long lo, long hi, char *err, size_t errlen)
{
	const char *const names[] = { name, NULL };
	return snap_env_int(names, out, lo, hi, err, errlen);
}

static int smp_env_uint(const char *name, unsigned *out, long lo, long hi, char *err, size_t errlen)
{
	int x = (int)*out;
	int rc = smp_env_int(name, &x, lo, hi, err, errlen);
	if (rc == 0)
		*out = (unsigned)x;
	return rc;
}

int snap_smp_config_from_env(struct snap_smp_config *cfg, char *err, size_t errlen)
{
	if (!cfg) {
		snap_fmt(err, errlen, "snap_smp_config_from_env: NULL config");
		return SNAP_EINVAL;
	}
	int rc = snap_config_from_env(&cfg->client, err, errlen);
	if (rc)
		return rc;
	if ((rc = snap_env_size("SNAP_MEM_LIMIT", &cfg->mem_limit, 4096, err, errlen)) ||
	    (rc = smp_env_uint("SNAP_SLOTS", &cfg->slots, 2, 64, err, errlen)) ||
	    (rc = smp_env_int("SNAP_VERIFY_COMMIT", &cfg->verify_commit, 0, 1, err, errlen)) ||
	    (rc = snap_env_str("SNAP_FLUSH_DIR", cfg->flush_dir, sizeof(cfg->flush_dir), err, errlen)) ||
	    (rc = smp_env_uint("SNAP_FLUSH_EVERY", &cfg->flush_every, 0, 1 << 30, err, errlen)) ||
	    (rc = smp_env_uint("SNAP_FLUSH_INTERVAL", &cfg->flush_interval, 0, 1 << 30, err, errlen)) ||
	    (rc = smp_env_uint("SNAP_FLUSH_KEEP", &cfg->flush_keep, 1, 1 << 20, err, errlen)) ||
	    (rc = smp_env_int("SNAP_ALLOW_OLDER", &cfg->allow_older, 0, 1, err, errlen)) ||
	    (rc = snap_env_size("SNAP_SCRUB_RATE", &cfg->scrub_rate, 0, err, errlen)) ||
	    (rc = smp_env_int("SNAP_FLUSH_FILES", &cfg->flush_files, 0, 1, err, errlen)) ||
	    (rc = smp_env_int("SNAP_FLUSH_DIRECT", &cfg->flush_direct, 0, 1, err, errlen)) ||
	    (rc = snap_env_str("SNAP_LOG", cfg->log, sizeof(cfg->log), err, errlen)) ||
	    (rc = snap_env_str("SNAP_METRICS_FILE", cfg->metrics_file, sizeof(cfg->metrics_file), err, errlen)) ||
	    (rc = smp_env_uint("SNAP_METRICS_INTERVAL", &cfg->metrics_interval, 1, 86400, err, errlen)))
		return rc;
	const char *level = getenv("SNAP_LOG_LEVEL");
	if (level && *level && (rc = snap_smp_log_level_parse(level, &cfg->log_level))) {
		snap_fmt(err, errlen, "SNAP_LOG_LEVEL=\"%s\": expected error, warn, info or debug", level);
		return rc;
	}
	const char *mode = getenv("SNAP_FLUSH_MODE");
	if (mode && *mode && (rc = snap_smp_flush_mode_parse(mode, &cfg->flush_mode))) {
		snap_fmt(err, errlen, "SNAP_FLUSH_MODE=\"%s\": expected octal permission bits that include 0600, "
			 "e.g. 0600 or 0640", mode);
		return rc;
	}
	const char *codec = getenv("SNAP_FLUSH_CODEC");
	if (codec && *codec && (rc = snap_smp_flush_codec_parse(codec, &cfg->flush_codec))) {
		snap_fmt(err, errlen, "SNAP_FLUSH_CODEC=\"%s\": expected none or lz4", codec);
		return rc;
	}
	return snap_smp_config_check(cfg, err, errlen);
}

int snap_smp_config_check(const struct snap_smp_config *cfg, char *err, size_t errlen)
{
	if (!cfg) {
		snap_fmt(err, errlen, "NULL config");
		return SNAP_EINVAL;
	}
	if (cfg->flush_mode > 0777 || (cfg->flush_mode & 0600) != 0600) {
		snap_fmt(err, errlen, "flush mode %03o must be permission bits that include 0600", cfg->flush_mode);
		return SNAP_EINVAL;
	}
	if (cfg->flush_dir[0] && cfg->flush_dir[0] != '/') {
		snap_fmt(err, errlen, "flush directory \"%s\" (--flush-dir, SNAP_FLUSH_DIR) must be an absolute path",
			 cfg->flush_dir);
		return SNAP_EINVAL;
	}
	if (!snap_smp_log_level_name(cfg->log_level)) {
		snap_fmt(err, errlen, "log level %d: expected error, warn, info or debug", cfg->log_level);
		return SNAP_EINVAL;
	}
	if (cfg->metrics_interval < 1) {
		snap_fmt(err, errlen, "metrics interval must be at least 1 second");
		return SNAP_EINVAL;
	}
	if (cfg->slots < 2) {
		snap_fmt(err, errlen, "slots must be >= 2");
		return SNAP_EINVAL;
	}
	return 0;
}
