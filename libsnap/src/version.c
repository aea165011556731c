/* SPDX-License-Identifier: BSD-3-Clause */
/* The version of the library loaded, against the header a program was built with. */
#include "snap/snap.h"

#define SNAP_STR_(x) #x
#define SNAP_STR(x) SNAP_STR_(x)

int snap_version(void)
{
	return SNAP_VERSION_NUMBER;
}

const char *snap_version_string(void)
{
	return SNAP_STR(SNAP_VERSION_MAJOR) "." SNAP_STR(SNAP_VERSION_MINOR) "." SNAP_STR(SNAP_VERSION_PATCH);
}
