/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/proto.h - what a client and its snapsmp agree on besides the wire and
 * manifest formats (snap/wire.h, snap/manifest.h): the settings both read.
 * struct snap_config itself is defined by snap/config.h (common/), part of
 * the public API snap/snap.h; proto/ uses its definitions, never libsnap.so.
 * Not installed.
 */
#ifndef SNAP_PROTO_H
#define SNAP_PROTO_H

#include <stddef.h>

#include "snap/base.h"
#include "snap/config.h"

/* sizeof(struct snap_config) in 0.4, the first layout with a size field. */
#define SNAP_CONFIG_SIZE_0_4 (offsetof(struct snap_config, capture) + 1024)

/*
 * dst = a whole struct snap_config of this version made from the caller's
 * src (src->size bytes; see "Growing the ABI" in snap.h): the fields src
 * lacks take their defaults. 0, SNAP_EINVAL (not initialised) or
 * SNAP_EUNSUPPORTED (sets fields this build does not know).
 */
int snap_config_get(struct snap_config *dst, const struct snap_config *src, char *err, size_t errlen);
int snap_config_check(const struct snap_config *cfg, char *err, size_t errlen);
/* Fill cfg->socket with <store>/smp.sock when it was left empty (not set explicitly). */
int snap_config_socket(struct snap_config *cfg, char *err, size_t errlen);

/*
 * SNAP_AUTOSTART: start snapsmp for store (serving sock), detached, after a
 * connect found no listener there; returns when it serves, or when another
 * snapsmp holds the store (a concurrent first client's: it serves in a
 * moment), or at deadline_ns (CLOCK_MONOTONIC, snap_now_ns). The program is
 * $SNAPSMP, else bin/snapsmp of the prefix the calling library is installed
 * in, else snapsmp on PATH; its environment is the caller's without
 * LD_PRELOAD. 0 (connect now, retrying until the caller's deadline), or
 * SNAP_ESMP / SNAP_ENOENT / SNAP_ENOMEM with a message naming the program
 * and its log.
 */
int snap_smp_autostart(const char *store, const char *sock, uint64_t deadline_ns, char *err, size_t errlen);
#endif
