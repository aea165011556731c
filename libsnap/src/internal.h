/* SPDX-License-Identifier: BSD-3-Clause */
/* internal.h - helpers shared by libsnap, snapsmp and snaptool; not installed. */
#ifndef SNAP_INTERNAL_H
#define SNAP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "snap/snap.h"

#if defined(__GNUC__)
#define SNAP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SNAP_PRINTF(a, b)
#endif

/* snprintf into err[errlen] when err is not NULL. */
void snap_fmt(char *err, size_t errlen, const char *fmt, ...) SNAP_PRINTF(3, 4);

/* CRC32C (Castagnoli, ISA-L crc32_iscsi), standard init/final xor: crc32c("") == 0. */
uint32_t snap_crc32c(const void *buf, size_t len);
/* Continue a CRC: snap_crc32c_update(snap_crc32c(a), b) == snap_crc32c(a ++ b). */
uint32_t snap_crc32c_update(uint32_t crc, const void *buf, size_t len);

int snap_job_name_ok(const char *job);
/* "none" -> 0, "lz4" -> 1. */
int snap_flush_codec_parse(const char *s, int *codec);
/*
 * A codec spec as in SNAP_CODEC_PARAM: "none", "lossless", "abs:<bound>",
 * "rel:<factor>". 0 or SNAP_EINVAL. The name of a codec id in the same terms.
 */
int snap_codec_spec_parse(const char *s, int *codec, double *bound);
const char *snap_codec_spec_name(int codec);
int snap_config_check(const struct snap_config *cfg, char *err, size_t errlen);
/* "0600", "640", ...: octal permission bits including 0600. 0 or SNAP_EINVAL. */
int snap_flush_mode_parse(const char *s, unsigned *mode);
/* Fill cfg->socket with <store>/smp.sock when it was left empty (not set explicitly). */
int snap_config_socket(struct snap_config *cfg, char *err, size_t errlen);

/*
 * CRC32C of a ++ b from crc(a), crc(b) and len(b), without the bytes (zlib's
 * crc32_combine method over GF(2) with the Castagnoli polynomial). Lets the
 * flush derive a region's CRC from its chunks' CRCs instead of rereading it.
 */
uint32_t snap_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* Monotonic clock in nanoseconds. */
uint64_t snap_now_ns(void);

#endif
