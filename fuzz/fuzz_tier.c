/*
 * fuzz_tier.c — the shared tier's record decoder and verifier
 * (src/tier_record.c: pkv_tier_decode, pkv_tier_verify, pkv_tier_unpack), the entry for values
 * read from a Redis anyone with write access to it may have written
 * (docs/remote.md, rule T1).
 * Input: byte 0 picks the reader's geometry (and so which verifications can
 * pass), the rest is one record value. In this fuzzing build the tag
 * comparison accepts (pkv_sum_ok), so mutations reach every field.
 * Checks: nothing reads outside the input (ASan); a refusal is PKV_ECORRUPT or
 * PKV_EVERSION; an accepted record lies inside the input and re-encodes, field
 * by field, to exactly the bytes it came from (tag aside): only the documented
 * layout is accepted; a record verifies against the expectations it states
 * itself, and one that verifies against the reader's fixed prompt carries
 * exactly that prompt's tokens; an LZ4 payload decompresses to exactly the
 * K/V's length or is refused, without reading or writing outside its buffers.
 */
#include "fuzz_common.h"
#include "tier.h"

#include <stdlib.h>
#include <string.h>

static const pkv_geometry GEOS[4] = {
    {1, 1, 2, 4, PKV_F32, 4, 8, 32, 64, 4096},
    {2, 2, 4, 16, PKV_F32, 4, 32, 256, 2048, 4096},
    {1, 1, 2, 1, PKV_F16, 2, 4, 4, 8, 4096},
    {3, 1, 2, 3, PKV_F32, 4, 16, 24, 144, 4096},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static pkv_tier_keys k;
    static bool init;
    if (!init) {
        pkv_tier_keys_derive(&k, "fuzz-tier-secret-0123456789", 27);
        init = true;
    }
    const pkv_geometry *g = &GEOS[data[0] & 3];
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    pkv_tier_rec r;
    int rc = pkv_tier_decode(&k, buf, len, &r);
    if (rc) {
        FZ_ASSERT(rc == PKV_ECORRUPT || rc == PKV_EVERSION, "decode -> %d", rc);
        return 0;
    }
    uint64_t ntok = ((uint64_t)r.depth + 1) * r.block_size;
    FZ_ASSERT(r.tokens >= buf && r.tokens + ntok * 4 <= buf + len, "tokens outside");
    FZ_ASSERT(r.payload >= buf && r.payload + r.stored_len + PKV_TIER_TAG == buf + len,
              "payload outside");
    FZ_ASSERT(r.encoding == PKV_TIER_ENC_RAW ? r.stored_len == r.payload_len
                                             : r.encoding == PKV_TIER_ENC_LZ4,
              "encoding %u", r.encoding);
    /* the K/V: raw, or an LZ4 stream that must fill payload_len exactly (an
     * exact-size buffer: ASan sees any write past it) */
    if (r.payload_len <= (1u << 20)) {
        uint8_t *kv = malloc(r.payload_len);
        FZ_ASSERT(kv, "out of memory");
        rc = pkv_tier_unpack(&r, kv);
        FZ_ASSERT(rc == 0 || (rc == PKV_ECORRUPT && r.encoding == PKV_TIER_ENC_LZ4),
                  "unpack -> %d", rc);
        if (rc == 0 && r.encoding == PKV_TIER_ENC_RAW)
            FZ_ASSERT(memcmp(kv, r.payload, r.payload_len) == 0, "raw payload differs");
        free(kv);
    }
    FZ_ASSERT((const uint8_t *)r.model == buf + PKV_TIER_HDR, "model outside");
    /* re-encode */
    uint32_t *toks = malloc(ntok * sizeof *toks);
    uint8_t *out = malloc(len);
    FZ_ASSERT(toks && out, "out of memory");
    for (uint64_t i = 0; i < ntok; i++) toks[i] = pkv_get_u32(r.tokens + 4 * i);
    pkv_tier_encode(&k, &r, toks, out);
    FZ_ASSERT(memcmp(out, buf, len - PKV_TIER_TAG) == 0, "re-encoding differs");
    /* it verifies against what it states itself (when the model is a string) */
    char model[PKV_MODEL_ID_MAX + 1];
    memcpy(model, r.model, r.model_len);
    model[r.model_len] = 0;
    pkv_geometry own = {r.num_layers, r.num_kv_heads, r.head_dim, r.block_size, r.dtype, 0,
                        0, 0, r.payload_len, 0};
    pkv_tier_want w = {&own, model, r.salt, r.depth, r.parent, r.hash, toks};
    if (strlen(model) == r.model_len) FZ_ASSERT(pkv_tier_verify(&r, &w) == 0, "self verify");
    /* the reader's fixed prompt: 0, 1, 2, ... */
    uint32_t *prompt = malloc(ntok * sizeof *prompt);
    FZ_ASSERT(prompt, "out of memory");
    for (uint64_t i = 0; i < ntok; i++) prompt[i] = (uint32_t)i;
    pkv_tier_want fixed = {g, "fuzz-model", 7, r.depth, r.parent, r.hash, prompt};
    rc = pkv_tier_verify(&r, &fixed);
    FZ_ASSERT(rc == 0 || rc == PKV_ECORRUPT, "verify -> %d", rc);
    if (rc == 0)
        for (uint64_t i = 0; i < ntok; i++)
            FZ_ASSERT(pkv_get_u32(r.tokens + 4 * i) == i, "verified a wrong token");
    free(prompt);
    free(toks);
    free(out);
    return 0;
}
