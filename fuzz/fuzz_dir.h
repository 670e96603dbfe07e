/*
 * fuzz_dir.h — a cache directory built from fuzz input, shared by fuzz_recover.c
 * and fuzz_kvdump.c (so both read the same corpus format).
 *
 * Input: byte 0 holds flags; the rest is split at the separator "PKVFZSEP" into
 *   part 0  the arena header page (zero-padded or cut to 4096 bytes), followed
 *           in the file by zeroed block slots (all of them, or half with flag 2);
 *   part 1  the checkpoint chain: a checkpoint file, named ckpt-<LSN at offset
 *           16> (absent if empty), then zero or more delta checkpoints, each
 *           introduced by the marker "PKVFZDLT" (FZ_DELTA) and written as
 *           delta-<u64 after the marker> holding the bytes after that u64 (the
 *           name is explicit, so it can disagree with the file's header LSN; a
 *           u64 cut short is zero-padded). At most FZ_MAX_DELTAS deltas: the
 *           last one takes the rest of the part, markers included. A later
 *           delta of the same name replaces an earlier one;
 *   part 2+ log segments, each named wal-<number at offset 16>.
 * Inputs written before deltas existed hold no "PKVFZDLT" and keep their
 * meaning: their part 1 is the checkpoint file alone.
 * The options are those of the header (so an open gets past the geometry check),
 * except with flag 8, which gives a fixed geometry. Geometries larger than 4096
 * blocks, 1 MiB slots or a 16 MiB arena are refused, so that one input cannot
 * ask for gigabytes: the header's own as well as flag 8's, since kvdump opens
 * with the geometry the header states.
 */
#ifndef PKV_FUZZ_DIR_H
#define PKV_FUZZ_DIR_H

#include "fuzz_common.h"

/* Introduces a delta checkpoint inside part 1 (see above). */
#define FZ_DELTA "PKVFZDLT"
#define FZ_MAX_DELTAS 64

typedef struct fz_cachedir {
    const char *dir;   /* fz_base()/<name> */
    unsigned flags;    /* byte 0 of the input */
    pkv_options o;     /* from the header (or fixed, flag 8); io = fz_io() */
    char model[PKV_MODEL_ID_MAX + 1];
} fz_cachedir;

/* Build the directory; false (nothing written) for an empty input or a geometry
 * out of bounds. cd must stay in place while cd->o is used (o.model_id points
 * into it). */
bool fz_cachedir_build(fz_cachedir *cd, const char *name, const uint8_t *data, size_t size);

#endif
