/*
 * metrics.c — the library's metrics as Prometheus text (exposition format 0.0.4):
 * pkv_metrics_text for a cache, pkv_cuda_metrics_text for a CUDA handle, and the
 * histogram bucket layouts (histogram.h). docs/metrics.md lists every family.
 *
 * How it fits: the engine keeps plain counters under the cache lock (pkv_counters,
 * pkv_wal) and relaxed-atomic histograms (pkv_hist, filled by wal/log.c and
 * wal/checkpoint.c). A call copies all of them in one short hold of the lock (the
 * same copy pkv_get_stats makes, so the two agree), releases it, and only then
 * formats, so a scraper holds the lock for a few hundred bytes of copying.
 *
 * Invariants: no allocation and no stdio (the text is built by hand into the
 * caller's buffer; *needed is computed even when it does not fit); every family
 * has exactly one # HELP and one # TYPE line, before its samples; a histogram's
 * buckets are cumulative and its le="+Inf" bucket equals its _count; label values
 * are escaped (backslash, double quote, newline) as the format requires, and
 * valid UTF-8 (an invalid byte becomes U+FFFD).
 */
#include "internal.h"

#include <math.h>

const pkv_hist_layout pkv_hist_latency = {
    {100000u, 250000u, 500000u, 1000000u, 2500000u, 5000000u, 10000000u, 25000000u,
     50000000u, 100000000u, 250000000u, 500000000u, 1000000000u},
    {"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
     "0.1", "0.25", "0.5", "1"}};
const pkv_hist_layout pkv_hist_long = {
    {1000000u, 5000000u, 10000000u, 50000000u, 100000000u, 250000000u, 500000000u,
     1000000000u, 2500000000u, 5000000000u, 10000000000u, 30000000000u, 60000000000u},
    {"0.001", "0.005", "0.01", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30",
     "60"}};

/* ---- Text building into the caller's buffer ------------------------------ */

/* Bytes beyond cap are counted, not written: len is the text's full length. */
typedef struct mw {
    char *buf;
    size_t cap, len;
} mw;

static void put(mw *w, const char *s, size_t n) {
    if (w->len + n <= w->cap) memcpy(w->buf + w->len, s, n);
    w->len += n;
}
static void puts_(mw *w, const char *s) { put(w, s, strlen(s)); }

static void put_u64(mw *w, uint64_t v) {
    char d[24];
    size_t i = sizeof d;
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(w, d + i, sizeof d - i);
}

/* Nanoseconds as seconds: "12.0005" (no trailing zeros). */
static void put_secs(mw *w, uint64_t ns) {
    put_u64(w, ns / 1000000000u);
    uint64_t f = ns % 1000000000u;
    if (!f) return;
    char d[10];
    d[0] = '.';
    for (int i = 9; i >= 1; i--, f /= 10) d[i] = (char)('0' + f % 10);
    size_t n = 10;
    while (d[n - 1] == '0') n--;
    put(w, d, n);
}

/* The length of the well-formed UTF-8 sequence at p (1..4), or 0 if p does not
 * start one (a stray continuation byte, an overlong form, a surrogate, a code
 * point above U+10FFFF, a truncated sequence). */
static size_t utf8_len(const unsigned char *p) {
    unsigned char b = p[0];
    if (b < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (b >= 0xC2 && b <= 0xDF) n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) lo = 0xA0;      /* overlong */
        else if (b == 0xED) hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) lo = 0x90;      /* overlong */
        else if (b == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0; /* a NUL ends it here too */
    return n;
}

/* A label value, escaped: \ -> \\, " -> \", newline -> \n. The format requires
 * valid UTF-8 (Prometheus refuses the whole scrape otherwise) and has no escape
 * for other bytes, so each byte that is not part of a well-formed sequence is
 * written as U+FFFD. A model_id is any bytes (pkv_options). */
static void put_label(mw *w, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_len(p);
        if (*p == '\\') put(w, "\\\\", 2);
        else if (*p == '"') put(w, "\\\"", 2);
        else if (*p == '\n') put(w, "\\n", 2);
        else if (n == 0) put(w, "\xEF\xBF\xBD", 3);
        else put(w, (const char *)p, n);
        p += n ? n : 1;
    }
}

static void head(mw *w, const char *name, const char *type, const char *help) {
    puts_(w, "# HELP ");
    puts_(w, name);
    put(w, " ", 1);
    puts_(w, help);
    puts_(w, "\n# TYPE ");
    puts_(w, name);
    put(w, " ", 1);
    puts_(w, type);
    put(w, "\n", 1);
}

/* One sample: name[{labels}] value. labels: the text between the braces or NULL. */
static void sample(mw *w, const char *name, const char *labels, uint64_t v) {
    puts_(w, name);
    if (labels) {
        put(w, "{", 1);
        puts_(w, labels);
        put(w, "}", 1);
    }
    put(w, " ", 1);
    put_u64(w, v);
    put(w, "\n", 1);
}

static void counter(mw *w, const char *name, const char *help, uint64_t v) {
    head(w, name, "counter", help);
    sample(w, name, NULL, v);
}
static void gauge(mw *w, const char *name, const char *help, uint64_t v) {
    head(w, name, "gauge", help);
    sample(w, name, NULL, v);
}
static void gauge_secs(mw *w, const char *name, const char *help, uint64_t ns) {
    head(w, name, "gauge", help);
    puts_(w, name);
    put(w, " ", 1);
    put_secs(w, ns);
    put(w, "\n", 1);
}

/* One sample of pagedkv_log_wait_seconds_total{reason=...}. */
static void wait_secs(mw *w, const char *reason, uint64_t us) {
    puts_(w, "pagedkv_log_wait_seconds_total{reason=\"");
    puts_(w, reason);
    puts_(w, "\"} ");
    put_secs(w, us * 1000u);
    put(w, "\n", 1);
}

typedef struct hist_copy {
    uint64_t n[PKV_HIST_BOUNDS + 1];
    uint64_t sum_ns;
} hist_copy;

static void hist_read(const pkv_hist *h, hist_copy *out) {
    for (unsigned i = 0; i <= PKV_HIST_BOUNDS; i++)
        out->n[i] = atomic_load_explicit(&h->n[i], memory_order_relaxed);
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
}

/* Buckets cumulative; _count is the +Inf bucket (the sum of the copies read). */
static void histogram(mw *w, const char *name, const char *help, const hist_copy *h,
                      const pkv_hist_layout *l) {
    head(w, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i <= PKV_HIST_BOUNDS; i++) {
        cum += h->n[i];
        puts_(w, name);
        puts_(w, "_bucket{le=\"");
        puts_(w, i < PKV_HIST_BOUNDS ? l->le[i] : "+Inf");
        puts_(w, "\"} ");
        put_u64(w, cum);
        put(w, "\n", 1);
    }
    puts_(w, name);
    puts_(w, "_sum ");
    put_secs(w, h->sum_ns);
    put(w, "\n", 1);
    puts_(w, name);
    puts_(w, "_count ");
    put_u64(w, cum);
    put(w, "\n", 1);
}

/* NUL-terminate, or report the size needed. */
static int finish(mw *w, size_t *needed) {
    if (needed) *needed = w->len + 1;
    if (w->len + 1 > w->cap) {
        if (w->cap) w->buf[0] = '\0';
        return pkv_err(PKV_ERANGE, "metrics text needs %zu bytes, the buffer has %zu",
                       w->len + 1, w->cap);
    }
    w->buf[w->len] = '\0';
    return 0;
}

/* Milliseconds (a recovery phase's time) as nanoseconds. */
static uint64_t ms_to_ns(double ms) {
    return ms > 0 && isfinite(ms) ? (uint64_t)(ms * 1e6) : 0;
}

/* ---- The cache ----------------------------------------------------------- */

/* What one call shows, copied under the lock. */
typedef struct snap {
    pkv_stats st;
    pkv_counters open; /* c->ctr_at_open */
    pkv_recovery rec;
    uint64_t refs, tokens_appended, ckpt_file_bytes;
    hist_copy delay, sync, ckpt;
    bool failed, rdonly;
    pkv_durability mode;
} snap;

static const char *durability_name(pkv_durability d) {
    return d == PKV_DURABLE_NONE ? "none" : d == PKV_DURABLE_ALWAYS ? "always" : "group";
}

int pkv_metrics_text(pkv_cache *c, char *buf, size_t cap, size_t *needed) {
    if (!c) return pkv_err(PKV_EINVAL, "cache is NULL");
    if (!buf && cap) return pkv_err(PKV_EINVAL, "buf is NULL with cap %zu", cap);
    /* A connected handle holds no log or counters: pkvd serves its metrics. */
    PKV_LOCAL_ONLY(c, "pkv_metrics_text");
    snap s;
    pkv_lock(c);
    pkv_stats_locked(c, &s.st);
    s.rec = c->rec;
    /* Kept by the block pool, checked by pkv_check (I2): a scan of the sequence
     * map here held the lock for O(its peak size), ~1 ms after a burst. */
    s.refs = c->pool.ref_total;
    s.tokens_appended = c->ctr.tokens_appended;
    s.open = c->ctr_at_open;
    const pkv_wal *wl = &c->wal;
    hist_read(&wl->delay_hist, &s.delay);
    hist_read(&wl->sync_hist, &s.sync);
    hist_read(&wl->ckpt_hist, &s.ckpt);
    s.ckpt_file_bytes = atomic_load_explicit(&wl->ckpt_file_bytes, memory_order_relaxed);
    s.failed = wl->failed != 0;
    s.rdonly = c->rdonly;
    s.mode = wl->mode;
    pkv_unlock(c);

    mw w = {buf, cap, 0};
    const pkv_stats *st = &s.st;
    /* identity and geometry (model_id is immutable: read without the lock) */
    head(&w, "pagedkv_info", "gauge",
         "Constant 1; the labels name the library version, the model and the durability mode.");
    puts_(&w, "pagedkv_info{version=\"" PKV_VERSION_STRING "\",model_id=\"");
    put_label(&w, c->arena.model_id);
    puts_(&w, "\",durability=\"");
    puts_(&w, durability_name(s.mode));
    puts_(&w, "\",read_only=\"");
    puts_(&w, s.rdonly ? "true" : "false");
    puts_(&w, "\"} 1\n");
    gauge(&w, "pagedkv_block_size_tokens", "Tokens per block.", c->arena.geo.block_size);
    gauge(&w, "pagedkv_block_payload_bytes", "K/V payload bytes of one block (all layers, K and V).",
          c->arena.geo.block_bytes);
    /* blocks */
    gauge(&w, "pagedkv_capacity_blocks", "Block slots in the arena.", st->capacity);
    head(&w, "pagedkv_blocks", "gauge",
         "Blocks by state: free (incl. limbo), cached (sealed, unreferenced, evictable), used (referenced); they sum to the capacity.");
    sample(&w, "pagedkv_blocks", "state=\"free\"", st->blocks_free);
    sample(&w, "pagedkv_blocks", "state=\"cached\"", st->blocks_cached);
    sample(&w, "pagedkv_blocks", "state=\"used\"", st->blocks_used);
    gauge(&w, "pagedkv_sealed_blocks", "Sealed blocks in the prefix index (cached + used sealed).",
          st->blocks_sealed);
    gauge(&w, "pagedkv_block_refs", "Sum of all block refcounts (block-table entries of open sequences).",
          s.refs);
    gauge(&w, "pagedkv_sequences", "Open sequences.", st->sequences);
    /* Counters since this open. The eight that checkpoints carry (pkv_stats
     * reports them carried over) restart here at 0: a reopen restores the
     * newest checkpoint's values, which may lie below what was scraped before
     * (events logged after it), and a counter that resumes lower than it was
     * would read as a reset plus a spike to Prometheus. The carried totals are
     * the _since_creation gauges below. */
    const pkv_counters *o = &s.open;
    const uint64_t hit_tokens = st->hit_tokens - o->hit_tokens;
    const uint64_t miss_tokens = st->miss_tokens - o->miss_tokens;
    const uint64_t hit_blocks = st->hit_blocks - o->hit_blocks;
    const uint64_t miss_blocks = st->miss_blocks - o->miss_blocks;
    /* prefix cache, vLLM's semantics: tokens queried and hit by prompt lookups */
    counter(&w, "pagedkv_prefix_cache_queries_total",
            "Prompt tokens looked up by pkv_seq_open since open (vLLM prefix_cache_queries).",
            hit_tokens + miss_tokens);
    counter(&w, "pagedkv_prefix_cache_hits_total",
            "Prompt tokens found cached by pkv_seq_open since open (vLLM prefix_cache_hits).",
            hit_tokens);
    counter(&w, "pagedkv_prefix_cache_block_queries_total",
            "Full prompt blocks looked up (the last prompt token's block excluded) since open.",
            hit_blocks + miss_blocks);
    counter(&w, "pagedkv_prefix_cache_block_hits_total", "Full prompt blocks found cached since open.",
            hit_blocks);
    counter(&w, "pagedkv_tokens_appended_total", "Tokens appended to sequences since open.",
            s.tokens_appended);
    counter(&w, "pagedkv_evictions_total", "Cached blocks evicted for reuse since open.",
            st->evictions - o->evictions);
    counter(&w, "pagedkv_cow_copies_total", "Blocks copied on write by append or truncate since open.",
            st->cow_copies - o->cow_copies);
    counter(&w, "pagedkv_dedupes_total",
            "Sealed blocks replaced by an identical cached block since open.",
            st->dedupes - o->dedupes);
    counter(&w, "pagedkv_seals_total", "Blocks sealed since open.", st->seals - o->seals);
    /* the carried totals (pkv_stats' values) */
    gauge(&w, "pagedkv_since_creation_prefix_cache_queries",
          "Prompt tokens looked up since the cache was created, as checkpoints carry it across opens (events after an earlier open's newest checkpoint are not in it).",
          st->hit_tokens + st->miss_tokens);
    gauge(&w, "pagedkv_since_creation_prefix_cache_hits",
          "Prompt tokens found cached since the cache was created, as checkpoints carry it.",
          st->hit_tokens);
    gauge(&w, "pagedkv_since_creation_prefix_cache_block_queries",
          "Full prompt blocks looked up since the cache was created, as checkpoints carry it.",
          st->hit_blocks + st->miss_blocks);
    gauge(&w, "pagedkv_since_creation_prefix_cache_block_hits",
          "Full prompt blocks found cached since the cache was created, as checkpoints carry it.",
          st->hit_blocks);
    gauge(&w, "pagedkv_since_creation_evictions",
          "Blocks evicted since the cache was created, as checkpoints carry it.", st->evictions);
    gauge(&w, "pagedkv_since_creation_cow_copies",
          "Copy-on-write copies since the cache was created, as checkpoints carry it.",
          st->cow_copies);
    gauge(&w, "pagedkv_since_creation_dedupes",
          "Dedupes since the cache was created, as checkpoints carry it.", st->dedupes);
    gauge(&w, "pagedkv_since_creation_seals",
          "Blocks sealed since the cache was created, as checkpoints carry it.", st->seals);
    counter(&w, "pagedkv_verify_failures_total",
            "Recovered blocks whose payload checksum failed since open.", st->verify_failures);
    counter(&w, "pagedkv_seal_sums_ahead_total",
            "Seal checksums computed ahead on seal threads since open.", st->seal_sums_ahead);
    /* the shared prefix tier (docs/remote.md): 0 without one */
    head(&w, "pagedkv_tier_blocks_total", "counter",
         "Blocks through the shared Redis tier since attach, by event: published, publish_dropped (queue full, gone, policy), publish_error, requested, found, imported, rejected (failed rule T1), error (I/O, timeout, node down), deleted (rejected and deleted from the tier), delete_failed.");
    sample(&w, "pagedkv_tier_blocks_total", "event=\"published\"", st->tier_published);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"publish_dropped\"", st->tier_publish_dropped);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"publish_error\"", st->tier_publish_errors);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"requested\"", st->tier_fetch_blocks);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"found\"", st->tier_fetch_found);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"imported\"", st->tier_imported);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"rejected\"", st->tier_rejected);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"error\"", st->tier_errors);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"deleted\"", st->tier_deleted);
    sample(&w, "pagedkv_tier_blocks_total", "event=\"delete_failed\"", st->tier_delete_failed);
    counter(&w, "pagedkv_tier_fetches_total",
            "pkv_seq_open calls that asked the shared tier since attach.", st->tier_fetches);
    counter(&w, "pagedkv_tier_deadline_misses_total",
            "Tier fetches and lookup probes that reached their deadline since attach.", st->tier_deadline_misses);
    counter(&w, "pagedkv_tier_redirects_total",
            "MOVED and ASK redirections followed since attach.", st->tier_redirects);
    counter(&w, "pagedkv_tier_lookups_total",
            "pkv_prefix_lookup calls that asked the shared tier since attach (PKV_TIER_LOOKUP).",
            st->tier_lookups);
    head(&w, "pagedkv_tier_lookup_blocks_total", "counter",
         "Keys the lookups probed in the shared tier since attach (EXISTS), by result: probed, found.");
    sample(&w, "pagedkv_tier_lookup_blocks_total", "result=\"probed\"", st->tier_lookup_blocks);
    sample(&w, "pagedkv_tier_lookup_blocks_total", "result=\"found\"", st->tier_lookup_found);
    /* write-ahead log */
    counter(&w, "pagedkv_wal_records_total", "Log records appended since open.", st->wal_records);
    counter(&w, "pagedkv_wal_bytes_total", "Bytes written to the log since open.", st->wal_bytes);
    counter(&w, "pagedkv_wal_frames_total", "Log frames (group commits) written since open.",
            st->wal_frames);
    counter(&w, "pagedkv_wal_syncs_total", "fdatasync calls on the log since open.", st->wal_syncs);
    gauge(&w, "pagedkv_wal_last_lsn", "Last log sequence number assigned.", st->last_lsn);
    gauge(&w, "pagedkv_wal_durable_lsn", "Every record up to this LSN is durable.", st->durable_lsn);
    /* The request thread's waits for the log (design.md, "Free list, limbo and
     * the policy's lists"): an allocation waits for limbo only for what eviction
     * cannot supply, for rule D3 before evicting a block whose SEAL (or the
     * truncation that released it) is not safe,
     * and any mutating call for the backlog. */
    head(&w, "pagedkv_log_waits_total", "counter",
         "Calls that waited for the log since open, by reason: limbo (freed blocks not yet safe to reuse), seal (rule D3: a victim's SEAL, or the truncation that released it, not yet safe), backlog (the unflushed log buffer full).");
    sample(&w, "pagedkv_log_waits_total", "reason=\"limbo\"", st->waits_limbo);
    sample(&w, "pagedkv_log_waits_total", "reason=\"seal\"", st->waits_seal);
    sample(&w, "pagedkv_log_waits_total", "reason=\"backlog\"", st->waits_backlog);
    head(&w, "pagedkv_log_wait_seconds_total", "counter",
         "Time calls spent waiting for the log since open, by reason (as pagedkv_log_waits_total).");
    wait_secs(&w, "limbo", st->wait_limbo_us);
    wait_secs(&w, "seal", st->wait_seal_us);
    wait_secs(&w, "backlog", st->wait_backlog_us);
    gauge(&w, "pagedkv_limbo_blocks",
          "Of the free blocks, those in limbo: freed, waiting for the log to make their release safe before reuse.",
          st->blocks_limbo);
    histogram(&w, "pagedkv_wal_group_commit_delay_seconds",
              "Wait of each synced group's first record from its append until durable, since open (not measured in NONE mode).",
              &s.delay, &pkv_hist_latency);
    gauge_secs(&w, "pagedkv_wal_group_commit_delay_max_seconds",
               "Longest group-commit delay since open.", st->wal_max_delay_us * 1000u);
    histogram(&w, "pagedkv_wal_sync_duration_seconds",
              "Duration of each log write+fdatasync (one linked I/O) or lone fdatasync of the flusher, since open.",
              &s.sync, &pkv_hist_latency);
    /* checkpoints */
    counter(&w, "pagedkv_checkpoints_total", "Checkpoints written since open, deltas included.",
            st->checkpoints);
    counter(&w, "pagedkv_checkpoint_deltas_total", "Delta checkpoints written since open.",
            st->checkpoint_deltas);
    counter(&w, "pagedkv_checkpoint_failures_total",
            "Checkpoint attempts discarded (no space or memory) since open.", st->checkpoint_failures);
    counter(&w, "pagedkv_checkpoint_written_bytes_total",
            "Bytes of checkpoint files written (compressed) since open.", s.ckpt_file_bytes);
    histogram(&w, "pagedkv_checkpoint_duration_seconds",
              "Duration of each checkpoint written, snapshot to directory sync, since open.",
              &s.ckpt, &pkv_hist_long);
    gauge(&w, "pagedkv_checkpoint_lsn", "LSN covered by the newest checkpoint.", st->checkpoint_lsn);
    gauge_secs(&w, "pagedkv_checkpoint_backoff_seconds",
               "Delay before the next automatic checkpoint attempt after failures (0: none).",
               (uint64_t)st->checkpoint_backoff_ms * 1000000u);
    /* the recovery of this open */
    head(&w, "pagedkv_recovery_duration_seconds", "gauge",
         "Time the open of this cache spent recovering, by phase.");
    static const char *const phases[4] = {"phase=\"checkpoint\"", "phase=\"replay\"",
                                          "phase=\"rebuild\"", "phase=\"verify\""};
    const double ms[4] = {s.rec.ms_checkpoint, s.rec.ms_replay, s.rec.ms_rebuild,
                          s.rec.ms_verify};
    for (int i = 0; i < 4; i++) {
        puts_(&w, "pagedkv_recovery_duration_seconds{");
        puts_(&w, phases[i]);
        puts_(&w, "} ");
        put_secs(&w, ms_to_ns(ms[i]));
        put(&w, "\n", 1);
    }
    gauge(&w, "pagedkv_recovery_records_replayed", "Log records the open replayed after the checkpoint.",
          s.rec.records_replayed);
    gauge(&w, "pagedkv_recovery_blocks_recovered", "Sealed blocks the open recovered.",
          s.rec.blocks_sealed);
    gauge(&w, "pagedkv_recovery_sequences_recovered", "Sequences the open recovered.", s.rec.sequences);
    gauge(&w, "pagedkv_recovery_blocks_dropped",
          "Blocks the open dropped (arena lost, replaced or short).", s.rec.blocks_dropped);
    gauge(&w, "pagedkv_recovery_torn_bytes", "Bytes of torn log tail the open cut off.",
          s.rec.torn_bytes);
    gauge(&w, "pagedkv_recovery_repaired", "1 if the open repaired damage and wrote a checkpoint.",
          s.rec.repaired ? 1 : 0);
    gauge(&w, "pagedkv_failed", "1 once the cache hit an I/O error and refuses changes (reopen).",
          s.failed ? 1 : 0);
    /* CUDA layer (the handles' own counters: pkv_cuda_metrics_text) */
    gauge(&w, "pagedkv_gpu_handles", "pkv_cuda handles open on this cache.", st->cuda_handles);
    head(&w, "pagedkv_gpu_mode", "gauge",
         "How the newest open CUDA handle reaches the arena: 1 for the current mode, 0 for the others.");
    for (uint32_t mo = PKV_CUDA_MODE_NONE; mo <= PKV_CUDA_MODE_STAGING; mo++) {
        puts_(&w, "pagedkv_gpu_mode{mode=\"");
        puts_(&w, pkv_cuda_mode_name((pkv_cuda_mode)mo));
        puts_(&w, "\"} ");
        put_u64(&w, st->cuda_mode == mo);
        put(&w, "\n", 1);
    }
    return finish(&w, needed);
}

/* ---- A CUDA handle -------------------------------------------------------- */

int pkv_cuda_metrics_text(pkv_cuda *g, char *buf, size_t cap, size_t *needed) {
    /* First, as every CUDA-layer call: PKV_ENOTSUP whatever the arguments in a
     * build without the layer, PKV_EINVAL for a NULL handle in one with it. */
    pkv_cuda_stats st;
    int rc = pkv_cuda_get_stats(g, &st);
    if (rc) return rc;
    if (!buf && cap) return pkv_err(PKV_EINVAL, "buf is NULL with cap %zu", cap);
    mw w = {buf, cap, 0};
    head(&w, "pagedkv_gpu_info", "gauge",
         "Constant 1; the labels name the CUDA device and how it reaches the arena.");
    puts_(&w, "pagedkv_gpu_info{device=\"");
    put_u64(&w, st.device >= 0 ? (uint64_t)st.device : 0);
    puts_(&w, "\",device_name=\"");
    put_label(&w, st.device_name);
    puts_(&w, "\",mode=\"");
    put_label(&w, st.mode_name);
    puts_(&w, "\",batched_copy=\"");
    puts_(&w, st.batched_copy ? "true" : "false");
    puts_(&w, "\"} 1\n");
    gauge(&w, "pagedkv_gpu_pool_blocks", "Device block slots.", st.pool_blocks);
    head(&w, "pagedkv_gpu_slots", "gauge",
         "Device slots by state: free, cached (resident, evictable), pinned (by a batch).");
    sample(&w, "pagedkv_gpu_slots", "state=\"free\"", st.slots_free);
    sample(&w, "pagedkv_gpu_slots", "state=\"cached\"", st.slots_cached);
    sample(&w, "pagedkv_gpu_slots", "state=\"pinned\"", st.slots_pinned);
    gauge(&w, "pagedkv_gpu_registered_bytes", "Bytes of the arena registered for DMA.",
          st.registered_bytes);
    gauge_secs(&w, "pagedkv_gpu_register_duration_seconds", "Time spent registering the arena.",
               ms_to_ns(st.register_ms));
    counter(&w, "pagedkv_gpu_page_ins_total", "Page-in calls.", st.page_ins);
    counter(&w, "pagedkv_gpu_page_in_failures_total", "Page-in calls that failed.",
            st.page_in_failures);
    counter(&w, "pagedkv_gpu_blocks_hit_total",
            "Distinct blocks of a batch already valid on the device.", st.blocks_hit);
    counter(&w, "pagedkv_gpu_blocks_copied_total", "Blocks copied to the device.", st.blocks_copied);
    counter(&w, "pagedkv_gpu_blocks_recopied_total",
            "Blocks copied again (their device copy had been evicted).", st.blocks_recopied);
    counter(&w, "pagedkv_gpu_evictions_total", "Device slots evicted.", st.evictions);
    counter(&w, "pagedkv_gpu_h2d_bytes_total", "Bytes copied host to device.", st.bytes_h2d);
    counter(&w, "pagedkv_gpu_writebacks_total", "Write-back calls.", st.writebacks);
    counter(&w, "pagedkv_gpu_tokens_written_back_total", "Tokens written back to the arena.",
            st.tokens_written_back);
    counter(&w, "pagedkv_gpu_d2h_bytes_total", "Bytes copied device to host.", st.bytes_d2h);
    return finish(&w, needed);
}
