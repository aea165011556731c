/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the mesh that mesh.c, protect.c and recover.c share (see
 * mesh_int.h): the job list, the calling thread's CPU time and the error
 * exit. Calls nothing above it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mesh/mesh_int.h"

struct mjob *mesh_job(struct snap_mesh *mesh, const char *name)
{
	struct mjob **pp = &mesh->jobs;
	for (; *pp; pp = &(*pp)->next) {
		int c = strcmp((*pp)->name, name);
		if (c == 0)
			return *pp;
		if (c > 0)
			break;
	}
	struct mjob *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->next = *pp;
	*pp = j;
	return j;
}

struct mjob *mesh_job_find(struct snap_mesh *mesh, const char *name)
{
	for (struct mjob *j = mesh->jobs; j; j = j->next)
		if (strcmp(j->name, name) == 0)
			return j;
	return NULL;
}

uint64_t mesh_thread_cpu_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

_Noreturn void snap_mesh_abort(struct snap_mesh *mesh, int code)
{
	(void)mesh;
	MPI_Abort(MPI_COMM_WORLD, code);
	_exit(code); /* not reached */
}
