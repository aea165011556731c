/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/config.h - the library's version and the client's
 * configuration (struct snap_config, its enums, defaults and SNAP_*
 * overrides).
 * Part of the public API: snap/snap.h includes it, and a user includes
 * snap/snap.h, not this header. It lives in common/ because proto/ (what a
 * client and snapsmp agree on) needs the same definitions without
 * depending on libsnap/.
 */
#ifndef SNAP_CONFIG_H
#define SNAP_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Versions. The macros give the version this header belongs to;
 * snap_version() the version of the libsnap.so actually loaded. CMake reads
 * the project version from these three lines.
 */
#define SNAP_VERSION_MAJOR 0
#define SNAP_VERSION_MINOR 4
#define SNAP_VERSION_PATCH 0
#define SNAP_VERSION_NUMBER (SNAP_VERSION_MAJOR * 10000 + SNAP_VERSION_MINOR * 100 + SNAP_VERSION_PATCH)

/*
 * Configuration of the client. snap_config_init() fills defaults;
 * snap_config_from_env() applies SNAP_* environment overrides. The same
 * names appear everywhere: field mem_limit <-> SNAP_MEM_LIMIT <-> flag
 * --mem-limit <-> Python keyword mem_limit; docs/design/configuration.md lists them all.
 * The daemon's own settings (memory budget, slots, flush) are snapsmp's
 * (its flags and SNAP_* variables), not fields here.
 */
struct snap_config {
	uint32_t size;                /* set by snap_config_init(): the struct's size as compiled */
	char job[SNAP_JOB_MAX + 1];   /* SNAP_JOB, default "default" */
	char store[SNAP_PATH_MAX];    /* SNAP_STORE: node store root, default /dev/shm/libsnap */
	char socket[SNAP_PATH_MAX];   /* SNAP_SOCKET: "" (the default) means <store>/smp.sock,
	                                 derived by snap_open from the store it is given */
	int rank;                     /* SNAP_RANK (else OMPI/PMI/SLURM rank vars), default 0 */
	int world_size;               /* SNAP_WORLD_SIZE (else launcher vars), default 1 */
	int local_rank;               /* SNAP_LOCAL_RANK (else launcher vars), default 0 */
	unsigned copy_threads;        /* SNAP_COPY_THREADS: default half the CPUs of the
	                                 process's affinity, at least 2, at most 8 */
	uint64_t chunk_size;          /* SNAP_CHUNK_SIZE: CRC granularity, default 4 MiB */
	unsigned timeout_ms;          /* SNAP_TIMEOUT_MS: connect and slot wait, default 30000 */
	int populate;                 /* SNAP_POPULATE: pre-fault slot mappings at register (1) */
	/* Default codecs for float regions (f32, bf16, f16) registered with
	 * codec SNAP_CODEC_NONE, by kind: SNAP_CODEC_PARAM and SNAP_CODEC_OPTIM,
	 * each "none", "lossless", "abs:<bound>" or "rel:<factor>" (default none). */
	int codec_param;              /* enum snap_codec_id */
	double codec_param_bound;
	int codec_optim;
	double codec_optim_bound;
	/* SNAP_CAPTURE, read by the preload (LD_PRELOAD=libsnap_preload.so,
	 * docs/design/captured-files.md): ':'-separated absolute directories
	 * whose files a preloaded process keeps in the node store (empty: none). */
	char capture[1024];
	/* SNAP_LAUNCH: names one launch of the job; every rank of it starts
	 * with the same value and a relaunch gets another. Default: from the
	 * launcher (TORCHELASTIC_RUN_ID + TORCHELASTIC_RESTART_COUNT, SLURM's
	 * job, step and restart count, Open MPI's PMIX_NAMESPACE), else empty.
	 * snapsmp uses it to tell a late rank of the running launch from a
	 * relaunch: without it, a process new to snapsmp that finds no rank of
	 * its job connected starts a new incarnation, which withdraws the steps
	 * past the one it restores, even when they were its own launch's (a
	 * rank that ran and exited before its peers started). */
	char launch[128];
	/* SNAP_RESTORE_VERIFY: when snap_restore() checks each chunk's CRC32C
	 * (enum snap_restore_verify; "auto", "first" or "inline"). */
	int restore_verify;
	/* SNAP_AUTOSTART: what snap_open() does when no snapsmp answers on
	 * cfg->socket (enum snap_autostart). By default it starts one, detached
	 * (`snapsmp --detach --store STORE --socket SOCKET`: its own session,
	 * default settings sized from the machine, log STORE/snapsmp.log), and
	 * connects to it; concurrent first clients start exactly one, the store
	 * lock deciding. snapsmp is $SNAPSMP, else bin/snapsmp of the prefix
	 * libsnap.so is installed in, else found on PATH. SNAP_AUTOSTART_OFF (or
	 * SNAP_AUTOSTART=0): fail with SNAP_ESMP naming the socket and store, as
	 * deployments that start snapsmp themselves (a mesh, --flush-dir) want.
	 * Zero is the default (on), as for every field added after 0.4. */
	int autostart;
};

enum snap_autostart {
	SNAP_AUTOSTART_DEFAULT = 0,   /* on */
	SNAP_AUTOSTART_ON = 1,
	SNAP_AUTOSTART_OFF = -1,
};

/*
 * FIRST reads the slot twice (every chunk's CRC32C, then the copy) so that
 * on a bad chunk your memory is untouched; INLINE reads it once, checking
 * each chunk as it is copied (the README has the figures), and a bad chunk
 * leaves memory partly overwritten (the error says so). AUTO, the default,
 * is INLINE for a context that has neither saved nor restored yet (a
 * relaunched trainer: its memory holds nothing a snapshot could give back)
 * and FIRST afterwards (live training state). Before this field existed
 * every restore was FIRST; a program built against that header gets AUTO.
 */
enum snap_restore_verify {
	SNAP_VERIFY_AUTO = 0,
	SNAP_VERIFY_FIRST = 1,
	SNAP_VERIFY_INLINE = 2,
};

/*
 * Fill every field with its default and cfg->size with `size`, the caller's
 * sizeof(struct snap_config). 0, SNAP_EINVAL when cfg is NULL or size is
 * smaller than the first released layout.
 */
SNAP_API int snap_config_init_size(struct snap_config *cfg, size_t size);
static inline int snap_config_init(struct snap_config *cfg)
{
	return snap_config_init_size(cfg, sizeof(*cfg));
}

/*
 * Apply SNAP_* environment variables (and the launcher's rank variables) over
 * cfg. On a malformed value returns SNAP_EINVAL and, if err is not NULL,
 * writes a message naming the variable into err[errlen]. cfg must have been
 * filled by snap_config_init() (cfg->size): SNAP_EINVAL otherwise, as for
 * snap_open().
 */
SNAP_API int snap_config_from_env(struct snap_config *cfg, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
