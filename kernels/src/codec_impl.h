/* codec_impl.h - block coders of the C twin, shared by codec.c. */
#ifndef SNAP_CODEC_IMPL_H
#define SNAP_CODEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "codec_core.h"

/* Encode n (1..SNAP_CODEC_BLOCK_MAX) values at src into at most cap bytes;
 * *len gets the block size. 0 or SNAP_EOVERFLOW. */
int snapc_ll_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    uint8_t *dst, size_t cap, size_t *len);
/* Decode a block of exactly len bytes into n values. 0 or SNAP_ECORRUPT. */
int snapc_ll_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, uint8_t *dst);

int snapc_ly_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    const struct snapc_lyq *qp, uint8_t *dst, size_t cap,
		    size_t *len);
int snapc_ly_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, const struct snapc_lyq *qp,
		    uint8_t *dst);

#endif
