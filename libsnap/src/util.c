/* Small helpers shared by every binary: messages, CRC32C, clock. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include <isa-l/crc.h>

#include "internal.h"

void snap_fmt(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || errlen == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

uint32_t snap_crc32c_update(uint32_t crc, const void *buf, size_t len)
{
	/* ISA-L's crc32_iscsi takes and returns the raw (non-inverted) register,
	 * and an int length: feed it at most 1 GiB at a time. */
	const unsigned char *p = buf;
	crc = ~crc;
	while (len > 0) {
		size_t n = len < (1u << 30) ? len : (1u << 30);
		crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
		p += n;
		len -= n;
	}
	return ~crc;
}

uint32_t snap_crc32c(const void *buf, size_t len)
{
	return snap_crc32c_update(0, buf, len);
}

uint64_t snap_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
