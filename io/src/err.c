/* SPDX-License-Identifier: BSD-3-Clause */
/* Error messages, errno mapping, and the guard around every HDF5 section. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>


#include "snap/base.h"
#include "io_int.h"

void io_err_clear(struct snap_io_err *err)
{
	if (err) {
		err->code = 0;
		err->msg[0] = '\0';
	}
}

static int vfail(struct snap_io_err *err, int code, const char *suffix, const char *fmt, va_list ap)
{
	if (!err || err->code != 0)
		return code;
	err->code = code;
	int k = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	if (suffix && k >= 0 && (size_t)k < sizeof err->msg)
		snprintf(err->msg + k, sizeof err->msg - (size_t)k, "%s", suffix);
	return code;
}

int io_fail(struct snap_io_err *err, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, NULL, fmt, ap);
	va_end(ap);
	return code;
}

/* The innermost HDF5 error is the one that says what is wrong with the file
 * ("addr overflow", "bad object header version"); the outer ones only say
 * which API call failed. */
static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *arg)
{
	char *out = arg;
	if (n == 0 && e->desc)
		snprintf(out, 160, " (HDF5: %s in %s)", e->desc, e->func_name ? e->func_name : "?");
	return 0;
}

int io_fail_h5(struct snap_io_err *err, int code, const char *fmt, ...)
{
	char h5[160] = "";
	H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, h5);
	H5Eclear2(H5E_DEFAULT);
	va_list ap;
	va_start(ap, fmt);
	vfail(err, code, h5, fmt, ap);
	va_end(ap);
	return code;
}

int io_errno_code(int e)
{
	switch (e) {
	case ENOSPC: case EDQUOT: return SNAP_ENOSPC;
	case EACCES: case EPERM: case EROFS: return SNAP_EPERM;
	case ENOENT: case ENOTDIR: return SNAP_ENOENT;
	case ENOMEM: return SNAP_ENOMEM;
	case EINVAL: return SNAP_EINVAL;
	default: return SNAP_EIO;
	}
}

static pthread_mutex_t h5_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int h5_depth;
static H5E_auto2_t h5_saved_fn;
static void *h5_saved_data;

void io_h5_enter(void)
{
	pthread_mutex_lock(&h5_lock);
	if (h5_depth++ == 0) {
		H5Eget_auto2(H5E_DEFAULT, &h5_saved_fn, &h5_saved_data);
		H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
	}
}

void io_h5_leave(void)
{
	if (--h5_depth == 0)
		H5Eset_auto2(H5E_DEFAULT, h5_saved_fn, h5_saved_data);
	pthread_mutex_unlock(&h5_lock);
}

/* io carries the CRC register un-inverted between calls (its running
 * state in the writers); the bytes go through common's one CRC32C. */
uint32_t io_crc_update(uint32_t state, const void *buf, size_t len)
{
	return ~snap_crc32c_update(~state, buf, len);
}

uint32_t io_crc_u32le(uint32_t state, uint32_t v)
{
	unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
			       (unsigned char)(v >> 24)};
	return io_crc_update(state, le, 4);
}

uint32_t snap_io_crc32c(const void *buf, size_t len)
{
	return snap_crc32c(buf, len);
}
