/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * backend.cu - libsnap_cuda.so: the CUDA side of libsnap's copy pipeline
 * (the contract is libsnap/src/gpu.h).
 *
 * A save moves device memory into the rank's slot, a shared-memory file the
 * trainer mapped and pinned once (cudaHostRegister), on non-blocking streams
 * ordered after the trainer's stream by an event. Raw chunks go as
 * cudaMemcpyAsync D2H on the copy stream. Codec chunks go as the compression
 * kernels (kernels/cuda) writing their frame straight into the pinned slot
 * through its device mapping, so only the compressed bytes cross PCIe; they
 * take turns over a few codec streams, each with its scratch, since one
 * 4 MiB chunk's kernels fill only part of a large GPU. An event per chunk
 * tells the copy threads when to CRC it; the save's end joins the codec
 * streams into the copy stream, and its done event is what the
 * stream-ordered fence waits on.
 *
 * Restores use lanes (a stream and device scratch each), one per thread
 * that restores at once, grown on demand and kept until close.
 */
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "snap/codec.h"
#include "snap/error.h"

struct lane {
	cudaStream_t st;
	void *buf;              /* frame copy (decode) */
	size_t buf_len;
	void *scratch;
	size_t scratch_len;
	int *status;
	struct lane *next_free, *next_all;
};

struct pin {
	void *base;
	uint64_t len;
};

#define CODEC_STREAMS 4

/* A stream for codec chunks and the compressor scratch it reuses in order. */
struct cstream {
	cudaStream_t st;
	cudaEvent_t join;
	void *scratch;
	size_t scratch_len;
	int used;               /* ran a chunk of the current save */
};

struct snap_gpu {
	int device;
	cudaStream_t copy;
	cudaEvent_t start, done;
	struct cstream cs[CODEC_STREAMS];
	unsigned next_cs;       /* round robin over cs, from each save's start */
	cudaEvent_t *ev;        /* one per chunk of the current layout */
	uint32_t nev;
	uint64_t *lens;         /* pinned + mapped: compressed length per chunk */
	uint64_t *d_lens;
	struct pin *pins;
	unsigned npins, cappins;
	uint64_t pinned;
	pthread_mutex_t mu;     /* lanes, pins */
	struct lane *free_lanes, *all_lanes;
};

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

#define CUDA_TRY(call, what)                                                                   \
	do {                                                                                   \
		cudaError_t e_ = (call);                                                       \
		if (e_ != cudaSuccess)                                                         \
			return fail(err, errlen, SNAP_EIO, "%s: %s", what, cudaGetErrorString(e_)); \
	} while (0)

static int g_probe(const void *ptr, uint64_t bytes, int *device, char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0)
		return fail(err, errlen, SNAP_EUNSUPPORTED, "no usable CUDA device (%s)",
			    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
	struct cudaPointerAttributes a;
	e = cudaPointerGetAttributes(&a, ptr);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return fail(err, errlen, SNAP_EINVAL, "pointer %p is not known to CUDA (%s)", ptr, cudaGetErrorString(e));
	}
	if (a.type != cudaMemoryTypeDevice)
		return fail(err, errlen, SNAP_EINVAL, "pointer %p is not device memory (CUDA memory type %d)", ptr,
			    (int)a.type);
	/* The whole range must be one allocation's: probe its last byte too. */
	if (bytes > 1) {
		struct cudaPointerAttributes b;
		e = cudaPointerGetAttributes(&b, (const char *)ptr + bytes - 1);
		if (e != cudaSuccess || b.type != cudaMemoryTypeDevice || b.device != a.device) {
			cudaGetLastError();
			return fail(err, errlen, SNAP_EINVAL, "range %p + %llu bytes runs past its device allocation",
				    ptr, (unsigned long long)bytes);
		}
	}
	*device = a.device;
	return 0;
}

static int g_open(struct snap_gpu **gp, int device, char *err, size_t errlen)
{
	*gp = NULL;
	struct snap_gpu *g = (struct snap_gpu *)calloc(1, sizeof(*g));
	if (!g)
		return fail(err, errlen, SNAP_ENOMEM, "out of memory");
	g->device = device;
	pthread_mutex_init(&g->mu, NULL);
	*gp = g;
	CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
	CUDA_TRY(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking), "cudaStreamCreate");
	CUDA_TRY(cudaEventCreateWithFlags(&g->start, cudaEventDisableTiming), "cudaEventCreate");
	CUDA_TRY(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming), "cudaEventCreate");
	for (int k = 0; k < CODEC_STREAMS; k++) {
		CUDA_TRY(cudaStreamCreateWithFlags(&g->cs[k].st, cudaStreamNonBlocking), "cudaStreamCreate");
		CUDA_TRY(cudaEventCreateWithFlags(&g->cs[k].join, cudaEventDisableTiming), "cudaEventCreate");
	}
	return 0;
}

static void g_close(struct snap_gpu *g)
{
	if (!g)
		return;
	cudaSetDevice(g->device);
	/* Nothing may still write the length table or the slots. */
	if (g->copy)
		cudaStreamSynchronize(g->copy);
	for (int k = 0; k < CODEC_STREAMS; k++)
		if (g->cs[k].st)
			cudaStreamSynchronize(g->cs[k].st);
	for (struct lane *l = g->all_lanes, *n; l; l = n) {
		n = l->next_all;
		cudaStreamDestroy(l->st);
		cudaFree(l->buf);
		cudaFree(l->scratch);
		cudaFree(l->status);
		free(l);
	}
	for (uint32_t i = 0; i < g->nev; i++)
		cudaEventDestroy(g->ev[i]);
	free(g->ev);
	if (g->lens)
		cudaFreeHost(g->lens);
	for (int k = 0; k < CODEC_STREAMS; k++) {
		if (g->cs[k].st)
			cudaStreamDestroy(g->cs[k].st);
		if (g->cs[k].join)
			cudaEventDestroy(g->cs[k].join);
		cudaFree(g->cs[k].scratch);
	}
	for (unsigned i = 0; i < g->npins; i++)
		cudaHostUnregister(g->pins[i].base);
	free(g->pins);
	if (g->start)
		cudaEventDestroy(g->start);
	if (g->done)
		cudaEventDestroy(g->done);
	if (g->copy)
		cudaStreamDestroy(g->copy);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

static int g_pin(struct snap_gpu *g, void *base, uint64_t len, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	pthread_mutex_lock(&g->mu);
	int rc = 0;
	if (g->npins == g->cappins) {
		unsigned cap = g->cappins ? 2 * g->cappins : 8;
		struct pin *p = (struct pin *)realloc(g->pins, cap * sizeof(*p));
		if (!p)
			rc = fail(err, errlen, SNAP_ENOMEM, "out of memory");
		else {
			g->pins = p;
			g->cappins = cap;
		}
	}
	if (!rc) {
		/* Mapped: the compressor writes frames into the slot directly. */
		cudaError_t e = cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
		if (e != cudaSuccess) {
			cudaGetLastError();
			rc = fail(err, errlen, SNAP_EIO, "cudaHostRegister of a %llu-byte slot: %s",
				  (unsigned long long)len, cudaGetErrorString(e));
		} else {
			g->pins[g->npins].base = base;
			g->pins[g->npins].len = len;
			g->npins++;
			g->pinned += len;
		}
	}
	pthread_mutex_unlock(&g->mu);
	return rc;
}

static void g_unpin(struct snap_gpu *g, void *base, uint64_t len)
{
	cudaSetDevice(g->device);
	pthread_mutex_lock(&g->mu);
	for (unsigned i = 0; i < g->npins; i++) {
		if (g->pins[i].base != base || g->pins[i].len != len)
			continue;
		cudaHostUnregister(base);
		g->pinned -= len;
		g->pins[i] = g->pins[--g->npins];
		break;
	}
	pthread_mutex_unlock(&g->mu);
}

static uint64_t g_pinned_bytes(const struct snap_gpu *g)
{
	return g->pinned + (uint64_t)g->nev * sizeof(uint64_t);
}

static int g_save_begin(struct snap_gpu *g, void *stream, uint32_t nchunks, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	if (nchunks > g->nev) {
		cudaEvent_t *ev = (cudaEvent_t *)realloc(g->ev, nchunks * sizeof(*ev));
		if (!ev)
			return fail(err, errlen, SNAP_ENOMEM, "out of memory");
		g->ev = ev;
		for (; g->nev < nchunks; g->nev++)
			CUDA_TRY(cudaEventCreateWithFlags(&g->ev[g->nev], cudaEventDisableTiming), "cudaEventCreate");
		if (g->lens)
			cudaFreeHost(g->lens);
		g->lens = NULL;
		CUDA_TRY(cudaHostAlloc((void **)&g->lens, nchunks * sizeof(uint64_t), cudaHostAllocMapped),
			 "cudaHostAlloc of the frame length table");
		CUDA_TRY(cudaHostGetDevicePointer((void **)&g->d_lens, g->lens, 0), "cudaHostGetDevicePointer");
	}
	/* NULL means the trainer's legacy default stream, whatever this
	 * module's default-stream mode is. */
	cudaStream_t ts = stream ? (cudaStream_t)stream : cudaStreamLegacy;
	CUDA_TRY(cudaEventRecord(g->start, ts), "cudaEventRecord on the trainer's stream");
	CUDA_TRY(cudaStreamWaitEvent(g->copy, g->start, 0), "cudaStreamWaitEvent");
	for (int k = 0; k < CODEC_STREAMS; k++)
		g->cs[k].used = 0;
	g->next_cs = 0;
	return 0;
}

static int g_copy(struct snap_gpu *g, uint32_t i, void *dst, const void *src, uint64_t n, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, g->copy), "cudaMemcpyAsync D2H");
	CUDA_TRY(cudaEventRecord(g->ev[i], g->copy), "cudaEventRecord");
	return 0;
}

static int g_compress(struct snap_gpu *g, uint32_t i, const struct snap_codec_params *p, const void *src,
		      uint64_t count, void *dst, uint64_t cap, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	struct cstream *c = &g->cs[g->next_cs++ % CODEC_STREAMS];
	if (!c->used) {
		/* Its first chunk of this save: after the trainer's work. */
		CUDA_TRY(cudaStreamWaitEvent(c->st, g->start, 0), "cudaStreamWaitEvent");
		c->used = 1;
	}
	size_t need = snap_codec_cuda_scratch_size(p, count);
	if (need > c->scratch_len) {
		/* Only on the first saves: kernels of this stream may still use it. */
		CUDA_TRY(cudaStreamSynchronize(c->st), "cudaStreamSynchronize");
		cudaFree(c->scratch);
		c->scratch = NULL;
		c->scratch_len = 0;
		CUDA_TRY(cudaMalloc(&c->scratch, need), "cudaMalloc of codec scratch");
		c->scratch_len = need;
	}
	void *d_dst;
	CUDA_TRY(cudaHostGetDevicePointer(&d_dst, dst, 0), "cudaHostGetDevicePointer of the slot");
	int rc = snap_codec_cuda_compress(p, src, count, d_dst, cap, c->scratch, c->scratch_len, &g->d_lens[i],
					  c->st);
	if (rc)
		return fail(err, errlen, rc, "compression kernels: %s", snap_strerror(rc));
	CUDA_TRY(cudaEventRecord(g->ev[i], c->st), "cudaEventRecord");
	return 0;
}

static int g_save_end(struct snap_gpu *g, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	for (int k = 0; k < CODEC_STREAMS; k++) {
		if (!g->cs[k].used)
			continue;
		CUDA_TRY(cudaEventRecord(g->cs[k].join, g->cs[k].st), "cudaEventRecord");
		CUDA_TRY(cudaStreamWaitEvent(g->copy, g->cs[k].join, 0), "cudaStreamWaitEvent");
	}
	CUDA_TRY(cudaEventRecord(g->done, g->copy), "cudaEventRecord");
	return 0;
}

static int g_wait(struct snap_gpu *g, uint32_t i, char *err, size_t errlen)
{
	CUDA_TRY(cudaEventSynchronize(g->ev[i]), "copy stream");
	return 0;
}

static uint64_t g_frame_len(const struct snap_gpu *g, uint32_t i)
{
	return ((volatile const uint64_t *)g->lens)[i];
}

static int g_fence(struct snap_gpu *g, void *stream, int host, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	if (host)
		CUDA_TRY(cudaEventSynchronize(g->done), "copy stream");
	else
		CUDA_TRY(cudaStreamWaitEvent(stream ? (cudaStream_t)stream : cudaStreamLegacy, g->done, 0),
			 "cudaStreamWaitEvent on the trainer's stream");
	return 0;
}

/* ---- restore ----------------------------------------------------------- */

static struct lane *lane_get(struct snap_gpu *g)
{
	pthread_mutex_lock(&g->mu);
	struct lane *l = g->free_lanes;
	if (l)
		g->free_lanes = l->next_free;
	pthread_mutex_unlock(&g->mu);
	if (l)
		return l;
	l = (struct lane *)calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	if (cudaStreamCreateWithFlags(&l->st, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaMalloc((void **)&l->status, sizeof(int)) != cudaSuccess) {
		cudaGetLastError();
		if (l->st)
			cudaStreamDestroy(l->st);
		free(l);
		return NULL;
	}
	pthread_mutex_lock(&g->mu);
	l->next_all = g->all_lanes;
	g->all_lanes = l;
	pthread_mutex_unlock(&g->mu);
	return l;
}

static void lane_put(struct snap_gpu *g, struct lane *l)
{
	pthread_mutex_lock(&g->mu);
	l->next_free = g->free_lanes;
	g->free_lanes = l;
	pthread_mutex_unlock(&g->mu);
}

static int grow(void **p, size_t *have, size_t need)
{
	if (need <= *have)
		return 0;
	cudaFree(*p);
	*p = NULL;
	*have = 0;
	if (cudaMalloc(p, need) != cudaSuccess) {
		cudaGetLastError();
		return SNAP_ENOMEM;
	}
	*have = need;
	return 0;
}

static int g_h2d(struct snap_gpu *g, void *dst, const void *src, uint64_t n, char *err, size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	struct lane *l = lane_get(g);
	if (!l)
		return fail(err, errlen, SNAP_ENOMEM, "no device memory for a restore lane");
	int rc = 0;
	if (cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, l->st) != cudaSuccess ||
	    cudaStreamSynchronize(l->st) != cudaSuccess)
		rc = fail(err, errlen, SNAP_EIO, "cudaMemcpy H2D: %s", cudaGetErrorString(cudaGetLastError()));
	lane_put(g, l);
	return rc;
}

static int g_decode(struct snap_gpu *g, const void *frame, uint64_t len, void *dst, uint64_t cap, char *err,
		    size_t errlen)
{
	CUDA_TRY(cudaSetDevice(g->device), "cudaSetDevice");
	struct snap_codec_info info;
	int rc = snap_codec_inspect(frame, len, &info);
	if (rc)
		return fail(err, errlen, rc, "frame header: %s", snap_strerror(rc));
	struct lane *l = lane_get(g);
	if (!l)
		return fail(err, errlen, SNAP_ENOMEM, "no device memory for a restore lane");
	int st = 0;
	size_t sl = snap_codec_cuda_decode_scratch_size(&info);
	if (grow(&l->buf, &l->buf_len, len ? len : 1) || grow(&l->scratch, &l->scratch_len, sl ? sl : 1)) {
		rc = fail(err, errlen, SNAP_ENOMEM, "no device memory to decode a %llu-byte frame",
			  (unsigned long long)len);
	} else if (cudaMemcpyAsync(l->buf, frame, len, cudaMemcpyHostToDevice, l->st) != cudaSuccess ||
		   (rc = snap_codec_cuda_decompress(&info, l->buf, len, dst, cap, l->scratch, l->scratch_len,
						    l->status, l->st)) != 0 ||
		   cudaMemcpyAsync(&st, l->status, sizeof(int), cudaMemcpyDeviceToHost, l->st) != cudaSuccess ||
		   cudaStreamSynchronize(l->st) != cudaSuccess) {
		cudaError_t e = cudaGetLastError();
		rc = fail(err, errlen, rc ? rc : SNAP_EIO, "decode on the GPU: %s",
			  rc ? snap_strerror(rc) : cudaGetErrorString(e));
	} else if (st) {
		rc = fail(err, errlen, st, "decode on the GPU: %s", snap_strerror(st));
	}
	lane_put(g, l);
	return rc;
}

static const struct snap_gpu_ops ops = {
	SNAP_GPU_ABI, sizeof(struct snap_gpu_ops),
	g_probe, g_open, g_close, g_pin, g_unpin, g_pinned_bytes,
	g_save_begin, g_copy, g_compress, g_save_end, g_wait, g_frame_len, g_fence,
	g_h2d, g_decode,
};

extern "C" __attribute__((visibility("default"))) const struct snap_gpu_ops *snap_gpu_backend_v1(void)
{
	return &ops;
}
