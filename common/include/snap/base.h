/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/base.h - the base layer every libsnap component may use (common/):
 * messages, CRC32C, the clock, value parsers. It uses nothing of the
 * project but snap/error.h and snap/types.h. Not installed.
 */
#ifndef SNAP_BASE_H
#define SNAP_BASE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"

#if defined(__GNUC__)
#define SNAP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SNAP_PRINTF(a, b)
#endif

/*
 * The one way a message travels with an error code inside the project: the
 * callee writes into the caller's err[errlen] (which may be NULL) and
 * returns the negative code. snprintf into err[errlen] when err is not NULL.
 */
void snap_fmt(char *err, size_t errlen, const char *fmt, ...) SNAP_PRINTF(3, 4);

/*
 * CRC32C (Castagnoli, ISA-L crc32_iscsi), standard init/final xor:
 * crc32c("") == 0, crc32c("123456789") == 0xE3069283. Also exported by
 * libsnap.so (snap/snap.h declares the same function).
 */
SNAP_API uint32_t snap_crc32c(const void *buf, size_t len);
/* Continue a CRC: snap_crc32c_update(snap_crc32c(a), b) == snap_crc32c(a ++ b). */
uint32_t snap_crc32c_update(uint32_t crc, const void *buf, size_t len);
/*
 * CRC32C of a ++ b from crc(a), crc(b) and len(b), without the bytes (zlib's
 * crc32_combine method over GF(2) with the Castagnoli polynomial). Lets the
 * flush derive a region's CRC from its chunks' CRCs instead of rereading it.
 */
uint32_t snap_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/*
 * Copy n bytes to memory the caller will not read soon (a restore into a
 * trainer's buffers, best from a block still in cache): non-temporal stores
 * on x86-64,
 * whose speed does not depend on dst's alignment (copy.c says why memcpy's
 * does), memcpy elsewhere. Ordered before return like memcpy.
 * snap_copy_stream_base is the plain C version the tests compare with.
 */
void snap_copy_stream(void *dst, const void *src, size_t n);
void snap_copy_stream_base(void *dst, const void *src, size_t n);

/*
 * Whether files created under dir get transparent huge pages (hugepages.c
 * says why it matters): 1 yes (a tmpfs mounted huge=always|within_size, or
 * shmem_enabled=force), 0 a tmpfs without them, -1 not a tmpfs or dir
 * unreadable. desc gets the setting that decided, e.g. "tmpfs, huge=never".
 */
int snap_store_hugepages(const char *dir, char *desc, size_t len);

/*
 * The part of snap_store_hugepages that reads /proc/self/mountinfo, for the
 * tests: from the mount table in f, the huge= option of the mount holding
 * path (the longest mount point above it, the later one of two at the same
 * point) into out ("" when it is not a tmpfs or has no huge=). 0, or -1 when
 * no line holds path. Malformed lines and lines over 4 KiB are skipped.
 */
int snap_mountinfo_huge(FILE *f, const char *path, char *out, size_t cap);

/* Monotonic clock in nanoseconds. */
uint64_t snap_now_ns(void);

/* "4096", "4K", "4KiB", "16M", "2G", "1T" -> bytes. 0 or SNAP_EINVAL (also for NULL). */
SNAP_API int snap_parse_size(const char *s, uint64_t *out);
/* 1..SNAP_JOB_MAX of [A-Za-z0-9._-], no leading '.': 1 if ok. */
int snap_job_name_ok(const char *job);
/*
 * A codec spec as in SNAP_CODEC_PARAM: "none", "lossless", "abs:<bound>",
 * "rel:<factor>". 0 or SNAP_EINVAL. The name of a codec id in the same terms.
 */
int snap_codec_spec_parse(const char *s, int *codec, double *bound);
const char *snap_codec_spec_name(int codec);

/*
 * SNAP_* variables. Unset or empty leaves *out alone. snap_env_int takes
 * the first set variable of a NULL-terminated list (SNAP_RANK, then the
 * launchers' names) and checks [lo, hi]; snap_env_size parses a size
 * (snap_parse_size) >= lo; snap_env_str copies into dst[cap]. On a bad value:
 * SNAP_EINVAL and a message naming the variable and what it expects.
 */
int snap_env_int(const char *const *names, int *out, long lo, long hi, char *err, size_t errlen);
int snap_env_size(const char *name, uint64_t *out, uint64_t lo, char *err, size_t errlen);
int snap_env_str(const char *name, char *dst, size_t cap, char *err, size_t errlen);

/*
 * Structs of the public ABI grow at their end; the caller says how big its
 * struct is. copyin: src_size < min_size -> SNAP_EINVAL (not a struct of any
 * released layout); bytes of src past dst_size not all zero ->
 * SNAP_EUNSUPPORTED (the caller sets fields this build does not know);
 * otherwise dst gets the common prefix and keeps its own values (defaults)
 * past it. copyout: dst gets the common prefix, its bytes past src_size
 * are zeroed.
 */
int snap_abi_copyin(void *dst, size_t dst_size, const void *src, size_t src_size, size_t min_size);
void snap_abi_copyout(void *dst, size_t dst_size, const void *src, size_t src_size);

#endif
