/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Configuration defaults and SNAP_* environment overrides. One table drives
 * both, so a new field is one line here and one in snap.h.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snap/snap.h"
#include "internal.h"

int snap_parse_size(const char *s, uint64_t *out)
{
	if (!out || !s || !*s || !isdigit((unsigned char)*s))
		return SNAP_EINVAL;
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return SNAP_EINVAL;
	uint64_t mul = 1;
	switch (toupper((unsigned char)*end)) {
	case '\0': break;
	case 'K': mul = 1ull << 10; end++; break;
	case 'M': mul = 1ull << 20; end++; break;
	case 'G': mul = 1ull << 30; end++; break;
	case 'T': mul = 1ull << 40; end++; break;
	default: return SNAP_EINVAL;
	}
	if (mul > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
		end += strlen(end);
	if (*end || (mul > 1 && v > UINT64_MAX / mul))
		return SNAP_EINVAL;
	*out = v * mul;
	return 0;
}

int snap_flush_codec_parse(const char *s, int *codec)
{
	if (!strcmp(s, "none"))
		*codec = 0;
	else if (!strcmp(s, "lz4"))
		*codec = 1;
	else
		return SNAP_EINVAL;
	return 0;
}

int snap_flush_mode_parse(const char *s, unsigned *mode)
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

int snap_codec_spec_parse(const char *s, int *codec, double *bound)
{
	char *end;
	*bound = 0;
	if (!strcmp(s, "none")) {
		*codec = SNAP_CODEC_NONE;
		return 0;
	}
	if (!strcmp(s, "lossless")) {
		*codec = SNAP_CODEC_LOSSLESS;
		return 0;
	}
	if (!strncmp(s, "abs:", 4))
		*codec = SNAP_CODEC_LOSSY_ABS;
	else if (!strncmp(s, "rel:", 4))
		*codec = SNAP_CODEC_LOSSY_REL;
	else
		return SNAP_EINVAL;
	errno = 0;
	*bound = strtod(s + 4, &end);
	/* The codec's own check (snap_codec_check) runs at register time. */
	if (errno || end == s + 4 || *end || !(*bound > 0) || *bound >= 1e300)
		return SNAP_EINVAL;
	return 0;
}

const char *snap_codec_spec_name(int codec)
{
	switch (codec) {
	case SNAP_CODEC_NONE: return "none";
	case SNAP_CODEC_LOSSLESS: return "lossless";
	case SNAP_CODEC_LOSSY_ABS: return "abs";
	case SNAP_CODEC_LOSSY_REL: return "rel";
	default: return "?";
	}
}

int snap_job_name_ok(const char *job)
{
	size_t n = strlen(job);
	if (n == 0 || n > SNAP_JOB_MAX || job[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)job[i]) && !strchr("._-", job[i]))
			return 0;
	return 1;
}

int snap_config_init(struct snap_config *cfg)
{
	if (!cfg)
		return SNAP_EINVAL;
	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->job, "default");
	strcpy(cfg->store, "/dev/shm/libsnap");
	/* socket stays empty: "<store>/smp.sock", derived where it is used
	 * (snap_open, snapsmp, snaptool), so that setting cfg.store alone after
	 * this call does not leave the client talking to another store's daemon. */
	cfg->world_size = 1;
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	cfg->mem_limit = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 4 : (1ull << 30);
	cfg->slots = 2;
	cfg->copy_threads = 2;
	cfg->chunk_size = 4ull << 20;
	cfg->timeout_ms = 30000;
	cfg->populate = 1;
	cfg->flush_keep = 2;
	cfg->flush_mode = 0600;
	cfg->flush_files = 1;
	return 0;
}

/* First variable in the list that is set, or NULL. */
static const char *env_first(const char *const *names, const char **which)
{
	for (; *names; names++) {
		const char *v = getenv(*names);
		if (v && *v) {
			*which = *names;
			return v;
		}
	}
	return NULL;
}

static int env_int(const char *const *names, int *out, long lo, long hi, char *err, size_t errlen)
{
	const char *which = NULL, *v = env_first(names, &which);
	if (!v)
		return 0;
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi) {
		snap_fmt(err, errlen, "%s=\"%s\": expected an integer in [%ld, %ld]", which, v, lo, hi);
		return SNAP_EINVAL;
	}
	*out = (int)x;
	return 0;
}

static int env_size(const char *name, uint64_t *out, uint64_t lo, char *err, size_t errlen)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	uint64_t x;
	if (snap_parse_size(v, &x) || x < lo) {
		snap_fmt(err, errlen, "%s=\"%s\": expected a size >= %" PRIu64 " (e.g. 4096, 64M, 2G)", name, v, lo);
		return SNAP_EINVAL;
	}
	*out = x;
	return 0;
}

static int env_str(const char *name, char *dst, size_t cap, char *err, size_t errlen)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	if (strlen(v) >= cap) {
		snap_fmt(err, errlen, "%s is longer than %zu bytes", name, cap - 1);
		return SNAP_EINVAL;
	}
	strcpy(dst, v);
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

int snap_config_from_env(struct snap_config *cfg, char *err, size_t errlen)
{
	static const char *const rank_vars[] = { "SNAP_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL };
	static const char *const world_vars[] = { "SNAP_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL };
	static const char *const local_vars[] = { "SNAP_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL };
	static const char *const slots_var[] = { "SNAP_SLOTS", NULL };
	static const char *const threads_var[] = { "SNAP_COPY_THREADS", NULL };
	static const char *const timeout_var[] = { "SNAP_TIMEOUT_MS", NULL };
	static const char *const verify_var[] = { "SNAP_VERIFY_COMMIT", NULL };
	static const char *const populate_var[] = { "SNAP_POPULATE", NULL };
	static const char *const every_var[] = { "SNAP_FLUSH_EVERY", NULL };
	static const char *const interval_var[] = { "SNAP_FLUSH_INTERVAL", NULL };
	static const char *const keep_var[] = { "SNAP_FLUSH_KEEP", NULL };
	static const char *const older_var[] = { "SNAP_ALLOW_OLDER", NULL };
	static const char *const files_var[] = { "SNAP_FLUSH_FILES", NULL };
	if (!cfg) {
		snap_fmt(err, errlen, "snap_config_from_env: NULL config");
		return SNAP_EINVAL;
	}
	int every = (int)cfg->flush_every, interval = (int)cfg->flush_interval, keep = (int)cfg->flush_keep;
	int rc = 0, slots = (int)cfg->slots, threads = (int)cfg->copy_threads, timeout = (int)cfg->timeout_ms;

	if ((rc = env_str("SNAP_JOB", cfg->job, sizeof(cfg->job), err, errlen)) ||
	    (rc = env_str("SNAP_STORE", cfg->store, sizeof(cfg->store), err, errlen)) ||
	    (rc = env_str("SNAP_SOCKET", cfg->socket, sizeof(cfg->socket), err, errlen)) ||
	    (rc = env_int(rank_vars, &cfg->rank, 0, 1 << 24, err, errlen)) ||
	    (rc = env_int(world_vars, &cfg->world_size, 1, 1 << 24, err, errlen)) ||
	    (rc = env_int(local_vars, &cfg->local_rank, 0, 1 << 24, err, errlen)) ||
	    (rc = env_size("SNAP_MEM_LIMIT", &cfg->mem_limit, 4096, err, errlen)) ||
	    (rc = env_int(slots_var, &slots, 2, 64, err, errlen)) ||
	    (rc = env_int(threads_var, &threads, 1, 256, err, errlen)) ||
	    (rc = env_size("SNAP_CHUNK_SIZE", &cfg->chunk_size, 4096, err, errlen)) ||
	    (rc = env_int(timeout_var, &timeout, 0, 1 << 30, err, errlen)) ||
	    (rc = env_int(verify_var, &cfg->verify_commit, 0, 1, err, errlen)) ||
	    (rc = env_int(populate_var, &cfg->populate, 0, 1, err, errlen)) ||
	    (rc = env_str("SNAP_FLUSH_DIR", cfg->flush_dir, sizeof(cfg->flush_dir), err, errlen)) ||
	    (rc = env_int(every_var, &every, 0, 1 << 30, err, errlen)) ||
	    (rc = env_int(interval_var, &interval, 0, 1 << 30, err, errlen)) ||
	    (rc = env_int(keep_var, &keep, 1, 1 << 20, err, errlen)) ||
	    (rc = env_int(older_var, &cfg->allow_older, 0, 1, err, errlen)) ||
	    (rc = env_str("SNAP_CAPTURE", cfg->capture, sizeof(cfg->capture), err, errlen)) ||
	    (rc = env_int(files_var, &cfg->flush_files, 0, 1, err, errlen)))
		return rc;
	cfg->flush_every = (unsigned)every;
	cfg->flush_interval = (unsigned)interval;
	cfg->flush_keep = (unsigned)keep;
	const char *mode = getenv("SNAP_FLUSH_MODE");
	if (mode && *mode && (rc = snap_flush_mode_parse(mode, &cfg->flush_mode))) {
		snap_fmt(err, errlen, "SNAP_FLUSH_MODE=\"%s\": expected octal permission bits that include 0600, "
			 "e.g. 0600 or 0640", mode);
		return rc;
	}
	const char *codec = getenv("SNAP_FLUSH_CODEC");
	if (codec && *codec && (rc = snap_flush_codec_parse(codec, &cfg->flush_codec))) {
		snap_fmt(err, errlen, "SNAP_FLUSH_CODEC=\"%s\": expected none or lz4", codec);
		return rc;
	}
	if ((rc = env_codec("SNAP_CODEC_PARAM", &cfg->codec_param, &cfg->codec_param_bound, err, errlen)) ||
	    (rc = env_codec("SNAP_CODEC_OPTIM", &cfg->codec_optim, &cfg->codec_optim_bound, err, errlen)))
		return rc;
	cfg->slots = (unsigned)slots;
	cfg->copy_threads = (unsigned)threads;
	cfg->timeout_ms = (unsigned)timeout;
	return snap_config_check(cfg, err, errlen);
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
		snap_fmt(err, errlen, "job name \"%s\" is invalid: use 1-%d of [A-Za-z0-9._-], not starting with '.'",
			 cfg->job, SNAP_JOB_MAX);
		return SNAP_EINVAL;
	}
	if (cfg->store[0] != '/') {
		snap_fmt(err, errlen, "store root \"%s\" must be an absolute path", cfg->store);
		return SNAP_EINVAL;
	}
	if (cfg->rank < 0 || cfg->world_size < 1 || cfg->rank >= cfg->world_size) {
		snap_fmt(err, errlen, "rank %d is outside world size %d", cfg->rank, cfg->world_size);
		return SNAP_EINVAL;
	}
	if (cfg->flush_mode > 0777 || (cfg->flush_mode & 0600) != 0600) {
		snap_fmt(err, errlen, "flush mode %03o must be permission bits that include 0600", cfg->flush_mode);
		return SNAP_EINVAL;
	}
	if (cfg->flush_dir[0] && cfg->flush_dir[0] != '/') {
		snap_fmt(err, errlen, "flush directory \"%s\" must be an absolute path", cfg->flush_dir);
		return SNAP_EINVAL;
	}
	if (cfg->slots < 2 || cfg->copy_threads < 1 || cfg->chunk_size < 4096 || cfg->chunk_size > (1ull << 31)) {
		snap_fmt(err, errlen, "slots must be >= 2, copy threads >= 1, chunk size in [4 KiB, 2 GiB]");
		return SNAP_EINVAL;
	}
	return 0;
}
