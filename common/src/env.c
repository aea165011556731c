/* SPDX-License-Identifier: BSD-3-Clause */
/* SNAP_* environment variables parsed with messages that name them. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"

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

int snap_env_int(const char *const *names, int *out, long lo, long hi, char *err, size_t errlen)
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

int snap_env_size(const char *name, uint64_t *out, uint64_t lo, char *err, size_t errlen)
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

int snap_env_str(const char *name, char *dst, size_t cap, char *err, size_t errlen)
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
