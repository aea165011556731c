/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The client's configuration: defaults, SNAP_* environment overrides,
 * checks, and the sized copy that lets struct snap_config grow (snap.h,
 * "Growing the ABI"). The daemon's settings are smp/'s (smp/base/smp_config.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snap/proto.h"

/* The copy threads read registered memory (or wait on the GPU's copies)
 * and CRC every chunk: 2 leave a GPU's pinned copy at a third of its speed
 * where 8 keep up. Half the CPUs this process may run on (its affinity, so
 * a launcher's binding of ranks to cores counts), at least 2, at most 8. */
static unsigned snap_default_copy_threads(void)
{
	long cpus = 0;
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		cpus = CPU_COUNT(&set);
	if (cpus < 1)
		cpus = sysconf(_SC_NPROCESSORS_ONLN);
	long n = cpus / 2;
	return n < 2 ? 2u : n > 8 ? 8u : (unsigned)n;
}

int snap_config_init_size(struct snap_config *cfg, size_t size)
{
	if (!cfg || size < SNAP_CONFIG_SIZE_0_4)
		return SNAP_EINVAL;
	struct snap_config c;
	memset(&c, 0, sizeof(c));
	strcpy(c.job, "default");
	strcpy(c.store, "/dev/shm/libsnap");
	/* socket stays empty: "<store>/smp.sock", derived where it is used
	 * (snap_open, snapsmp, snaptool), so that setting cfg.store alone after
	 * this call does not leave the client talking to another store's daemon. */
	c.world_size = 1;
	c.copy_threads = snap_default_copy_threads();
	c.chunk_size = 4ull << 20;
	c.timeout_ms = 30000;
	c.populate = 1;
	/* Fields of a newer header that this library does not know stay zero,
	 * which by the rule of "Growing the ABI" means their default. */
	snap_abi_copyout(cfg, size, &c, sizeof(c));
	cfg->size = (uint32_t)(size < UINT32_MAX ? size : UINT32_MAX);
	return 0;
}

int snap_config_get(struct snap_config *dst, const struct snap_config *src, char *err, size_t errlen)
{
	snap_config_init(dst);
	if (!src) {
		snap_fmt(err, errlen, "NULL config");
		return SNAP_EINVAL;
	}
	int rc = snap_abi_copyin(dst, sizeof(*dst), src, src->size, SNAP_CONFIG_SIZE_0_4);
	if (rc == SNAP_EINVAL)
		snap_fmt(err, errlen, "struct snap_config (size field %" PRIu32 ") was not filled by snap_config_init()",
			 src->size);
	else if (rc)
		snap_fmt(err, errlen, "struct snap_config sets fields this libsnap (%d.%d) does not know: the program "
			 "was built against a newer snap/snap.h", SNAP_VERSION_MAJOR, SNAP_VERSION_MINOR);
	dst->size = sizeof(*dst);
	return rc;
}

static int env_verify(int *mode, char *err, size_t errlen)
{
	static const char *const names[] = { [SNAP_VERIFY_AUTO] = "auto", [SNAP_VERIFY_FIRST] = "first",
					     [SNAP_VERIFY_INLINE] = "inline" };
	const char *v = getenv("SNAP_RESTORE_VERIFY");
	if (!v || !*v)
		return 0;
	for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
		if (!strcmp(v, names[i])) {
			*mode = i;
			return 0;
		}
	snap_fmt(err, errlen, "SNAP_RESTORE_VERIFY=\"%s\": expected auto, first or inline", v);
	return SNAP_EINVAL;
}

/* SNAP_AUTOSTART=0|1 -> SNAP_AUTOSTART_OFF|ON (the struct's 0 is the default, on). */
static int env_autostart(int *autostart, char *err, size_t errlen)
{
	const char *v = getenv("SNAP_AUTOSTART");
	if (!v || !*v)
		return 0;
	if (strcmp(v, "0") && strcmp(v, "1")) {
		snap_fmt(err, errlen, "SNAP_AUTOSTART=\"%s\": expected 0 (off) or 1 (start snapsmp when none answers)", v);
		return SNAP_EINVAL;
	}
	*autostart = v[0] == '1' ? SNAP_AUTOSTART_ON : SNAP_AUTOSTART_OFF;
	return 0;
}

static int env_codec(const char *var, int *codec, double *bound, char *err, size_t errlen)
{
	const char *v = getenv(var);
	if (v && *v && snap_codec_spec_parse(v, codec, bound)) {
		snap_fmt(err, errlen, "%s=\"%s\": expected none, lossless, abs:<bound> or rel:<factor> with a "
			 "positive number", var, v);
		return SNAP_EINVAL;
	}
	return 0;
}

/*
 * The launch, when SNAP_LAUNCH does not name it: what the launchers set that
 * is the same for every rank of one launch and differs at a relaunch.
 * torchrun (elastic) keeps the run id and counts restarts; SLURM has the
 * job, the step and the requeue count; Open MPI gives each mpirun its own
 * PMIx namespace. Longer values are cut (the daemon compares them only).
 */
static void launch_from_launcher(char *dst, size_t cap)
{
	const char *run = getenv("TORCHELASTIC_RUN_ID"), *restart = getenv("TORCHELASTIC_RESTART_COUNT");
	const char *sjob = getenv("SLURM_JOB_ID"), *sstep = getenv("SLURM_STEP_ID");
	const char *srest = getenv("SLURM_RESTART_COUNT"), *pmix = getenv("PMIX_NAMESPACE");
	if (run && *run && restart && *restart)
		snprintf(dst, cap, "torchelastic:%s:%s", run, restart);
	else if (sjob && *sjob && sstep && *sstep)   /* an srun step; not a shell in an allocation */
		snprintf(dst, cap, "slurm:%s.%s:%s", sjob, sstep, srest ? srest : "0");
	else if (pmix && *pmix)
		snprintf(dst, cap, "pmix:%s", pmix);
}

static int from_env(struct snap_config *cfg, char *err, size_t errlen)
{
	static const char *const rank_vars[] = { "SNAP_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL };
	static const char *const world_vars[] = { "SNAP_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL };
	static const char *const local_vars[] = { "SNAP_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL };
	static const char *const threads_var[] = { "SNAP_COPY_THREADS", NULL };
	static const char *const timeout_var[] = { "SNAP_TIMEOUT_MS", NULL };
	static const char *const populate_var[] = { "SNAP_POPULATE", NULL };
	int rc, threads = (int)cfg->copy_threads, timeout = (int)cfg->timeout_ms;

	if ((rc = snap_env_str("SNAP_JOB", cfg->job, sizeof(cfg->job), err, errlen)) ||
	    (rc = snap_env_str("SNAP_STORE", cfg->store, sizeof(cfg->store), err, errlen)) ||
	    (rc = snap_env_str("SNAP_SOCKET", cfg->socket, sizeof(cfg->socket), err, errlen)) ||
	    (rc = snap_env_int(rank_vars, &cfg->rank, 0, 1 << 24, err, errlen)) ||
	    (rc = snap_env_int(world_vars, &cfg->world_size, 1, 1 << 24, err, errlen)) ||
	    (rc = snap_env_int(local_vars, &cfg->local_rank, 0, 1 << 24, err, errlen)) ||
	    (rc = snap_env_int(threads_var, &threads, 1, 256, err, errlen)) ||
	    (rc = snap_env_size("SNAP_CHUNK_SIZE", &cfg->chunk_size, 4096, err, errlen)) ||
	    (rc = snap_env_int(timeout_var, &timeout, 0, 1 << 30, err, errlen)) ||
	    (rc = snap_env_int(populate_var, &cfg->populate, 0, 1, err, errlen)) ||
	    (rc = snap_env_str("SNAP_CAPTURE", cfg->capture, sizeof(cfg->capture), err, errlen)) ||
	    (rc = snap_env_str("SNAP_LAUNCH", cfg->launch, sizeof(cfg->launch), err, errlen)) ||
	    (rc = env_codec("SNAP_CODEC_PARAM", &cfg->codec_param, &cfg->codec_param_bound, err, errlen)) ||
	    (rc = env_codec("SNAP_CODEC_OPTIM", &cfg->codec_optim, &cfg->codec_optim_bound, err, errlen)) ||
	    (rc = env_verify(&cfg->restore_verify, err, errlen)) ||
	    (rc = env_autostart(&cfg->autostart, err, errlen)))
		return rc;
	cfg->copy_threads = (unsigned)threads;
	cfg->timeout_ms = (unsigned)timeout;
	if (!cfg->launch[0])
		launch_from_launcher(cfg->launch, sizeof(cfg->launch));
	return snap_config_check(cfg, err, errlen);
}

int snap_config_from_env(struct snap_config *cfg, char *err, size_t errlen)
{
	if (!cfg) {
		snap_fmt(err, errlen, "snap_config_from_env: NULL config");
		return SNAP_EINVAL;
	}
	/* Work on a whole struct of this version, then hand back as much of it
	 * as the caller's struct holds. */
	struct snap_config c;
	int rc = snap_config_get(&c, cfg, err, errlen);
	if (rc || (rc = from_env(&c, err, errlen)))
		return rc;
	uint32_t size = cfg->size;
	snap_abi_copyout(cfg, size, &c, sizeof(c));
	cfg->size = size;
	return 0;
}

int snap_config_socket(struct snap_config *cfg, char *err, size_t errlen)
{
	/* The socket follows the store unless set explicitly. */
	if (!cfg->socket[0] && snprintf(cfg->socket, sizeof(cfg->socket), "%s/smp.sock", cfg->store) >= (int)sizeof(cfg->socket)) {
		cfg->socket[0] = '\0';
		snap_fmt(err, errlen, "store path %s is too long for a socket path", cfg->store);
		return SNAP_EINVAL;
	}
	return 0;
}

int snap_config_check(const struct snap_config *cfg, char *err, size_t errlen)
{
	if (!cfg) {
		snap_fmt(err, errlen, "NULL config");
		return SNAP_EINVAL;
	}
	if (!snap_job_name_ok(cfg->job)) {
		snap_fmt(err, errlen, "job name \"%s\" (job, SNAP_JOB) is invalid: use 1-%d of [A-Za-z0-9._-], "
			 "not starting with '.'", cfg->job, SNAP_JOB_MAX);
		return SNAP_EINVAL;
	}
	if (cfg->store[0] != '/') {
		snap_fmt(err, errlen, "store root \"%s\" (store, SNAP_STORE) must be an absolute path", cfg->store);
		return SNAP_EINVAL;
	}
	if (cfg->rank < 0 || cfg->world_size < 1 || cfg->rank >= cfg->world_size) {
		snap_fmt(err, errlen, "rank %d is outside world size %d (rank, world_size: SNAP_RANK, SNAP_WORLD_SIZE, "
			 "else the launcher's variables)", cfg->rank, cfg->world_size);
		return SNAP_EINVAL;
	}
	const char *end = memchr(cfg->launch, 0, sizeof(cfg->launch));
	for (const char *p = cfg->launch; end && p < end; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			end = NULL;
	if (!end) {
		snap_fmt(err, errlen, "launch (SNAP_LAUNCH) must be a string of at most %zu printable bytes",
			 sizeof(cfg->launch) - 1);
		return SNAP_EINVAL;
	}
	if (cfg->restore_verify < SNAP_VERIFY_AUTO || cfg->restore_verify > SNAP_VERIFY_INLINE) {
		snap_fmt(err, errlen, "restore_verify %d is not SNAP_VERIFY_AUTO, _FIRST or _INLINE", cfg->restore_verify);
		return SNAP_EINVAL;
	}
	if (cfg->autostart < SNAP_AUTOSTART_OFF || cfg->autostart > SNAP_AUTOSTART_ON) {
		snap_fmt(err, errlen, "autostart %d is not SNAP_AUTOSTART_DEFAULT, _ON or _OFF", cfg->autostart);
		return SNAP_EINVAL;
	}
	if (cfg->copy_threads < 1 || cfg->chunk_size < 4096 || cfg->chunk_size > (1ull << 31)) {
		snap_fmt(err, errlen, "copy threads (copy_threads, SNAP_COPY_THREADS) must be >= 1, chunk size "
			 "(chunk_size, SNAP_CHUNK_SIZE) in [4 KiB, 2 GiB]");
		return SNAP_EINVAL;
	}
	return 0;
}
