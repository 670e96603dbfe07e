/*
 * kvdump — inspect, verify, export and import a pagedkv cache directory offline.
 *
 *   kvdump summary  DIR                     geometry, occupancy, log, checkpoint chain
 *   kvdump blocks   DIR [--state S] [--limit N]
 *   kvdump block    DIR ID [--payload]
 *   kvdump seqs     DIR
 *   kvdump seq      DIR ID
 *   kvdump prefixes DIR [--top N]           the prefix tree
 *   kvdump wal      DIR [--from LSN] [--to LSN] [--type T] [--stats]
 *   kvdump verify   DIR                     the checkpoint chain, the log, every
 *                                           invariant and payload checksum
 *   kvdump export   DIR (--seq ID | --prompt FILE) -o BUNDLE
 *   kvdump import   DIR BUNDLE
 *
 * Every command takes --json and --help. Reading never takes the writer's lock
 * and never changes the directory: the cache is opened with PKV_OPEN_RDONLY,
 * which loads the checkpoint chain (the full checkpoint, then its deltas) and
 * replays the valid log prefix in memory; kvdump never rebuilds state itself.
 * Exit codes: 0 ok, 1 problems found (verify), 2 usage or unreadable input, 3
 * the operation failed (export / import). docs/kvdump.md is the reference.
 */
#include "kvdump.h"

#include <errno.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

static const char main_usage[] =
    "usage: kvdump COMMAND DIR [ARGS] [--json] [--help]\n"
    "       kvdump --help | --version\n"
    "\n"
    "Inspect, verify, export and import a pagedkv cache directory offline. Every\n"
    "command but import only reads: it takes no lock (a live writer keeps running)\n"
    "and never modifies the directory. import writes, and needs the writer's lock.\n"
    "\n"
    "commands:\n"
    "  summary  DIR                          geometry, model, occupancy, log, checkpoints\n"
    "  blocks   DIR [--state S] [--limit N]  list blocks (S: free, cached, used, all)\n"
    "  block    DIR ID [--payload]           one block; --payload: K/V statistics\n"
    "  seqs     DIR                          list sequences\n"
    "  seq      DIR ID                       one sequence and its block table\n"
    "  prefixes DIR [--top N]                the prefix tree, most shared prefixes\n"
    "  wal      DIR [--from LSN] [--to LSN] [--type T] [--stats]\n"
    "                                        the log records, and where the log ends\n"
    "  verify   DIR                          check the checkpoint chain, the log, every\n"
    "                                        invariant and payload checksum\n"
    "  export   DIR (--seq ID | --prompt FILE) -o BUNDLE\n"
    "                                        write a prefix's blocks to a bundle\n"
    "  import   DIR BUNDLE                   load a bundle into a cache\n"
    "\n"
    "common options:\n"
    "  --json            one JSON document on stdout (schema: docs/kvdump.md)\n"
    "  --point-in-time   read a log damaged in the middle up to the damage\n"
    "  --help            usage of a command\n"
    "\n"
    "exit status: 0 ok, 1 problems found (verify), 2 usage error or unreadable\n"
    "input, 3 the operation failed (export, import)\n";

/* ---- Shared scans of the opened cache ---------------------------------------- */

/* Depth (1 = chain root) of every sealed block; 0 for other blocks or a broken
 * chain (the library's pkv_pool_depths, shifted by one). */
static uint32_t *depths(const pkv_cache *c) {
    const pkv_pool *p = &c->pool;
    const uint32_t cap = p->capacity;
    uint32_t *d = malloc((cap ? cap : 1) * sizeof *d), *stack = malloc(((size_t)cap + 1) * sizeof *stack);
    if (!d || !stack) {
        free(d);
        free(stack);
        return NULL;
    }
    pkv_pool_depths(p, d, stack);
    for (uint32_t b = 0; b < cap; b++) d[b] = d[b] >= UINT32_MAX - 1 ? 0 : d[b] + 1;
    free(stack);
    return d;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted ids of all sequences (malloc'd; *n receives the count). */
static uint64_t *seq_ids(const pkv_cache *c, size_t *n) {
    uint64_t *ids = malloc((c->seqs.count ? c->seqs.count : 1) * sizeof *ids);
    *n = 0;
    if (!ids) return NULL;
    for (uint64_t i = 0; i <= c->seqs.mask; i++)
        if (c->seqs.slots[i] && *n < c->seqs.count) ids[(*n)++] = c->seqs.slots[i]->id;
    qsort(ids, *n, sizeof *ids, cmp_u64);
    return ids;
}

static pkv_seq *seq_get(pkv_cache *c, uint64_t id) { return pkv_seqmap_get(&c->seqs, id); }

static const char *flags_str(uint8_t f) {
    if ((f & BLKF_BAD) && (f & BLKF_UNVERIFIED)) return "bad,unverified";
    if (f & BLKF_BAD) return "bad";
    if (f & BLKF_UNVERIFIED) return "unverified";
    return "";
}

static void json_flags(kj *j, uint8_t f) {
    kj_arr(j, "flags", true);
    if (f & BLKF_UNVERIFIED) kj_str(j, NULL, "unverified");
    if (f & BLKF_BAD) kj_str(j, NULL, "bad");
    kj_end_arr(j);
}

static void print_tokens_wrapped(const uint32_t *t, uint64_t n, const char *indent) {
    for (uint64_t i = 0; i < n; i++) {
        if (i % 16 == 0) printf("%s%s", i ? "\n" : "", indent);
        else putchar(' ');
        printf("%u", t[i]);
    }
    if (n) putchar('\n');
}

static int out_status(kd_ctx *x, int rc) {
    fflush(stdout);
    if (ferror(stdout)) return kd_fail(x, KD_FAILED, "writing the output failed");
    return rc;
}

/* Parse "kvdump CMD DIR [ID]" with the options of opts; npos_want positionals. */
static int parse_simple(kd_ctx *x, int argc, char **argv, kd_opt *opts, const char **pos,
                        int npos_want, const char *usage, const char *what) {
    int np = kd_parse(x, argc, argv, 2, opts, pos, npos_want, usage);
    if (np == -1) return -1;
    if (np < 0) return KD_USAGE;
    if (np != npos_want)
        return kd_fail(x, KD_USAGE, "expected %s (see kvdump %s --help)", what, x->cmd);
    x->dir = pos[0];
    return 0;
}

/* ---- summary ------------------------------------------------------------------- */

/* Where the arena file is, what file system holds it, and what the CUDA layer
 * last obtained (src/cuda/cuda.c leaves <dir>/cuda.status when it attaches). */
typedef struct kd_place {
    const char *path; /* the arena file (dir/arena or the link's target) */
    bool linked;
    char fs[48];
    bool gpu;         /* cuda.status was found */
    char mode[48], device[320], note[600];
    long long pid, time;
} kd_place;

static void kd_fs_name(const char *path, char *out, size_t cap) {
    struct statfs sf;
    if (statfs(path, &sf)) {
        snprintf(out, cap, "unknown (%s)", strerror(errno));
        return;
    }
    switch ((unsigned long)sf.f_type) {
    case TMPFS_MAGIC: snprintf(out, cap, "tmpfs"); break;
    case HUGETLBFS_MAGIC: snprintf(out, cap, "hugetlbfs"); break;
    case EXT4_SUPER_MAGIC: snprintf(out, cap, "ext4"); break;
    case XFS_SUPER_MAGIC: snprintf(out, cap, "xfs"); break;
    case BTRFS_SUPER_MAGIC: snprintf(out, cap, "btrfs"); break;
    case OVERLAYFS_SUPER_MAGIC: snprintf(out, cap, "overlay"); break;
    default: snprintf(out, cap, "0x%lx", (unsigned long)sf.f_type); break;
    }
}

static void kd_place_read(const kd_ctx *x, const pkv_cache *c, kd_place *p) {
    memset(p, 0, sizeof *p);
    p->path = c->arena.path;
    p->linked = c->arena.linked;
    kd_fs_name(p->path, p->fs, sizeof p->fs);
    char path[4200], line[1024];
    snprintf(path, sizeof path, "%s/cuda.status", x->dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    p->gpu = true;
    snprintf(p->mode, sizeof p->mode, "?");
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *v = strchr(line, ' ');
        if (!v) continue;
        *v++ = '\0';
        if (!strcmp(line, "mode")) snprintf(p->mode, sizeof p->mode, "%.47s", v);
        else if (!strcmp(line, "device")) snprintf(p->device, sizeof p->device, "%.319s", v);
        else if (!strcmp(line, "note")) snprintf(p->note, sizeof p->note, "%.599s", v);
        else if (!strcmp(line, "pid")) p->pid = strtoll(v, NULL, 10);
        else if (!strcmp(line, "time")) p->time = strtoll(v, NULL, 10);
    }
    fclose(f);
}

/* The checkpoint chain of a summary (kd_log_scan): JSON member "checkpoint_chain". */
static void json_chain(kj *j, const kd_log *L) {
    kj_obj(j, "checkpoint_chain", false);
    kj_bool(j, "ok", L->chain_ok);
    kj_str(j, "error", L->chain_ok ? NULL : L->chain_err);
    if (L->have_ckpt) kj_u64(j, "base_lsn", L->ckpt_lsn);
    else kj_null(j, "base_lsn");
    kj_u64(j, "newest_lsn", L->chain_lsn);
    kj_u64(j, "deltas", L->nchain);
    kj_u64(j, "delta_raw_bytes", L->chain_raw);
    kj_u64(j, "stale", L->nstale);
    kj_arr(j, "files", false);
    for (size_t i = 0; i < L->ndeltas; i++) {
        const kd_delta *d = &L->deltas[i];
        bool decoded = !d->fail;
        kj_obj(j, NULL, true);
        kj_strf(j, "file", "delta-%016llx", (unsigned long long)d->no);
        kj_u64(j, "lsn", d->no);
        kj_str(j, "state", kd_delta_state_name(d->state));
        kj_u64(j, "file_bytes", d->file_size);
        kj_u64(j, "raw_bytes", d->raw);
        kj_u64(j, "mtime_ns", d->mtime_ns);
        if (decoded) {
            kj_u64(j, "prev_lsn", d->prev_lsn);
            kj_u64(j, "sealed_blocks", d->sealed);
            kj_u64(j, "freed_blocks", d->freed);
            kj_u64(j, "sequences", d->sequences);
        } else {
            kj_null(j, "prev_lsn");
            kj_null(j, "sealed_blocks");
            kj_null(j, "freed_blocks");
            kj_null(j, "sequences");
        }
        kj_str(j, "error", d->err[0] ? d->err : NULL);
        kj_end_obj(j);
    }
    kj_end_arr(j);
    kj_end_obj(j);
}

/* One "delta" line of the text summary. */
static void print_delta(const kd_delta *d) {
    char b1[32], b2[32], t1[64];
    printf("delta       LSN %llu, %s (raw %s), written %s", (unsigned long long)d->no,
           kd_bytes(b1, sizeof b1, d->file_size), kd_bytes(b2, sizeof b2, d->raw),
           kd_time(t1, sizeof t1, d->mtime_ns));
    if (!d->fail)
        printf(": %llu sealed block%s changed, %llu freed, %llu sequence%s",
               (unsigned long long)d->sealed, d->sealed == 1 ? "" : "s",
               (unsigned long long)d->freed, (unsigned long long)d->sequences,
               d->sequences == 1 ? "" : "s");
    if (d->state == KD_DELTA_BROKEN) printf("; BROKEN: %s", d->err);
    else if (d->state == KD_DELTA_UNREACHED) printf("; not applied (the chain breaks before it)");
    putchar('\n');
}

/* The text summary's checkpoint lines: the full checkpoint, each delta of the
 * chain, the chain, the stale deltas. Without delta files: one line, as before. */
static void print_chain(const kd_log *L) {
    char b1[32], b2[32], t1[64];
    if (L->have_ckpt)
        printf("checkpoint  LSN %llu, %s (raw %s), written %s\n", (unsigned long long)L->ckpt_lsn,
               kd_bytes(b1, sizeof b1, L->ckpt_file_size), kd_bytes(b2, sizeof b2, L->ckpt_raw),
               kd_time(t1, sizeof t1, L->ckpt_mtime_ns));
    else
        printf("checkpoint  none\n");
    if (!L->ndeltas) return;
    size_t stale = 0;
    for (size_t i = 0; i < L->ndeltas; i++) {
        if (L->deltas[i].state != KD_DELTA_STALE) print_delta(&L->deltas[i]);
        else stale++;
    }
    if (!L->chain_ok)
        printf("chain       BROKEN: %s; recovery fails\n", L->chain_err);
    else if (L->nchain)
        printf("chain       full checkpoint + %zu delta%s (raw %s): the log is replayed after "
               "LSN %llu\n", L->nchain, L->nchain == 1 ? "" : "s",
               kd_bytes(b1, sizeof b1, L->chain_raw), (unsigned long long)L->chain_lsn);
    if (!stale) return;
    printf("stale       %zu delta%s from an older chain, ignored (LSN <= %llu):", stale,
           stale == 1 ? "" : "s", (unsigned long long)L->ckpt_no);
    for (size_t i = 0; i < L->ndeltas; i++)
        if (L->deltas[i].state == KD_DELTA_STALE)
            printf(" %llu", (unsigned long long)L->deltas[i].no);
    putchar('\n');
}

static const char summary_usage[] =
    "usage: kvdump summary DIR [--json] [--point-in-time]\n"
    "\n"
    "Geometry, model identity, capacity; blocks free / cached / in use; sequences;\n"
    "log size and LSN range; the checkpoint chain (the full checkpoint, each delta\n"
    "checkpoint on it, stale deltas); what recovery replays and how long this\n"
    "read-only recovery took.\n";

static int cmd_summary(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, summary_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    char why[1024];
    kd_log L;
    int lrc = kd_log_scan(x->dir, &x->hdr, &L, NULL, NULL, why, sizeof why);
    if (lrc) kd_warn(x, "log scan: %s", why);
    pkv_stats st;
    pkv_recovery rec;
    pkv_get_stats(c, &st);
    pkv_get_recovery(c, &rec);
    const pkv_pool *p = &c->pool;
    uint64_t n_open = 0, n_bad = 0, n_unver = 0, tokens = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        n_open += p->b[b].state == BLK_OPEN;
        n_bad += p->b[b].state == BLK_SEALED && (p->b[b].flags & BLKF_BAD);
        n_unver += p->b[b].state == BLK_SEALED && (p->b[b].flags & BLKF_UNVERIFIED);
    }
    for (uint64_t i = 0; i <= c->seqs.mask; i++)
        if (c->seqs.slots[i]) tokens += c->seqs.slots[i]->committed;
    const kd_hdr *h = &x->hdr;
    uint64_t need = h->data_offset + h->capacity * h->slot_bytes;
    kd_place pl;
    kd_place_read(x, c, &pl);
    double ms = rec.ms_checkpoint + rec.ms_replay + rec.ms_rebuild + rec.ms_verify;
    size_t nvalid = 0, nread = 0;
    if (!lrc)
        for (size_t i = 0; i < L.nsegs; i++) {
            nvalid += L.segs[i].valid;
            nread += L.segs[i].read;
        }
    if (x->json) {
        kj *j = &x->j;
        kj_init(j, stdout);
        kj_begin_doc(j, "summary");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_str(j, "model_id", h->model_id);
        kj_obj(j, "geometry", false);
        kj_u64(j, "num_layers", h->num_layers);
        kj_u64(j, "num_kv_heads", h->num_kv_heads);
        kj_u64(j, "head_dim", h->head_dim);
        kj_u64(j, "block_size", h->block_size);
        kj_str(j, "dtype", kd_dtype_name(h->dtype));
        kj_u64(j, "elem_size", h->elem_size);
        kj_u64(j, "capacity", h->capacity);
        kj_u64(j, "block_bytes", h->block_bytes);
        kj_u64(j, "slot_bytes", h->slot_bytes);
        kj_end_obj(j);
        kj_obj(j, "arena", false);
        kj_u64(j, "file_bytes", h->file_size);
        kj_u64(j, "expected_bytes", need);
        kj_u64(j, "valid_blocks", c->arena.valid_blocks);
        kj_u64(j, "created_ns", h->created_ns);
        kj_str(j, "path", pl.path);
        kj_bool(j, "linked", pl.linked);
        kj_str(j, "filesystem", pl.fs);
        kj_end_obj(j);
        kj_obj(j, "cuda", false);
        kj_bool(j, "attached_ever", pl.gpu);
        if (pl.gpu) {
            kj_str(j, "mode", pl.mode);
            kj_str(j, "device", pl.device);
            kj_i64(j, "pid", pl.pid);
            kj_i64(j, "time", pl.time);
            kj_str(j, "note", pl.note);
        }
        kj_end_obj(j);
        kj_obj(j, "blocks", false);
        kj_u64(j, "capacity", st.capacity);
        kj_u64(j, "free", st.blocks_free);
        kj_u64(j, "cached", st.blocks_cached);
        kj_u64(j, "used", st.blocks_used);
        kj_u64(j, "sealed", st.blocks_sealed);
        kj_u64(j, "open", n_open);
        kj_u64(j, "unverified", n_unver);
        kj_u64(j, "bad", n_bad);
        kj_end_obj(j);
        kj_obj(j, "sequences", false);
        kj_u64(j, "count", st.sequences);
        kj_u64(j, "committed_tokens", tokens);
        kj_end_obj(j);
        kj_obj(j, "log", false);
        if (!lrc) {
            kj_u64(j, "segments", L.nsegs);
            kj_u64(j, "segments_valid", nvalid);
            kj_u64(j, "segments_read", nread);
            kj_u64(j, "spares", L.nspare);
            kj_u64(j, "spares_stray", L.nspare_stray + L.nspare_ignored);
            kj_u64(j, "bytes_allocated", L.seg_bytes);
            kj_u64(j, "bytes_used", L.used_bytes);
            if (L.first_lsn) kj_u64(j, "first_lsn", L.first_lsn);
            else kj_null(j, "first_lsn");
            kj_u64(j, "last_lsn", rec.last_lsn);
            kj_u64(j, "records", L.records);
            kj_str(j, "end_reason", kd_end_name(L.end_reason));
            kj_str(j, "end_detail", L.end_reason ? L.end_detail : "no log segment to read");
        } else {
            kj_str(j, "error", why);
        }
        kj_u64(j, "torn_bytes", rec.torn_bytes);
        kj_end_obj(j);
        if (!lrc && L.have_ckpt) {
            kj_obj(j, "checkpoint", false);
            kj_u64(j, "lsn", L.ckpt_lsn);
            kj_u64(j, "file_bytes", L.ckpt_file_size);
            kj_u64(j, "raw_bytes", L.ckpt_raw);
            kj_u64(j, "mtime_ns", L.ckpt_mtime_ns);
            kj_end_obj(j);
        } else {
            kj_null(j, "checkpoint");
        }
        if (!lrc) json_chain(j, &L);
        else kj_null(j, "checkpoint_chain");
        kj_obj(j, "recovery", false);
        kj_u64(j, "checkpoint_lsn", rec.checkpoint_lsn);
        kj_u64(j, "checkpoint_deltas", rec.checkpoint_deltas);
        kj_u64(j, "records_replayed", rec.records_replayed);
        kj_u64(j, "bytes_replayed", lrc ? 0 : L.replay_bytes);
        kj_u64(j, "last_lsn", rec.last_lsn);
        kj_dbl(j, "ms", ms);
        kj_dbl(j, "ms_checkpoint", rec.ms_checkpoint);
        kj_dbl(j, "ms_replay", rec.ms_replay);
        kj_dbl(j, "ms_rebuild", rec.ms_rebuild);
        kj_dbl(j, "ms_verify", rec.ms_verify);
        kj_u64(j, "blocks_dropped", rec.blocks_dropped);
        kj_u64(j, "sequences_dropped", rec.sequences_dropped);
        kj_u64(j, "sequences_cut", rec.sequences_cut);
        kj_u64(j, "seq_blocks_bad", rec.seq_blocks_bad);
        if (rec.corrupt_lsn) kj_u64(j, "corrupt_lsn", rec.corrupt_lsn);
        else kj_null(j, "corrupt_lsn");
        kj_bool(j, "repair_needed", rec.repaired != 0);
        kj_str(j, "note", rec.note);
        kj_u64(j, "retries", (uint64_t)x->retries);
        kj_end_obj(j);
        kj_obj(j, "counters", false);
        kj_u64(j, "hit_tokens", st.hit_tokens);
        kj_u64(j, "miss_tokens", st.miss_tokens);
        kj_u64(j, "hit_blocks", st.hit_blocks);
        kj_u64(j, "miss_blocks", st.miss_blocks);
        kj_u64(j, "evictions", st.evictions);
        kj_u64(j, "cow_copies", st.cow_copies);
        kj_u64(j, "dedupes", st.dedupes);
        kj_u64(j, "seals", st.seals);
        kj_end_obj(j);
        kj_end_doc(j);
    } else {
        char b1[32], b2[32], b3[32], t1[64];
        printf("cache       %s\n", x->dir);
        char pm[PKV_MODEL_ID_MAX + 1];
        printf("model       %s\n", kd_printable(h->model_id, pm, sizeof pm));
        printf("geometry    %u layers x %u kv heads x head_dim %u, %s, %u tokens per block\n",
               h->num_layers, h->num_kv_heads, h->head_dim, kd_dtype_name(h->dtype),
               h->block_size);
        printf("arena       %llu block slots of %s (payload %s), file %s%s, created %s\n",
               (unsigned long long)h->capacity, kd_bytes(b1, sizeof b1, h->slot_bytes),
               kd_bytes(b2, sizeof b2, h->block_bytes), kd_bytes(b3, sizeof b3, h->file_size),
               h->file_size < need ? " (SHORT)" : "", kd_time(t1, sizeof t1, h->created_ns));
        if (pl.linked)
            printf("            %s (%s/arena links to it) on %s\n", pl.path, x->dir, pl.fs);
        else
            printf("            %s on %s\n", pl.path, pl.fs);
        if (pl.gpu)
            printf("gpu         last attached by pid %lld at %s: mode %s, device %s%s%s\n", pl.pid,
                   kd_time(t1, sizeof t1, (uint64_t)pl.time * 1000000000ull), pl.mode, pl.device,
                   strcmp(pl.note, "-") ? "; " : "", strcmp(pl.note, "-") ? pl.note : "");
        else
            printf("gpu         never attached (no cuda.status)\n");
        printf("blocks      %llu free, %llu cached, %llu used (%llu sealed, %llu open",
               (unsigned long long)st.blocks_free, (unsigned long long)st.blocks_cached,
               (unsigned long long)st.blocks_used, (unsigned long long)st.blocks_sealed,
               (unsigned long long)n_open);
        if (n_unver) printf(", %llu not yet verified", (unsigned long long)n_unver);
        if (n_bad) printf(", %llu BAD", (unsigned long long)n_bad);
        printf(")\n");
        printf("sequences   %llu, %llu committed tokens\n", (unsigned long long)st.sequences,
               (unsigned long long)tokens);
        if (!lrc) {
            printf("log         %zu segment%s (%zu read), %s allocated, %s used; ", L.nsegs,
                   L.nsegs == 1 ? "" : "s", nread, kd_bytes(b1, sizeof b1, L.seg_bytes),
                   kd_bytes(b2, sizeof b2, L.used_bytes));
            if (L.first_lsn)
                printf("LSN %llu..%llu, %llu records\n", (unsigned long long)L.first_lsn,
                       (unsigned long long)rec.last_lsn, (unsigned long long)L.records);
            else
                printf("no records (last LSN %llu)\n", (unsigned long long)rec.last_lsn);
            printf("log end     %s\n", L.end_reason ? L.end_detail : "no log segment to read");
            if (L.nspare || L.nspare_stray || L.nspare_ignored)
                printf("spares      %zu to recycle, %zu stray\n", L.nspare,
                       L.nspare_stray + L.nspare_ignored);
            print_chain(&L);
        } else {
            printf("log         unreadable: %s\n", why);
        }
        printf("recovery    replays %llu records (%s) after the checkpoint%s; this read-only "
               "recovery took %.1f ms (checkpoint %.1f, replay %.1f, rebuild %.1f, verify %.1f)\n",
               (unsigned long long)rec.records_replayed,
               kd_bytes(b1, sizeof b1, lrc ? 0 : L.replay_bytes),
               rec.checkpoint_deltas ? " chain" : "", ms, rec.ms_checkpoint,
               rec.ms_replay, rec.ms_rebuild, rec.ms_verify);
        if (rec.note[0]) printf("            note: %s\n", rec.note);
        if (rec.repaired)
            printf("            the next writable open repairs the damage and checkpoints\n");
        printf("counters    hits %llu tokens / %llu blocks, misses %llu tokens / %llu blocks, "
               "%llu seals, %llu dedupes, %llu copies, %llu evictions (%s)\n",
               (unsigned long long)st.hit_tokens, (unsigned long long)st.hit_blocks,
               (unsigned long long)st.miss_tokens, (unsigned long long)st.miss_blocks,
               (unsigned long long)st.seals, (unsigned long long)st.dedupes,
               (unsigned long long)st.cow_copies, (unsigned long long)st.evictions,
               rec.checkpoint_lsn ? "as saved by the checkpoint" : "saved only by checkpoints: none yet");
    }
    kd_log_free(&L); /* also after a failed scan: it frees what was listed */
    kd_close(x);
    return out_status(x, KD_OK);
}

/* ---- blocks ---------------------------------------------------------------------- */

static const char blocks_usage[] =
    "usage: kvdump blocks DIR [--state free|cached|used|all] [--limit N] [--json]\n"
    "\n"
    "One line per block: state (free: unused; cached: sealed, no sequence holds it;\n"
    "used: held by sequences), kind (sealed or open), refcount, parent, children,\n"
    "depth in its chain, salt, tokens, flags and the first token ids. Without\n"
    "--state every block that is not free is listed.\n";

static int cmd_blocks(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{"--state", true, NULL}, {"--limit", true, NULL}, {NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, blocks_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    const char *state = kd_optval(opts, "--state"), *v;
    uint64_t limit = UINT64_MAX;
    if (state && strcmp(state, "free") && strcmp(state, "cached") && strcmp(state, "used") &&
        strcmp(state, "all"))
        return kd_fail(x, KD_USAGE, "--state must be free, cached, used or all");
    if ((v = kd_optval(opts, "--limit")) && !kd_parse_u64(v, &limit))
        return kd_fail(x, KD_USAGE, "--limit: '%s' is not a number", v);
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    uint32_t *d = depths(c), *nt = kd_ntok_table(c);
    if (!d || !nt) {
        free(d);
        free(nt);
        kd_close(x);
        return kd_fail(x, KD_FAILED, "out of memory");
    }
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "blocks");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_str(j, "state", state ? state : "not_free");
        kj_arr(j, "blocks", false);
    } else {
        printf("%-8s %-6s %-6s %4s %8s %8s %5s %6s %6s %-10s %s\n", "block", "state", "kind",
               "ref", "parent", "children", "depth", "salt", "tokens", "flags", "first tokens");
    }
    uint64_t matched = 0, shown = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        const pkv_block *bk = &p->b[b];
        const char *s = kd_block_state(bk);
        if (state ? (strcmp(state, "all") && strcmp(state, s)) : !strcmp(s, "free")) continue;
        matched++;
        if (shown >= limit) continue;
        shown++;
        bool sealed = bk->state == BLK_SEALED;
        const char *kind = sealed ? "sealed" : bk->state == BLK_OPEN ? "open" : "free";
        const uint32_t *t = pkv_pool_tokens(p, b);
        if (x->json) {
            kj_obj(j, NULL, true);
            kj_u64(j, "block", b);
            kj_str(j, "state", s);
            kj_str(j, "kind", kind);
            kj_u64(j, "ref", bk->ref);
            if (sealed) {
                kj_block(j, "parent", bk->parent);
                kj_u64(j, "children", bk->nchild);
                kj_u64(j, "depth", d[b]);
                kj_u64(j, "salt", bk->salt);
                kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)bk->hash.hi,
                        (unsigned long long)bk->hash.lo);
            }
            kj_u64(j, "tokens", nt[b]);
            json_flags(j, sealed ? bk->flags : 0);
            kj_end_obj(j);
        } else {
            char par[16] = "-", ch[16] = "-", dep[16] = "-", salt[24] = "-";
            if (sealed) {
                if (bk->parent != PKV_NONE) snprintf(par, sizeof par, "%u", bk->parent);
                snprintf(ch, sizeof ch, "%u", bk->nchild);
                snprintf(dep, sizeof dep, "%u", d[b]);
                snprintf(salt, sizeof salt, "%llu", (unsigned long long)bk->salt);
            }
            printf("%-8u %-6s %-6s %4u %8s %8s %5s %6s %6u %-10s", b, s, kind, bk->ref, par, ch,
                   dep, salt, nt[b], sealed ? (flags_str(bk->flags)[0] ? flags_str(bk->flags) : "-") : "-");
            if (nt[b]) {
                printf(" [");
                for (uint32_t i = 0; i < nt[b] && i < 4; i++) printf(i ? " %u" : "%u", t[i]);
                printf(nt[b] > 4 ? " ...]" : "]");
            }
            putchar('\n');
        }
    }
    if (x->json) {
        kj_end_arr(j);
        kj_u64(j, "matched", matched);
        kj_u64(j, "shown", shown);
        kj_end_doc(j);
    } else {
        printf("%llu block%s", (unsigned long long)matched, matched == 1 ? "" : "s");
        if (shown < matched) printf(" (%llu shown, --limit)", (unsigned long long)shown);
        if (!state) printf("; %llu free blocks not listed (--state free or all)",
                           (unsigned long long)(p->capacity - matched));
        putchar('\n');
    }
    free(d);
    free(nt);
    kd_close(x);
    return out_status(x, KD_OK);
}

/* ---- block ID ---------------------------------------------------------------------- */

static const char block_usage[] =
    "usage: kvdump block DIR ID [--payload] [--json]\n"
    "\n"
    "Everything about one block: state, refcount, parent, children, depth, salt,\n"
    "hash, token ids, payload checksum (stored and recomputed) and the sequences\n"
    "that hold it. --payload adds per-layer min / max / mean / NaN / Inf counts of\n"
    "its K and V (over the tokens it holds).\n";

typedef struct kvstat {
    double min, max, sum;
    uint64_t n, nan, inf;
} kvstat;

static void kvstat_add(kvstat *s, float v) {
    if (isnan(v)) {
        s->nan++;
        return;
    }
    if (isinf(v)) {
        s->inf++;
        return;
    }
    if (!s->n || v < s->min) s->min = v;
    if (!s->n || v > s->max) s->max = v;
    s->sum += v;
    s->n++;
}

static void json_kvstat(kj *j, const char *key, const kvstat *s) {
    kj_obj(j, key, true);
    if (s->n) {
        kj_dbl(j, "min", s->min);
        kj_dbl(j, "max", s->max);
        kj_dbl(j, "mean", s->sum / (double)s->n);
    } else {
        kj_null(j, "min");
        kj_null(j, "max");
        kj_null(j, "mean");
    }
    kj_u64(j, "nan", s->nan);
    kj_u64(j, "inf", s->inf);
    kj_end_obj(j);
}

static int cmd_block(kd_ctx *x, int argc, char **argv) {
    const char *pos[2];
    kd_opt opts[] = {{"--payload", false, NULL}, {NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 2, block_usage, "DIR and a block ID");
    if (rc) return rc < 0 ? KD_OK : rc;
    uint64_t id;
    if (!kd_parse_u64(pos[1], &id)) return kd_fail(x, KD_USAGE, "'%s' is not a block id", pos[1]);
    bool payload = kd_optval(opts, "--payload") != NULL;
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    if (id >= p->capacity) {
        uint32_t cap = p->capacity;
        kd_close(x);
        return kd_fail(x, KD_USAGE, "block %llu is out of range (capacity %u)",
                       (unsigned long long)id, cap);
    }
    uint32_t b = (uint32_t)id;
    const pkv_block *bk = &p->b[b];
    uint32_t *d = depths(c), *nt = kd_ntok_table(c);
    if (!d || !nt) {
        free(d);
        free(nt);
        kd_close(x);
        return kd_fail(x, KD_FAILED, "out of memory");
    }
    bool sealed = bk->state == BLK_SEALED;
    bool mapped = b < c->arena.valid_blocks;
    const pkv_geometry *g = &c->arena.geo;
    uint64_t sum = mapped ? pkv_arena_sum(&c->arena, b) : 0;
    /* Children and holders. */
    uint32_t nkids = 0, *kids = malloc(((size_t)bk->nchild + 1) * sizeof *kids);
    for (uint32_t k = 0; k < p->capacity && kids; k++)
        if (p->b[k].state == BLK_SEALED && p->b[k].parent == b && nkids < bk->nchild) kids[nkids++] = k;
    size_t nids;
    uint64_t *ids = seq_ids(c, &nids);
    uint32_t ntok = bk->state == BLK_FREE ? p->block_size : nt[b];
    /* Payload statistics over the tokens the block holds. */
    kvstat *ps = NULL;
    if (payload && mapped) {
        ps = calloc(2ull * g->num_layers, sizeof *ps);
        for (uint32_t l = 0; ps && l < g->num_layers; l++)
            for (uint32_t k = 0; k < 2; k++)
                for (uint32_t hh = 0; hh < g->num_kv_heads; hh++) {
                    const uint8_t *run = pkv_arena_run(&c->arena, b, l, k, hh);
                    for (uint64_t e = 0; e < (uint64_t)ntok * g->head_dim; e++)
                        kvstat_add(&ps[2 * l + k], kd_elem(run + e * g->elem_size, g->dtype));
                }
    }
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "block");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_u64(j, "block", b);
        kj_str(j, "state", kd_block_state(bk));
        kj_str(j, "kind", sealed ? "sealed" : bk->state == BLK_OPEN ? "open" : "free");
        kj_u64(j, "ref", bk->ref);
        kj_bool(j, "in_arena_file", mapped);
        if (sealed) {
            kj_block(j, "parent", bk->parent);
            kj_arr(j, "children", true);
            for (uint32_t k = 0; k < nkids; k++) kj_u64(j, NULL, kids[k]);
            kj_end_arr(j);
            kj_u64(j, "depth", d[b]);
            kj_u64(j, "salt", bk->salt);
            kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)bk->hash.hi,
                    (unsigned long long)bk->hash.lo);
            kj_hex64(j, "payload_sum", bk->payload_sum);
            if (mapped) kj_hex64(j, "payload_sum_actual", sum);
            else kj_null(j, "payload_sum_actual");
            kj_bool(j, "payload_ok", mapped && sum == bk->payload_sum);
            json_flags(j, bk->flags);
        }
        kj_arr(j, "tokens", true);
        if (bk->state != BLK_FREE)
            for (uint32_t i = 0; i < nt[b]; i++) kj_u64(j, NULL, pkv_pool_tokens(p, b)[i]);
        kj_end_arr(j);
        kj_arr(j, "sequences", false);
        for (size_t i = 0; ids && i < nids; i++) {
            const pkv_seq *s = seq_get(c, ids[i]);
            for (uint32_t k = 0; s && k < s->nblocks; k++)
                if (s->blocks[k] == b) {
                    kj_obj(j, NULL, true);
                    kj_u64(j, "seq", s->id);
                    kj_u64(j, "entry", k);
                    kj_end_obj(j);
                }
        }
        kj_end_arr(j);
        if (payload) {
            if (ps) {
                kj_obj(j, "payload", false);
                kj_u64(j, "tokens", ntok);
                kj_arr(j, "layers", false);
                for (uint32_t l = 0; l < g->num_layers; l++) {
                    kj_obj(j, NULL, true);
                    kj_u64(j, "layer", l);
                    json_kvstat(j, "k", &ps[2 * l]);
                    json_kvstat(j, "v", &ps[2 * l + 1]);
                    kj_end_obj(j);
                }
                kj_end_arr(j);
                kj_end_obj(j);
            } else {
                kj_null(j, "payload");
            }
        }
        kj_end_doc(j);
    } else {
        printf("block %u\n", b);
        if (bk->state == BLK_FREE)
            printf("  state      free (its slot holds no K/V anyone refers to)\n");
        else
            printf("  state      %s (%s), refcount %u\n", kd_block_state(bk),
                   sealed ? "sealed" : "open", bk->ref);
        if (!mapped) printf("  arena      slot lies beyond the end of the (short) arena file\n");
        if (sealed) {
            if (bk->parent == PKV_NONE) printf("  parent     none (first block of a chain)\n");
            else printf("  parent     %u\n", bk->parent);
            printf("  children  ");
            for (uint32_t k = 0; k < nkids && k < 32; k++) printf(" %u", kids[k]);
            if (nkids > 32) printf(" ... (%u in all)", nkids);
            printf(nkids ? "\n" : " none\n");
            printf("  depth      %u (tokens %llu..%llu of its chain)\n", d[b],
                   (unsigned long long)(d[b] ? (uint64_t)(d[b] - 1) * p->block_size : 0),
                   (unsigned long long)((uint64_t)d[b] * p->block_size - 1));
            printf("  salt       %llu\n", (unsigned long long)bk->salt);
            printf("  hash       %016llx%016llx\n", (unsigned long long)bk->hash.hi,
                   (unsigned long long)bk->hash.lo);
            printf("  checksum   sealed %016llx, payload %016llx: %s\n",
                   (unsigned long long)bk->payload_sum, (unsigned long long)sum,
                   !mapped ? "slot not in the file" : sum == bk->payload_sum ? "ok" : "MISMATCH");
            if (bk->flags) printf("  flags      %s\n", flags_str(bk->flags));
        } else if (bk->state == BLK_OPEN) {
            printf("  tokens     %u of %u committed (open blocks carry no checksum)\n", nt[b],
                   p->block_size);
        }
        printf("  sequences ");
        size_t nh = 0;
        for (size_t i = 0; ids && i < nids; i++) {
            const pkv_seq *s = seq_get(c, ids[i]);
            for (uint32_t k = 0; s && k < s->nblocks; k++)
                if (s->blocks[k] == b) {
                    printf("%s%llu (entry %u)", nh++ ? ", " : " ", (unsigned long long)s->id, k);
                }
        }
        printf(nh ? "\n" : " none\n");
        if (bk->state != BLK_FREE && nt[b]) {
            printf("  token ids\n");
            print_tokens_wrapped(pkv_pool_tokens(p, b), nt[b], "    ");
        }
        if (payload && ps) {
            printf("payload over %u token%s%s:\n", ntok, ntok == 1 ? "" : "s",
                   bk->state == BLK_FREE ? " (a free slot: stale contents)" : "");
            printf("  %5s %4s %14s %14s %14s %8s %8s\n", "layer", "kind", "min", "max", "mean",
                   "nan", "inf");
            for (uint32_t l = 0; l < g->num_layers; l++)
                for (uint32_t k = 0; k < 2; k++) {
                    const kvstat *s = &ps[2 * l + k];
                    if (s->n)
                        printf("  %5u %4s %14.6g %14.6g %14.6g %8llu %8llu\n", l, k ? "V" : "K",
                               s->min, s->max, s->sum / (double)s->n, (unsigned long long)s->nan,
                               (unsigned long long)s->inf);
                    else
                        printf("  %5u %4s %14s %14s %14s %8llu %8llu\n", l, k ? "V" : "K", "-",
                               "-", "-", (unsigned long long)s->nan, (unsigned long long)s->inf);
                }
        } else if (payload) {
            printf("payload: not available (the slot is not in the arena file)\n");
        }
    }
    free(ps);
    free(ids);
    free(kids);
    free(d);
    free(nt);
    kd_close(x);
    return out_status(x, KD_OK);
}

/* ---- seqs / seq ---------------------------------------------------------------------- */

static const char seqs_usage[] =
    "usage: kvdump seqs DIR [--json]\n"
    "\n"
    "One line per open sequence, by id: salt, length, committed tokens, block-table\n"
    "entries, sealed entries and entries shared with other sequences. A recovered\n"
    "sequence holds only committed tokens (pending tokens are never logged).\n";

static int cmd_seqs(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, seqs_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    size_t n;
    uint64_t *ids = seq_ids(c, &n);
    if (!ids) {
        kd_close(x);
        return kd_fail(x, KD_FAILED, "out of memory");
    }
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "seqs");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_arr(j, "sequences", false);
    } else {
        printf("%-20s %-20s %10s %10s %8s %8s %8s\n", "seq", "salt", "len", "committed", "blocks",
               "sealed", "shared");
    }
    for (size_t i = 0; i < n; i++) {
        const pkv_seq *s = seq_get(c, ids[i]);
        if (!s) continue;
        uint64_t sealed = 0, shared = 0;
        for (uint32_t k = 0; k < s->nblocks; k++) {
            sealed += p->b[s->blocks[k]].state == BLK_SEALED;
            shared += p->b[s->blocks[k]].ref > 1;
        }
        if (x->json) {
            kj_obj(j, NULL, true);
            kj_u64(j, "id", s->id);
            kj_u64(j, "salt", s->salt);
            kj_u64(j, "len", s->len);
            kj_u64(j, "committed", s->committed);
            kj_u64(j, "blocks", s->nblocks);
            kj_u64(j, "sealed_blocks", sealed);
            kj_u64(j, "shared_blocks", shared);
            kj_end_obj(j);
        } else {
            printf("%-20llu %-20llu %10llu %10llu %8u %8llu %8llu\n", (unsigned long long)s->id,
                   (unsigned long long)s->salt, (unsigned long long)s->len,
                   (unsigned long long)s->committed, s->nblocks, (unsigned long long)sealed,
                   (unsigned long long)shared);
        }
    }
    if (x->json) {
        kj_end_arr(j);
        kj_u64(j, "count", n);
        kj_end_doc(j);
    } else {
        printf("%zu sequence%s\n", n, n == 1 ? "" : "s");
    }
    free(ids);
    kd_close(x);
    return out_status(x, KD_OK);
}

static const char seq_usage[] =
    "usage: kvdump seq DIR ID [--json]\n"
    "\n"
    "One sequence: salt, length, committed tokens, its block table (per entry: the\n"
    "block, its kind, refcount and token range) and its token ids.\n";

static int cmd_seq(kd_ctx *x, int argc, char **argv) {
    const char *pos[2];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 2, seq_usage, "DIR and a sequence ID");
    if (rc) return rc < 0 ? KD_OK : rc;
    uint64_t id;
    if (!kd_parse_u64(pos[1], &id)) return kd_fail(x, KD_USAGE, "'%s' is not a sequence id", pos[1]);
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    const uint32_t bs = p->block_size;
    const pkv_seq *s = seq_get(c, id);
    if (!s) {
        kd_close(x);
        return kd_fail(x, KD_USAGE, "no sequence %llu in %s", (unsigned long long)id, x->dir);
    }
    uint32_t *tok = s->len < (1ull << 32) ? malloc((s->len ? s->len : 1) * sizeof *tok) : NULL;
    size_t ntok = 0;
    if (!tok || pkv_seq_tokens(c, id, tok, s->len, &ntok)) ntok = 0;
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "seq");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_u64(j, "id", s->id);
        kj_u64(j, "salt", s->salt);
        kj_u64(j, "len", s->len);
        kj_u64(j, "committed", s->committed);
        kj_arr(j, "table", false);
        for (uint32_t k = 0; k < s->nblocks; k++) {
            const pkv_block *bk = &p->b[s->blocks[k]];
            uint64_t from = (uint64_t)k * bs, to = from + bs;
            if (to > s->len) to = s->len;
            kj_obj(j, NULL, true);
            kj_u64(j, "entry", k);
            kj_u64(j, "block", s->blocks[k]);
            kj_str(j, "kind", bk->state == BLK_SEALED ? "sealed" : "open");
            kj_u64(j, "ref", bk->ref);
            kj_u64(j, "first_token", from);
            kj_u64(j, "tokens", to - from);
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_arr(j, "tokens", true);
        for (size_t i = 0; i < ntok; i++) kj_u64(j, NULL, tok[i]);
        kj_end_arr(j);
        kj_end_doc(j);
    } else {
        printf("sequence %llu\n", (unsigned long long)s->id);
        printf("  salt       %llu\n", (unsigned long long)s->salt);
        printf("  length     %llu tokens, %llu committed\n", (unsigned long long)s->len,
               (unsigned long long)s->committed);
        printf("  table      %u entries\n", s->nblocks);
        printf("    %6s %10s %-6s %5s  %s\n", "entry", "block", "kind", "ref", "tokens");
        for (uint32_t k = 0; k < s->nblocks; k++) {
            const pkv_block *bk = &p->b[s->blocks[k]];
            uint64_t from = (uint64_t)k * bs, to = from + bs;
            if (to > s->len) to = s->len;
            printf("    %6u %10u %-6s %5u  %llu..%llu%s\n", k, s->blocks[k],
                   bk->state == BLK_SEALED ? "sealed" : "open", bk->ref, (unsigned long long)from,
                   (unsigned long long)(to - 1), bk->ref > 1 ? " (shared)" : "");
        }
        printf("  token ids\n");
        print_tokens_wrapped(tok, ntok, "    ");
    }
    free(tok);
    kd_close(x);
    return out_status(x, KD_OK);
}

/* ---- prefixes -------------------------------------------------------------------------- */

static const char prefixes_usage[] =
    "usage: kvdump prefixes DIR [--top N] [--json]\n"
    "\n"
    "The prefix tree of the sealed blocks, per salt, drawn as a tree. Chains whose\n"
    "blocks are all held by the same sequences are drawn as one line. Each line gives\n"
    "the blocks, the depth (in blocks) and token range, the sequences that use the\n"
    "prefix, its fan-out (distinct cached continuations) and the size of its subtree.\n"
    "A table of the most shared prefixes comes first.\n"
    "\n"
    "  --top N   list the N most shared prefixes and draw only the branches leading\n"
    "            to them (default: 10 listed, the whole tree drawn)\n";

typedef struct ptree {
    const pkv_cache *c;
    uint32_t *kid_off, *kids; /* CSR children of sealed blocks */
    uint32_t *depth, *subtree;
    uint32_t *seg_end;        /* head -> end of its segment (PKV_NONE: not a head) */
    uint8_t *visible;         /* per head: drawn (--top) */
} ptree;

static uint32_t pt_users(const ptree *t, uint32_t b) { return t->c->pool.b[b].ref; }

static const ptree *g_rank_tree; /* qsort has no context argument in C11 */

static int cmp_rank(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const ptree *t = g_rank_tree;
    uint32_t ux = pt_users(t, x), uy = pt_users(t, y);
    if (ux != uy) return ux > uy ? -1 : 1;
    if (t->depth[x] != t->depth[y]) return t->depth[x] > t->depth[y] ? -1 : 1;
    if (t->subtree[x] != t->subtree[y]) return t->subtree[x] > t->subtree[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Order of sibling heads: most users, then biggest subtree, then block id. */
static int cmp_sib(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const ptree *t = g_rank_tree;
    uint32_t ux = pt_users(t, x), uy = pt_users(t, y);
    if (ux != uy) return ux > uy ? -1 : 1;
    if (t->subtree[x] != t->subtree[y]) return t->subtree[x] > t->subtree[y] ? -1 : 1;
    if (t->c->pool.b[x].salt != t->c->pool.b[y].salt)
        return t->c->pool.b[x].salt < t->c->pool.b[y].salt ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The tree's ruler for a line at `level` (indent holds 4 characters per level):
 * past RULER_LEVELS, "[level L] " and the ruler of the deepest RULER_LEVELS
 * levels only, so a deep tree prints O(lines), not O(lines x depth) (a spine of
 * 8192 blocks with a leaf at each printed 270 MB). */
#define RULER_LEVELS 32u
static void put_ruler(const char *indent, uint32_t level) {
    if (level <= RULER_LEVELS) {
        fputs(indent, stdout);
        return;
    }
    printf("[level %u] %s", level, indent + (size_t)(level - RULER_LEVELS) * 4);
}

static void print_seg_line(const ptree *t, uint32_t head, const char *indent, uint32_t level,
                           const char *branch) {
    const pkv_pool *p = &t->c->pool;
    uint32_t end = t->seg_end[head];
    uint32_t n = t->depth[end] - t->depth[head] + 1;
    put_ruler(indent, level);
    fputs(branch, stdout);
    if (n == 1) printf("b%u", head);
    else printf("b%u..b%u", head, end);
    printf("  %u block%s, depth %u", n, n == 1 ? "" : "s", t->depth[end]);
    printf(", tokens %llu..%llu", (unsigned long long)((uint64_t)(t->depth[head] - 1) * p->block_size),
           (unsigned long long)((uint64_t)t->depth[end] * p->block_size - 1));
    printf(", used by %u seq%s, fan-out %u, subtree %u\n", pt_users(t, end),
           pt_users(t, end) == 1 ? "" : "s", t->kid_off[end + 1] - t->kid_off[end],
           t->subtree[head]);
}

static int cmd_prefixes(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{"--top", true, NULL}, {NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, prefixes_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    uint64_t top = 10;
    const char *v = kd_optval(opts, "--top");
    bool limited = v != NULL;
    if (v && (!kd_parse_u64(v, &top) || top == 0))
        return kd_fail(x, KD_USAGE, "--top: '%s' is not a positive number", v);
    if ((rc = kd_open(x))) return rc;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    const uint32_t cap = p->capacity;
    ptree t;
    memset(&t, 0, sizeof t);
    t.c = c;
    t.kid_off = calloc((size_t)cap + 2, sizeof *t.kid_off);
    t.kids = malloc(((size_t)p->n_sealed + 1) * sizeof *t.kids);
    t.depth = depths(c);
    t.subtree = calloc((size_t)cap + 1, sizeof *t.subtree);
    t.seg_end = malloc(((size_t)cap + 1) * sizeof *t.seg_end);
    t.visible = calloc((size_t)cap + 1, 1);
    uint32_t *order = malloc(((size_t)p->n_sealed + 1) * sizeof *order);
    uint32_t *ends = malloc(((size_t)p->n_sealed + 1) * sizeof *ends);
    uint32_t *roots = malloc(((size_t)p->n_sealed + 1) * sizeof *roots);
    uint32_t *stk = malloc(((size_t)p->n_sealed + 1) * sizeof *stk);
    uint32_t *heads = malloc(((size_t)p->n_sealed + 1) * sizeof *heads);
    uint32_t *rootof = malloc(((size_t)cap + 1) * sizeof *rootof);
    if (!t.kid_off || !t.kids || !t.depth || !t.subtree || !t.seg_end || !t.visible || !order ||
        !ends || !roots || !stk || !heads || !rootof) {
        rc = kd_fail(x, KD_FAILED, "out of memory");
        goto out;
    }
    g_rank_tree = &t;
    /* Children lists (CSR) of sealed blocks whose chain is intact (depth > 0). */
    for (uint32_t b = 0; b < cap; b++) {
        const pkv_block *bk = &p->b[b];
        if (bk->state == BLK_SEALED && t.depth[b] && bk->parent != PKV_NONE) t.kid_off[bk->parent + 1]++;
    }
    for (uint32_t b = 0; b < cap; b++) t.kid_off[b + 1] += t.kid_off[b];
    uint32_t *fill = t.subtree; /* reused as a cursor, reset below */
    size_t nroots = 0, norder = 0, nends = 0;
    for (uint32_t b = 0; b < cap; b++) {
        const pkv_block *bk = &p->b[b];
        if (bk->state != BLK_SEALED || !t.depth[b]) continue;
        if (bk->parent == PKV_NONE) roots[nroots++] = b;
        else t.kids[t.kid_off[bk->parent] + fill[bk->parent]++] = b;
    }
    memset(t.subtree, 0, ((size_t)cap + 1) * sizeof *t.subtree);
    /* BFS order from the roots; subtree sizes in reverse. */
    for (size_t i = 0; i < nroots; i++) order[norder++] = roots[i];
    for (size_t i = 0; i < norder; i++)
        for (uint32_t k = t.kid_off[order[i]]; k < t.kid_off[order[i] + 1]; k++) order[norder++] = t.kids[k];
    for (size_t i = norder; i-- > 0;) {
        uint32_t b = order[i];
        t.subtree[b] += 1;
        if (p->b[b].parent != PKV_NONE) t.subtree[p->b[b].parent] += t.subtree[b];
    }
    /* Segments: a head is a root, or a block whose parent has fan-out != 1 or a
     * different number of users. */
    for (uint32_t b = 0; b < cap; b++) t.seg_end[b] = PKV_NONE;
    for (size_t i = 0; i < norder; i++) {
        uint32_t b = order[i], par = p->b[b].parent;
        bool head = par == PKV_NONE || t.kid_off[par + 1] - t.kid_off[par] != 1 ||
                    pt_users(&t, par) != pt_users(&t, b);
        if (!head) continue;
        uint32_t e = b;
        while (t.kid_off[e + 1] - t.kid_off[e] == 1 && pt_users(&t, t.kids[t.kid_off[e]]) == pt_users(&t, e))
            e = t.kids[t.kid_off[e]];
        t.seg_end[b] = e;
        ends[nends++] = e;
    }
    qsort(ends, nends, sizeof *ends, cmp_rank);
    size_t ntop = nends < top ? nends : (size_t)top;
    /* Heads of every segment on the path to a top prefix (or all). */
    if (limited) { /* a visible head's ancestors are marked already: stop there */
        for (size_t i = 0; i < ntop; i++)
            for (uint32_t b = ends[i]; b != PKV_NONE; b = p->b[b].parent) {
                if (t.seg_end[b] == PKV_NONE) continue;
                if (t.visible[b]) break;
                t.visible[b] = 1;
            }
    } else {
        for (uint32_t b = 0; b < cap; b++) t.visible[b] = t.seg_end[b] != PKV_NONE;
    }
    kj *j = &x->j;
    size_t nseq = c->seqs.count;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "prefixes");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_u64(j, "block_size", p->block_size);
        kj_u64(j, "sealed_blocks", norder);
        kj_u64(j, "trees", nroots);
        kj_u64(j, "sequences", nseq);
        kj_arr(j, "top", false);
        for (size_t i = 0; i < ntop; i++) {
            uint32_t e = ends[i];
            kj_obj(j, NULL, true);
            kj_u64(j, "rank", i + 1);
            kj_u64(j, "block", e);
            kj_u64(j, "salt", p->b[e].salt);
            kj_u64(j, "depth", t.depth[e]);
            kj_u64(j, "tokens", (uint64_t)t.depth[e] * p->block_size);
            kj_u64(j, "users", pt_users(&t, e));
            kj_u64(j, "fanout", t.kid_off[e + 1] - t.kid_off[e]);
            kj_u64(j, "subtree_blocks", t.subtree[e]);
            /* Path root..e. */
            uint32_t n = 0;
            for (uint32_t b = e; b != PKV_NONE && n <= t.depth[e]; b = p->b[b].parent) stk[n++] = b;
            kj_arr(j, "path", true);
            while (n) kj_u64(j, NULL, stk[--n]);
            kj_end_arr(j);
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_arr(j, "segments", false);
        for (size_t i = 0; i < norder; i++) {
            uint32_t h = order[i];
            if (t.seg_end[h] == PKV_NONE || !t.visible[h]) continue;
            uint32_t e = t.seg_end[h], par = p->b[h].parent;
            kj_obj(j, NULL, true);
            kj_u64(j, "head", h);
            kj_u64(j, "end", e);
            kj_u64(j, "salt", p->b[h].salt);
            kj_block(j, "parent", par);
            kj_arr(j, "blocks", true);
            for (uint32_t b = h;; b = t.kids[t.kid_off[b]]) {
                kj_u64(j, NULL, b);
                if (b == e) break;
            }
            kj_end_arr(j);
            kj_u64(j, "depth_from", t.depth[h]);
            kj_u64(j, "depth_to", t.depth[e]);
            kj_u64(j, "users", pt_users(&t, e));
            kj_u64(j, "fanout", t.kid_off[e + 1] - t.kid_off[e]);
            kj_u64(j, "subtree_blocks", t.subtree[h]);
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_end_doc(j);
        goto out;
    }
    printf("%zu sealed block%s in %zu tree%s, %zu sequence%s, %u tokens per block\n", norder,
           norder == 1 ? "" : "s", nroots, nroots == 1 ? "" : "s", nseq, nseq == 1 ? "" : "s",
           p->block_size);
    if (!norder) goto out;
    printf("\nmost shared prefixes:\n");
    printf("  %4s %6s %6s %8s %7s %8s %10s %8s  %s\n", "rank", "users", "depth", "tokens",
           "fan-out", "subtree", "last block", "salt", "first tokens");
    /* The root of every block, parents first (order is breadth-first from the
     * roots), instead of a walk to the root per listed prefix. */
    for (size_t i = 0; i < norder; i++) {
        uint32_t b = order[i], par = p->b[b].parent;
        rootof[b] = par == PKV_NONE ? b : rootof[par];
    }
    for (size_t i = 0; i < ntop; i++) {
        uint32_t e = ends[i], r = rootof[e];
        const uint32_t *tk = pkv_pool_tokens(p, r);
        printf("  %4zu %6u %6u %8llu %7u %8u %10u %8llu  [", i + 1, pt_users(&t, e), t.depth[e],
               (unsigned long long)((uint64_t)t.depth[e] * p->block_size),
               t.kid_off[e + 1] - t.kid_off[e], t.subtree[e], e, (unsigned long long)p->b[e].salt);
        for (uint32_t k = 0; k < p->block_size && k < 6; k++) printf(k ? " %u" : "%u", tk[k]);
        printf(p->block_size > 6 ? " ...]\n" : "]\n");
    }
    printf("\nprefix tree%s:\n", limited ? " (branches leading to the prefixes above)" : "");
    /* Roots by salt, then as siblings. */
    size_t nheads = 0;
    for (size_t i = 0; i < nroots; i++)
        if (t.visible[roots[i]]) heads[nheads++] = roots[i];
    qsort(heads, nheads, sizeof *heads, cmp_sib);
    /* Iterative DFS. Stack entries: head | (last-sibling flag in bit 31 is not
     * possible for 32-bit ids), so keep a parallel level array. */
    {
        size_t depth_cap = 64;
        char *indent = malloc(depth_cap * 4 + 1);
        uint32_t *lvl = malloc(((size_t)p->n_sealed + 1) * sizeof *lvl);
        uint8_t *last = malloc(((size_t)p->n_sealed + 1));
        uint32_t *tmp = malloc(((size_t)p->n_sealed + 1) * sizeof *tmp);
        if (!indent || !lvl || !last || !tmp) {
            free(indent);
            free(lvl);
            free(last);
            free(tmp);
            rc = kd_fail(x, KD_FAILED, "out of memory");
            goto out;
        }
        uint64_t cur_salt = 0;
        bool have_salt = false;
        for (size_t r = 0; r < nheads; r++) {
            uint64_t salt = p->b[heads[r]].salt;
            if (!have_salt || salt != cur_salt) {
                printf("salt %llu\n", (unsigned long long)salt);
                cur_salt = salt;
                have_salt = true;
            }
            bool lastroot = r + 1 == nheads || p->b[heads[r + 1]].salt != salt;
            size_t sp = 0;
            stk[sp] = heads[r];
            lvl[sp] = 0;
            last[sp] = lastroot;
            sp++;
            while (sp) {
                sp--;
                uint32_t h = stk[sp], L = lvl[sp];
                bool isl = last[sp];
                if ((size_t)L + 1 > depth_cap) {
                    size_t nc = depth_cap * 2;
                    while (nc < (size_t)L + 1) nc *= 2;
                    char *ni = realloc(indent, nc * 4 + 1);
                    if (!ni) break;
                    indent = ni;
                    depth_cap = nc;
                }
                indent[(size_t)L * 4] = '\0';
                print_seg_line(&t, h, indent, L, isl ? "`-- " : "|-- ");
                memcpy(indent + (size_t)L * 4, isl ? "    " : "|   ", 4);
                indent[(size_t)L * 4 + 4] = '\0';
                uint32_t e = t.seg_end[h];
                size_t nk = 0, hidden = 0, hidden_blocks = 0;
                for (uint32_t k = t.kid_off[e]; k < t.kid_off[e + 1]; k++) {
                    uint32_t kid = t.kids[k];
                    if (t.visible[kid]) tmp[nk++] = kid;
                    else {
                        hidden++;
                        hidden_blocks += t.subtree[kid];
                    }
                }
                qsort(tmp, nk, sizeof *tmp, cmp_sib);
                if (hidden) {
                    put_ruler(indent, L + 1);
                    printf("%s... %zu more branch%s (%zu block%s)\n", nk ? "|-- " : "`-- ",
                           hidden, hidden == 1 ? "" : "es", hidden_blocks, hidden_blocks == 1 ? "" : "s");
                }
                /* Push in reverse so the first sibling is drawn first. */
                for (size_t k = nk; k-- > 0;) {
                    stk[sp] = tmp[k];
                    lvl[sp] = L + 1;
                    last[sp] = k + 1 == nk;
                    sp++;
                }
            }
        }
        free(indent);
        free(lvl);
        free(last);
        free(tmp);
    }
out:
    free(t.kid_off);
    free(t.kids);
    free(t.depth);
    free(t.subtree);
    free(t.seg_end);
    free(t.visible);
    free(order);
    free(ends);
    free(roots);
    free(stk);
    free(heads);
    free(rootof);
    kd_close(x);
    return rc ? rc : out_status(x, KD_OK);
}

/* ---- verify -------------------------------------------------------------------------- */

static const char verify_usage[] =
    "usage: kvdump verify DIR [--json]\n"
    "\n"
    "Check everything that can be checked offline and list each problem:\n"
    "the arena header and size; the checkpoint chain (the full checkpoint, then each\n"
    "delta checkpoint, which must name the file before it; stale deltas are notes);\n"
    "every log segment header, frame\n"
    "and record that recovery reads (corruption, gaps, foreign segments); what\n"
    "recovery had to drop or cut; for every sealed block its chain hash and its\n"
    "payload checksum; and every invariant of pkv_check (refcounts, lists, prefix\n"
    "index, child counts, block tables). Torn log tails, which recovery cuts as\n"
    "designed, are reported as notes.\n"
    "\n"
    "exit status: 0 no problem, 1 problems found, 2 not a readable cache directory.\n";

typedef struct vitem {
    const char *kind;
    uint64_t block, seq; /* UINT64_MAX: none */
    char msg[480];
} vitem;

typedef struct vlist {
    vitem *v;
    size_t n, cap;
} vlist;

static void vadd(vlist *l, const char *kind, uint64_t block, uint64_t seq, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void vadd(vlist *l, const char *kind, uint64_t block, uint64_t seq, const char *fmt, ...) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        vitem *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return; /* out of memory: the item is lost, the count below is not */
        l->v = nv;
        l->cap = nc;
    }
    vitem *it = &l->v[l->n++];
    it->kind = kind;
    it->block = block;
    it->seq = seq;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->msg, sizeof it->msg, fmt, ap);
    va_end(ap);
}

typedef struct vcount {
    uint64_t sealed, payloads, hashes, sequences, passes, seq_bad;
    bool opened, invariants, oom;
} vcount;

/* A sealed block whose payload does not match its checksum in a snapshot. */
typedef struct suspect {
    uint32_t block;
    uint64_t sum, actual;
    bool bad_flag;
} suspect;

/* The sequences that hold a suspect block: the HOLDERS_SHOWN smallest ids, and
 * how many table entries in all. */
#define HOLDERS_SHOWN 4
typedef struct holders {
    uint64_t id[HOLDERS_SHOWN];
    uint64_t n;
} holders;

/* The holders of every suspect, in one pass over the block tables (in id order):
 * a block-indexed map from slot to suspect, so the cost is capacity + table
 * entries, not suspects x entries (a damaged arena of a large cache makes every
 * sealed block a suspect). NULL if out of memory. */
static holders *find_holders(pkv_cache *c, const suspect *sus, size_t nsus) {
    const uint32_t cap = c->pool.capacity;
    size_t nids;
    uint64_t *ids = seq_ids(c, &nids);
    uint32_t *at = malloc((cap ? cap : 1) * sizeof *at);
    holders *h = calloc(nsus ? nsus : 1, sizeof *h);
    if (!ids || !at || !h) {
        free(ids);
        free(at);
        free(h);
        return NULL;
    }
    memset(at, 0xff, (size_t)cap * sizeof *at); /* UINT32_MAX: not a suspect */
    for (size_t i = 0; i < nsus; i++)
        if (sus[i].block < cap) at[sus[i].block] = (uint32_t)i;
    for (size_t q = 0; q < nids; q++) {
        const pkv_seq *s = seq_get(c, ids[q]);
        for (uint32_t e = 0; s && e < s->nblocks; e++) {
            uint32_t b = s->blocks[e];
            if (b >= cap || at[b] == UINT32_MAX) continue;
            holders *x = &h[at[b]];
            if (x->n < HOLDERS_SHOWN) x->id[x->n] = s->id;
            x->n++;
        }
    }
    free(ids);
    free(at);
    return h;
}

/* "; held by sequence 3, 9 and 2 more" into out ("" when no sequence holds it). */
static void format_holders(const holders *x, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
    for (uint64_t i = 0; i < x->n && i < HOLDERS_SHOWN && o < len; i++) {
        int w = snprintf(out + o, len - o, "%s%llu", i ? ", " : "; held by sequence ",
                         (unsigned long long)x->id[i]);
        if (w > 0) o += (size_t)w;
    }
    if (x->n > HOLDERS_SHOWN && o < len)
        snprintf(out + o, len - o, " and %llu more", (unsigned long long)(x->n - HOLDERS_SHOWN));
}

static uint64_t snap_lsn(pkv_cache *c) {
    pkv_recovery r;
    pkv_get_recovery(c, &r);
    return r.last_lsn;
}

/* One read-only snapshot: recovery report, chain hashes, payload checksums (the
 * mismatches go to *sus, to be confirmed), pkv_check. */
static void verify_pass(kd_ctx *x, uint32_t flags, vlist *prob, vlist *notes, vcount *k,
                        suspect **sus, size_t *nsus) {
    char why[1024];
    int rc = kd_open_quiet(x, flags, why, sizeof why);
    if (rc) {
        vadd(prob, "recovery", UINT64_MAX, UINT64_MAX, "recovery fails: %s: %s", pkv_strerror(rc), why);
        return;
    }
    k->opened = true;
    pkv_cache *c = x->c;
    const pkv_pool *p = &c->pool;
    pkv_recovery rec;
    pkv_get_recovery(c, &rec);
    if (x->retries)
        vadd(notes, "live_writer", UINT64_MAX, UINT64_MAX, "the directory changed while it was "
             "read (a live writer); read again %d time%s", x->retries, x->retries == 1 ? "" : "s");
    if (rec.blocks_dropped || rec.sequences_dropped)
        vadd(prob, "recovery_dropped", UINT64_MAX, UINT64_MAX, "recovery drops %llu sealed "
             "block%s and %llu sequence%s%s%s", (unsigned long long)rec.blocks_dropped,
             rec.blocks_dropped == 1 ? "" : "s", (unsigned long long)rec.sequences_dropped,
             rec.sequences_dropped == 1 ? "" : "s", rec.note[0] ? ": " : "", rec.note);
    else if (rec.note[0] && !rec.torn_bytes && !rec.corrupt_lsn)
        vadd(notes, "recovery", UINT64_MAX, UINT64_MAX, "%s", rec.note);
    k->seq_bad = rec.seq_blocks_bad;
    if (rec.sequences_cut > rec.seq_blocks_bad)
        vadd(prob, "sequence_cut", UINT64_MAX, UINT64_MAX, "recovery cuts %llu sequence%s at a "
             "block-table entry that is out of place (lost or dropped, unsealed, or out of chain)",
             (unsigned long long)(rec.sequences_cut - rec.seq_blocks_bad),
             rec.sequences_cut - rec.seq_blocks_bad == 1 ? "" : "s");
    size_t cap = 0;
    for (uint32_t b = 0; b < p->capacity; b++) {
        const pkv_block *bk = &p->b[b];
        if (bk->state != BLK_SEALED) continue;
        k->sealed++;
        pkv_h128 ph;
        bool chain = true;
        if (bk->parent == PKV_NONE) {
            ph = pkv_hash_root(c->arena.secret, bk->salt);
        } else if (bk->parent >= p->capacity || p->b[bk->parent].state != BLK_SEALED ||
                   p->b[bk->parent].salt != bk->salt) {
            vadd(prob, "chain", b, UINT64_MAX, "block %u: parent %u is not a sealed block of the "
                 "same salt", b, bk->parent);
            chain = false;
            ph.lo = ph.hi = 0;
        } else {
            ph = p->b[bk->parent].hash;
        }
        if (chain) {
            k->hashes++;
            pkv_h128 hh = pkv_hash_block(c->arena.secret, ph, pkv_pool_tokens(p, b), p->block_size);
            if (!pkv_h128_eq(hh, bk->hash))
                vadd(prob, "hash", b, UINT64_MAX, "block %u: stored hash %016llx%016llx does not "
                     "match its parent hash and tokens (%016llx%016llx)", b,
                     (unsigned long long)bk->hash.hi, (unsigned long long)bk->hash.lo,
                     (unsigned long long)hh.hi, (unsigned long long)hh.lo);
        }
        if (b >= c->arena.valid_blocks) {
            vadd(prob, "payload_missing", b, UINT64_MAX, "block %u: sealed, but its slot is "
                 "beyond the end of the arena file", b);
            continue;
        }
        k->payloads++;
        uint64_t sum = pkv_arena_sum(&c->arena, b);
        if (sum != bk->payload_sum) {
            if (*nsus == cap) {
                cap = cap ? cap * 2 : 16;
                suspect *ns = realloc(*sus, cap * sizeof *ns);
                if (!ns) {
                    k->oom = true; /* cmd_verify fails rather than report a partial list */
                    return;
                }
                *sus = ns;
            }
            (*sus)[(*nsus)++] = (suspect){b, bk->payload_sum, sum, (bk->flags & BLKF_BAD) != 0};
        }
    }
    k->sequences = c->seqs.count;
    char cwhy[512];
    if (pkv_check(c, cwhy, sizeof cwhy))
        vadd(prob, "invariant", UINT64_MAX, UINT64_MAX, "%s", cwhy);
    k->invariants = true;
}

/* Whether delta-<no> is still there 50 ms after the scan: a live writer's full
 * checkpoint renames ckpt-<lsn> into place, then deletes every delta, so a scan
 * between the two sees stale deltas that are gone a moment later. */
static bool delta_stays(const char *dir, uint64_t no, bool *slept) {
    if (!*slept) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        *slept = true;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/delta-%016llx", dir, (unsigned long long)no);
    struct stat st;
    return lstat(path, &st) == 0 || errno != ENOENT; /* a dangling link stays */
}

/* The checkpoint chain (kd_log_scan): a break is a problem (recovery fails), a
 * delta of another arena than its chain is a broken chain), stale deltas notes. */
static void verify_chain(const char *dir, const kd_log *L, vlist *prob, vlist *notes) {
    size_t unreached = 0, vanished = 0;
    bool slept = false;
    for (size_t i = 0; i < L->ndeltas; i++) {
        const kd_delta *d = &L->deltas[i];
        unreached += d->state == KD_DELTA_UNREACHED && L->ckpt_ok;
        if (d->state == KD_DELTA_STALE && !delta_stays(dir, d->no, &slept))
            vanished++;
        else if (d->state == KD_DELTA_STALE)
            vadd(notes, "stale_delta", UINT64_MAX, UINT64_MAX, "delta-%016llx: LSN %llu is not "
                 "after the full checkpoint ckpt-%016llx: left from an older chain (a crash "
                 "before that checkpoint deleted it); recovery ignores it and the next "
                 "writable open or full checkpoint deletes it", (unsigned long long)d->no, (unsigned long long)d->no,
                 (unsigned long long)L->ckpt_no);
    }
    if (vanished)
        vadd(notes, "live_writer", UINT64_MAX, UINT64_MAX, "%zu stale delta%s vanished just "
             "after the read: a live writer's full checkpoint deleted %s (not damage)", vanished,
             vanished == 1 ? "" : "s", vanished == 1 ? "it" : "them");
    if (L->chain_ok) return;
    char after[96] = "";
    if (unreached)
        snprintf(after, sizeof after, "; %zu later delta%s cannot be applied either", unreached,
                 unreached == 1 ? "" : "s");
    vadd(prob, "checkpoint_chain", UINT64_MAX, UINT64_MAX, "%s: recovery fails%s", L->chain_err,
         after);
}

static void vlist_free(vlist *l) {
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Out of memory halfway: verify fails (KD_FAILED) rather than report part of it. */
static int verify_oom(kd_ctx *x, suspect *sus, vlist *prob, vlist *notes, kd_log *L,
                      const char *what) {
    free(sus);
    kd_close(x);
    vlist_free(prob);
    vlist_free(notes);
    kd_log_free(L);
    return kd_fail(x, KD_FAILED, "out of memory while %s", what);
}

static int cmd_verify(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, verify_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    vlist prob = {0}, notes = {0};
    vcount k;
    memset(&k, 0, sizeof k);
    char why[1024];
    kd_log L;
    memset(&L, 0, sizeof L);
    bool have_log = false;
    rc = kd_read_header(x->dir, &x->hdr, why, sizeof why);
    if (rc == KD_USAGE) return kd_fail(x, KD_USAGE, "%s", why);
    if (rc == KD_PROBLEMS) {
        vadd(&prob, "arena_header", UINT64_MAX, UINT64_MAX, "%s", why);
        goto report;
    }
    const kd_hdr *h = &x->hdr;
    uint64_t need = h->data_offset + h->capacity * h->slot_bytes;
    if (h->file_size < need)
        vadd(&prob, "arena_short", UINT64_MAX, UINT64_MAX, "the arena file has %llu bytes, its "
             "geometry needs %llu: the slots of blocks %llu and up are missing",
             (unsigned long long)h->file_size, (unsigned long long)need,
             (unsigned long long)((h->file_size - h->data_offset) / h->slot_bytes));
    else if (h->file_size > need)
        vadd(&notes, "arena_long", UINT64_MAX, UINT64_MAX, "the arena file has %llu bytes, "
             "%llu more than its geometry needs (ignored)", (unsigned long long)h->file_size,
             (unsigned long long)(h->file_size - need));
    uint32_t flags = 0;
    rc = kd_log_scan(x->dir, h, &L, NULL, NULL, why, sizeof why);
    if (rc) {
        vadd(&prob, "log_unreadable", UINT64_MAX, UINT64_MAX, "%s", why);
    } else {
        have_log = true;
        if (L.have_ckpt && !L.ckpt_ok)
            vadd(&prob, "checkpoint", UINT64_MAX, UINT64_MAX, "%s", L.ckpt_err);
        if (L.ckpt_ok && L.ckpt_secret != h->secret)
            vadd(&prob, "foreign_checkpoint", UINT64_MAX, UINT64_MAX, "checkpoint LSN %llu "
                 "describes another arena (the arena was replaced or recreated)",
                 (unsigned long long)L.ckpt_lsn);
        if (L.nckpt_files > 1)
            vadd(&notes, "old_checkpoints", UINT64_MAX, UINT64_MAX, "%zu checkpoint files; "
                 "recovery reads only the newest", L.nckpt_files);
        verify_chain(x->dir, &L, &prob, &notes);
        for (size_t i = 0; i < L.nsegs; i++) {
            const kd_seg *s = &L.segs[i];
            if (s->foreign)
                vadd(&prob, "foreign_segment", UINT64_MAX, UINT64_MAX, "wal-%016llx: %s",
                     (unsigned long long)s->no, s->why);
            else if (!s->valid)
                vadd(&notes, "segment_header", UINT64_MAX, UINT64_MAX, "wal-%016llx: invalid "
                     "header (%s): recovery skips it as never written", (unsigned long long)s->no,
                     s->why);
        }
        switch (L.end_reason) {
        case KD_END_CORRUPT:
        case KD_END_GAP:
        case KD_END_BAD_RECORD:
            vadd(&prob, L.end_reason == KD_END_GAP ? "log_gap" :
                 L.end_reason == KD_END_CORRUPT ? "log_corrupt" : "log_bad_record",
                 UINT64_MAX, UINT64_MAX, "log segment %llu offset %llu: %s",
                 (unsigned long long)L.end_seg, (unsigned long long)L.end_off, L.end_detail);
            if (L.end_reason != KD_END_BAD_RECORD) flags = PKV_OPEN_POINT_IN_TIME;
            break;
        default:
            break;
        }
        if (L.torn_bytes)
            vadd(&notes, "torn_tail", UINT64_MAX, UINT64_MAX, "a torn log tail of %llu bytes "
                 "after LSN %llu (segment %llu offset %llu): a write cut short by a crash; "
                 "recovery discards it", (unsigned long long)L.torn_bytes,
                 (unsigned long long)L.last_lsn, (unsigned long long)L.end_seg,
                 (unsigned long long)L.end_off);
        if (L.arena_tmp)
            vadd(&notes, "stray_file", UINT64_MAX, UINT64_MAX, "arena.tmp: left by an "
                 "interrupted creation (ignored)");
        if (L.ckpt_tmp)
            vadd(&notes, "stray_file", UINT64_MAX, UINT64_MAX, "ckpt.tmp: left by an "
                 "interrupted checkpoint (ignored)");
        uint64_t strays = pkv_wal_spare_strays(L.spare_mask);
        for (unsigned k = 0; k < 64; k++)
            if (strays >> k & 1)
                vadd(&notes, "stray_file", UINT64_MAX, UINT64_MAX, "wal-spare-%016x: outside "
                     "the run of spares from wal-spare-0 that the log recycles (%zu long; a "
                     "recycling failed); the next writable open deletes it", k, L.nspare);
        if (L.nspare_ignored)
            vadd(&notes, "stray_file", UINT64_MAX, UINT64_MAX, "%zu wal-spare-* file%s "
                 "numbered 64 or more: no writer makes them; the next writable open "
                 "deletes them", L.nspare_ignored, L.nspare_ignored == 1 ? "" : "s");
    }
    /* Read the state. A live writer evicts cached blocks and reuses their slots
     * at once, before the EVICT record reaches the log, so a snapshot (the valid
     * log prefix) may name a slot that already holds other K/V. A payload mismatch
     * therefore counts only if a later snapshot, taken once the log has caught up,
     * still has the block sealed with the same checksum and the mismatch persists. */
    vcount k0;
    memset(&k0, 0, sizeof k0);
    suspect *sus = NULL;
    size_t nsus = 0, unconfirmed = 0;
    bool moved = false;
    verify_pass(x, flags, &prob, &notes, &k0, &sus, &nsus);
    if (k0.oom) return verify_oom(x, sus, &prob, &notes, &L, "checking payloads");
    k = k0;
    k.passes = 1;
    if (x->c) {
        uint64_t lsn = snap_lsn(x->c);
        for (int round = 0; nsus && round < 5; round++) {
            struct timespec ts = {0, (long)(50 * 1000 * 1000) << round};
            nanosleep(&ts, NULL);
            kd_ctx y = *x;
            y.c = NULL;
            y.retries = 0;
            if (kd_open_quiet(&y, flags, why, sizeof why)) break; /* keep them all */
            k.passes++;
            uint64_t l2 = snap_lsn(y.c);
            if (l2 == lsn) { /* the log did not move: the mismatches stand */
                pkv_close(y.c);
                break;
            }
            moved = true;
            size_t w = 0;
            const pkv_pool *p2 = &y.c->pool;
            for (size_t i = 0; i < nsus; i++) {
                uint32_t b = sus[i].block;
                const pkv_block *bk = &p2->b[b];
                bool still = bk->state == BLK_SEALED && bk->payload_sum == sus[i].sum &&
                             b < y.c->arena.valid_blocks &&
                             pkv_arena_sum(&y.c->arena, b) != sus[i].sum;
                if (still) sus[w++] = sus[i];
                else unconfirmed++;
            }
            nsus = w;
            lsn = l2;
            pkv_close(y.c);
        }
        holders *hs = find_holders(x->c, sus, nsus);
        if (!hs) return verify_oom(x, sus, &prob, &notes, &L, "listing payload mismatches");
        bool held_bad = false;
        for (size_t i = 0; i < nsus; i++) {
            uint32_t b = sus[i].block;
            char held[160];
            format_holders(&hs[i], held, sizeof held);
            if (hs[i].n) held_bad = true;
            if (sus[i].bad_flag) held_bad = true; /* recovery flagged it: a sequence held it */
            vadd(&prob, "payload_checksum", b, UINT64_MAX, "block %u: payload checksum %016llx "
                 "does not match the one sealed with it (%016llx)%s%s", b,
                 (unsigned long long)sus[i].actual, (unsigned long long)sus[i].sum,
                 sus[i].bad_flag ? "; flagged bad, never served" : "; a prefix lookup would reject it",
                 held);
        }
        free(hs);
        if (k0.seq_bad && (!moved || held_bad))
            vadd(&prob, "sequence_cut_payload", UINT64_MAX, UINT64_MAX, "recovery cuts %llu "
                 "sequence%s before a block whose payload fails its checksum",
                 (unsigned long long)k0.seq_bad, k0.seq_bad == 1 ? "" : "s");
        else if (k0.seq_bad)
            vadd(&notes, "live_writer", UINT64_MAX, UINT64_MAX, "this snapshot's recovery cut %llu "
                 "sequence%s at blocks the live writer had already reused (not damage)",
                 (unsigned long long)k0.seq_bad, k0.seq_bad == 1 ? "" : "s");
        if (unconfirmed)
            vadd(&notes, "live_writer", UINT64_MAX, UINT64_MAX, "%zu payload mismatch%s vanished "
                 "in a later snapshot: blocks the live writer evicted and reused (not damage)",
                 unconfirmed, unconfirmed == 1 ? "" : "es");
    }
    free(sus);
    kd_close(x);
report:;
    kj *j = &x->j;
    if (x->json) {
        kj_init(j, stdout);
        kj_begin_doc(j, "verify");
        x->doc_open = true;
        kj_str(j, "dir", x->dir);
        kj_bool(j, "ok", prob.n == 0);
        kj_arr(j, "problems", false);
        for (size_t i = 0; i < prob.n; i++) {
            kj_obj(j, NULL, true);
            kj_str(j, "kind", prob.v[i].kind);
            if (prob.v[i].block != UINT64_MAX) kj_u64(j, "block", prob.v[i].block);
            if (prob.v[i].seq != UINT64_MAX) kj_u64(j, "seq", prob.v[i].seq);
            kj_str(j, "message", prob.v[i].msg);
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_arr(j, "notes", false);
        for (size_t i = 0; i < notes.n; i++) {
            kj_obj(j, NULL, true);
            kj_str(j, "kind", notes.v[i].kind);
            kj_str(j, "message", notes.v[i].msg);
            kj_end_obj(j);
        }
        kj_end_arr(j);
        kj_obj(j, "checked", false);
        kj_bool(j, "recovered", k.opened);
        size_t nread = 0;
        for (size_t i = 0; have_log && i < L.nsegs; i++) nread += L.segs[i].read;
        kj_u64(j, "segments_read", nread);
        kj_u64(j, "records", have_log ? L.records : 0);
        kj_u64(j, "checkpoint_deltas", have_log ? L.ndeltas : 0);
        kj_u64(j, "sealed_blocks", k.sealed);
        kj_u64(j, "payloads", k.payloads);
        kj_u64(j, "hashes", k.hashes);
        kj_u64(j, "sequences", k.sequences);
        kj_bool(j, "invariants", k.invariants);
        kj_u64(j, "passes", k.passes);
        kj_end_obj(j);
        kj_end_doc(j);
    } else {
        printf("verify %s\n", x->dir);
        if (have_log) {
            size_t nread = 0;
            for (size_t i = 0; i < L.nsegs; i++) nread += L.segs[i].read;
            printf("  log         %zu segment%s read, %llu records, last LSN %llu; %s\n", nread,
                   nread == 1 ? "" : "s", (unsigned long long)L.records,
                   (unsigned long long)L.last_lsn,
                   L.end_reason ? L.end_detail : "no log segment to read");
            if (L.have_ckpt)
                printf("  checkpoint  LSN %llu%s", (unsigned long long)L.ckpt_lsn,
                       L.ckpt_ok ? "" : " (unreadable)");
            if (L.nchain)
                printf(" + %zu delta%s, the log read after LSN %llu", L.nchain,
                       L.nchain == 1 ? "" : "s", (unsigned long long)L.chain_lsn);
            if (L.have_ckpt && !L.chain_ok) printf(", the chain is broken");
            if (L.have_ckpt && L.nstale) printf(", %zu stale delta%s", L.nstale,
                                                L.nstale == 1 ? "" : "s");
            if (L.have_ckpt) putchar('\n');
        }
        if (k.opened)
            printf("  checked     %llu sealed blocks (%llu payload checksums, %llu chain hashes), "
                   "%llu sequences, invariants I1-I10\n", (unsigned long long)k.sealed,
                   (unsigned long long)k.payloads, (unsigned long long)k.hashes,
                   (unsigned long long)k.sequences);
        for (size_t i = 0; i < prob.n; i++) printf("problem: %s: %s\n", prob.v[i].kind, prob.v[i].msg);
        for (size_t i = 0; i < notes.n; i++) printf("note: %s: %s\n", notes.v[i].kind, notes.v[i].msg);
        if (prob.n) printf("%zu problem%s found\n", prob.n, prob.n == 1 ? "" : "s");
        else printf("no problems found\n");
    }
    size_t np = prob.n;
    vlist_free(&prob);
    vlist_free(&notes);
    kd_log_free(&L);
    return out_status(x, np ? KD_PROBLEMS : KD_OK);
}

/* ---- main ---------------------------------------------------------------------------- */

typedef struct kd_cmd {
    const char *name;
    int (*fn)(kd_ctx *x, int argc, char **argv);
} kd_cmd;

static const kd_cmd commands[] = {
    {"summary", cmd_summary}, {"blocks", cmd_blocks},     {"block", cmd_block},
    {"seqs", cmd_seqs},       {"seq", cmd_seq},           {"prefixes", cmd_prefixes},
    {"wal", kd_cmd_wal},      {"verify", cmd_verify},     {"export", kd_cmd_export},
    {"import", kd_cmd_import},
};

int main(int argc, char **argv) {
    kd_install_sigbus();
    kd_ctx x;
    memset(&x, 0, sizeof x);
    if (argc < 2) {
        fputs(main_usage, stderr);
        return KD_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(main_usage, stdout);
        return KD_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("kvdump (pagedkv %d.%d), JSON schema %d, bundle format 1\n", PKV_VERSION_MAJOR,
               PKV_VERSION_MINOR, KD_SCHEMA);
        return KD_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) {
            x.cmd = commands[i].name;
            return commands[i].fn(&x, argc, argv);
        }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--json")) x.json = true;
    return kd_fail(&x, KD_USAGE, "unknown command '%s' (kvdump --help lists them)", cmd);
}
