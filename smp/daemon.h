/* SPDX-License-Identifier: BSD-3-Clause */
/* daemon.h - snapsmp's serving loop, callable from main() and from tests. */
#ifndef SNAP_DAEMON_H
#define SNAP_DAEMON_H

#include <stddef.h>

#include "snap/smp_config.h"
#include "snap/base.h"
#include "snap/snap.h"
#include "snap/store.h"

struct snap_mesh;
/* Serve cfg->store on cfg->socket until SIGTERM/SIGINT, 0 on clean shutdown;
 * as one node of an --ec mesh when mesh is set (from snap_mesh_init). */
/* Once the daemon listens with its store loaded, *serving becomes 1 and
 * ready_fd, when >= 0, gets one byte and is closed (snapsmp --detach's
 * parent waits on it). A failure with *serving still 0 happened at start:
 * SNAP_EBUSY then means the store is another snapsmp's. */
int snap_smp_serve(const struct snap_smp_config *cfg, int quiet, struct snap_mesh *mesh, int ready_fd, int *serving,
		   char *err, size_t errlen);

#endif
