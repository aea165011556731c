/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers every component may use: messages, clock, value parsers. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "snap/base.h"

void snap_fmt(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || errlen == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

uint64_t snap_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

int snap_abi_copyin(void *dst, size_t dst_size, const void *src, size_t src_size, size_t min_size)
{
	if (src_size < min_size)
		return SNAP_EINVAL;
	for (size_t i = dst_size; i < src_size; i++)
		if (((const unsigned char *)src)[i])
			return SNAP_EUNSUPPORTED;
	memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
	return 0;
}

void snap_abi_copyout(void *dst, size_t dst_size, const void *src, size_t src_size)
{
	memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
	if (dst_size > src_size)
		memset((unsigned char *)dst + src_size, 0, dst_size - src_size);
}
