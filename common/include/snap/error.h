/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/error.h - error codes shared by every libsnap component.
 *
 * Every libsnap function that can fail returns 0 (or a non-negative count) on
 * success and one of the negative codes below on failure. Components that know
 * nothing of each other (kernels/, ec/) include this header alone: it is a
 * plain enum with no link-time dependency. snap_strerror() lives in libsnap.
 */
#ifndef SNAP_ERROR_H
#define SNAP_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Marks the functions libsnap.so exports: the libraries are built with
 * -fvisibility=hidden, so everything else stays inside them.
 */
#ifndef SNAP_API
#if defined(__GNUC__)
#define SNAP_API __attribute__((visibility("default")))
#else
#define SNAP_API
#endif
#endif

enum snap_error {
	SNAP_OK = 0,
	SNAP_EINVAL = -1,        /* invalid argument */
	SNAP_ENOMEM = -2,        /* out of (heap) memory */
	SNAP_EIO = -3,           /* an I/O call failed; see the context message */
	SNAP_ENOENT = -4,        /* no such step, region, job or file */
	SNAP_ECORRUPT = -5,      /* checksum mismatch or torn data */
	SNAP_EPROTO = -6,        /* malformed or unexpected protocol message */
	SNAP_ESMP = -7,          /* snapsmp unreachable or connection lost */
	SNAP_EBUSY = -8,         /* busy: no free slot yet, rank or store in use */
	SNAP_EUNFENCED = -9,     /* previous save was not fenced */
	SNAP_ENOSPC = -10,       /* memory budget or store space exhausted */
	SNAP_EMISMATCH = -11,    /* layout differs from the snapshot's */
	SNAP_EPERM = -12,        /* permission denied */
	SNAP_ESTATE = -13,       /* call not valid in the current state */
	SNAP_ETIMEDOUT = -14,    /* timed out */
	SNAP_EFORMAT = -15,      /* unknown format, magic or version */
	SNAP_EUNSUPPORTED = -16, /* feature not available in this build */
	SNAP_ETRUNC = -17,       /* input shorter than its header says */
	SNAP_EOVERFLOW = -18,    /* output buffer too small */
	SNAP_ERANGE = -19,       /* value out of range (e.g. error bound) */
	SNAP_ELOST = -20,        /* more failures than the redundancy covers */
};

/* Static English text for a code returned by any libsnap component. Never NULL. */
SNAP_API const char *snap_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_ERROR_H */
