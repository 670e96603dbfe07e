/*
 * tier_record.c — the shared tier's record: encode, strict decode, verify
 * (docs/remote.md, "Record"), and the key a record is stored under.
 *
 * Owns no state. The decoder trusts nothing: the length must be exactly what
 * the header implies, every count within the format's limits, the encoding
 * known, and the tag, HMAC-SHA-256 (src/hmac.c) keyed with a key derived from
 * the cluster secret, must match over every byte before it. pkv_tier_verify
 * then compares the record with what the reader asks for (rule T1): geometry,
 * model identity, salt, depth, parent and own chain hash, and the whole
 * prefix's token ids against the prompt's. Only a record that passes both is
 * ever imported (tier.c), and an LZ4 payload only if it decompresses to
 * exactly the K/V's length (pkv_tier_unpack).
 */
#include "tier.h"

#include <lz4.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_generateSecret */
#include <xxhash.h>

/* Per-purpose keys: HMAC(secret, label). The labels name the format version,
 * so version-2 records live under other keys than version 1's did. */
void pkv_tier_keys_derive(pkv_tier_keys *k, const void *secret, size_t len) {
    static const char mac_label[] = "pagedkv tier v2: record tag";
    static const char name_label[] = "pagedkv tier v2: key names";
    uint8_t d[PKV_HMAC_LEN];
    pkv_hmac_sha256(secret, len, mac_label, sizeof mac_label - 1, d);
    pkv_hmac_key_init(&k->mac, d, sizeof d);
    pkv_hmac_sha256(secret, len, name_label, sizeof name_label - 1, d);
    XXH3_generateSecret(k->secret, sizeof k->secret, d, sizeof d);
    k->seed = XXH3_64bits_withSecret("pagedkv-tier-chain", 18, k->secret, sizeof k->secret);
    explicit_bzero(d, sizeof d);
}

uint64_t pkv_tier_rec_size(uint32_t model_len, uint32_t depth, uint32_t bs,
                           uint64_t stored_len) {
    if (model_len == 0 || model_len > PKV_MODEL_ID_MAX || depth >= PKV_TIER_MAX_DEPTH ||
        bs == 0 || bs > PKV_BLOCK_SIZE_MAX || stored_len == 0 ||
        stored_len > PKV_TIER_MAX_PAYLOAD)
        return 0;
    return PKV_TIER_HDR + model_len + ((uint64_t)depth + 1) * bs * 4 + stored_len +
           PKV_TIER_TAG;
}

static void put_h(uint8_t *p, pkv_h128 h) {
    pkv_put_u64(p, h.lo);
    pkv_put_u64(p + 8, h.hi);
}
static pkv_h128 get_h(const uint8_t *p) {
    return (pkv_h128){pkv_get_u64(p), pkv_get_u64(p + 8)};
}

static void tag_of(const pkv_tier_keys *k, const uint8_t *buf, size_t len,
                   uint8_t out[PKV_TIER_TAG]) {
    pkv_hmac_ctx x;
    pkv_hmac_begin(&x, &k->mac);
    pkv_hmac_update(&x, buf, len);
    pkv_hmac_end(&x, out);
}

void pkv_tier_encode(const pkv_tier_keys *k, const pkv_tier_rec *r, const uint32_t *tokens,
                     uint8_t *out) {
    uint64_t ntok = ((uint64_t)r->depth + 1) * r->block_size;
    uint64_t size = pkv_tier_rec_size(r->model_len, r->depth, r->block_size, r->stored_len);
    pkv_put_u32(out, PKV_TIER_MAGIC);
    out[4] = PKV_TIER_VERSION & 0xff;
    out[5] = PKV_TIER_VERSION >> 8;
    out[6] = (uint8_t)(r->model_len & 0xff);
    out[7] = (uint8_t)(r->model_len >> 8);
    pkv_put_u32(out + 8, r->num_layers);
    pkv_put_u32(out + 12, r->num_kv_heads);
    pkv_put_u32(out + 16, r->head_dim);
    pkv_put_u32(out + 20, r->block_size);
    pkv_put_u32(out + 24, r->dtype);
    pkv_put_u32(out + 28, r->depth);
    pkv_put_u64(out + 32, r->salt);
    put_h(out + 40, r->parent);
    put_h(out + 56, r->hash);
    pkv_put_u64(out + 72, r->payload_len);
    pkv_put_u64(out + 80, r->stored_len);
    pkv_put_u32(out + 88, r->encoding);
    pkv_put_u32(out + 92, 0);
    uint8_t *p = out + PKV_TIER_HDR;
    memcpy(p, r->model, r->model_len);
    p += r->model_len;
    for (uint64_t i = 0; i < ntok; i++) pkv_put_u32(p + 4 * i, tokens[i]);
    p += ntok * 4;
    memcpy(p, r->payload, r->stored_len);
    p += r->stored_len;
    tag_of(k, out, size - PKV_TIER_TAG, p);
}

int pkv_tier_decode(const pkv_tier_keys *k, const uint8_t *buf, size_t len,
                    pkv_tier_rec *out) {
    if (!buf || len < PKV_TIER_HDR + PKV_TIER_TAG)
        return pkv_err(PKV_ECORRUPT, "tier record of %zu bytes is too short", len);
    if (pkv_get_u32(buf) != PKV_TIER_MAGIC)
        return pkv_err(PKV_ECORRUPT, "tier record: bad magic");
    uint32_t ver = buf[4] | (uint32_t)buf[5] << 8;
    if (ver != PKV_TIER_VERSION)
        return pkv_err(PKV_EVERSION, "tier record version %u (this build reads %u)", ver,
                       PKV_TIER_VERSION);
    pkv_tier_rec r;
    r.model_len = buf[6] | (uint32_t)buf[7] << 8;
    r.num_layers = pkv_get_u32(buf + 8);
    r.num_kv_heads = pkv_get_u32(buf + 12);
    r.head_dim = pkv_get_u32(buf + 16);
    r.block_size = pkv_get_u32(buf + 20);
    r.dtype = pkv_get_u32(buf + 24);
    r.depth = pkv_get_u32(buf + 28);
    r.salt = pkv_get_u64(buf + 32);
    r.parent = get_h(buf + 40);
    r.hash = get_h(buf + 56);
    r.payload_len = pkv_get_u64(buf + 72);
    r.stored_len = pkv_get_u64(buf + 80);
    r.encoding = pkv_get_u32(buf + 88);
    if (pkv_get_u32(buf + 92) != 0)
        return pkv_err(PKV_ECORRUPT, "tier record: reserved field not zero");
    if (r.payload_len == 0 || r.payload_len > PKV_TIER_MAX_PAYLOAD)
        return pkv_err(PKV_ECORRUPT, "tier record: payload of %llu bytes",
                       (unsigned long long)r.payload_len);
    if (r.encoding == PKV_TIER_ENC_RAW ? r.stored_len != r.payload_len
        : r.encoding == PKV_TIER_ENC_LZ4
            ? r.stored_len > (uint64_t)LZ4_compressBound((int)r.payload_len)
            : true)
        return pkv_err(PKV_ECORRUPT, "tier record: encoding %u with %llu of %llu bytes",
                       r.encoding, (unsigned long long)r.stored_len,
                       (unsigned long long)r.payload_len);
    uint64_t size = pkv_tier_rec_size(r.model_len, r.depth, r.block_size, r.stored_len);
    if (size == 0)
        return pkv_err(PKV_ECORRUPT, "tier record: a count is out of range (model %u, "
                       "depth %u, block size %u, stored %llu)", r.model_len, r.depth,
                       r.block_size, (unsigned long long)r.stored_len);
    if (size != len)
        return pkv_err(PKV_ECORRUPT, "tier record of %zu bytes, its header says %llu", len,
                       (unsigned long long)size);
    uint8_t t[PKV_TIER_TAG];
    tag_of(k, buf, len - PKV_TIER_TAG, t);
    if (!pkv_sum_ok(pkv_hmac_diff(t, buf + len - PKV_TIER_TAG, PKV_TIER_TAG), 0))
        return pkv_err(PKV_ECORRUPT, "tier record: tag mismatch");
    r.model = (const char *)buf + PKV_TIER_HDR;
    r.tokens = buf + PKV_TIER_HDR + r.model_len;
    r.payload = r.tokens + ((uint64_t)r.depth + 1) * r.block_size * 4;
    *out = r;
    return 0;
}

int pkv_tier_unpack(const pkv_tier_rec *r, uint8_t *out) {
    if (r->encoding == PKV_TIER_ENC_RAW) {
        memcpy(out, r->payload, r->payload_len);
        return 0;
    }
    /* LZ4_decompress_safe never writes past its capacity nor reads past its
     * input; the exact length is required on top */
    int n = LZ4_decompress_safe((const char *)r->payload, (char *)out, (int)r->stored_len,
                                (int)r->payload_len);
    if (n < 0 || (uint64_t)n != r->payload_len)
        return pkv_err(PKV_ECORRUPT, "tier record: LZ4 payload decodes to %d of %llu bytes",
                       n, (unsigned long long)r->payload_len);
    return 0;
}

bool pkv_tier_deletable(const uint8_t *buf, size_t len) {
    if (!buf || len < 6 || pkv_get_u32(buf) != PKV_TIER_MAGIC) return true;
    return (buf[4] | (uint32_t)buf[5] << 8) <= PKV_TIER_VERSION;
}

int pkv_tier_verify(const pkv_tier_rec *r, const pkv_tier_want *w) {
    const pkv_geometry *g = w->geo;
    if (r->num_layers != g->num_layers || r->num_kv_heads != g->num_kv_heads ||
        r->head_dim != g->head_dim || r->block_size != g->block_size ||
        r->dtype != g->dtype || r->payload_len != g->block_bytes)
        return pkv_err(PKV_ECORRUPT, "tier record: geometry differs");
    size_t ml = strlen(w->model);
    if (r->model_len != ml || memcmp(r->model, w->model, ml) != 0)
        return pkv_err(PKV_ECORRUPT, "tier record: model identity differs");
    if (r->salt != w->salt) return pkv_err(PKV_ECORRUPT, "tier record: salt differs");
    if (r->depth != w->depth)
        return pkv_err(PKV_ECORRUPT, "tier record: depth %u, expected %u", r->depth, w->depth);
    if (!pkv_h128_eq(r->parent, w->parent) || !pkv_h128_eq(r->hash, w->hash))
        return pkv_err(PKV_ECORRUPT, "tier record: chain hash differs");
    uint64_t ntok = ((uint64_t)r->depth + 1) * r->block_size;
    for (uint64_t i = 0; i < ntok; i++)
        if (pkv_get_u32(r->tokens + 4 * i) != w->prompt[i])
            return pkv_err(PKV_ECORRUPT, "tier record: token %llu differs from the prompt's",
                           (unsigned long long)i);
    return 0;
}

void pkv_tier_key(const pkv_tier_keys *k, pkv_h128 h, const pkv_geometry *g, const char *model,
                  char out[PKV_TIER_KEY_LEN + 1]) {
    uint8_t buf[16 + 20 + PKV_MODEL_ID_MAX];
    size_t ml = strlen(model);
    if (ml > PKV_MODEL_ID_MAX) ml = PKV_MODEL_ID_MAX;
    put_h(buf, h);
    pkv_put_u32(buf + 16, g->num_layers);
    pkv_put_u32(buf + 20, g->num_kv_heads);
    pkv_put_u32(buf + 24, g->head_dim);
    pkv_put_u32(buf + 28, g->block_size);
    pkv_put_u32(buf + 32, g->dtype);
    memcpy(buf + 36, model, ml);
    XXH128_hash_t x = XXH3_128bits_withSecret(buf, 36 + ml, k->secret, sizeof k->secret);
    snprintf(out, PKV_TIER_KEY_LEN + 1, "pkv:%016llx%016llx", (unsigned long long)x.high64,
             (unsigned long long)x.low64);
}
