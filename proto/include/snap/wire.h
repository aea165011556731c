/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * wire.h - the trainer <-> snapsmp protocol over a Unix stream socket.
 *
 * Every message is a 16-byte header (magic "SNAP", version, type, payload
 * length, status) and a payload of at most SNAP_WIRE_MAX bytes encoded with
 * buf.h. A reply has the request's type | SNAP_MSG_REPLY; a negative status
 * means failure and the payload is then a human-readable message. Slot files
 * travel as SCM_RIGHTS descriptors attached to replies. docs/design/store-and-protocol.md,
 * "Socket protocol", lists each message's payload.
 */
#ifndef SNAP_WIRE_H
#define SNAP_WIRE_H

#include <stdint.h>

#define SNAP_WIRE_MAGIC 0x50414E53u     /* "SNAP" little-endian */
#define SNAP_WIRE_VERSION 4           /* 2: codec bounds, chunk lengths; 3: pinned bytes; 4: RESTORE's note */
#define SNAP_WIRE_HDR 16
#define SNAP_WIRE_MAX (64u << 20)

enum snap_msg_type {
	SNAP_MSG_HELLO = 1,     /* str job, u32 rank, u32 world, u32 pid, u64 gen[, str launch] -> u32 slots, u64 mem_limit, u64 mem_used, u64 gen */
	SNAP_MSG_REGISTER = 2,  /* layout -> (empty) */
	SNAP_MSG_ACQUIRE = 3,   /* u64 step -> u32 slot, u64 bytes + fd (read-write) */
	SNAP_MSG_COMMIT = 4,    /* u32 slot, u64 step, u32 ncrc, u32 crc[ncrc], u32 len[ncrc], u64 pinned -> (empty) */
	SNAP_MSG_LATEST = 5,    /* (empty) -> u64 step */
	SNAP_MSG_RESTORE = 6,   /* u64 step (UINT64_MAX = latest) -> manifest bytes + fd (read-only) */
	SNAP_MSG_FLUSH = 7,     /* str job, u64 step, u8 wait -> [u64 step, u64 bytes, u64 ns]; no HELLO needed */
	SNAP_MSG_RECOMMIT = 8,  /* as COMMIT, for a slot acquired from a daemon that died -> (empty) */
	SNAP_MSG_STATUS = 9,    /* (empty) -> u64 mem_limit, u64 mem_used, u32 slots, u32 pid, u64 pinned, u32 pinners,
	                           u32 slot files being reserved, then the self-healing counters: u64 repaired_chunks,
	                           u64 damaged_steps, u64 scrubbed_bytes, u64 scrub_passes, u64 scrub_rate, str last
	                           damage ("none"; kept in the store, snap/damage.h), u64 damaged_files (older
	                           daemons end before these); no HELLO needed */
	SNAP_MSG_REPAIR = 10,   /* str job, u32 rank (UINT32_MAX: all), u64 step (UINT64_MAX = latest) -> u64 step,
	                           u32 ranks checked, u32 bad chunks, u32 repaired, u32 ranks withdrawn, u32 slot files
	                           mended (missing or short: recreated or grown), str how, u32 of the repaired
	                           from parity (the rest from the flush; older daemons end before it);
	                           no HELLO needed (snaptool verify --repair) */
	/* Captured files (integration/preload, smp/files/fileopen.c); no HELLO needed, FATTACH first. */
	SNAP_MSG_FATTACH = 16,  /* str job, u32 pid -> u64 mem_limit, u64 mem_used */
	SNAP_MSG_FCREATE = 17,  /* str path, u32 mode, u8 excl -> u32 errno, u64 id (files/data/<id> created empty) */
	SNAP_MSG_FGROW = 18,    /* u64 id, u64 bytes -> (empty); SNAP_ENOSPC: the store is full */
	SNAP_MSG_FCOMMIT = 19,  /* u64 id, u64 size, u32 chunk, u32 n, u32 crc[n] [u32 set, u32 mode, u64 mtime_ns] -> (empty) */
	SNAP_MSG_FABORT = 20,   /* u64 id -> (empty) */
	SNAP_MSG_FRENAME = 21,  /* str from, str to -> u32 errno */
	SNAP_MSG_FUNLINK = 22,  /* str path, u8 store_only -> u32 errno */
	SNAP_MSG_FFLUSH = 23,   /* u8 wait -> u64 files, u64 bytes (flushed now / still to flush) */
	SNAP_MSG_REPLY = 0x8000,
};

struct snap_msg_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t len;
	int32_t status;
};

/* Decode and check a header from SNAP_WIRE_HDR bytes: SNAP_EPROTO/EFORMAT on a bad one. */
int snap_wire_parse_hdr(const void *b, struct snap_msg_hdr *h);
void snap_wire_put_hdr(void *b, uint16_t type, int32_t status, uint32_t len);

/*
 * Send one message (blocking, complete, no SIGPIPE). pass_fd >= 0 attaches a
 * descriptor. Returns 0 or SNAP_ESMP.
 */
int snap_wire_send(int sock, uint16_t type, int32_t status, const void *payload, uint32_t len, int pass_fd);

/*
 * Receive one message, waiting at most timeout_ms (-1: forever). *payload is
 * malloc'd (NULL when empty; free it). If fd_out is not NULL it receives a
 * passed descriptor or -1; descriptors nobody asked for are closed. Returns 0,
 * SNAP_ESMP (closed/error), SNAP_ETIMEDOUT, SNAP_EPROTO or SNAP_ENOMEM.
 */
int snap_wire_recv(int sock, struct snap_msg_hdr *h, void **payload, int *fd_out, int timeout_ms);

#endif
