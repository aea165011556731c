/* SPDX-License-Identifier: BSD-3-Clause */
/* cuda_check.h - CU(call): a CUDA runtime call in a GPU test either
 * succeeds or ends the test, saying which call failed and why. */
#ifndef SNAP_TEST_CUDA_CHECK_H
#define SNAP_TEST_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CU(call)                                                                                       \
	do {                                                                                           \
		cudaError_t e_ = (call);                                                               \
		if (e_ != cudaSuccess) {                                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

#endif
