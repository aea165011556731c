/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * store.h - the node store: snapshot slots in shared-memory files under one
 * root, and the manifests that make a slot "committed".
 *
 *   <root>/                         0700, locked by snapsmp (smp.lock)
 *   <root>/<job>/rank-<r>/slot-<i>        slot data, 0600, fallocated
 *   <root>/<job>/rank-<r>/slot-<i>.man    manifest; present = committed
 *
 * Crash-only: the only state is the files. A slot is committed iff its
 * manifest parses, checks out and matches the slot file; anything else is a
 * free slot. A manifest is published by write + rename and withdrawn by
 * unlink before the slot is handed out for writing, so no crash can leave a
 * manifest describing bytes that are being overwritten.
 */
#ifndef SNAP_STORE_H
#define SNAP_STORE_H

#define SNAP_FILE_MAX 1024   /* any path inside a store */

#include <stdint.h>
#include <sys/stat.h>

#include "snap/base.h"
#include "snap/manifest.h"

enum slot_state { SLOT_FREE = 0, SLOT_WRITING = 1, SLOT_COMMITTED = 2 };

struct store_slot {
	int state;
	uint64_t step;                 /* when committed or writing */
	uint64_t size;                 /* file size (reserved bytes) */
	struct snap_manifest man;      /* when committed */
	void *man_bytes;               /* encoded manifest, for RESTORE replies */
	uint32_t man_len;
	void *owner;                   /* connection writing it */
	unsigned refs;                 /* readers (flush, EC) pinning it */
	uint64_t resv;                 /* its file is being reserved in the background
	                                  (smp/store/reserve.h): the ticket; 0 none */
	int superseded;                /* withdrawn (manifest unlinked) while a reader held it: counts
	                                  for nothing, freed by snap_store_unref */
};

struct store_rank {
	uint32_t rank;
	struct store_slot *slots;
	struct snap_layout layout;     /* registered by the current connection */
	int has_layout;
	void *conn;                    /* connected trainer, if any */
	uint32_t pid;
	uint32_t discarded;            /* damaged manifests the scan at start discarded (a committed step lost) */
};

struct store_job {
	char name[SNAP_JOB_MAX + 1];
	struct store_rank **ranks;     /* indexed by rank, sparse */
	uint32_t nranks;               /* array length */
	uint32_t world;                /* from the newest HELLO */
	uint64_t gen;                  /* current generation, see snap_store_new_generation */
	char launch[128];              /* the launch (SNAP_LAUNCH) that started it here; "" unknown */
	uint32_t connected;            /* ranks with a live connection */
	/* Slot files, counted by slots.c for the daemon's log and metrics:
	 * reserved at REGISTER ahead of the save that takes them; found in
	 * place at the layout's size by a REGISTER (kept across a relaunch);
	 * reserved (or finished) by the ACQUIRE that needed them. */
	uint64_t slots_precreated, slots_reused, slots_late;
	/* persistence, kept by the daemon */
	int flushing;                  /* a flush of flush_step is under way */
	uint64_t flush_step;
	int want_latest;               /* flush the newest restorable step after this one */
	int want_step_set;             /* ...and/or this explicitly requested step */
	uint64_t want_step;
	int has_persisted;
	uint64_t persisted;            /* newest step this daemon persisted */
	int has_seen;
	uint64_t seen;                 /* newest restorable step seen */
	unsigned since_flush;          /* new restorable steps since the last flush */
	uint64_t last_flush_ns;
	int has_disk;                  /* restore from disk: the step chosen ... */
	uint64_t disk_step, disk_gen;  /* ... for generation disk_gen */
	/* --ec mesh only (smp/mesh/mesh.c): the newest globally complete step. */
	int mesh_has_latest;
	uint64_t mesh_latest;
	/* --ec mesh only: this node's first rewind of a generation, for the
	 * next agreement round to announce to every node (snap_store_rewind). */
	uint64_t rewound_gen;          /* generation of the last rewind here */
	/* --ec mesh with a flush directory (smp/mesh/meshflush.c, persist.c): this
	 * node's part of the mesh's flush of step mfl_step ... */
	int mfl_state;                 /* ... 0 writing, 1 written (mfl_ranks rank files), 2 failed */
	uint64_t mfl_step;
	uint64_t mfl_try;              /* this node's tries so far: a late result of an earlier
	                                  try of the same step is not this one's */
	uint32_t mfl_ranks;
	uint32_t mfl_world;            /* the step's world size (0: no rank of it here) */
	uint64_t mfl_bytes;            /* bytes this node wrote of it */
	uint64_t mfl_ns;               /* agreement to seal of the last persisted step, here */
	int mfl_busy;                  /* the mesh agreed a flush of this job, or one is wanted */
	int mfl_failed;                /* the last mesh flush failed: its step and why */
	uint64_t mfl_failed_step;
	char mfl_msg[256];
	/* Captured files (smp/files/fileopen.c): namespace changes of this job here, so
	 * the mesh knows when to protect a new generation (smp/mesh/meshcap.c). 1 at
	 * start when the job has a files directory. */
	uint64_t files_ver;
	int news;                      /* 0: none; 1: rewound to news_base; 2: rewound to nothing */
	uint64_t news_base;
	struct store_job *next;
};

struct snap_store {
	char root[SNAP_PATH_MAX];
	int lock_fd;
	int read_only;                 /* opened by snaptool: never modifies */
	unsigned nslots;
	uint64_t mem_limit, mem_used;
	struct store_job *jobs;
	void (*log)(const char *msg);
	int mesh;                      /* --ec: restorable = the mesh's global view (job->mesh_latest) */
	int mesh_flush_wanted;         /* mesh: a node asked for a flush (signal, interval, FLUSH) ... */
	int mesh_flush_taken;          /* ... which a round has taken and not yet decided */
	int mesh_stopped;              /* the mesh thread has ended: nothing more is agreed */
	unsigned ahead;                /* mesh: parity files being made ahead of a job's first protects
	                                  (smp/meshwarm.c): in mem_used, not yet in their files */
	char denied[SNAP_FILE_MAX];    /* first path the scan could not read (EACCES): open fails */
	struct snap_reserver *resv;    /* slot files reserved in the background (smp/store/reserve.h) */
};

/*
 * Open (creating if needed) the store at root and scan it: discard torn
 * manifests, temp files and slots whose file is shorter than its manifest
 * says. read_only opens without locking or modifying (snaptool). Messages
 * about what was discarded go to log (may be NULL).
 */
int snap_store_open(struct snap_store **sp, const char *root, unsigned nslots, uint64_t mem_limit,
		    int read_only, void (*log)(const char *), char *err, size_t errlen);
void snap_store_close(struct snap_store *s);

struct store_job *snap_store_job(struct snap_store *s, const char *name, int create);
struct store_rank *snap_store_rank(struct snap_store *s, struct store_job *j, uint32_t rank, int create);

/* Newest step committed by every rank 0..world-1 with that world size: 0 or SNAP_ENOENT.
 * In a mesh (s->mesh) the ranks live on several nodes: the mesh's agreed view instead. */
int snap_store_latest(const struct snap_store *s, const struct store_job *j, uint64_t *step);

/*
 * Reserve slot files for a layout within the memory budget and make it the
 * rank's layout. On success takes ownership of *lay (zeroes it). The bytes
 * count against the budget at once; the files of free slots are allocated
 * by a thread (smp/store/reserve.h), and an ACQUIRE of a slot waits for its file.
 */
int snap_store_register(struct snap_store *s, struct store_job *j, struct store_rank *r,
			struct snap_layout *lay, char *err, size_t errlen);

/* Apply the slot reservations that have ended (register and acquire do it
 * too); a failed one leaves its slot empty and logs why. s may be NULL. */
void snap_store_reap(struct snap_store *s);
/* Slots whose file is still being reserved (after a reap), and parity
 * files being made ahead (ahead): their bytes are in mem_used, not yet all
 * in their files. */
unsigned snap_store_reserving(struct snap_store *s);

/* Pick a slot to write `step` into, withdraw its manifest, open it read-write. */
int snap_store_acquire(struct snap_store *s, struct store_job *j, struct store_rank *r, uint64_t step,
		       void *owner, uint32_t *slot, int *fd, char *err, size_t errlen);

/* Publish the manifest of a slot that `owner` has written. */
int snap_store_commit(struct snap_store *s, struct store_job *j, struct store_rank *r, void *owner,
		      uint32_t slot, uint64_t step, const uint32_t *crc, const uint32_t *len, uint32_t ncrc,
		      int verify, char *err, size_t errlen);

/*
 * A COMMIT for a slot that a previous daemon handed to this rank and that
 * died before the commit reached it (the trainer reconnected): publish it if
 * the slot is still free, under the same rules as an ACQUIRE of that step
 * followed by a COMMIT; succeed without change if the dead daemon had
 * published exactly this commit already.
 */
int snap_store_recommit(struct snap_store *s, struct store_job *j, struct store_rank *r, void *owner,
			uint32_t slot, uint64_t step, const uint32_t *crc, const uint32_t *len, uint32_t ncrc,
			int verify, char *err, size_t errlen);

/*
 * Generations keep two incarnations of a job from mixing. A job's ranks
 * reconnecting after all of them were gone is a new incarnation: call this,
 * and manifests committed from then on carry the new number. The counter is
 * kept in <root>/<job>/generation too, so that a restarted daemon never
 * hands out again a number a dead one gave to processes that may still be
 * alive and reconnect with it.
 */
void snap_store_new_generation(struct snap_store *s, struct store_job *j);
/* Adopt generation gen (> j->gen) that a live process of the job reports. */
void snap_store_set_generation(struct snap_store *s, struct store_job *j, uint64_t gen);

/*
 * A restore of step `base` (or none: has_base == 0) starts a new timeline:
 * withdraw every rank's committed steps newer than base that an older
 * generation committed, so they can never combine with the new timeline's
 * steps into a "restorable" step that no incarnation ever had.
 *
 * In a mesh the other ranks' older steps live on other nodes, where no rank
 * of the new incarnation may have connected yet. So the first rewind of a
 * generation on a node is also announced to the whole mesh (j->news, sent
 * by the next agreement round), and every node then drops its steps past
 * the base that no connected process of the current generation wrote
 * (snap_store_supersede). A slot being read is withdrawn all the same: its
 * manifest goes now, its memory when the reader is done (snap_store_unref).
 */
int snap_store_rewind(struct snap_store *s, struct store_job *j, int has_base, uint64_t base, char *err,
		      size_t errlen);

/*
 * Mesh: another node announced that the job's new incarnation rewound to
 * `base` (or to nothing: has_base == 0). Withdraw this node's committed steps
 * of the job past it that were not written by the connected process of the
 * current generation: they belong to a dead incarnation's timeline.
 * same_launch: the incarnation that rewound is the launch (SNAP_LAUNCH) that
 * started this node's current generation, so the current generation's steps
 * stay even where their writers have exited: a rank of one launch that
 * starts late (its peers on other nodes already saved and exited) is no
 * relaunch. Returns the number of slots withdrawn.
 */
unsigned snap_store_supersede(struct snap_store *s, struct store_job *j, int has_base, uint64_t base,
			      int same_launch);
/* Withdraw committed slot i outside the normal recycling (a step damaged
 * beyond repair, smp/heal/repair.c): logged with why; its manifest goes now. */
int snap_store_withdraw(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i, const char *why,
			char *err, size_t errlen);
/* A reader (protect, flush) is done with slot i: a slot withdrawn while it
 * read is freed now. */
void snap_store_unref(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i);
/* Mesh: is this committed slot the current incarnation's (its writer connected)? */
int snap_store_slot_current(const struct store_job *j, const struct store_rank *r, const struct store_slot *sl);

/*
 * Open a store file only if it is a regular file (O_NONBLOCK | O_NOFOLLOW,
 * then fstat): a FIFO planted where a manifest belongs must not hang a scan.
 * Returns the descriptor, or -1 with errno set (ENOENT: absent; EINVAL: not
 * a regular file) and why describing the problem.
 */
int snap_store_open_regular(const char *path, int flags, struct stat *st, char *err, size_t errlen);

/* A message through the store's log callback (none when NULL). */
void snap_store_logf(const struct snap_store *s, const char *fmt, ...) SNAP_PRINTF(2, 3);

/* Forget a slot's manifest in memory (the file is the caller's business): free. */
void snap_store_slot_clear(struct store_slot *sl);

/* Free every slot `owner` was writing (its trainer went away). */
void snap_store_release_owner(const struct snap_store *s, struct store_rank *r, void *owner);

/* The committed slot holding `step` of a rank, or NULL. */
struct store_slot *snap_store_find(const struct snap_store *s, struct store_rank *r, uint64_t step, uint32_t *slot);

/* Open a slot's file read-only, checking it still holds the manifest's bytes. */
int snap_store_open_slot(struct snap_store *s, const struct store_job *j, const struct store_rank *r,
			 uint32_t slot, char *err, size_t errlen);

/* Path of a slot file (or its manifest when man != 0). */
int snap_store_path(const struct snap_store *s, const char *job, uint32_t rank, uint32_t slot, int man,
		    char *out, size_t cap);

#endif
