/* SPDX-License-Identifier: BSD-3-Clause */
/* seeds.h - valid small streams of every codec and dtype, the starting
 * points of fuzzing and of the malformed-stream tests. */
#ifndef SNAP_KERNELS_SEEDS_H
#define SNAP_KERNELS_SEEDS_H
#include <stddef.h>
#include <stdint.h>

#define NSEEDS 12
/* Make seed i (0..NSEEDS-1) into buf (cap bytes); returns its length or 0. */
size_t seed_stream(int i, uint8_t *buf, size_t cap);
#endif
