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
 * Each command gathers what it shows through pagedkv.h and pagedkv_inspect.h
 * (kd_state, kvdump_out.c), then checks and prints it in per-section pieces.
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

/* ---- Shared pieces of the commands ------------------------------------------- */

static const char *flags_str(uint32_t f) {
    if ((f & PKV_BLOCK_BAD) && (f & PKV_BLOCK_UNVERIFIED)) return "bad,unverified";
    if (f & PKV_BLOCK_BAD) return "bad";
    if (f & PKV_BLOCK_UNVERIFIED) return "unverified";
    return "";
}

static void json_flags(kj *j, uint32_t f) {
    kj_arr(j, "flags", true);
    if (f & PKV_BLOCK_UNVERIFIED) kj_str(j, NULL, "unverified");
    if (f & PKV_BLOCK_BAD) kj_str(j, NULL, "bad");
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

/* Open x->dir read-only and read its state into s: 0, or an exit code after
 * kd_fail (nothing left open). */
static int open_state(kd_ctx *x, kd_state *s) {
    int rc = kd_open(x);
    if (rc) return rc;
    rc = kd_state_load(x->c, s);
    if (!rc) return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", pkv_last_error());
    kd_close(x);
    if (rc == PKV_ENOMEM) return kd_fail(x, KD_FAILED, "out of memory");
    return kd_fail(x, KD_FAILED, "reading %s: %s: %s", x->dir, pkv_strerror(rc), why);
}

static void close_state(kd_ctx *x, kd_state *s) {
    kd_state_free(s);
    kd_close(x);
}

/* Start the JSON document of the command on stdout, with its "dir" member. */
static kj *begin_json(kd_ctx *x) {
    kj *j = &x->j;
    kj_init(j, stdout);
    kj_begin_doc(j, x->cmd);
    x->doc_open = true;
    kj_str(j, "dir", x->dir);
    return j;
}

/* A sealed block's hash as kvdump prints it: hi then lo, 32 hex digits. */
static void json_hash(kj *j, const pkv_block_info *bk) {
    kj_strf(j, "hash", "%016llx%016llx", (unsigned long long)bk->hash_hi,
            (unsigned long long)bk->hash_lo);
}

/* Block b's token ids into t (block_size entries); false if they cannot be read. */
static bool block_tokens(kd_ctx *x, const kd_state *s, uint32_t b, uint32_t *t) {
    return pkv_inspect_block_tokens(x->c, b, t, s->inf.block_size, NULL) == 0;
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

static void kd_place_read(const kd_ctx *x, const pkv_arena_info *a, kd_place *p) {
    memset(p, 0, sizeof *p);
    p->path = a->path;
    p->linked = a->linked != 0;
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

/* Everything a summary prints, gathered first. */
typedef struct summary {
    const kd_hdr *h;
    kd_log L;
    int lrc;           /* the log scan's error (why), or 0 */
    char why[1024];
    pkv_stats st;
    pkv_recovery rec;
    uint64_t n_open, n_bad, n_unver, tokens;
    uint64_t need;     /* the arena file's size by its geometry */
    uint64_t valid_blocks;
    kd_place pl;
    double ms;         /* this read-only recovery */
    size_t nvalid, nread; /* log segments */
} summary;

static void summary_gather(kd_ctx *x, const kd_state *s, summary *m) {
    memset(m, 0, sizeof *m);
    m->h = &x->hdr;
    m->lrc = kd_log_scan(x->dir, &x->hdr, &m->L, NULL, NULL, m->why, sizeof m->why);
    if (m->lrc) kd_warn(x, "log scan: %s", m->why);
    pkv_get_stats(x->c, &m->st);
    pkv_get_recovery(x->c, &m->rec);
    for (uint32_t b = 0; b < s->cap; b++) {
        const pkv_block_info *bk = &s->blk[b];
        bool sealed = bk->state == PKV_BLOCK_SEALED;
        m->n_open += bk->state == PKV_BLOCK_OPEN;
        m->n_bad += sealed && (bk->flags & PKV_BLOCK_BAD);
        m->n_unver += sealed && (bk->flags & PKV_BLOCK_UNVERIFIED);
    }
    for (size_t i = 0; i < s->nseq; i++) m->tokens += s->seq[i].inf.committed;
    m->need = m->h->data_offset + m->h->capacity * m->h->slot_bytes;
    m->valid_blocks = s->arena.valid_blocks;
    kd_place_read(x, &s->arena, &m->pl);
    m->ms = m->rec.ms_checkpoint + m->rec.ms_replay + m->rec.ms_rebuild + m->rec.ms_verify;
    for (size_t i = 0; !m->lrc && i < m->L.nsegs; i++) {
        m->nvalid += m->L.segs[i].valid;
        m->nread += m->L.segs[i].read;
    }
}

static void json_geometry(kj *j, const kd_hdr *h) {
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
}

static void json_place(kj *j, const summary *m) {
    const kd_place *pl = &m->pl;
    kj_obj(j, "arena", false);
    kj_u64(j, "file_bytes", m->h->file_size);
    kj_u64(j, "expected_bytes", m->need);
    kj_u64(j, "valid_blocks", m->valid_blocks);
    kj_u64(j, "created_ns", m->h->created_ns);
    kj_str(j, "path", pl->path);
    kj_bool(j, "linked", pl->linked);
    kj_str(j, "filesystem", pl->fs);
    kj_end_obj(j);
    kj_obj(j, "cuda", false);
    kj_bool(j, "attached_ever", pl->gpu);
    if (pl->gpu) {
        kj_str(j, "mode", pl->mode);
        kj_str(j, "device", pl->device);
        kj_i64(j, "pid", pl->pid);
        kj_i64(j, "time", pl->time);
        kj_str(j, "note", pl->note);
    }
    kj_end_obj(j);
}

static void json_occupancy(kj *j, const summary *m) {
    const pkv_stats *st = &m->st;
    kj_obj(j, "blocks", false);
    kj_u64(j, "capacity", st->capacity);
    kj_u64(j, "free", st->blocks_free);
    kj_u64(j, "cached", st->blocks_cached);
    kj_u64(j, "used", st->blocks_used);
    kj_u64(j, "sealed", st->blocks_sealed);
    kj_u64(j, "open", m->n_open);
    kj_u64(j, "unverified", m->n_unver);
    kj_u64(j, "bad", m->n_bad);
    kj_end_obj(j);
    kj_obj(j, "sequences", false);
    kj_u64(j, "count", st->sequences);
    kj_u64(j, "committed_tokens", m->tokens);
    kj_end_obj(j);
}

static void json_log(kj *j, const summary *m) {
    const kd_log *L = &m->L;
    kj_obj(j, "log", false);
    if (!m->lrc) {
        kj_u64(j, "segments", L->nsegs);
        kj_u64(j, "segments_valid", m->nvalid);
        kj_u64(j, "segments_read", m->nread);
        kj_u64(j, "spares", L->nspare);
        kj_u64(j, "spares_stray", L->nspare_stray + L->nspare_ignored);
        kj_u64(j, "bytes_allocated", L->seg_bytes);
        kj_u64(j, "bytes_used", L->used_bytes);
        if (L->first_lsn) kj_u64(j, "first_lsn", L->first_lsn);
        else kj_null(j, "first_lsn");
        kj_u64(j, "last_lsn", m->rec.last_lsn);
        kj_u64(j, "records", L->records);
        kj_str(j, "end_reason", kd_end_name(L->end_reason));
        kj_str(j, "end_detail", L->end_reason ? L->end_detail : "no log segment to read");
    } else {
        kj_str(j, "error", m->why);
    }
    kj_u64(j, "torn_bytes", m->rec.torn_bytes);
    kj_end_obj(j);
    if (!m->lrc && L->have_ckpt) {
        kj_obj(j, "checkpoint", false);
        kj_u64(j, "lsn", L->ckpt_lsn);
        kj_u64(j, "file_bytes", L->ckpt_file_size);
        kj_u64(j, "raw_bytes", L->ckpt_raw);
        kj_u64(j, "mtime_ns", L->ckpt_mtime_ns);
        kj_end_obj(j);
    } else {
        kj_null(j, "checkpoint");
    }
    if (!m->lrc) json_chain(j, L);
    else kj_null(j, "checkpoint_chain");
}

static void json_recovery(kj *j, const summary *m, int retries) {
    const pkv_recovery *rec = &m->rec;
    kj_obj(j, "recovery", false);
    kj_u64(j, "checkpoint_lsn", rec->checkpoint_lsn);
    kj_u64(j, "checkpoint_deltas", rec->checkpoint_deltas);
    kj_u64(j, "records_replayed", rec->records_replayed);
    kj_u64(j, "bytes_replayed", m->lrc ? 0 : m->L.replay_bytes);
    kj_u64(j, "last_lsn", rec->last_lsn);
    kj_dbl(j, "ms", m->ms);
    kj_dbl(j, "ms_checkpoint", rec->ms_checkpoint);
    kj_dbl(j, "ms_replay", rec->ms_replay);
    kj_dbl(j, "ms_rebuild", rec->ms_rebuild);
    kj_dbl(j, "ms_verify", rec->ms_verify);
    kj_u64(j, "blocks_dropped", rec->blocks_dropped);
    kj_u64(j, "sequences_dropped", rec->sequences_dropped);
    kj_u64(j, "sequences_cut", rec->sequences_cut);
    kj_u64(j, "seq_blocks_bad", rec->seq_blocks_bad);
    if (rec->corrupt_lsn) kj_u64(j, "corrupt_lsn", rec->corrupt_lsn);
    else kj_null(j, "corrupt_lsn");
    kj_bool(j, "repair_needed", rec->repaired != 0);
    kj_str(j, "note", rec->note);
    kj_u64(j, "retries", (uint64_t)retries);
    kj_end_obj(j);
}

static void json_counters(kj *j, const pkv_stats *st) {
    kj_obj(j, "counters", false);
    kj_u64(j, "hit_tokens", st->hit_tokens);
    kj_u64(j, "miss_tokens", st->miss_tokens);
    kj_u64(j, "hit_blocks", st->hit_blocks);
    kj_u64(j, "miss_blocks", st->miss_blocks);
    kj_u64(j, "evictions", st->evictions);
    kj_u64(j, "cow_copies", st->cow_copies);
    kj_u64(j, "dedupes", st->dedupes);
    kj_u64(j, "seals", st->seals);
    kj_end_obj(j);
}

static void summary_json(kd_ctx *x, const summary *m) {
    kj *j = begin_json(x);
    kj_str(j, "model_id", m->h->model_id);
    json_geometry(j, m->h);
    json_place(j, m);
    json_occupancy(j, m);
    json_log(j, m);
    json_recovery(j, m, x->retries);
    json_counters(j, &m->st);
    kj_end_doc(j);
}

/* The text summary's lines from "cache" to "gpu". */
static void print_place(const kd_ctx *x, const summary *m) {
    const kd_hdr *h = m->h;
    const kd_place *pl = &m->pl;
    char b1[32], b2[32], b3[32], t1[64], pm[PKV_MODEL_ID_MAX + 1];
    printf("cache       %s\n", x->dir);
    printf("model       %s\n", kd_printable(h->model_id, pm, sizeof pm));
    printf("geometry    %u layers x %u kv heads x head_dim %u, %s, %u tokens per block\n",
           h->num_layers, h->num_kv_heads, h->head_dim, kd_dtype_name(h->dtype), h->block_size);
    printf("arena       %llu block slots of %s (payload %s), file %s%s, created %s\n",
           (unsigned long long)h->capacity, kd_bytes(b1, sizeof b1, h->slot_bytes),
           kd_bytes(b2, sizeof b2, h->block_bytes), kd_bytes(b3, sizeof b3, h->file_size),
           h->file_size < m->need ? " (SHORT)" : "", kd_time(t1, sizeof t1, h->created_ns));
    if (pl->linked)
        printf("            %s (%s/arena links to it) on %s\n", pl->path, x->dir, pl->fs);
    else
        printf("            %s on %s\n", pl->path, pl->fs);
    if (pl->gpu)
        printf("gpu         last attached by pid %lld at %s: mode %s, device %s%s%s\n", pl->pid,
               kd_time(t1, sizeof t1, (uint64_t)pl->time * 1000000000ull), pl->mode, pl->device,
               strcmp(pl->note, "-") ? "; " : "", strcmp(pl->note, "-") ? pl->note : "");
    else
        printf("gpu         never attached (no cuda.status)\n");
}

static void print_occupancy(const summary *m) {
    const pkv_stats *st = &m->st;
    printf("blocks      %llu free, %llu cached, %llu used (%llu sealed, %llu open",
           (unsigned long long)st->blocks_free, (unsigned long long)st->blocks_cached,
           (unsigned long long)st->blocks_used, (unsigned long long)st->blocks_sealed,
           (unsigned long long)m->n_open);
    if (m->n_unver) printf(", %llu not yet verified", (unsigned long long)m->n_unver);
    if (m->n_bad) printf(", %llu BAD", (unsigned long long)m->n_bad);
    printf(")\n");
    printf("sequences   %llu, %llu committed tokens\n", (unsigned long long)st->sequences,
           (unsigned long long)m->tokens);
}

static void print_log(const summary *m) {
    const kd_log *L = &m->L;
    char b1[32], b2[32];
    if (m->lrc) {
        printf("log         unreadable: %s\n", m->why);
        return;
    }
    printf("log         %zu segment%s (%zu read), %s allocated, %s used; ", L->nsegs,
           L->nsegs == 1 ? "" : "s", m->nread, kd_bytes(b1, sizeof b1, L->seg_bytes),
           kd_bytes(b2, sizeof b2, L->used_bytes));
    if (L->first_lsn)
        printf("LSN %llu..%llu, %llu records\n", (unsigned long long)L->first_lsn,
               (unsigned long long)m->rec.last_lsn, (unsigned long long)L->records);
    else
        printf("no records (last LSN %llu)\n", (unsigned long long)m->rec.last_lsn);
    printf("log end     %s\n", L->end_reason ? L->end_detail : "no log segment to read");
    if (L->nspare || L->nspare_stray || L->nspare_ignored)
        printf("spares      %zu to recycle, %zu stray\n", L->nspare,
               L->nspare_stray + L->nspare_ignored);
    print_chain(L);
}

static void print_recovery(const summary *m) {
    const pkv_recovery *rec = &m->rec;
    char b1[32];
    printf("recovery    replays %llu records (%s) after the checkpoint%s; this read-only "
           "recovery took %.1f ms (checkpoint %.1f, replay %.1f, rebuild %.1f, verify %.1f)\n",
           (unsigned long long)rec->records_replayed,
           kd_bytes(b1, sizeof b1, m->lrc ? 0 : m->L.replay_bytes),
           rec->checkpoint_deltas ? " chain" : "", m->ms, rec->ms_checkpoint, rec->ms_replay,
           rec->ms_rebuild, rec->ms_verify);
    if (rec->note[0]) printf("            note: %s\n", rec->note);
    if (rec->repaired)
        printf("            the next writable open repairs the damage and checkpoints\n");
}

static void print_counters(const summary *m) {
    const pkv_stats *st = &m->st;
    printf("counters    hits %llu tokens / %llu blocks, misses %llu tokens / %llu blocks, "
           "%llu seals, %llu dedupes, %llu copies, %llu evictions (%s)\n",
           (unsigned long long)st->hit_tokens, (unsigned long long)st->hit_blocks,
           (unsigned long long)st->miss_tokens, (unsigned long long)st->miss_blocks,
           (unsigned long long)st->seals, (unsigned long long)st->dedupes,
           (unsigned long long)st->cow_copies, (unsigned long long)st->evictions,
           m->rec.checkpoint_lsn ? "as saved by the checkpoint"
                                 : "saved only by checkpoints: none yet");
}

static int cmd_summary(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, summary_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    summary m;
    summary_gather(x, &s, &m);
    if (x->json) {
        summary_json(x, &m);
    } else {
        print_place(x, &m);
        print_occupancy(&m);
        print_log(&m);
        print_recovery(&m);
        print_counters(&m);
    }
    kd_log_free(&m.L); /* also after a failed scan: it frees what was listed */
    close_state(x, &s);
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

static void json_block_row(kj *j, const kd_state *s, uint32_t b) {
    const pkv_block_info *bk = &s->blk[b];
    kj_obj(j, NULL, true);
    kj_u64(j, "block", b);
    kj_str(j, "state", kd_block_state(bk));
    kj_str(j, "kind", kd_block_kind(bk));
    kj_u64(j, "ref", bk->ref);
    if (bk->state == PKV_BLOCK_SEALED) {
        kj_block(j, "parent", bk->parent);
        kj_u64(j, "children", bk->children);
        kj_u64(j, "depth", s->depth[b]);
        kj_u64(j, "salt", bk->salt);
        json_hash(j, bk);
    }
    kj_u64(j, "tokens", s->ntok[b]);
    json_flags(j, bk->flags);
    kj_end_obj(j);
}

static void print_block_row(kd_ctx *x, const kd_state *s, uint32_t b, uint32_t *tok) {
    const pkv_block_info *bk = &s->blk[b];
    char par[16] = "-", ch[16] = "-", dep[16] = "-", salt[24] = "-";
    if (bk->state == PKV_BLOCK_SEALED) {
        if (bk->parent != PKV_NO_BLOCK) snprintf(par, sizeof par, "%u", bk->parent);
        snprintf(ch, sizeof ch, "%u", bk->children);
        snprintf(dep, sizeof dep, "%u", s->depth[b]);
        snprintf(salt, sizeof salt, "%llu", (unsigned long long)bk->salt);
    }
    const char *fl = flags_str(bk->flags);
    printf("%-8u %-6s %-6s %4u %8s %8s %5s %6s %6u %-10s", b, kd_block_state(bk),
           kd_block_kind(bk), bk->ref, par, ch, dep, salt, s->ntok[b], fl[0] ? fl : "-");
    uint32_t nt = s->ntok[b];
    if (nt && block_tokens(x, s, b, tok)) {
        printf(" [");
        for (uint32_t i = 0; i < nt && i < 4; i++) printf(i ? " %u" : "%u", tok[i]);
        printf(nt > 4 ? " ...]" : "]");
    }
    putchar('\n');
}

/* Whether block b is listed under --state (NULL: every block not free). */
static bool blocks_match(const pkv_block_info *bk, const char *state) {
    const char *st = kd_block_state(bk);
    return state ? !strcmp(state, "all") || !strcmp(state, st) : strcmp(st, "free") != 0;
}

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
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    kj *j = &x->j;
    uint32_t tok[PKV_BLOCK_SIZE_MAX];
    if (x->json) {
        j = begin_json(x);
        kj_str(j, "state", state ? state : "not_free");
        kj_arr(j, "blocks", false);
    } else {
        printf("%-8s %-6s %-6s %4s %8s %8s %5s %6s %6s %-10s %s\n", "block", "state", "kind",
               "ref", "parent", "children", "depth", "salt", "tokens", "flags", "first tokens");
    }
    uint64_t matched = 0, shown = 0;
    for (uint32_t b = 0; b < s.cap; b++) {
        if (!blocks_match(&s.blk[b], state)) continue;
        matched++;
        if (shown >= limit) continue;
        shown++;
        if (x->json) json_block_row(j, &s, b);
        else print_block_row(x, &s, b, tok);
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
                           (unsigned long long)(s.cap - matched));
        putchar('\n');
    }
    close_state(x, &s);
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

/* Everything `kvdump block` prints about block b, gathered first. */
typedef struct blockv {
    uint32_t b;
    const pkv_block_info *bk;
    bool sealed, mapped; /* mapped: the slot is in the arena file */
    pkv_block_check chk; /* sealed blocks */
    uint32_t *kids, nkids;
    uint32_t tok[PKV_BLOCK_SIZE_MAX];
    bool have_tok;
    uint32_t ntok;       /* tokens the payload statistics cover */
    kvstat *ps;          /* --payload: [layer][K|V], or NULL */
} blockv;

/* Per-layer statistics of the K and V of v->ntok tokens of the block's slot. */
static kvstat *payload_stats(kd_ctx *x, const kd_state *s, const blockv *v) {
    const pkv_cache_info *g = &s->inf;
    kvstat *ps = calloc(2ull * g->num_layers, sizeof *ps);
    for (uint32_t l = 0; ps && l < g->num_layers; l++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t hh = 0; hh < g->num_kv_heads; hh++) {
                const uint8_t *run = pkv_kv(x->c, v->b, l, (pkv_kind)k, hh);
                for (uint64_t e = 0; run && e < (uint64_t)v->ntok * g->head_dim; e++)
                    kvstat_add(&ps[2 * l + k], kd_elem(run + e * g->elem_size, g->dtype));
            }
    return ps;
}

static void block_gather(kd_ctx *x, const kd_state *s, uint32_t b, bool payload, blockv *v) {
    v->b = b;
    v->bk = &s->blk[b];
    v->sealed = v->bk->state == PKV_BLOCK_SEALED;
    v->mapped = b < s->arena.valid_blocks;
    memset(&v->chk, 0, sizeof v->chk);
    if (v->sealed) pkv_inspect_check_block(x->c, b, &v->chk);
    v->nkids = 0;
    v->kids = malloc(((size_t)v->bk->children + 1) * sizeof *v->kids);
    for (uint32_t k = 0; k < s->cap && v->kids; k++)
        if (s->blk[k].state == PKV_BLOCK_SEALED && s->blk[k].parent == b &&
            v->nkids < v->bk->children)
            v->kids[v->nkids++] = k;
    v->have_tok = block_tokens(x, s, b, v->tok);
    v->ntok = v->bk->state == PKV_BLOCK_FREE ? s->inf.block_size : s->ntok[b];
    v->ps = payload && v->mapped ? payload_stats(x, s, v) : NULL;
}

/* The (sequence, entry) pairs whose table names block b, by sequence id. */
#define FOR_HOLDERS(s, b, q, k)                                                   \
    for (size_t i_ = 0; i_ < (s)->nseq; i_++)                                     \
        for (const kd_seqv *q = &(s)->seq[i_]; q; q = NULL)                       \
            for (uint64_t k = 0; k < q->inf.n_blocks; k++)                        \
                if (q->blocks[k] == (b))

static void json_block_payload(kj *j, const kd_state *s, const blockv *v) {
    if (!v->ps) {
        kj_null(j, "payload");
        return;
    }
    kj_obj(j, "payload", false);
    kj_u64(j, "tokens", v->ntok);
    kj_arr(j, "layers", false);
    for (uint32_t l = 0; l < s->inf.num_layers; l++) {
        kj_obj(j, NULL, true);
        kj_u64(j, "layer", l);
        json_kvstat(j, "k", &v->ps[2 * l]);
        json_kvstat(j, "v", &v->ps[2 * l + 1]);
        kj_end_obj(j);
    }
    kj_end_arr(j);
    kj_end_obj(j);
}

static void json_block_sealed(kj *j, const kd_state *s, const blockv *v) {
    const pkv_block_info *bk = v->bk;
    kj_block(j, "parent", bk->parent);
    kj_arr(j, "children", true);
    for (uint32_t k = 0; k < v->nkids; k++) kj_u64(j, NULL, v->kids[k]);
    kj_end_arr(j);
    kj_u64(j, "depth", s->depth[v->b]);
    kj_u64(j, "salt", bk->salt);
    json_hash(j, bk);
    kj_hex64(j, "payload_sum", bk->payload_sum);
    if (v->mapped) kj_hex64(j, "payload_sum_actual", v->chk.payload_sum_actual);
    else kj_null(j, "payload_sum_actual");
    kj_bool(j, "payload_ok", v->chk.payload_ok);
    json_flags(j, bk->flags);
}

static void block_json(kd_ctx *x, const kd_state *s, const blockv *v, bool payload) {
    const pkv_block_info *bk = v->bk;
    kj *j = begin_json(x);
    kj_u64(j, "block", v->b);
    kj_str(j, "state", kd_block_state(bk));
    kj_str(j, "kind", kd_block_kind(bk));
    kj_u64(j, "ref", bk->ref);
    kj_bool(j, "in_arena_file", v->mapped);
    if (v->sealed) json_block_sealed(j, s, v);
    kj_arr(j, "tokens", true);
    if (bk->state != PKV_BLOCK_FREE && v->have_tok)
        for (uint32_t i = 0; i < s->ntok[v->b]; i++) kj_u64(j, NULL, v->tok[i]);
    kj_end_arr(j);
    kj_arr(j, "sequences", false);
    FOR_HOLDERS(s, v->b, q, k) {
        kj_obj(j, NULL, true);
        kj_u64(j, "seq", q->id);
        kj_u64(j, "entry", k);
        kj_end_obj(j);
    }
    kj_end_arr(j);
    if (payload) json_block_payload(j, s, v);
    kj_end_doc(j);
}

static void print_block_sealed(const kd_state *s, const blockv *v) {
    const pkv_block_info *bk = v->bk;
    const uint32_t d = s->depth[v->b], bs = s->inf.block_size;
    if (bk->parent == PKV_NO_BLOCK) printf("  parent     none (first block of a chain)\n");
    else printf("  parent     %u\n", bk->parent);
    printf("  children  ");
    for (uint32_t k = 0; k < v->nkids && k < 32; k++) printf(" %u", v->kids[k]);
    if (v->nkids > 32) printf(" ... (%u in all)", v->nkids);
    printf(v->nkids ? "\n" : " none\n");
    printf("  depth      %u (tokens %llu..%llu of its chain)\n", d,
           (unsigned long long)(d ? (uint64_t)(d - 1) * bs : 0),
           (unsigned long long)((uint64_t)d * bs - 1));
    printf("  salt       %llu\n", (unsigned long long)bk->salt);
    printf("  hash       %016llx%016llx\n", (unsigned long long)bk->hash_hi,
           (unsigned long long)bk->hash_lo);
    printf("  checksum   sealed %016llx, payload %016llx: %s\n",
           (unsigned long long)bk->payload_sum, (unsigned long long)v->chk.payload_sum_actual,
           !v->mapped ? "slot not in the file" : v->chk.payload_ok ? "ok" : "MISMATCH");
    if (bk->flags) printf("  flags      %s\n", flags_str(bk->flags));
}

static void print_block_payload(const kd_state *s, const blockv *v) {
    printf("payload over %u token%s%s:\n", v->ntok, v->ntok == 1 ? "" : "s",
           v->bk->state == PKV_BLOCK_FREE ? " (a free slot: stale contents)" : "");
    printf("  %5s %4s %14s %14s %14s %8s %8s\n", "layer", "kind", "min", "max", "mean", "nan",
           "inf");
    for (uint32_t l = 0; l < s->inf.num_layers; l++)
        for (uint32_t k = 0; k < 2; k++) {
            const kvstat *t = &v->ps[2 * l + k];
            if (t->n)
                printf("  %5u %4s %14.6g %14.6g %14.6g %8llu %8llu\n", l, k ? "V" : "K", t->min,
                       t->max, t->sum / (double)t->n, (unsigned long long)t->nan,
                       (unsigned long long)t->inf);
            else
                printf("  %5u %4s %14s %14s %14s %8llu %8llu\n", l, k ? "V" : "K", "-", "-",
                       "-", (unsigned long long)t->nan, (unsigned long long)t->inf);
        }
}

static void block_text(const kd_state *s, const blockv *v, bool payload) {
    const pkv_block_info *bk = v->bk;
    printf("block %u\n", v->b);
    if (bk->state == PKV_BLOCK_FREE)
        printf("  state      free (its slot holds no K/V anyone refers to)\n");
    else
        printf("  state      %s (%s), refcount %u\n", kd_block_state(bk), kd_block_kind(bk),
               bk->ref);
    if (!v->mapped) printf("  arena      slot lies beyond the end of the (short) arena file\n");
    if (v->sealed)
        print_block_sealed(s, v);
    else if (bk->state == PKV_BLOCK_OPEN)
        printf("  tokens     %u of %u committed (open blocks carry no checksum)\n",
               s->ntok[v->b], s->inf.block_size);
    printf("  sequences ");
    size_t nh = 0;
    FOR_HOLDERS(s, v->b, q, k)
        printf("%s%llu (entry %llu)", nh++ ? ", " : " ", (unsigned long long)q->id,
               (unsigned long long)k);
    printf(nh ? "\n" : " none\n");
    if (bk->state != PKV_BLOCK_FREE && s->ntok[v->b] && v->have_tok) {
        printf("  token ids\n");
        print_tokens_wrapped(v->tok, s->ntok[v->b], "    ");
    }
    if (payload && v->ps) print_block_payload(s, v);
    else if (payload) printf("payload: not available (the slot is not in the arena file)\n");
}

static int cmd_block(kd_ctx *x, int argc, char **argv) {
    const char *pos[2];
    kd_opt opts[] = {{"--payload", false, NULL}, {NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 2, block_usage, "DIR and a block ID");
    if (rc) return rc < 0 ? KD_OK : rc;
    uint64_t id;
    if (!kd_parse_u64(pos[1], &id)) return kd_fail(x, KD_USAGE, "'%s' is not a block id", pos[1]);
    bool payload = kd_optval(opts, "--payload") != NULL;
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    if (id >= s.cap) {
        uint32_t cap = s.cap;
        close_state(x, &s);
        return kd_fail(x, KD_USAGE, "block %llu is out of range (capacity %u)",
                       (unsigned long long)id, cap);
    }
    blockv *v = malloc(sizeof *v);
    if (!v) {
        close_state(x, &s);
        return kd_fail(x, KD_FAILED, "out of memory");
    }
    block_gather(x, &s, (uint32_t)id, payload, v);
    if (x->json) block_json(x, &s, v, payload);
    else block_text(&s, v, payload);
    free(v->ps);
    free(v->kids);
    free(v);
    close_state(x, &s);
    return out_status(x, KD_OK);
}

/* ---- seqs / seq ---------------------------------------------------------------------- */

static const char seqs_usage[] =
    "usage: kvdump seqs DIR [--json]\n"
    "\n"
    "One line per open sequence, by id: salt, length, committed tokens, block-table\n"
    "entries, sealed entries and entries shared with other sequences. A recovered\n"
    "sequence holds only committed tokens (pending tokens are never logged).\n";

static void seqs_row(kd_ctx *x, const kd_state *s, const kd_seqv *q) {
    uint64_t sealed = 0, shared = 0;
    for (uint64_t k = 0; k < q->inf.n_blocks; k++) {
        const pkv_block_info *bk = &s->blk[q->blocks[k]];
        sealed += bk->state == PKV_BLOCK_SEALED;
        shared += bk->ref > 1;
    }
    if (x->json) {
        kj *j = &x->j;
        kj_obj(j, NULL, true);
        kj_u64(j, "id", q->id);
        kj_u64(j, "salt", q->inf.salt);
        kj_u64(j, "len", q->inf.len);
        kj_u64(j, "committed", q->inf.committed);
        kj_u64(j, "blocks", q->inf.n_blocks);
        kj_u64(j, "sealed_blocks", sealed);
        kj_u64(j, "shared_blocks", shared);
        kj_end_obj(j);
    } else {
        printf("%-20llu %-20llu %10llu %10llu %8llu %8llu %8llu\n", (unsigned long long)q->id,
               (unsigned long long)q->inf.salt, (unsigned long long)q->inf.len,
               (unsigned long long)q->inf.committed, (unsigned long long)q->inf.n_blocks,
               (unsigned long long)sealed, (unsigned long long)shared);
    }
}

static int cmd_seqs(kd_ctx *x, int argc, char **argv) {
    const char *pos[1];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 1, seqs_usage, "DIR");
    if (rc) return rc < 0 ? KD_OK : rc;
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    if (x->json) {
        kj_arr(begin_json(x), "sequences", false);
    } else {
        printf("%-20s %-20s %10s %10s %8s %8s %8s\n", "seq", "salt", "len", "committed", "blocks",
               "sealed", "shared");
    }
    for (size_t i = 0; i < s.nseq; i++) seqs_row(x, &s, &s.seq[i]);
    if (x->json) {
        kj_end_arr(&x->j);
        kj_u64(&x->j, "count", s.nseq);
        kj_end_doc(&x->j);
    } else {
        printf("%zu sequence%s\n", s.nseq, s.nseq == 1 ? "" : "s");
    }
    close_state(x, &s);
    return out_status(x, KD_OK);
}

static const char seq_usage[] =
    "usage: kvdump seq DIR ID [--json]\n"
    "\n"
    "One sequence: salt, length, committed tokens, its block table (per entry: the\n"
    "block, its kind, refcount and token range) and its token ids.\n";

/* Tokens [*from, *to) of the sequence that table entry k covers. */
static void entry_range(const kd_state *s, const kd_seqv *q, uint64_t k, uint64_t *from,
                        uint64_t *to) {
    const uint32_t bs = s->inf.block_size;
    *from = k * bs;
    *to = *from + bs;
    if (*to > q->inf.len) *to = q->inf.len;
}

static void seq_json(kd_ctx *x, const kd_state *s, const kd_seqv *q, const uint32_t *tok,
                     size_t ntok) {
    kj *j = begin_json(x);
    kj_u64(j, "id", q->id);
    kj_u64(j, "salt", q->inf.salt);
    kj_u64(j, "len", q->inf.len);
    kj_u64(j, "committed", q->inf.committed);
    kj_arr(j, "table", false);
    for (uint64_t k = 0; k < q->inf.n_blocks; k++) {
        const pkv_block_info *bk = &s->blk[q->blocks[k]];
        uint64_t from, to;
        entry_range(s, q, k, &from, &to);
        kj_obj(j, NULL, true);
        kj_u64(j, "entry", k);
        kj_u64(j, "block", q->blocks[k]);
        kj_str(j, "kind", bk->state == PKV_BLOCK_SEALED ? "sealed" : "open");
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
}

static void seq_text(const kd_state *s, const kd_seqv *q, const uint32_t *tok, size_t ntok) {
    printf("sequence %llu\n", (unsigned long long)q->id);
    printf("  salt       %llu\n", (unsigned long long)q->inf.salt);
    printf("  length     %llu tokens, %llu committed\n", (unsigned long long)q->inf.len,
           (unsigned long long)q->inf.committed);
    printf("  table      %llu entries\n", (unsigned long long)q->inf.n_blocks);
    printf("    %6s %10s %-6s %5s  %s\n", "entry", "block", "kind", "ref", "tokens");
    for (uint64_t k = 0; k < q->inf.n_blocks; k++) {
        const pkv_block_info *bk = &s->blk[q->blocks[k]];
        uint64_t from, to;
        entry_range(s, q, k, &from, &to);
        printf("    %6llu %10u %-6s %5u  %llu..%llu%s\n", (unsigned long long)k, q->blocks[k],
               bk->state == PKV_BLOCK_SEALED ? "sealed" : "open", bk->ref,
               (unsigned long long)from, (unsigned long long)(to - 1),
               bk->ref > 1 ? " (shared)" : "");
    }
    printf("  token ids\n");
    print_tokens_wrapped(tok, ntok, "    ");
}

static int cmd_seq(kd_ctx *x, int argc, char **argv) {
    const char *pos[2];
    kd_opt opts[] = {{NULL, false, NULL}};
    int rc = parse_simple(x, argc, argv, opts, pos, 2, seq_usage, "DIR and a sequence ID");
    if (rc) return rc < 0 ? KD_OK : rc;
    uint64_t id;
    if (!kd_parse_u64(pos[1], &id)) return kd_fail(x, KD_USAGE, "'%s' is not a sequence id", pos[1]);
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    const kd_seqv *q = kd_state_seq(&s, id);
    if (!q) {
        close_state(x, &s);
        return kd_fail(x, KD_USAGE, "no sequence %llu in %s", (unsigned long long)id, x->dir);
    }
    uint64_t len = q->inf.len;
    uint32_t *tok = len < (1ull << 32) ? malloc((len ? len : 1) * sizeof *tok) : NULL;
    size_t ntok = 0;
    if (!tok || pkv_seq_tokens(x->c, id, tok, len, &ntok)) ntok = 0;
    if (x->json) seq_json(x, &s, q, tok, ntok);
    else seq_text(&s, q, tok, ntok);
    free(tok);
    close_state(x, &s);
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
    const kd_state *s;
    uint32_t *kid_off, *kids; /* CSR children of sealed blocks */
    uint32_t *depth;          /* kd_state.depth */
    uint32_t *subtree;
    uint32_t *seg_end;        /* head -> end of its segment (PKV_NO_BLOCK: not a head) */
    uint8_t *visible;         /* per head: drawn (--top) */
    uint32_t *order;          /* sealed blocks of intact chains, breadth-first */
    uint32_t *ends;           /* segment ends, most shared first */
    uint32_t *roots;
    uint32_t *stk;            /* scratch */
    size_t norder, nends, nroots, ntop;
} ptree;

static uint32_t pt_users(const ptree *t, uint32_t b) { return t->s->blk[b].ref; }
static uint32_t pt_parent(const ptree *t, uint32_t b) { return t->s->blk[b].parent; }
static uint32_t pt_fanout(const ptree *t, uint32_t b) { return t->kid_off[b + 1] - t->kid_off[b]; }

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
    if (t->s->blk[x].salt != t->s->blk[y].salt) return t->s->blk[x].salt < t->s->blk[y].salt ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void ptree_free(ptree *t) {
    free(t->kid_off);
    free(t->kids);
    free(t->subtree);
    free(t->seg_end);
    free(t->visible);
    free(t->order);
    free(t->ends);
    free(t->roots);
    free(t->stk);
}

/* false: out of memory. */
static bool ptree_alloc(ptree *t, const kd_state *s) {
    const size_t cap = s->cap, ns = s->sealed;
    memset(t, 0, sizeof *t);
    t->s = s;
    t->depth = s->depth;
    t->kid_off = calloc(cap + 2, sizeof *t->kid_off);
    t->kids = malloc((ns + 1) * sizeof *t->kids);
    t->subtree = calloc(cap + 1, sizeof *t->subtree);
    t->seg_end = malloc((cap + 1) * sizeof *t->seg_end);
    t->visible = calloc(cap + 1, 1);
    t->order = malloc((ns + 1) * sizeof *t->order);
    t->ends = malloc((ns + 1) * sizeof *t->ends);
    t->roots = malloc((ns + 1) * sizeof *t->roots);
    t->stk = malloc((ns + 1) * sizeof *t->stk);
    return t->kid_off && t->kids && t->subtree && t->seg_end && t->visible && t->order &&
           t->ends && t->roots && t->stk;
}

/* Children lists (CSR) of the sealed blocks whose chain is intact (depth > 0),
 * and the roots. */
static void ptree_children(ptree *t) {
    const kd_state *s = t->s;
    for (uint32_t b = 0; b < s->cap; b++) {
        const pkv_block_info *bk = &s->blk[b];
        if (bk->state == PKV_BLOCK_SEALED && t->depth[b] && bk->parent != PKV_NO_BLOCK)
            t->kid_off[bk->parent + 1]++;
    }
    for (uint32_t b = 0; b < s->cap; b++) t->kid_off[b + 1] += t->kid_off[b];
    uint32_t *fill = t->subtree; /* reused as a cursor, reset below */
    for (uint32_t b = 0; b < s->cap; b++) {
        const pkv_block_info *bk = &s->blk[b];
        if (bk->state != PKV_BLOCK_SEALED || !t->depth[b]) continue;
        if (bk->parent == PKV_NO_BLOCK) t->roots[t->nroots++] = b;
        else t->kids[t->kid_off[bk->parent] + fill[bk->parent]++] = b;
    }
    memset(t->subtree, 0, ((size_t)s->cap + 1) * sizeof *t->subtree);
}

/* Breadth-first order from the roots; subtree sizes in reverse. */
static void ptree_order(ptree *t) {
    for (size_t i = 0; i < t->nroots; i++) t->order[t->norder++] = t->roots[i];
    for (size_t i = 0; i < t->norder; i++)
        for (uint32_t k = t->kid_off[t->order[i]]; k < t->kid_off[t->order[i] + 1]; k++)
            t->order[t->norder++] = t->kids[k];
    for (size_t i = t->norder; i-- > 0;) {
        uint32_t b = t->order[i];
        t->subtree[b] += 1;
        if (pt_parent(t, b) != PKV_NO_BLOCK) t->subtree[pt_parent(t, b)] += t->subtree[b];
    }
}

/* Segments: a head is a root, or a block whose parent has fan-out != 1 or a
 * different number of users; its segment runs down while neither changes. */
static void ptree_segments(ptree *t) {
    for (uint32_t b = 0; b < t->s->cap; b++) t->seg_end[b] = PKV_NO_BLOCK;
    for (size_t i = 0; i < t->norder; i++) {
        uint32_t b = t->order[i], par = pt_parent(t, b);
        bool head = par == PKV_NO_BLOCK || pt_fanout(t, par) != 1 ||
                    pt_users(t, par) != pt_users(t, b);
        if (!head) continue;
        uint32_t e = b;
        while (pt_fanout(t, e) == 1 && pt_users(t, t->kids[t->kid_off[e]]) == pt_users(t, e))
            e = t->kids[t->kid_off[e]];
        t->seg_end[b] = e;
        t->ends[t->nends++] = e;
    }
}

/* Rank the segment ends and mark the heads to draw: every head on the path to
 * one of the top prefixes (limited), or all. */
static void ptree_rank(ptree *t, uint64_t top, bool limited) {
    qsort(t->ends, t->nends, sizeof *t->ends, cmp_rank);
    t->ntop = t->nends < top ? t->nends : (size_t)top;
    if (!limited) {
        for (uint32_t b = 0; b < t->s->cap; b++) t->visible[b] = t->seg_end[b] != PKV_NO_BLOCK;
        return;
    }
    for (size_t i = 0; i < t->ntop; i++) /* a visible head's ancestors are marked already */
        for (uint32_t b = t->ends[i]; b != PKV_NO_BLOCK; b = pt_parent(t, b)) {
            if (t->seg_end[b] == PKV_NO_BLOCK) continue;
            if (t->visible[b]) break;
            t->visible[b] = 1;
        }
}

static void json_top(kj *j, const ptree *t) {
    const uint32_t bs = t->s->inf.block_size;
    kj_arr(j, "top", false);
    for (size_t i = 0; i < t->ntop; i++) {
        uint32_t e = t->ends[i];
        kj_obj(j, NULL, true);
        kj_u64(j, "rank", i + 1);
        kj_u64(j, "block", e);
        kj_u64(j, "salt", t->s->blk[e].salt);
        kj_u64(j, "depth", t->depth[e]);
        kj_u64(j, "tokens", (uint64_t)t->depth[e] * bs);
        kj_u64(j, "users", pt_users(t, e));
        kj_u64(j, "fanout", pt_fanout(t, e));
        kj_u64(j, "subtree_blocks", t->subtree[e]);
        uint32_t n = 0; /* the path root..e */
        for (uint32_t b = e; b != PKV_NO_BLOCK && n <= t->depth[e]; b = pt_parent(t, b))
            t->stk[n++] = b;
        kj_arr(j, "path", true);
        while (n) kj_u64(j, NULL, t->stk[--n]);
        kj_end_arr(j);
        kj_end_obj(j);
    }
    kj_end_arr(j);
}

static void json_segments(kj *j, const ptree *t) {
    kj_arr(j, "segments", false);
    for (size_t i = 0; i < t->norder; i++) {
        uint32_t h = t->order[i];
        if (t->seg_end[h] == PKV_NO_BLOCK || !t->visible[h]) continue;
        uint32_t e = t->seg_end[h];
        kj_obj(j, NULL, true);
        kj_u64(j, "head", h);
        kj_u64(j, "end", e);
        kj_u64(j, "salt", t->s->blk[h].salt);
        kj_block(j, "parent", pt_parent(t, h));
        kj_arr(j, "blocks", true);
        for (uint32_t b = h;; b = t->kids[t->kid_off[b]]) {
            kj_u64(j, NULL, b);
            if (b == e) break;
        }
        kj_end_arr(j);
        kj_u64(j, "depth_from", t->depth[h]);
        kj_u64(j, "depth_to", t->depth[e]);
        kj_u64(j, "users", pt_users(t, e));
        kj_u64(j, "fanout", pt_fanout(t, e));
        kj_u64(j, "subtree_blocks", t->subtree[h]);
        kj_end_obj(j);
    }
    kj_end_arr(j);
}

static void prefixes_json(kd_ctx *x, const ptree *t) {
    kj *j = begin_json(x);
    kj_u64(j, "block_size", t->s->inf.block_size);
    kj_u64(j, "sealed_blocks", t->norder);
    kj_u64(j, "trees", t->nroots);
    kj_u64(j, "sequences", t->s->nseq);
    json_top(j, t);
    json_segments(j, t);
    kj_end_doc(j);
}

/* The table of the most shared prefixes. false: out of memory. */
static bool print_top(kd_ctx *x, const ptree *t) {
    const kd_state *s = t->s;
    const uint32_t bs = s->inf.block_size;
    uint32_t *rootof = malloc(((size_t)s->cap + 1) * sizeof *rootof);
    if (!rootof) return false;
    printf("\nmost shared prefixes:\n");
    printf("  %4s %6s %6s %8s %7s %8s %10s %8s  %s\n", "rank", "users", "depth", "tokens",
           "fan-out", "subtree", "last block", "salt", "first tokens");
    /* The root of every block, parents first (order is breadth-first from the
     * roots), instead of a walk to the root per listed prefix. */
    for (size_t i = 0; i < t->norder; i++) {
        uint32_t b = t->order[i], par = pt_parent(t, b);
        rootof[b] = par == PKV_NO_BLOCK ? b : rootof[par];
    }
    uint32_t tk[PKV_BLOCK_SIZE_MAX];
    for (size_t i = 0; i < t->ntop; i++) {
        uint32_t e = t->ends[i];
        bool have = block_tokens(x, s, rootof[e], tk);
        printf("  %4zu %6u %6u %8llu %7u %8u %10u %8llu  [", i + 1, pt_users(t, e), t->depth[e],
               (unsigned long long)((uint64_t)t->depth[e] * bs), pt_fanout(t, e), t->subtree[e],
               e, (unsigned long long)s->blk[e].salt);
        for (uint32_t k = 0; have && k < bs && k < 6; k++) printf(k ? " %u" : "%u", tk[k]);
        printf(bs > 6 ? " ...]\n" : "]\n");
    }
    free(rootof);
    return true;
}

/* The tree's ruler for a line at `level` (indent holds 4 characters per level):
 * past RULER_LEVELS, "[level L] " and the ruler of the deepest RULER_LEVELS
 * levels only, so a deep tree prints O(lines), not O(lines x depth). */
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
    const uint32_t bs = t->s->inf.block_size;
    uint32_t end = t->seg_end[head];
    uint32_t n = t->depth[end] - t->depth[head] + 1;
    put_ruler(indent, level);
    fputs(branch, stdout);
    if (n == 1) printf("b%u", head);
    else printf("b%u..b%u", head, end);
    printf("  %u block%s, depth %u", n, n == 1 ? "" : "s", t->depth[end]);
    printf(", tokens %llu..%llu", (unsigned long long)((uint64_t)(t->depth[head] - 1) * bs),
           (unsigned long long)((uint64_t)t->depth[end] * bs - 1));
    printf(", used by %u seq%s, fan-out %u, subtree %u\n", pt_users(t, end),
           pt_users(t, end) == 1 ? "" : "s", pt_fanout(t, end), t->subtree[head]);
}

/* The drawing's state: an explicit stack of heads to draw, with their levels
 * and whether each is the last of its siblings, and the ruler so far. */
typedef struct pdraw {
    const ptree *t;
    uint32_t *stk, *lvl, *tmp;
    uint8_t *last;
    size_t sp;
    char *indent;
    size_t depth_cap;  /* levels indent has room for */
} pdraw;

/* Room in the ruler for `levels` levels; false: out of memory. */
static bool pdraw_room(pdraw *d, size_t levels) {
    if (levels <= d->depth_cap) return true;
    size_t nc = d->depth_cap * 2;
    while (nc < levels) nc *= 2;
    char *ni = realloc(d->indent, nc * 4 + 1);
    if (!ni) return false;
    d->indent = ni;
    d->depth_cap = nc;
    return true;
}

/* Draw head h at level L, then push its visible children (a line for the
 * hidden ones), the first sibling on top. */
static void pdraw_head(pdraw *d, uint32_t h, uint32_t L, bool isl) {
    const ptree *t = d->t;
    d->indent[(size_t)L * 4] = '\0';
    print_seg_line(t, h, d->indent, L, isl ? "`-- " : "|-- ");
    memcpy(d->indent + (size_t)L * 4, isl ? "    " : "|   ", 4);
    d->indent[(size_t)L * 4 + 4] = '\0';
    uint32_t e = t->seg_end[h];
    size_t nk = 0, hidden = 0, hidden_blocks = 0;
    for (uint32_t k = t->kid_off[e]; k < t->kid_off[e + 1]; k++) {
        uint32_t kid = t->kids[k];
        if (t->visible[kid]) {
            d->tmp[nk++] = kid;
        } else {
            hidden++;
            hidden_blocks += t->subtree[kid];
        }
    }
    qsort(d->tmp, nk, sizeof *d->tmp, cmp_sib);
    if (hidden) {
        put_ruler(d->indent, L + 1);
        printf("%s... %zu more branch%s (%zu block%s)\n", nk ? "|-- " : "`-- ", hidden,
               hidden == 1 ? "" : "es", hidden_blocks, hidden_blocks == 1 ? "" : "s");
    }
    for (size_t k = nk; k-- > 0;) {
        d->stk[d->sp] = d->tmp[k];
        d->lvl[d->sp] = L + 1;
        d->last[d->sp] = k + 1 == nk;
        d->sp++;
    }
}

/* The tree below one root (an iterative depth-first walk). */
static void pdraw_root(pdraw *d, uint32_t root, bool lastroot) {
    d->sp = 0;
    d->stk[d->sp] = root;
    d->lvl[d->sp] = 0;
    d->last[d->sp] = lastroot;
    d->sp++;
    while (d->sp) {
        d->sp--;
        uint32_t h = d->stk[d->sp], L = d->lvl[d->sp];
        if (!pdraw_room(d, (size_t)L + 1)) break;
        pdraw_head(d, h, L, d->last[d->sp]);
    }
}

/* The prefix tree: roots by salt, then as siblings. false: out of memory. */
static bool print_tree(const ptree *t, uint32_t *heads) {
    const size_t ns = t->s->sealed + 1;
    size_t nheads = 0;
    for (size_t i = 0; i < t->nroots; i++)
        if (t->visible[t->roots[i]]) heads[nheads++] = t->roots[i];
    qsort(heads, nheads, sizeof *heads, cmp_sib);
    pdraw d = {t, t->stk, malloc(ns * sizeof *d.lvl), malloc(ns * sizeof *d.tmp), malloc(ns),
               0, malloc(64 * 4 + 1), 64};
    bool ok = d.lvl && d.tmp && d.last && d.indent;
    uint64_t cur_salt = 0;
    bool have_salt = false;
    for (size_t r = 0; ok && r < nheads; r++) {
        uint64_t salt = t->s->blk[heads[r]].salt;
        if (!have_salt || salt != cur_salt) {
            printf("salt %llu\n", (unsigned long long)salt);
            cur_salt = salt;
            have_salt = true;
        }
        pdraw_root(&d, heads[r], r + 1 == nheads || t->s->blk[heads[r + 1]].salt != salt);
    }
    free(d.lvl);
    free(d.tmp);
    free(d.last);
    free(d.indent);
    return ok;
}

static int prefixes_text(kd_ctx *x, const ptree *t, bool limited) {
    size_t nseq = t->s->nseq;
    printf("%zu sealed block%s in %zu tree%s, %zu sequence%s, %u tokens per block\n", t->norder,
           t->norder == 1 ? "" : "s", t->nroots, t->nroots == 1 ? "" : "s", nseq,
           nseq == 1 ? "" : "s", t->s->inf.block_size);
    if (!t->norder) return 0;
    if (!print_top(x, t)) return kd_fail(x, KD_FAILED, "out of memory");
    printf("\nprefix tree%s:\n", limited ? " (branches leading to the prefixes above)" : "");
    uint32_t *heads = malloc((t->s->sealed + 1) * sizeof *heads);
    bool ok = heads && print_tree(t, heads);
    free(heads);
    return ok ? 0 : kd_fail(x, KD_FAILED, "out of memory");
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
    kd_state s;
    if ((rc = open_state(x, &s))) return rc;
    ptree t;
    if (!ptree_alloc(&t, &s)) {
        rc = kd_fail(x, KD_FAILED, "out of memory");
    } else {
        g_rank_tree = &t;
        ptree_children(&t);
        ptree_order(&t);
        ptree_segments(&t);
        ptree_rank(&t, top, limited);
        if (x->json) prefixes_json(x, &t);
        else rc = prefixes_text(x, &t, limited);
    }
    ptree_free(&t);
    close_state(x, &s);
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
    kd_state s;
    if (kd_state_load(c, &s)) return NULL;
    const uint32_t cap = s.cap;
    uint32_t *at = malloc((cap ? cap : 1) * sizeof *at);
    holders *h = calloc(nsus ? nsus : 1, sizeof *h);
    if (!at || !h) {
        kd_state_free(&s);
        free(at);
        free(h);
        return NULL;
    }
    memset(at, 0xff, (size_t)cap * sizeof *at); /* UINT32_MAX: not a suspect */
    for (size_t i = 0; i < nsus; i++)
        if (sus[i].block < cap) at[sus[i].block] = (uint32_t)i;
    for (size_t q = 0; q < s.nseq; q++) {
        const kd_seqv *sq = &s.seq[q];
        for (uint64_t e = 0; e < sq->inf.n_blocks; e++) {
            uint32_t b = sq->blocks[e];
            if (b >= cap || at[b] == UINT32_MAX) continue;
            holders *x = &h[at[b]];
            if (x->n < HOLDERS_SHOWN) x->id[x->n] = sq->id;
            x->n++;
        }
    }
    kd_state_free(&s);
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

/* What the recovery of a snapshot reports: drops, cuts, notes. */
static void verify_recovery(kd_ctx *x, vlist *prob, vlist *notes, vcount *k) {
    pkv_recovery rec;
    pkv_get_recovery(x->c, &rec);
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
}

/* Add a suspect to *sus; false: out of memory. */
static bool add_suspect(suspect **sus, size_t *nsus, size_t *cap, suspect v) {
    if (*nsus == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        suspect *ns = realloc(*sus, nc * sizeof *ns);
        if (!ns) return false;
        *sus = ns;
        *cap = nc;
    }
    (*sus)[(*nsus)++] = v;
    return true;
}

/* One sealed block's chain hash and payload checksum; a payload mismatch becomes
 * a suspect. false: out of memory. */
static bool verify_block(kd_ctx *x, uint32_t b, const pkv_block_info *bk, vlist *prob,
                         vcount *k, suspect **sus, size_t *nsus, size_t *cap) {
    pkv_block_check chk;
    k->sealed++;
    if (pkv_inspect_check_block(x->c, b, &chk)) return true; /* not sealed: cannot happen */
    if (!chk.chain_ok)
        vadd(prob, "chain", b, UINT64_MAX, "block %u: parent %u is not a sealed block of the "
             "same salt", b, bk->parent);
    if (chk.chain_ok) {
        k->hashes++;
        if (!chk.hash_ok)
            vadd(prob, "hash", b, UINT64_MAX, "block %u: stored hash %016llx%016llx does not "
                 "match its parent hash and tokens (%016llx%016llx)", b,
                 (unsigned long long)bk->hash_hi, (unsigned long long)bk->hash_lo,
                 (unsigned long long)chk.hash_hi_actual, (unsigned long long)chk.hash_lo_actual);
    }
    if (!chk.in_file) {
        vadd(prob, "payload_missing", b, UINT64_MAX, "block %u: sealed, but its slot is "
             "beyond the end of the arena file", b);
        return true;
    }
    k->payloads++;
    if (chk.payload_ok) return true;
    suspect v = {b, bk->payload_sum, chk.payload_sum_actual, (bk->flags & PKV_BLOCK_BAD) != 0};
    return add_suspect(sus, nsus, cap, v);
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
    verify_recovery(x, prob, notes, k);
    pkv_cache_info inf;
    pkv_info(x->c, &inf);
    size_t cap = 0;
    for (uint32_t b = 0; b < inf.capacity; b++) {
        pkv_block_info bk;
        if (pkv_inspect_block(x->c, b, &bk) || bk.state != PKV_BLOCK_SEALED) continue;
        if (!verify_block(x, b, &bk, prob, k, sus, nsus, &cap)) {
            k->oom = true; /* cmd_verify fails rather than report a partial list */
            return;
        }
    }
    pkv_stats st;
    pkv_get_stats(x->c, &st);
    k->sequences = st.sequences;
    char cwhy[512];
    if (pkv_check(x->c, cwhy, sizeof cwhy))
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

/* The arena file's size against its geometry. */
static void verify_arena_size(const kd_hdr *h, vlist *prob, vlist *notes) {
    uint64_t need = h->data_offset + h->capacity * h->slot_bytes;
    if (h->file_size < need)
        vadd(prob, "arena_short", UINT64_MAX, UINT64_MAX, "the arena file has %llu bytes, its "
             "geometry needs %llu: the slots of blocks %llu and up are missing",
             (unsigned long long)h->file_size, (unsigned long long)need,
             (unsigned long long)((h->file_size - h->data_offset) / h->slot_bytes));
    else if (h->file_size > need)
        vadd(notes, "arena_long", UINT64_MAX, UINT64_MAX, "the arena file has %llu bytes, "
             "%llu more than its geometry needs (ignored)", (unsigned long long)h->file_size,
             (unsigned long long)(h->file_size - need));
}

/* The full checkpoint and the log segments' headers. */
static void verify_log_files(const kd_hdr *h, const kd_log *L, vlist *prob, vlist *notes) {
    if (L->have_ckpt && !L->ckpt_ok)
        vadd(prob, "checkpoint", UINT64_MAX, UINT64_MAX, "%s", L->ckpt_err);
    if (L->ckpt_ok && L->ckpt_secret != h->secret)
        vadd(prob, "foreign_checkpoint", UINT64_MAX, UINT64_MAX, "checkpoint LSN %llu "
             "describes another arena (the arena was replaced or recreated)",
             (unsigned long long)L->ckpt_lsn);
    if (L->nckpt_files > 1)
        vadd(notes, "old_checkpoints", UINT64_MAX, UINT64_MAX, "%zu checkpoint files; "
             "recovery reads only the newest", L->nckpt_files);
    for (size_t i = 0; i < L->nsegs; i++) {
        const kd_seg *s = &L->segs[i];
        if (s->foreign)
            vadd(prob, "foreign_segment", UINT64_MAX, UINT64_MAX, "wal-%016llx: %s",
                 (unsigned long long)s->no, s->why);
        else if (!s->valid)
            vadd(notes, "segment_header", UINT64_MAX, UINT64_MAX, "wal-%016llx: invalid "
                 "header (%s): recovery skips it as never written", (unsigned long long)s->no,
                 s->why);
    }
}

/* Where the valid log ends; the open flags the snapshots then need. */
static uint32_t verify_log_end(const kd_log *L, vlist *prob, vlist *notes) {
    uint32_t flags = 0;
    switch (L->end_reason) {
    case PKV_LOG_END_CORRUPT:
    case PKV_LOG_END_GAP:
    case PKV_LOG_END_BAD_RECORD:
        vadd(prob, L->end_reason == PKV_LOG_END_GAP ? "log_gap" :
             L->end_reason == PKV_LOG_END_CORRUPT ? "log_corrupt" : "log_bad_record",
             UINT64_MAX, UINT64_MAX, "log segment %llu offset %llu: %s",
             (unsigned long long)L->end_seg, (unsigned long long)L->end_off, L->end_detail);
        if (L->end_reason != PKV_LOG_END_BAD_RECORD) flags = PKV_OPEN_POINT_IN_TIME;
        break;
    default:
        break;
    }
    if (L->torn_bytes)
        vadd(notes, "torn_tail", UINT64_MAX, UINT64_MAX, "a torn log tail of %llu bytes "
             "after LSN %llu (segment %llu offset %llu): a write cut short by a crash; "
             "recovery discards it", (unsigned long long)L->torn_bytes,
             (unsigned long long)L->last_lsn, (unsigned long long)L->end_seg,
             (unsigned long long)L->end_off);
    return flags;
}

/* Files the library leaves or ignores: notes. */
static void verify_strays(const kd_log *L, vlist *notes) {
    if (L->arena_tmp)
        vadd(notes, "stray_file", UINT64_MAX, UINT64_MAX, "arena.tmp: left by an "
             "interrupted creation (ignored)");
    if (L->ckpt_tmp)
        vadd(notes, "stray_file", UINT64_MAX, UINT64_MAX, "ckpt.tmp: left by an "
             "interrupted checkpoint (ignored)");
    uint64_t strays = kd_spare_strays(L->spare_mask);
    for (unsigned k = 0; k < 64; k++)
        if (strays >> k & 1)
            vadd(notes, "stray_file", UINT64_MAX, UINT64_MAX, "wal-spare-%016x: outside "
                 "the run of spares from wal-spare-0 that the log recycles (%zu long; a "
                 "recycling failed); the next writable open deletes it", k, L->nspare);
    if (L->nspare_ignored)
        vadd(notes, "stray_file", UINT64_MAX, UINT64_MAX, "%zu wal-spare-* file%s "
             "numbered 64 or more: no writer makes them; the next writable open "
             "deletes them", L->nspare_ignored, L->nspare_ignored == 1 ? "" : "s");
}

/* Whether suspect v still stands in snapshot c: the block still sealed with the
 * same checksum, and its payload still does not match it. */
static bool suspect_stands(pkv_cache *c, const suspect *v) {
    pkv_block_info bk;
    pkv_block_check chk;
    return !pkv_inspect_block(c, v->block, &bk) && bk.state == PKV_BLOCK_SEALED &&
           bk.payload_sum == v->sum && !pkv_inspect_check_block(c, v->block, &chk) &&
           chk.in_file && chk.payload_sum_actual != v->sum;
}

/* The suspects that later snapshots confirm (while the log moves, up to 5 more
 * reads, backing off from 50 ms): *nsus shrinks to them; *unconfirmed counts the
 * others, *moved says whether the log moved. */
static void confirm_suspects(kd_ctx *x, uint32_t flags, suspect *sus, size_t *nsus,
                             vcount *k, size_t *unconfirmed, bool *moved) {
    char why[1024];
    uint64_t lsn = snap_lsn(x->c);
    for (int round = 0; *nsus && round < 5; round++) {
        struct timespec ts = {0, (long)(50 * 1000 * 1000) << round};
        nanosleep(&ts, NULL);
        kd_ctx y = *x;
        y.c = NULL;
        y.retries = 0;
        if (kd_open_quiet(&y, flags, why, sizeof why)) break; /* keep them all */
        k->passes++;
        uint64_t l2 = snap_lsn(y.c);
        if (l2 == lsn) { /* the log did not move: the mismatches stand */
            pkv_close(y.c);
            break;
        }
        *moved = true;
        size_t w = 0;
        for (size_t i = 0; i < *nsus; i++) {
            if (suspect_stands(y.c, &sus[i])) sus[w++] = sus[i];
            else (*unconfirmed)++;
        }
        *nsus = w;
        lsn = l2;
        pkv_close(y.c);
    }
}

/* The confirmed payload mismatches, with their holders, and what recovery cut
 * because of them. false: out of memory. */
static bool report_suspects(kd_ctx *x, const suspect *sus, size_t nsus, const vcount *k0,
                            bool moved, size_t unconfirmed, vlist *prob, vlist *notes) {
    holders *hs = find_holders(x->c, sus, nsus);
    if (!hs) return false;
    bool held_bad = false;
    for (size_t i = 0; i < nsus; i++) {
        uint32_t b = sus[i].block;
        char held[160];
        format_holders(&hs[i], held, sizeof held);
        if (hs[i].n) held_bad = true;
        if (sus[i].bad_flag) held_bad = true; /* recovery flagged it: a sequence held it */
        vadd(prob, "payload_checksum", b, UINT64_MAX, "block %u: payload checksum %016llx "
             "does not match the one sealed with it (%016llx)%s%s", b,
             (unsigned long long)sus[i].actual, (unsigned long long)sus[i].sum,
             sus[i].bad_flag ? "; flagged bad, never served" : "; a prefix lookup would reject it",
             held);
    }
    free(hs);
    if (k0->seq_bad && (!moved || held_bad))
        vadd(prob, "sequence_cut_payload", UINT64_MAX, UINT64_MAX, "recovery cuts %llu "
             "sequence%s before a block whose payload fails its checksum",
             (unsigned long long)k0->seq_bad, k0->seq_bad == 1 ? "" : "s");
    else if (k0->seq_bad)
        vadd(notes, "live_writer", UINT64_MAX, UINT64_MAX, "this snapshot's recovery cut %llu "
             "sequence%s at blocks the live writer had already reused (not damage)",
             (unsigned long long)k0->seq_bad, k0->seq_bad == 1 ? "" : "s");
    if (unconfirmed)
        vadd(notes, "live_writer", UINT64_MAX, UINT64_MAX, "%zu payload mismatch%s vanished "
             "in a later snapshot: blocks the live writer evicted and reused (not damage)",
             unconfirmed, unconfirmed == 1 ? "" : "es");
    return true;
}

static size_t segments_read(const kd_log *L, bool have_log) {
    size_t n = 0;
    for (size_t i = 0; have_log && i < L->nsegs; i++) n += L->segs[i].read;
    return n;
}

static void json_vlist(kj *j, const char *key, const vlist *l, bool where) {
    kj_arr(j, key, false);
    for (size_t i = 0; i < l->n; i++) {
        kj_obj(j, NULL, true);
        kj_str(j, "kind", l->v[i].kind);
        if (where && l->v[i].block != UINT64_MAX) kj_u64(j, "block", l->v[i].block);
        if (where && l->v[i].seq != UINT64_MAX) kj_u64(j, "seq", l->v[i].seq);
        kj_str(j, "message", l->v[i].msg);
        kj_end_obj(j);
    }
    kj_end_arr(j);
}

static void verify_json(kd_ctx *x, const vlist *prob, const vlist *notes, const vcount *k,
                        const kd_log *L, bool have_log) {
    kj *j = begin_json(x);
    kj_bool(j, "ok", prob->n == 0);
    json_vlist(j, "problems", prob, true);
    json_vlist(j, "notes", notes, false);
    kj_obj(j, "checked", false);
    kj_bool(j, "recovered", k->opened);
    kj_u64(j, "segments_read", segments_read(L, have_log));
    kj_u64(j, "records", have_log ? L->records : 0);
    kj_u64(j, "checkpoint_deltas", have_log ? L->ndeltas : 0);
    kj_u64(j, "sealed_blocks", k->sealed);
    kj_u64(j, "payloads", k->payloads);
    kj_u64(j, "hashes", k->hashes);
    kj_u64(j, "sequences", k->sequences);
    kj_bool(j, "invariants", k->invariants);
    kj_u64(j, "passes", k->passes);
    kj_end_obj(j);
    kj_end_doc(j);
}

/* The text verify's "log" and "checkpoint" lines. */
static void print_verify_log(const kd_log *L) {
    size_t nread = segments_read(L, true);
    printf("  log         %zu segment%s read, %llu records, last LSN %llu; %s\n", nread,
           nread == 1 ? "" : "s", (unsigned long long)L->records, (unsigned long long)L->last_lsn,
           L->end_reason ? L->end_detail : "no log segment to read");
    if (L->have_ckpt)
        printf("  checkpoint  LSN %llu%s", (unsigned long long)L->ckpt_lsn,
               L->ckpt_ok ? "" : " (unreadable)");
    if (L->nchain)
        printf(" + %zu delta%s, the log read after LSN %llu", L->nchain, L->nchain == 1 ? "" : "s",
               (unsigned long long)L->chain_lsn);
    if (L->have_ckpt && !L->chain_ok) printf(", the chain is broken");
    if (L->have_ckpt && L->nstale) printf(", %zu stale delta%s", L->nstale, L->nstale == 1 ? "" : "s");
    if (L->have_ckpt) putchar('\n');
}

static void verify_text(kd_ctx *x, const vlist *prob, const vlist *notes, const vcount *k,
                        const kd_log *L, bool have_log) {
    printf("verify %s\n", x->dir);
    if (have_log) print_verify_log(L);
    if (k->opened)
        printf("  checked     %llu sealed blocks (%llu payload checksums, %llu chain hashes), "
               "%llu sequences, invariants I1-I10\n", (unsigned long long)k->sealed,
               (unsigned long long)k->payloads, (unsigned long long)k->hashes,
               (unsigned long long)k->sequences);
    for (size_t i = 0; i < prob->n; i++) printf("problem: %s: %s\n", prob->v[i].kind, prob->v[i].msg);
    for (size_t i = 0; i < notes->n; i++) printf("note: %s: %s\n", notes->v[i].kind, notes->v[i].msg);
    if (prob->n) printf("%zu problem%s found\n", prob->n, prob->n == 1 ? "" : "s");
    else printf("no problems found\n");
}

/* The offline checks of the files: header size, checkpoint chain, log. Returns
 * the open flags the snapshots need; *have_log: the log could be scanned. */
static uint32_t verify_files(kd_ctx *x, kd_log *L, bool *have_log, vlist *prob, vlist *notes) {
    char why[1024];
    verify_arena_size(&x->hdr, prob, notes);
    if (kd_log_scan(x->dir, &x->hdr, L, NULL, NULL, why, sizeof why)) {
        vadd(prob, "log_unreadable", UINT64_MAX, UINT64_MAX, "%s", why);
        return 0;
    }
    *have_log = true;
    verify_log_files(&x->hdr, L, prob, notes);
    verify_chain(x->dir, L, prob, notes);
    uint32_t flags = verify_log_end(L, prob, notes);
    verify_strays(L, notes);
    return flags;
}

/* Read the state. A live writer evicts cached blocks and reuses their slots at
 * once, before the EVICT record reaches the log, so a snapshot (the valid log
 * prefix) may name a slot that already holds other K/V. A payload mismatch
 * therefore counts only if a later snapshot, taken once the log has caught up,
 * still has the block sealed with the same checksum and the mismatch persists.
 * 0, or an exit code (out of memory; everything freed but prob, notes, L). */
static int verify_state(kd_ctx *x, uint32_t flags, vlist *prob, vlist *notes, vcount *k,
                        const char **oom) {
    vcount k0;
    memset(&k0, 0, sizeof k0);
    suspect *sus = NULL;
    size_t nsus = 0, unconfirmed = 0;
    bool moved = false;
    verify_pass(x, flags, prob, notes, &k0, &sus, &nsus);
    *k = k0;
    k->passes = 1;
    int rc = 0;
    if (k0.oom) {
        *oom = "checking payloads";
        rc = KD_FAILED;
    } else if (x->c) {
        confirm_suspects(x, flags, sus, &nsus, k, &unconfirmed, &moved);
        if (!report_suspects(x, sus, nsus, &k0, moved, unconfirmed, prob, notes)) {
            *oom = "listing payload mismatches";
            rc = KD_FAILED;
        }
    }
    free(sus);
    kd_close(x);
    return rc;
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
    } else {
        uint32_t flags = verify_files(x, &L, &have_log, &prob, &notes);
        const char *oom = NULL;
        if (verify_state(x, flags, &prob, &notes, &k, &oom)) {
            vlist_free(&prob);
            vlist_free(&notes);
            kd_log_free(&L);
            return kd_fail(x, KD_FAILED, "out of memory while %s", oom);
        }
    }
    if (x->json) verify_json(x, &prob, &notes, &k, &L, have_log);
    else verify_text(x, &prob, &notes, &k, &L, have_log);
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
