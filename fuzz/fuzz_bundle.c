/*
 * fuzz_bundle.c — libFuzzer target for `kvdump import` (tools/kvdump_bundle.c):
 * bundle validation (header, token section, block entries with their codecs,
 * LZ4 and byte-shuffle decoding, trailer) and the import itself through the
 * public API, called in process (kd_cmd_import) exactly as kvdump's main() calls
 * it.
 *
 * Input: a bundle file. It is imported into a new cache directory; an import
 * that succeeds must succeed again on the same directory (every block then
 * already present), and the cache it leaves must pass pkv_check with every
 * bundle block found by a prefix lookup (kd_cmd_import checks that and fails
 * otherwise). Built against libpagedkv_fuzz, with the kvdump sources compiled
 * with PKV_FUZZING, so every bundle checksum matches.
 */
#include "fuzz_common.h"
#include "internal.h" /* pkv_get_u32/u64 */
#include "kvdump.h"

#include <stdio.h>
#include <stdlib.h>

static int import(const char *dir, const char *path, const char *cap) {
    kd_ctx x;
    memset(&x, 0, sizeof x);
    x.cmd = "import";
    char *argv[] = {"kvdump", "import", (char *)dir, (char *)path, "--capacity", (char *)cap,
                    NULL};
    return kd_cmd_import(&x, cap ? 6 : 4, argv); /* no --capacity: the cache exists */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* Bound what one input may ask for: block payload and block count. */
    if (size >= 64 && (pkv_get_u64(data + 40) > (256u << 10) || pkv_get_u32(data + 56) > 64))
        return 0;
    const char *base = fz_base();
    char path[600], dir[600], cap[32];
    snprintf(path, sizeof path, "%s/bundle", base);
    if (fz_write(base, "bundle", data, size)) fz_fail("write bundle");
    snprintf(dir, sizeof dir, "%s", fz_dir("import"));
    uint32_t nblocks = size >= 64 ? pkv_get_u32(data + 56) : 1;
    snprintf(cap, sizeof cap, "%u", 2 * nblocks + 2);
    int rc = import(dir, path, cap);
    FZ_ASSERT(rc == KD_OK || rc == KD_USAGE, "kvdump import returned %d", rc);
    if (rc != KD_OK) return 0;
    rc = import(dir, path, NULL);
    FZ_ASSERT(rc == KD_OK, "a second import of the same bundle returned %d", rc);
    /* The cache left behind passes every invariant. */
    pkv_options o;
    pkv_options_init(&o);
    o.num_layers = pkv_get_u32(data + 16);
    o.num_kv_heads = pkv_get_u32(data + 20);
    o.head_dim = pkv_get_u32(data + 24);
    o.block_size = pkv_get_u32(data + 28);
    o.dtype = (pkv_dtype)pkv_get_u32(data + 32);
    char model[PKV_MODEL_ID_MAX + 1];
    uint32_t ml = pkv_get_u32(data + 60);
    FZ_ASSERT(ml >= 1 && ml <= PKV_MODEL_ID_MAX, "imported a bundle with model id length %u", ml);
    memcpy(model, data + 64, ml);
    model[ml] = 0;
    o.model_id = model;
    o.flags = PKV_OPEN_RDONLY;
    pkv_cache *c = NULL;
    rc = pkv_open(dir, &o, &c);
    FZ_ASSERT(rc == 0, "opening the imported cache: %s", pkv_last_error());
    fz_check(c, "import");
    pkv_close(c);
    return 0;
}
