/* SPDX-License-Identifier: BSD-3-Clause */
/* Writes the seed streams into a directory, the corpus of the libFuzzer runs. */
#include <stdio.h>

#include "seeds.h"

int main(int argc, char **argv)
{
	static uint8_t buf[8192];
	if (argc != 2) {
		fprintf(stderr, "usage: fuzz_seeds DIR\n");
		return 2;
	}
	for (int i = 0; i < NSEEDS; i++) {
		char path[4096];
		size_t len = seed_stream(i, buf, sizeof(buf));
		snprintf(path, sizeof(path), "%s/seed%02d", argv[1], i);
		FILE *f = fopen(path, "wb");
		if (!f || !len || fwrite(buf, 1, len, f) != len) {
			fprintf(stderr, "cannot write %s\n", path);
			return 1;
		}
		fclose(f);
	}
	return 0;
}
