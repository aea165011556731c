/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * status.h - the reply to STATUS (snap/wire.h: SNAP_MSG_STATUS), read in
 * one place for the programs that ask a running snapsmp for its state
 * (snaptool status, snapbench scrub). Not part of libsnap's API.
 */
#ifndef SNAP_STATUS_H
#define SNAP_STATUS_H

#include <stddef.h>
#include <stdint.h>

/* A daemon's state as STATUS reports it. Fields an older daemon does not
 * send read 0, with has_heal / has_files saying whether they came. */
struct snap_status {
	uint64_t mem_limit, mem_used;
	uint32_t slots, pid;
	uint64_t pinned;          /* bytes the connected trainers pinned (part of mem_used) */
	uint32_t pinners;         /* trainers that pinned some */
	uint32_t reserving;       /* slot files still being reserved (0 from older daemons) */
	int has_heal;             /* the self-healing counters came */
	uint64_t repaired_chunks, damaged_steps, scrubbed_bytes, scrub_passes, scrub_rate;
	char last_damage[768];    /* "none" when there was none */
	int has_files;            /* damaged_files came */
	uint64_t damaged_files;
};

/* Read a STATUS reply's payload into *st: 0, or -1 (*st all zero) when it
 * is malformed (too short for what it starts, a bad string). */
int snap_status_decode(const void *payload, size_t len, struct snap_status *st);

/* Ask the snapsmp listening on socket path sock: connect, STATUS, wait up
 * to timeout_ms for the reply and decode it. 0, or -1 when none answers,
 * it refuses, or the reply is malformed (*st all zero). */
int snap_status_ask(const char *sock, int timeout_ms, struct snap_status *st);

#endif
