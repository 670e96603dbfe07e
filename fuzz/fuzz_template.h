/*
 * fuzz_template.h — pristine caches for the in-memory harnesses
 * (fuzz_record.c, fuzz_checkpoint.c): a few small geometries, each an arena
 * without log or checkpoint, created once per process and opened read-only per
 * input, which yields a fresh, fully initialized pkv_cache to replay into.
 */
#ifndef PKV_FUZZ_TEMPLATE_H
#define PKV_FUZZ_TEMPLATE_H

#include "fuzz_common.h"

#define FZ_NGEO 4
/* Geometry i: block size and capacity (1 layer, 1 kv head, head_dim 2, f32). */
extern const uint32_t fz_geo_bs[FZ_NGEO], fz_geo_cap[FZ_NGEO];
#define FZ_MODEL "fuzz-model"
void fz_geo_opts(pkv_options *o, unsigned geo);
/* A fresh read-only handle on template `geo` (0..FZ_NGEO-1); aborts on failure. */
pkv_cache *fz_template_open(unsigned geo);
/* After recovery into c succeeded: check invariants and read back everything
 * through the public API (sequence list, info, tokens, blocks, stats). */
void fz_exercise(pkv_cache *c, const char *what);

#endif
