/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * config.h - snapsmp's settings: the client's (struct snap_config, the part
 * a trainer and the daemon must agree on: store, socket, job, ...) plus what
 * only the daemon decides (memory budget, slots, flushing). snaptool reads
 * the same settings to find what a daemon would use.
 *
 * One config: each field <-> its SNAP_* variable <-> the snapsmp flag
 * (--mem-limit <-> SNAP_MEM_LIMIT <-> mem_limit), as docs/design/configuration.md lists.
 */
#ifndef SNAP_SMP_CONFIG_H
#define SNAP_SMP_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "snap/snap.h"

/* Log levels (--log-level / SNAP_LOG_LEVEL), most severe first. */
enum { SNAP_SMP_LOG_ERROR = 0, SNAP_SMP_LOG_WARN = 1, SNAP_SMP_LOG_INFO = 2, SNAP_SMP_LOG_DEBUG = 3 };

struct snap_smp_config {
	struct snap_config client;    /* SNAP_STORE, SNAP_SOCKET, SNAP_JOB, ... (snap.h) */
	uint64_t mem_limit;           /* SNAP_MEM_LIMIT: bytes snapsmp may hold; default 1/4 of RAM */
	unsigned slots;               /* SNAP_SLOTS: slots per rank (>= 2), default 2; snapsmp decides,
	                                 trainers follow its count */
	int verify_commit;            /* SNAP_VERIFY_COMMIT: re-check every chunk CRC at commit (0) */
	/* Persistence: lazy flush of restorable steps to HDF5. */
	char flush_dir[SNAP_PATH_MAX];/* SNAP_FLUSH_DIR: "" disables flushing */
	unsigned flush_every;         /* SNAP_FLUSH_EVERY: flush every F-th new restorable step (0: off) */
	unsigned flush_interval;      /* SNAP_FLUSH_INTERVAL: seconds between flushes (0: off) */
	unsigned flush_keep;          /* SNAP_FLUSH_KEEP: persisted steps kept per job (2) */
	int flush_codec;              /* SNAP_FLUSH_CODEC: "none" (0) or "lz4" (1) */
	int allow_older;              /* SNAP_ALLOW_OLDER: restore may fall back to an older
	                                 persisted step when the newest is damaged (0) */
	/* SNAP_SCRUB_RATE (--scrub-rate SIZE): bytes per second the background
	 * scrub verifies of the committed slots (and repairs from the flush,
	 * smp/heal/scrub.c); default 16 MiB/s; 0 disables it. */
	uint64_t scrub_rate;
	/* SNAP_FLUSH_MODE (--flush-mode): permission bits of the files the flush
	 * creates (octal, default 0600; it must include 0600). Directories it
	 * creates get the same bits plus x where r is set (0600 -> 0700).
	 * Applied whatever the umask: checkpoints hold a model's weights. */
	unsigned flush_mode;
	/* SNAP_FLUSH_FILES (--flush-files 0|1): copy each committed captured file
	 * to its real path in the background right after the commit (1, the
	 * default), or only on SIGUSR1, SIGTERM or a request (0). */
	int flush_files;
	/* SNAP_FLUSH_DIRECT (--flush-direct 0|1): write the bulk bytes of a
	 * flush (uncompressed data, codec frames) with O_DIRECT where the file
	 * system allows it (1, the default: nothing of the checkpoint is left in
	 * the page cache), or through the page cache (0: faster on some virtual
	 * disks for small flushes, see the README's "Flush" figures). */
	int flush_direct;
	/* SNAP_LOG_LEVEL (--log-level): error, warn, info (the default) or debug;
	 * the daemon logs that level and the more severe ones. */
	int log_level;
	/* SNAP_LOG (--log): where: "" stderr (the default), "syslog", or a file
	 * appended to ("%n" is the mesh rank with --ec). */
	char log[SNAP_PATH_MAX];
	/* SNAP_METRICS_FILE (--metrics-file): where to keep the daemon's state
	 * in Prometheus' text format, for node_exporter's textfile collector
	 * (rewritten atomically; "%n" is the mesh rank with --ec); "" none. */
	char metrics_file[SNAP_PATH_MAX];
	/* SNAP_METRICS_INTERVAL (--metrics-interval): seconds between rewrites
	 * of the metrics file (10, at least 1). */
	unsigned metrics_interval;
};

/* Defaults: snap_config_init for the client part, then the daemon's. */
int snap_smp_config_init(struct snap_smp_config *cfg);
/*
 * Override from SNAP_* variables: snap_config_from_env for the client part,
 * then the daemon's variables; then both checks. 0 or SNAP_EINVAL with a
 * message naming the variable.
 */
int snap_smp_config_from_env(struct snap_smp_config *cfg, char *err, size_t errlen);
/* The daemon's fields are consistent (the client part is snap_config_check's). */
int snap_smp_config_check(const struct snap_smp_config *cfg, char *err, size_t errlen);

/* --flush-codec / SNAP_FLUSH_CODEC: "none" -> 0, "lz4" -> 1; else SNAP_EINVAL. */
int snap_smp_flush_codec_parse(const char *s, int *codec);
/* --log-level / SNAP_LOG_LEVEL: "error", "warn", "info", "debug" -> SNAP_SMP_LOG_*; else SNAP_EINVAL. */
int snap_smp_log_level_parse(const char *s, int *level);
/* The name of a level ("info"), NULL for none. */
const char *snap_smp_log_level_name(int level);
/* --flush-mode / SNAP_FLUSH_MODE: "0600", "640", ...: octal permission bits
 * including 0600. 0 or SNAP_EINVAL. */
int snap_smp_flush_mode_parse(const char *s, unsigned *mode);

#endif
