/*
 * pkvd — the pagedkv cache daemon (docs/pkvd.md): owns one cache directory
 * (pkv_open, the single writer) and serves clients (pkv_connect) over a
 * Unix-domain stream socket.
 *
 * Owns: the cache handle, the listening socket, and one connection record and
 * thread per client. A connection's thread reads a frame, decodes it with the
 * shared decoder (src/wire.c), calls the library, writes the reply; the
 * library's own lock serializes the cache (no other lock guards cache state).
 * Invariants:
 *  - a client names only its own sequences: each connection maps the ids its
 *    client chose to daemon ids it allocates (unique for the daemon's life), so
 *    an id not in the map is PKV_ENOSEQ whatever other clients use;
 *  - a connection's sequences are closed only once the client's end of the
 *    socket is closed (rule W1, docs/pkvd.md): before that the client may
 *    still write the slots it was handed. When the daemon ends a connection
 *    (malformed frame, failed reply) it shuts its side, serves nothing more
 *    and waits for that end of stream; at shutdown nothing is released
 *    (rule W2), as in a crash;
 *  - recovered sequences have no connection: they are closed at startup,
 *    before the socket listens (their sealed blocks stay cached), and only
 *    after every client of an earlier daemon has unmapped the arena: the
 *    arena descriptor handed to clients carries a shared flock that a
 *    starting daemon waits to take exclusively (rule W3);
 *  - a malformed frame (header or payload form) gets an error reply and ends
 *    the connection (rule W1 above); a well-formed one with bad values gets the library's
 *    error and the connection goes on;
 *  - the connection list (shutdown, CLIENTS) is under conns_mu, a plain mutex
 *    never held across a join; a connection's descriptor is closed only after
 *    its thread is joined.
 */
#include "internal.h" /* pkv_err: the daemon's messages travel as the library's */
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/time.h>
#include <grp.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static pkv_cache *cache;
static pkv_cache_info info;
static int arena_fd = -1;
/* The arena opened O_RDONLY, the descriptor read-only connections get: a
 * MAP_SHARED PROT_WRITE mapping or a write through it fails in the kernel. It
 * holds flock(LOCK_SH) too (rule W3: a reader of a dead daemon still reads the
 * blocks it attached, so a restart must not reuse them under it). */
static int arena_ro_fd = -1;
static atomic_uint_fast64_t next_id = 1;
/* --max-clients: connections served at once; past it a client's HELLO gets
 * PKV_EBUSY. --client-timeout: seconds a frame, once begun, may take to arrive
 * (and a reply to be taken); 0: no bound. */
static uint64_t max_clients = 1024, client_timeout = 30;
#define REFUSING_MAX 64 /* connections being refused at once; past it, closed unanswered */
#define MAX_UIDS 64
static uid_t allow_uids[MAX_UIDS]; /* SO_PEERCRED uids accepted */
static size_t n_uids;
static uid_t ro_uids[MAX_UIDS]; /* --allow-uid-ro: accepted, read-only connections */
static size_t n_ro_uids;

/* --salts UID=S1,S2,...: the salts (trust domains) a uid's connections may
 * name in a lookup or an open; a uid without a rule may name any. */
typedef struct salt_rule {
    uid_t uid;
    size_t n;
    uint64_t *salts;
} salt_rule;
static salt_rule rules[MAX_UIDS];
static size_t n_rules;

static const salt_rule *rule_of(uid_t u) {
    for (size_t i = 0; i < n_rules; i++)
        if (rules[i].uid == u) return &rules[i];
    return NULL;
}

static bool uid_allowed(uid_t u) {
    for (size_t i = 0; i < n_uids; i++)
        if (allow_uids[i] == u) return true;
    return false;
}

static bool uid_ro(uid_t u) {
    for (size_t i = 0; i < n_ro_uids; i++)
        if (ro_uids[i] == u) return true;
    return false;
}

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pkvd: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* ---- A connection's id map: client id -> daemon id (open addressing) -------- */

typedef struct idmap {
    uint64_t *key, *val;  /* val 0: empty; UINT64_MAX: deleted */
    uint64_t *mark;       /* STEP_BATCH: the batch that last named the entry */
    size_t cap, used, live;
} idmap;

static size_t im_home(const idmap *m, uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & (m->cap - 1);
}

/* The slot of k, or SIZE_MAX. */
static size_t im_find(const idmap *m, uint64_t k) {
    if (!m->cap) return SIZE_MAX;
    for (size_t i = im_home(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (m->val[i] == 0) return SIZE_MAX;
        if (m->val[i] != UINT64_MAX && m->key[i] == k) return i;
    }
}

static int im_grow(idmap *m) {
    size_t cap = m->cap ? m->cap * 2 : 16;
    if (m->live * 4 < m->cap) cap = m->cap; /* mostly deleted: rehash in place */
    idmap n = {calloc(cap, 8), calloc(cap, 8), calloc(cap, 8), cap, 0, 0};
    if (!n.key || !n.val || !n.mark) {
        free(n.key), free(n.val), free(n.mark);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->val[i] == 0 || m->val[i] == UINT64_MAX) continue;
        size_t j = im_home(&n, m->key[i]);
        while (n.val[j]) j = (j + 1) & (cap - 1);
        n.key[j] = m->key[i], n.val[j] = m->val[i];
        n.used++, n.live++;
    }
    free(m->key), free(m->val), free(m->mark);
    *m = n;
    return 0;
}

/* Room for one insertion, so that the insertion after a library call cannot fail. */
static int im_reserve(idmap *m) {
    return (m->used + 1) * 2 > m->cap ? im_grow(m) : 0;
}

static void im_put(idmap *m, uint64_t k, uint64_t v) {
    pkv_assert(m->cap > m->used); /* im_reserve came first */
    size_t i = im_home(m, k);
    while (m->val[i] != 0 && m->val[i] != UINT64_MAX) i = (i + 1) & (m->cap - 1);
    if (m->val[i] == 0) m->used++;
    m->key[i] = k, m->val[i] = v, m->mark[i] = 0;
    m->live++;
}

static void im_del(idmap *m, size_t i) {
    m->val[i] = UINT64_MAX;
    m->live--;
}

/* ---- Connections ------------------------------------------------------------ */

typedef struct conn {
    int fd;
    pthread_t th;
    /* ids is written only by the connection's thread, under ids_mu (which it
     * never holds across a library call); CLIENTS reads it under ids_mu. */
    pthread_mutex_t ids_mu;
    idmap ids;
    uint64_t batch; /* STEP_BATCH counter (marks in ids) */
    const salt_rule *salts; /* NULL: every salt */
    uid_t uid;
    pid_t pid;
    bool rdonly; /* read-only: O_RDONLY arena, no call that hands out slots */
    bool refuse; /* over --max-clients: its HELLO gets PKV_EBUSY */
    atomic_size_t nseq; /* sequences in ids (read by CLIENTS from other threads) */
    bool hello;
    atomic_bool finished;
    struct conn *next;
} conn;

static void ids_free(conn *k) {
    pthread_mutex_lock(&k->ids_mu);
    free(k->ids.key), free(k->ids.val), free(k->ids.mark);
    memset(&k->ids, 0, sizeof k->ids);
    pthread_mutex_unlock(&k->ids_mu);
}

/* At most this many sequences of a connection are listed by CLIENTS. */
#define CLIENTS_SEQS 16

static pthread_mutex_t conns_mu = PTHREAD_MUTEX_INITIALIZER;
static conn *conns;
/* Set before reap(true) at shutdown: connections then end without releasing
 * (rule W2). */
static atomic_bool stopping;

static bool read_all(int fd, uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k, n -= (size_t)k;
    }
    return true;
}

/* A connection's read of n bytes of a frame: 0, READ_END (end of stream or an
 * error) or READ_STALLED. A connection's socket has SO_RCVTIMEO set to
 * --client-timeout, so a wait that long fails with EAGAIN: allowed while none of
 * the n bytes came yet when `idle` (a client may rest between frames), a stall
 * otherwise (part of a frame came and the rest did not). */
enum { READ_END = 1, READ_STALLED = 2 };
static int read_in(int fd, uint8_t *p, size_t n, bool idle) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, p + got, n - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (idle && got == 0) continue;
            return READ_STALLED;
        }
        if (k <= 0) return READ_END;
        got += (size_t)k;
    }
    return 0;
}

static bool write_all(int fd, const uint8_t *p, size_t n, int pass_fd) {
    while (n) {
        struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int))];
        } cm;
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (pass_fd >= 0) {
            memset(&cm, 0, sizeof cm);
            m.msg_control = cm.b;
            m.msg_controllen = sizeof cm.b;
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(h), &pass_fd, sizeof pass_fd);
        }
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        pass_fd = -1; /* the descriptor went with the first byte */
        p += k, n -= (size_t)k;
    }
    return true;
}

/* Send a reply: rc, then (rc != 0) the error message, then `res`. */
static bool reply_v(conn *k, uint16_t version, uint16_t op, uint32_t req, int rc,
                    const pkvd_wr *res, int pass_fd);

static bool reply(conn *k, uint16_t op, uint32_t req, int rc, const pkvd_wr *res,
                  int pass_fd) {
    return reply_v(k, PKVD_VERSION, op, req, rc, res, pass_fd);
}

/* A reply in `version`: PKVD_VERSION, except the refusal of a HELLO, which is
 * written in the version of the HELLO's header so that a client of another
 * version reads it (wire.h: HELLO and an error reply are the same in all). */
static bool reply_v(conn *k, uint16_t version, uint16_t op, uint32_t req, int rc,
                    const pkvd_wr *res, int pass_fd) {
    pkvd_wr w = {0};
    pkvd_put_u32(&w, (uint32_t)rc);
    if (rc) {
        const char *msg = pkv_last_error();
        size_t ml = strlen(msg);
        if (ml > PKVD_MAX_MSG) ml = PKVD_MAX_MSG;
        pkvd_put_u16(&w, (uint16_t)ml);
        pkvd_put_bytes(&w, msg, ml);
    }
    if (res && res->len) pkvd_put_bytes(&w, res->p, res->len);
    bool ok = !w.oom && w.len <= PKVD_MAX_PAYLOAD;
    if (ok) { /* one buffer, so the reply is one send and one wake-up */
        uint8_t *f = malloc(PKVD_HDR + w.len);
        if ((ok = f != NULL)) {
            pkvd_hdr_put_v(f, version, (uint16_t)(op | PKVD_REPLY), (uint32_t)w.len, req);
            memcpy(f + PKVD_HDR, w.p, w.len);
            ok = write_all(k->fd, f, PKVD_HDR + w.len, pass_fd);
            free(f);
        }
    }
    pkvd_wr_free(&w);
    return ok;
}

static uint32_t *tokens_of(const pkvd_req *r) {
    uint32_t *t = malloc((r->n ? r->n : 1) * sizeof *t);
    if (t)
        for (uint32_t i = 0; i < r->n; i++) t[i] = pkvd_le32(r->tokens + 4 * (size_t)i);
    return t;
}

/* The library's wording for an unknown id, so a client cannot tell another
 * client's ids from unused ones. */
static int no_seq(uint64_t id) {
    return pkv_err(PKV_ENOSEQ, "no sequence %llu", (unsigned long long)id);
}

static int exists(uint64_t id) {
    return pkv_err(PKV_EEXIST, "sequence %llu already exists", (unsigned long long)id);
}

static int oom(void) { return pkv_err(PKV_ENOMEM, "pkvd: out of memory"); }

/* Salts are the tenant boundary: a connection may look up and open only under
 * the salts its uid is allowed (forks inherit their parent's). */
static int salt_check(const conn *k, uint64_t salt) {
    if (!k->salts) return 0;
    for (size_t i = 0; i < k->salts->n; i++)
        if (k->salts->salts[i] == salt) return 0;
    return pkv_err(PKV_EINVAL, "salt %llu is not allowed for this client (pkvd --salts)",
                   (unsigned long long)salt);
}

/* The calls a read-only connection may not make: those that hand out slots to
 * write (append, commit_append, step_batch), change what a sequence stands for
 * (commit, truncate, fork: a fork's open tail block could be appended to by
 * the fork) or make the daemon sync. A reader looks up, opens (attaches sealed
 * blocks), reads K/V in its read-only mapping, asks about its sequences, closes. */
static bool read_only_refused(uint16_t op) {
    switch (op) {
    case PKVD_APPEND:
    case PKVD_COMMIT:
    case PKVD_COMMIT_APPEND:
    case PKVD_STEP_BATCH:
    case PKVD_FORK:
    case PKVD_TRUNCATE:
    case PKVD_SYNC:
        return true;
    default:
        return false;
    }
}

/* Carry out one decoded request; results go to res. Returns the rc to send. */
static int serve(conn *k, const pkvd_req *r, pkvd_wr *res) {
    int rc = 0;
    size_t i;
    if (k->rdonly && read_only_refused(r->op)) {
        if (r->op == PKVD_STEP_BATCH) pkvd_put_u32(res, 0); /* done: none */
        return pkv_err(PKV_ERDONLY, "a read-only pkvd connection may look up, open, read "
                       "and close, not op %u", r->op);
    }
    switch (r->op) {
    case PKVD_LOOKUP: {
        if ((rc = salt_check(k, r->salt))) return rc;
        uint32_t *t = tokens_of(r);
        size_t nc = 0;
        rc = t ? pkv_prefix_lookup(cache, r->salt, t, r->n, &nc) : oom();
        free(t);
        if (!rc) pkvd_put_u64(res, nc);
        return rc;
    }
    case PKVD_SEQ_OPEN: {
        if (im_find(&k->ids, r->id) != SIZE_MAX) return exists(r->id);
        if ((rc = salt_check(k, r->salt))) return rc;
        pthread_mutex_lock(&k->ids_mu);
        int grown = im_reserve(&k->ids);
        pthread_mutex_unlock(&k->ids_mu);
        if (grown) return oom();
        uint32_t *t = tokens_of(r);
        if (!t) return oom();
        uint64_t did = atomic_fetch_add(&next_id, 1);
        size_t nc = 0;
        rc = pkv_seq_open(cache, did, r->salt, t, r->n, &nc);
        free(t);
        if (rc) return rc;
        pthread_mutex_lock(&k->ids_mu);
        im_put(&k->ids, r->id, did);
        pthread_mutex_unlock(&k->ids_mu);
        atomic_fetch_add(&k->nseq, 1);
        pkvd_put_u64(res, nc);
        return 0;
    }
    case PKVD_APPEND:
    case PKVD_COMMIT:
    case PKVD_COMMIT_APPEND: {
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        uint64_t did = k->ids.val[i];
        if (r->op == PKVD_COMMIT) return pkv_seq_commit(cache, did, (size_t)r->count);
        uint32_t *t = tokens_of(r);
        pkv_slot *s = malloc((r->n ? r->n : 1) * sizeof *s);
        if (!t || !s) rc = oom();
        else if (r->op == PKVD_APPEND) rc = pkv_seq_append(cache, did, t, r->n, s);
        else rc = pkv_seq_commit_append(cache, did, (size_t)r->count, t, r->n, s);
        for (uint32_t j = 0; !rc && j < r->n; j++) {
            pkvd_put_u32(res, s[j].block);
            pkvd_put_u32(res, s[j].offset);
        }
        free(t);
        free(s);
        return rc;
    }
    case PKVD_STEP_BATCH: {
        /* Translate the ids up to the first unknown or repeated one; the library
         * runs the steps before it; that one fails as its step would. */
        pkv_step *st = malloc((r->n ? r->n : 1) * sizeof *st);
        if (!st) {
            pkvd_put_u32(res, 0);
            return oom();
        }
        uint64_t mark = ++k->batch;
        uint32_t ok = 0;
        int stop = 0;
        for (; ok < r->n; ok++) {
            const uint8_t *p = r->steps + (size_t)ok * PKVD_STEP_BYTES;
            uint64_t cid = pkvd_le64(p);
            size_t j = im_find(&k->ids, cid);
            if (j == SIZE_MAX) {
                stop = no_seq(cid);
                break;
            }
            if (k->ids.mark[j] == mark) {
                /* the library requires distinct sequences in a batch */
                stop = pkv_err(PKV_EINVAL, "sequence %llu named twice in one batch",
                               (unsigned long long)cid);
                break;
            }
            k->ids.mark[j] = mark;
            st[ok] = (pkv_step){.id = k->ids.val[j], .n_commit = pkvd_le32(p + 8),
                                .token = pkvd_le32(p + 12)};
        }
        size_t done = 0;
        if (ok) rc = pkv_seq_step_batch(cache, st, ok, &done);
        if (!rc && stop) rc = stop;
        pkvd_put_u32(res, (uint32_t)done);
        for (size_t j = 0; j < done; j++) {
            pkvd_put_u32(res, st[j].slot.block);
            pkvd_put_u32(res, st[j].slot.offset);
        }
        free(st);
        return rc;
    }
    case PKVD_FORK: {
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        if (im_find(&k->ids, r->id2) != SIZE_MAX) return exists(r->id2);
        pthread_mutex_lock(&k->ids_mu);
        int grown = im_reserve(&k->ids);
        pthread_mutex_unlock(&k->ids_mu);
        if (grown) return oom();
        i = im_find(&k->ids, r->id); /* the reserve may have rehashed */
        uint64_t did = atomic_fetch_add(&next_id, 1);
        rc = pkv_seq_fork(cache, k->ids.val[i], did);
        if (!rc) {
            pthread_mutex_lock(&k->ids_mu);
            im_put(&k->ids, r->id2, did);
            pthread_mutex_unlock(&k->ids_mu);
            atomic_fetch_add(&k->nseq, 1);
        }
        return rc;
    }
    case PKVD_TRUNCATE:
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        return pkv_seq_truncate(cache, k->ids.val[i], (size_t)r->count);
    case PKVD_CLOSE:
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        rc = pkv_seq_close(cache, k->ids.val[i]);
        if (!rc) {
            pthread_mutex_lock(&k->ids_mu);
            im_del(&k->ids, i);
            pthread_mutex_unlock(&k->ids_mu);
            atomic_fetch_sub(&k->nseq, 1);
        }
        return rc;
    case PKVD_INFO: {
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        pkv_seq_info si;
        rc = pkv_seq_get_info(cache, k->ids.val[i], &si);
        if (!rc) {
            pkvd_put_u64(res, si.len);
            pkvd_put_u64(res, si.committed);
            pkvd_put_u64(res, si.n_blocks);
            pkvd_put_u64(res, si.salt);
        }
        return rc;
    }
    case PKVD_BLOCKS:
    case PKVD_TOKENS: {
        if ((i = im_find(&k->ids, r->id)) == SIZE_MAX) return no_seq(r->id);
        uint32_t *out = malloc((r->n ? r->n : 1) * sizeof *out);
        if (!out) return oom();
        size_t n = 0;
        rc = r->op == PKVD_BLOCKS ? pkv_seq_blocks(cache, k->ids.val[i], out, r->n, &n)
                                  : pkv_seq_tokens(cache, k->ids.val[i], out, r->n, &n);
        if (rc == 0 || rc == PKV_ERANGE) {
            pkvd_put_u64(res, n);
            for (size_t j = 0; j < n && j < r->n; j++) pkvd_put_u32(res, out[j]);
        }
        free(out);
        return rc;
    }
    case PKVD_STATS: {
        pkv_stats st;
        rc = pkv_get_stats(cache, &st);
        if (!rc) pkvd_put_stats(res, &st);
        return rc;
    }
    case PKVD_SYNC:
        return pkv_sync(cache);
    case PKVD_CLIENTS: {
        /* u32 count, then per connection: u32 uid, u32 pid, u64 sequences, u32
         * flags (1: read-only), u32 listed, listed x (u64 client id, u64 daemon id,
         * u64 len, u64 committed), the first CLIENTS_SEQS in its map. Lock order:
         * conns_mu, a connection's ids_mu, the cache's (pkv_seq_get_info). */
        pthread_mutex_lock(&conns_mu);
        uint32_t n = 0;
        for (const conn *q = conns; q; q = q->next) n += !atomic_load(&q->finished);
        pkvd_put_u32(res, n);
        for (conn *q = conns; q; q = q->next) {
            if (atomic_load(&q->finished)) continue;
            pkvd_put_u32(res, (uint32_t)q->uid);
            pkvd_put_u32(res, (uint32_t)q->pid);
            pkvd_put_u64(res, atomic_load(&q->nseq));
            pkvd_put_u32(res, q->rdonly ? 1u : 0u);
            uint64_t cid[CLIENTS_SEQS], did[CLIENTS_SEQS];
            uint32_t listed = 0;
            pthread_mutex_lock(&q->ids_mu);
            for (size_t j = 0; j < q->ids.cap && listed < CLIENTS_SEQS; j++) {
                uint64_t v = q->ids.val[j];
                if (v && v != UINT64_MAX) cid[listed] = q->ids.key[j], did[listed++] = v;
            }
            pkvd_put_u32(res, listed);
            for (uint32_t j = 0; j < listed; j++) {
                pkv_seq_info si = {0};
                pkv_seq_get_info(cache, did[j], &si); /* closed meanwhile: zeros */
                pkvd_put_u64(res, cid[j]);
                pkvd_put_u64(res, did[j]);
                pkvd_put_u64(res, si.len);
                pkvd_put_u64(res, si.committed);
            }
            pthread_mutex_unlock(&q->ids_mu);
        }
        pthread_mutex_unlock(&conns_mu);
        return res->oom ? oom() : 0;
    }
    default: /* HELLO is handled by the caller */
        return pkv_err(PKV_EINVAL, "op %u out of place", r->op);
    }
}

static void hello_results(pkvd_wr *w) {
    pkvd_put_u16(w, PKVD_VERSION);
    pkvd_put_u32(w, info.num_layers);
    pkvd_put_u32(w, info.num_kv_heads);
    pkvd_put_u32(w, info.head_dim);
    pkvd_put_u32(w, info.block_size);
    pkvd_put_u32(w, (uint32_t)info.dtype);
    pkvd_put_u32(w, info.elem_size);
    pkvd_put_u64(w, info.capacity);
    pkvd_put_u64(w, info.block_bytes);
    pkvd_put_u64(w, info.slot_bytes);
    pkvd_put_u64(w, info.run_bytes);
    size_t ml = strlen(info.model_id);
    pkvd_put_u16(w, (uint16_t)ml);
    pkvd_put_bytes(w, info.model_id, ml);
    pkvd_put_u64(w, 4096); /* the arena's header page (docs/format.md) */
}

static void *conn_main(void *arg) {
    conn *k = arg;
    uint8_t h[PKVD_HDR];
    uint8_t *payload = NULL;
    int e;
    if (k->refuse) { /* over --max-clients: answer the HELLO, serve nothing */
        pkvd_hdr hd;
        uint8_t hello[64];
        /* the whole HELLO is read first: a close with unread data would reset
         * the stream before the client reads the refusal */
        if (read_in(k->fd, h, sizeof h, false) == 0 && !pkvd_hdr_get(h, &hd, false, 0) &&
            hd.len <= sizeof hello && read_in(k->fd, hello, hd.len, false) == 0)
            reply_v(k, hd.op == PKVD_HELLO ? hd.version : PKVD_VERSION, hd.op, hd.req,
                  pkv_err(PKV_EBUSY, "pkvd serves its maximum of %llu clients "
                          "(--max-clients); try again later", (unsigned long long)max_clients),
                  NULL, -1);
        shutdown(k->fd, SHUT_WR);
        atomic_store(&k->finished, true); /* it holds no sequence, no arena */
        return NULL;
    }
    while (!(e = read_in(k->fd, h, sizeof h, true))) {
        pkvd_hdr hd;
        pkvd_req r;
        int rc = pkvd_hdr_get(h, &hd, false, 0);
        if (!rc && !(payload = malloc(hd.len ? hd.len : 1))) break;
        if (!rc && (e = read_in(k->fd, payload, hd.len, false))) {
            if (e == READ_STALLED)
                reply(k, hd.op, hd.req,
                      pkv_err(PKV_EINVAL, "a frame incomplete after %llu s (--client-timeout)",
                              (unsigned long long)client_timeout),
                      NULL, -1);
            break;
        }
        if (!rc) rc = pkvd_req_decode(hd.op, payload, hd.len, &r);
        if (!rc && (hd.op == PKVD_HELLO) == k->hello)
            rc = pkv_err(PKV_EINVAL, k->hello ? "HELLO twice" : "the first frame must be HELLO");
        /* A client of another version: refused in its own version (reply_v),
         * before anything of the payload but HELLO's frozen fields is read. */
        if (!rc && hd.op == PKVD_HELLO && (r.vmin > PKVD_VERSION || r.vmax < PKVD_VERSION)) {
            if (r.vmin == r.vmax)
                rc = pkv_err(PKV_EVERSION, "protocol version %u, expected %u (a pkvd and a "
                             "client of different pagedkv releases)", r.vmin, PKVD_VERSION);
            else
                rc = pkv_err(PKV_EVERSION, "protocol versions %u..%u, expected %u (a pkvd and "
                             "a client of different pagedkv releases)", r.vmin, r.vmax,
                             PKVD_VERSION);
        }
        if (!rc && hd.op == PKVD_HELLO && (r.flags & ~PKVD_HELLO_RDONLY))
            rc = pkv_err(PKV_EINVAL, "unknown HELLO flags 0x%x", r.flags);
        if (rc) { /* malformed: answer, then end the connection */
            reply_v(k, hd.op == PKVD_HELLO && !k->hello ? hd.version : PKVD_VERSION, hd.op,
                    hd.req, rc, NULL, -1);
            break;
        }
        pkvd_wr res = {0};
        bool ok;
        if (hd.op == PKVD_HELLO) {
            k->hello = true;
            if (r.flags & PKVD_HELLO_RDONLY) k->rdonly = true;
            hello_results(&res);
            ok = reply(k, hd.op, hd.req, 0, &res, k->rdonly ? arena_ro_fd : arena_fd);
        } else {
            rc = serve(k, &r, &res);
            ok = reply(k, hd.op, hd.req, rc, rc && hd.op != PKVD_STEP_BATCH &&
                                                 rc != PKV_ERANGE ? NULL : &res, -1);
        }
        pkvd_wr_free(&res);
        free(payload);
        payload = NULL;
        if (!ok) break;
    }
    free(payload);
    if (e == READ_STALLED)
        logf_("uid %u pid %d stalled in the middle of a frame for %llu s (--client-timeout): "
              "connection ended, its sequences held until it closes (rule W1)",
              (unsigned)k->uid, (int)k->pid, (unsigned long long)client_timeout);
    /* Rule W1 (docs/pkvd.md): the client may still write the slots it was handed
     * until its end of the socket is closed (pkv_close unmaps the arena first;
     * process exit unmaps it too). Unless that close is what ended the loop, the
     * daemon stops serving and shows the end (SHUT_WR: the client's next call
     * gets PKV_EDISCONNECTED), reads and drops frames until end of stream, and
     * only then releases the connection's sequences. */
    shutdown(k->fd, SHUT_WR);
    uint8_t sink[4096];
    for (;;) {
        ssize_t got = recv(k->fd, sink, sizeof sink, 0);
        /* EAGAIN: the receive timeout; only the end of the stream releases */
        if (got > 0 || (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)))
            continue;
        break;
    }
    /* Rule W2: at shutdown (the recv above was ended by reap, not by the
     * client) the daemon exits as if it crashed: nothing is released, the next
     * start recovers it after the clients have unmapped the arena. */
    if (atomic_load(&stopping)) {
        ids_free(k);
        atomic_store(&k->finished, true);
        return NULL;
    }
    /* The client can no longer write: its sequences go (pending tokens dropped,
     * sealed blocks stay cached), as a process crash would in embedded mode. */
    for (size_t i = 0; i < k->ids.cap; i++) {
        uint64_t v = k->ids.val[i];
        if (v && v != UINT64_MAX && pkv_seq_close(cache, v))
            logf_("closing sequence %llu of a closed connection: %s", (unsigned long long)v,
                  pkv_last_error());
    }
    ids_free(k);
    /* The descriptor is closed by reap() after the join, so its number cannot be
     * reused while reap() may still shut it down. */
    atomic_store(&k->finished, true);
    return NULL;
}

/* ---- Main: options, startup, the accept loop, shutdown ------------------------ */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    (void)sig;
    int e = errno;
    ssize_t k = write(sig_pipe[1], "x", 1);
    (void)k;
    errno = e;
}

/* One request on a raw connection (pkvd --status): 0 and the reply's results
 * in *buf and *rd, or -1 with the reason logged (the daemon's own message when
 * it refused the request: a client of another protocol version gets "protocol
 * version X, expected Y", never a misparsed reply). */
static int status_call(int fd, uint16_t op, const pkvd_wr *w, uint8_t **buf, pkvd_rd *rd) {
    uint8_t h[PKVD_HDR];
    pkvd_hdr_put(h, op, (uint32_t)w->len, op);
    if (!write_all(fd, h, sizeof h, -1) || (w->len && !write_all(fd, w->p, w->len, -1))) {
        logf_("--status: sending op %u: %s", op, strerror(errno));
        return -1;
    }
    /* HELLO's reply carries the arena descriptor: received and closed */
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct iovec iov = {.iov_base = h, .iov_len = sizeof h};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
                       .msg_controllen = sizeof cm.b};
    ssize_t k = recvmsg(fd, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); k > 0 && c; c = CMSG_NXTHDR(&m, c)) {
        int got;
        memcpy(&got, CMSG_DATA(c), sizeof got);
        close(got);
    }
    pkvd_hdr hd;
    if (k != (ssize_t)sizeof h || pkvd_hdr_get(h, &hd, true, op) || hd.len < 4) {
        logf_("--status: %s reply to op %u", k <= 0 ? "no" : "a malformed", op);
        return -1;
    }
    if (!(*buf = malloc(hd.len)) || !read_all(fd, *buf, hd.len)) {
        logf_("--status: the reply to op %u was cut short", op);
        return -1;
    }
    *rd = (pkvd_rd){.p = *buf, .left = hd.len};
    int32_t rc = (int32_t)pkvd_get_u32(rd);
    uint16_t ml = rc ? pkvd_get_u16(rd) : 0;
    const uint8_t *msg = rc ? pkvd_get_bytes(rd, ml) : NULL;
    if (hd.version != PKVD_VERSION) { /* only a HELLO's reply gets here (wire.h) */
        logf_("--status: pkvd speaks protocol version %u, expected %u (a pkvd of another "
              "pagedkv release%s%.*s)", hd.version, PKVD_VERSION, msg ? "; it said: " : "",
              msg ? (int)ml : 0, msg ? (const char *)msg : "");
        return -1;
    }
    if (rc) {
        logf_("--status: pkvd refused op %u: %s (%.*s)", op, pkv_strerror(rc),
              msg ? (int)ml : 0, msg ? (const char *)msg : "");
        return -1;
    }
    return 0;
}

/* pkvd --status --socket PATH: the daemon's connections, one line each, then its
 * counters (STATS: blocks, prompts, the shared tier). */
static int status_main(const struct sockaddr_un *sa) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)sa, sizeof *sa)) {
        logf_("connect to %s: %s", sa->sun_path, strerror(errno));
        return 1;
    }
    pkvd_wr w = {0};
    pkvd_put_u16(&w, PKVD_VERSION);
    pkvd_put_u16(&w, PKVD_VERSION);
    pkvd_put_u32(&w, 0);
    uint8_t *b1 = NULL, *b2 = NULL;
    pkvd_rd rd = {0};
    int rc = status_call(fd, PKVD_HELLO, &w, &b1, &rd);
    if (!rc) {
        uint16_t ver = pkvd_get_u16(&rd);
        if (ver != PKVD_VERSION) {
            logf_("--status: pkvd agreed on protocol version %u, expected %u", ver,
                  PKVD_VERSION);
            rc = -1;
        }
    }
    pkvd_wr none = {0};
    if (!rc) rc = status_call(fd, PKVD_CLIENTS, &none, &b2, &rd);
    pkvd_wr_free(&w);
    /* Twice over the reply: checked whole (every count within its bytes, nothing
     * left over), then printed, so a reply of another layout prints nothing. */
    for (int pass = 0; !rc && pass < 2; pass++) {
        pkvd_rd q = rd;
        uint32_t n = pkvd_get_u32(&q);
        if (pass) printf("%u connections (this one included)\n", n);
        for (uint32_t i = 0; i < n && !q.bad; i++) {
            uint32_t uid = pkvd_get_u32(&q), pid = pkvd_get_u32(&q);
            uint64_t ns = pkvd_get_u64(&q);
            uint32_t flags = pkvd_get_u32(&q), listed = pkvd_get_u32(&q);
            if (pass)
                printf("uid %u pid %u sequences %llu%s\n", uid, pid, (unsigned long long)ns,
                       flags & 1 ? " read-only" : "");
            for (uint32_t j = 0; j < listed && !q.bad; j++) {
                uint64_t cid = pkvd_get_u64(&q), did = pkvd_get_u64(&q);
                uint64_t len = pkvd_get_u64(&q), com = pkvd_get_u64(&q);
                if (pass)
                    printf("  sequence %llu (pkvd's %llu): %llu tokens, %llu committed\n",
                           (unsigned long long)cid, (unsigned long long)did,
                           (unsigned long long)len, (unsigned long long)com);
            }
            if (pass && listed < ns) printf("  (%llu more)\n", (unsigned long long)(ns - listed));
        }
        if (q.bad || q.left) {
            logf_("--status: the daemon's reply to CLIENTS is malformed (%s)",
                  q.bad ? "cut short" : "bytes left over");
            rc = -1;
        }
    }
    uint8_t *b3 = NULL;
    if (!rc) rc = status_call(fd, PKVD_STATS, &none, &b3, &rd);
    if (!rc) {
        pkv_stats st;
        if (!pkvd_get_stats(&rd, &st)) {
            logf_("--status: the daemon's reply to STATS is malformed");
            rc = -1;
        }
#define U(x) (unsigned long long)(x)
        if (!rc) {
            printf("blocks: %llu capacity, %llu free, %llu cached, %llu used\n", U(st.capacity),
                   U(st.blocks_free), U(st.blocks_cached), U(st.blocks_used));
            printf("prompts: %llu tokens hit, %llu missed\n", U(st.hit_tokens),
                   U(st.miss_tokens));
            printf("tier: %llu published (%llu dropped, %llu failed), %llu fetches, "
                   "%llu records asked, %llu found, %llu imported, %llu rejected "
                   "(%llu deleted, %llu deletions failed), %llu errors, "
                   "%llu deadlines reached, %llu redirects, %llu lookups (%llu keys "
                   "probed, %llu found)\n",
                   U(st.tier_published), U(st.tier_publish_dropped),
                   U(st.tier_publish_errors), U(st.tier_fetches), U(st.tier_fetch_blocks),
                   U(st.tier_fetch_found), U(st.tier_imported), U(st.tier_rejected),
                   U(st.tier_deleted), U(st.tier_delete_failed), U(st.tier_errors),
                   U(st.tier_deadline_misses), U(st.tier_redirects), U(st.tier_lookups),
                   U(st.tier_lookup_blocks), U(st.tier_lookup_found));
        }
#undef U
    }
    free(b1);
    free(b2);
    free(b3);
    close(fd);
    return rc ? 1 : 0;
}

static void usage(void) {
    fprintf(stderr,
            "usage: pkvd --dir DIR --socket PATH [--ready-fd N]\n"
            "            --layers N --kv-heads N --head-dim N --model-id ID --capacity N\n"
            "            [--block-size N] [--dtype f32|f16|bf16]\n"
            "            [--durability group|none|always]\n"
            "            [--socket-mode OCTAL] [--allow-uid UID]... [--salts UID=S,S...]...\n"
            "            [--allow-uid-ro UID]...   (read-only clients: lookup, open, read, close)\n"
            "            [--socket-group NAME]     (the socket's group, mode 0660)\n"
            "            [--max-clients N]         (connections at once, default 1024)\n"
            "            [--client-timeout S]      (a begun frame's bound, default 30; 0: none)\n"
            "            [--metrics HOST:PORT]   (Prometheus GET /metrics, loopback)\n"
            "            [--tier-nodes HOST:PORT,... --tier-secret-file PATH [--tier-lz4]\n"
            "             [--tier-lookup] [--tier-publish-on-hit]]\n"
            "                                (the shared prefix tier on Redis, docs/remote.md)\n"
            "            [--client-wait S]   (at startup, wait at most S seconds, default 60,\n"
            "                                 for clients of a previous pkvd to close)\n"
            "       pkvd --status --socket PATH   (the connections and counters of a running pkvd)\n"
            "Serves the cache directory DIR to pkv_connect clients on the Unix socket PATH\n"
            "(mode 0600 unless --socket-mode; only this uid and the --allow-uid ones may\n"
            "connect). docs/pkvd.md.\n");
}

static bool num(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return false;
    *out = v;
    return true;
}

/* UID=S1,S2,... (decimal) into a new rule. */
static bool parse_salts(const char *val) {
    uint64_t uid;
    const char *eq = strchr(val, '=');
    char head[32];
    if (!eq || eq == val || (size_t)(eq - val) >= sizeof head || n_rules == MAX_UIDS) return false;
    memcpy(head, val, (size_t)(eq - val));
    head[eq - val] = '\0';
    if (!num(head, &uid) || uid >= UINT32_MAX || rule_of((uid_t)uid)) return false;
    salt_rule *sr = &rules[n_rules];
    size_t cap = 1;
    for (const char *q = eq + 1; *q; q++) cap += *q == ',';
    if (!(sr->salts = calloc(cap, sizeof *sr->salts))) return false;
    char *copy = strdup(eq + 1), *save = NULL;
    size_t len = strlen(eq + 1);
    bool ok = copy != NULL && len && eq[1] != ',' && eq[len] != ',' && !strstr(eq, ",,");
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; ok && tok;
         tok = strtok_r(NULL, ",", &save))
        ok = num(tok, &sr->salts[sr->n++]);
    free(copy);
    if (!ok) {
        free(sr->salts);
        memset(sr, 0, sizeof *sr);
        return false;
    }
    sr->uid = (uid_t)uid;
    n_rules++;
    return true;
}

/* Close the sequences recovery brought back: their connections are gone. */
static int close_recovered(void) {
    size_t n = 0;
    int rc = pkv_seq_list(cache, NULL, 0, &n);
    if (rc && rc != PKV_ERANGE) return rc;
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return PKV_ENOMEM;
    if ((rc = pkv_seq_list(cache, ids, n, &n)) == 0)
        for (size_t i = 0; i < n && !rc; i++) rc = pkv_seq_close(cache, ids[i]);
    if (!rc && n) logf_("closed %zu recovered sequences (owned by connections of an "
                        "earlier run)", n);
    free(ids);
    return rc;
}

/* Rule W3 (docs/pkvd.md): the arena descriptor pkvd hands its clients is one
 * open file description, and it holds flock(LOCK_SH) on it. Every client's
 * descriptor and mapping refer to that description, so the lock lives as long
 * as any client of this daemon can still write the arena, even after the
 * daemon dies. A starting pkvd opens its own description and takes LOCK_EX on
 * it before pkv_open recovers anything: it waits until every client of an
 * earlier pkvd has unmapped the arena (or died), then downgrades to LOCK_SH
 * (the description it goes on to hand out). Returns the descriptor, -1 after
 * logging why (the wait ran past wait_s, or an I/O error); ENOENT is returned
 * as -2 with nothing logged (no arena yet: pkv_open creates it). */
static int lock_arena(const char *apath, uint64_t wait_s) {
    int fd = open(apath, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return -2;
        logf_("open %s: %s", apath, strerror(errno));
        return -1;
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t logged = 0;
    while (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            logf_("flock %s: %s", apath, strerror(errno));
            close(fd);
            return -1;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t ms = (uint64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                      (uint64_t)((now.tv_nsec - t0.tv_nsec) / 1000000);
        if (ms >= wait_s * 1000) {
            logf_("clients of a previous pkvd still map %s after %llu s (--client-wait); "
                  "end or close them (pkv_close) and start again", apath,
                  (unsigned long long)wait_s);
            close(fd);
            return -1;
        }
        if (ms >= logged) {
            logf_("waiting for the clients of a previous pkvd to close (they still map %s)",
                  apath);
            logged = ms + 5000;
        }
        struct timespec nap = {0, 50 * 1000000L};
        nanosleep(&nap, NULL);
    }
    return fd;
}

/* A socket file left by a daemon that died: nobody accepts on it. */
static void remove_stale(const struct sockaddr_un *sa) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) && errno == ECONNREFUSED)
        unlink(sa->sun_path);
    close(fd);
}

/* Join the finished connections (all: every connection, each shut down first).
 * The records are unlinked under conns_mu and joined outside it: a connection
 * thread may be waiting for conns_mu (a CLIENTS request), and a join under the
 * lock would wait for it forever. Only this thread unlinks, so an unlinked
 * record is no other thread's to read. */
static void reap(bool all) {
    conn *mine = NULL;
    pthread_mutex_lock(&conns_mu);
    for (conn **pp = &conns; *pp;) {
        conn *k = *pp;
        if (all || atomic_load(&k->finished)) {
            *pp = k->next;
            k->next = mine;
            mine = k;
        } else {
            pp = &k->next;
        }
    }
    pthread_mutex_unlock(&conns_mu);
    while (mine) {
        conn *k = mine;
        mine = k->next;
        if (!atomic_load(&k->finished)) shutdown(k->fd, SHUT_RDWR);
        pthread_join(k->th, NULL);
        close(k->fd);
        pthread_mutex_destroy(&k->ids_mu);
        free(k);
    }
}

/* The tier's cluster secret (docs/remote.md, "Trust model"): whoever reads it
 * can make every node of the deployment serve wrong K/V, so a file that others
 * can read or write is refused, as ssh refuses such a key. */
static int read_secret_file(const char *path, uint8_t secret[256], size_t *len) {
    /* O_NONBLOCK: a FIFO must be refused below, not wait for a writer */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return pkv_err(PKV_EIO, "--tier-secret-file %s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st))
        rc = pkv_err(PKV_EIO, "--tier-secret-file %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = pkv_err(PKV_EINVAL, "--tier-secret-file %s: not a regular file", path);
    else if (st.st_uid != geteuid() && st.st_uid != 0)
        rc = pkv_err(PKV_EINVAL, "--tier-secret-file %s: owned by uid %u, not by this user or "
                     "root", path, (unsigned)st.st_uid);
    else if (st.st_mode & 077)
        rc = pkv_err(PKV_EINVAL, "--tier-secret-file %s: mode %04o lets group or others "
                     "read or write the cluster secret (chmod 600 it)", path,
                     (unsigned)(st.st_mode & 07777));
    uint8_t extra;
    size_t n = 0;
    while (!rc && n < 256) {
        ssize_t r = read(fd, secret + n, 256 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = pkv_err(PKV_EIO, "--tier-secret-file %s: %s", path, strerror(errno));
        if (r <= 0) break;
        n += (size_t)r;
    }
    ssize_t more;
    while (!rc && n == 256 && (more = read(fd, &extra, 1)) != 0) {
        if (more < 0 && errno == EINTR) continue;
        rc = more < 0 ? pkv_err(PKV_EIO, "--tier-secret-file %s: %s", path, strerror(errno))
                      : pkv_err(PKV_EINVAL, "--tier-secret-file %s: longer than 256 bytes",
                                path);
    }
    if (!rc && n < 16)
        rc = pkv_err(PKV_EINVAL, "--tier-secret-file %s: %zu bytes, the secret needs 16..256",
                     path, n);
    close(fd);
    *len = rc ? 0 : n;
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *sock = NULL, *metrics_addr = NULL, *sock_group = NULL;
    const char *tier_nodes = NULL, *tier_secret_file = NULL;
    uint32_t tier_flags = 0; /* --tier-lz4, --tier-lookup, --tier-publish-on-hit */
    bool mode_given = false;
    bool status = false;
    uint64_t ready_fd = UINT64_MAX, v, sock_mode = 0600, client_wait = 60;
    allow_uids[n_uids++] = getuid();
    pkv_options o;
    pkv_options_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--status")) {
            status = true;
            continue;
        }
        if (!strcmp(a, "--tier-lz4") || !strcmp(a, "--tier-lookup") ||
            !strcmp(a, "--tier-publish-on-hit")) {
            tier_flags |= !strcmp(a, "--tier-lz4")      ? PKV_TIER_LZ4
                          : !strcmp(a, "--tier-lookup") ? PKV_TIER_LOOKUP
                                                        : PKV_TIER_PUBLISH_ON_HIT;
            continue;
        }
        if (!val) {
            logf_("%s needs a value", a);
            usage();
            return 2;
        }
        i++;
        bool ok = true;
        if (!strcmp(a, "--dir")) dir = val;
        else if (!strcmp(a, "--socket")) sock = val;
        else if (!strcmp(a, "--model-id")) o.model_id = val;
        else if (!strcmp(a, "--metrics")) metrics_addr = val;
        else if (!strcmp(a, "--tier-nodes")) tier_nodes = val;
        else if (!strcmp(a, "--tier-secret-file")) tier_secret_file = val;

        else if (!strcmp(a, "--ready-fd")) ok = num(val, &ready_fd) && ready_fd <= INT32_MAX;
        else if (!strcmp(a, "--layers")) ok = num(val, &v) && v <= UINT32_MAX && (o.num_layers = (uint32_t)v, 1);
        else if (!strcmp(a, "--kv-heads")) ok = num(val, &v) && v <= UINT32_MAX && (o.num_kv_heads = (uint32_t)v, 1);
        else if (!strcmp(a, "--head-dim")) ok = num(val, &v) && v <= UINT32_MAX && (o.head_dim = (uint32_t)v, 1);
        else if (!strcmp(a, "--block-size")) ok = num(val, &v) && v <= UINT32_MAX && (o.block_size = (uint32_t)v, 1);
        else if (!strcmp(a, "--capacity")) ok = num(val, &o.capacity);
        else if (!strcmp(a, "--client-wait")) ok = num(val, &client_wait) && client_wait <= 86400;
        else if (!strcmp(a, "--allow-uid"))
            ok = num(val, &v) && v < UINT32_MAX && n_uids < MAX_UIDS &&
                 (allow_uids[n_uids++] = (uid_t)v, 1);
        else if (!strcmp(a, "--allow-uid-ro"))
            ok = num(val, &v) && v < UINT32_MAX && n_ro_uids < MAX_UIDS &&
                 (ro_uids[n_ro_uids++] = (uid_t)v, 1);
        else if (!strcmp(a, "--salts")) ok = parse_salts(val);
        else if (!strcmp(a, "--socket-group")) sock_group = val;
        else if (!strcmp(a, "--max-clients")) ok = num(val, &max_clients) && max_clients >= 1 &&
                                                   max_clients <= 65536;
        else if (!strcmp(a, "--client-timeout")) ok = num(val, &client_timeout) &&
                                                      client_timeout <= 86400;
        else if (!strcmp(a, "--socket-mode")) {
            char *end;
            errno = 0;
            sock_mode = strtoull(val, &end, 8);
            ok = !errno && end != val && !*end && sock_mode <= 0777;
            mode_given = true;
        }
        else if (!strcmp(a, "--dtype")) {
            if (!strcmp(val, "f32")) o.dtype = PKV_F32;
            else if (!strcmp(val, "f16")) o.dtype = PKV_F16;
            else if (!strcmp(val, "bf16")) o.dtype = PKV_BF16;
            else ok = false;
        } else if (!strcmp(a, "--durability")) {
            if (!strcmp(val, "group")) o.durability = PKV_DURABLE_GROUP;
            else if (!strcmp(val, "none")) o.durability = PKV_DURABLE_NONE;
            else if (!strcmp(val, "always")) o.durability = PKV_DURABLE_ALWAYS;
            else ok = false;
        } else {
            logf_("unknown option %s", a);
            usage();
            return 2;
        }
        if (!ok) {
            logf_("bad value for %s: '%s'", a, val);
            return 2;
        }
    }
    if (!sock || (!dir && !status)) {
        usage();
        return 2;
    }
    gid_t sock_gid = (gid_t)-1;
    if (sock_group) { /* a name, as chgrp takes */
        struct group *g = getgrnam(sock_group);
        if (!g) {
            logf_("--socket-group %s: no such group", sock_group);
            return 2;
        }
        sock_gid = g->gr_gid;
        if (!mode_given) sock_mode = 0660;
    }
    /* A read-only descriptor confines only a uid that cannot open the arena
     * itself (docs/pkvd.md, "What the data plane trusts"). */
    for (size_t i = 0; i < n_ro_uids; i++)
        if (uid_allowed(ro_uids[i])) {
            logf_("--allow-uid-ro %u: that uid is already allowed read-write (%s)",
                  (unsigned)ro_uids[i],
                  ro_uids[i] == getuid() ? "it is pkvd's own uid, which owns the arena"
                                         : "--allow-uid");
            return 2;
        }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sa.sun_path) {
        logf_("socket path longer than %zu bytes", sizeof sa.sun_path - 1);
        return 2;
    }
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    if (status) {
        for (size_t i = 0; i < n_rules; i++) free(rules[i].salts);
        return status_main(&sa);
    }
    char apath[4200];
    if (snprintf(apath, sizeof apath, "%s/arena", dir) >= (int)sizeof apath) {
        logf_("--dir path too long");
        return 2;
    }
    /* A pkvd that still serves DIR holds the arena's lock too: say so now rather
     * than wait for its clients (pkv_open checks this again, race-free). */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0 && flock(dfd, LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK) {
        logf_("%s is open elsewhere (another pkvd or writer serves it)", dir);
        close(dfd);
        return 1;
    }
    if (dfd >= 0) close(dfd);
    arena_fd = lock_arena(apath, client_wait); /* rule W3: before any recovery */
    if (arena_fd == -1) return 1;
    int rc = pkv_open(dir, &o, &cache);
    if (rc) {
        logf_("pkv_open %s: %s (%s)", dir, pkv_strerror(rc), pkv_last_error());
        if (arena_fd >= 0) close(arena_fd);
        return 1;
    }
    /* A new arena (none before, or pkv_open replaced it): lock the file now in
     * use; no client can map it yet, so this does not wait. */
    struct stat s_lock, s_now;
    if (arena_fd >= 0 && (fstat(arena_fd, &s_lock) || stat(apath, &s_now) ||
                          s_lock.st_ino != s_now.st_ino || s_lock.st_dev != s_now.st_dev)) {
        close(arena_fd);
        arena_fd = -2;
    }
    if (arena_fd == -2) arena_fd = lock_arena(apath, client_wait);
    if (arena_fd < 0 || flock(arena_fd, LOCK_SH)) {
        if (arena_fd >= 0) logf_("flock %s: %s", apath, strerror(errno));
        else if (arena_fd == -2) logf_("%s: missing after pkv_open", apath);
        pkv_close(cache);
        if (arena_fd >= 0) close(arena_fd);
        return 1;
    }
    /* The read-only description, locked like the read-write one (rule W3). */
    struct stat s_ro;
    arena_ro_fd = open(apath, O_RDONLY | O_CLOEXEC);
    if (arena_ro_fd < 0 || flock(arena_ro_fd, LOCK_SH) || fstat(arena_ro_fd, &s_ro) ||
        fstat(arena_fd, &s_lock) || s_ro.st_ino != s_lock.st_ino || s_ro.st_dev != s_lock.st_dev) {
        logf_("read-only open of %s: %s", apath, arena_ro_fd < 0 ? strerror(errno) : "not the arena");
        pkv_close(cache);
        return 1;
    }
    if ((rc = pkv_info(cache, &info)) || (rc = close_recovered())) {
        logf_("startup: %s (%s)", pkv_strerror(rc), pkv_last_error());
        pkv_close(cache);
        return 1;
    }
    /* The shared prefix tier (docs/remote.md): attached before any client can
     * call (pkv_tier_attach must not run concurrently with other calls). */
    if (tier_nodes || tier_secret_file || tier_flags) {
        uint8_t secret[256];
        size_t slen = 0;
        pkv_tier_options to;
        memset(&to, 0, sizeof to);
        to.nodes = tier_nodes;
        to.secret = secret;
        to.flags = tier_flags;
        if (!tier_nodes || !tier_secret_file)
            rc = pkv_err(PKV_EINVAL, "--tier-nodes needs --tier-secret-file (a readable file "
                         "of 16..256 bytes) and back; --tier-lz4, --tier-lookup and "
                         "--tier-publish-on-hit need both");
        else if (!(rc = read_secret_file(tier_secret_file, secret, &slen))) {
            to.secret_len = slen;
            rc = pkv_tier_attach(cache, &to);
        }
        explicit_bzero(secret, sizeof secret);
        if (rc) {
            logf_("--tier-nodes: %s (%s)", pkv_strerror(rc), pkv_last_error());
            pkv_close(cache);
            return 1;
        }
        logf_("shared prefix tier on %s", tier_nodes);
    }
    /* The cache's metrics (pkv_metrics_serve, docs/metrics.md): the daemon's
     * handle is the only one with counters, so its endpoint is the service's. */
    pkv_metrics_server *msrv = NULL;
    if (metrics_addr) {
        if ((rc = pkv_metrics_serve(cache, metrics_addr, &msrv))) {
            logf_("--metrics %s: %s (%s)", metrics_addr, pkv_strerror(rc), pkv_last_error());
            pkv_close(cache);
            return 1;
        }
        logf_("metrics on http://%s/metrics (port %d)", metrics_addr, pkv_metrics_port(msrv));
    }
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (arena_fd < 0 || lfd < 0 || pipe2(sig_pipe, O_CLOEXEC)) {
        logf_("startup: %s", strerror(errno));
        pkv_metrics_stop(msrv);
        pkv_close(cache);
        return 1;
    }
    remove_stale(&sa);
    mode_t old = umask(0177); /* the socket file is created 0600 */
    int brc = bind(lfd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    /* the group first, so the group's bits never apply to another group */
    if (!brc && sock_group) brc = chown(sock, (uid_t)-1, sock_gid);
    if (!brc && sock_mode != 0600) brc = chmod(sock, (mode_t)sock_mode);
    if (brc || listen(lfd, 64)) {
        logf_("listen on %s: %s", sock, strerror(errno));
        pkv_metrics_stop(msrv);
        pkv_close(cache);
        return 1;
    }
    struct sigaction act = {.sa_handler = on_signal};
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    signal(SIGPIPE, SIG_IGN);
    logf_("serving %s on %s (capacity %llu blocks)", dir, sock,
          (unsigned long long)info.capacity);
    if (ready_fd != UINT64_MAX) {
        ssize_t k = write((int)ready_fd, "READY\n", 6);
        close((int)ready_fd);
        if (k != 6) logf_("--ready-fd %llu: %s", (unsigned long long)ready_fd, strerror(errno));
    }
    for (;;) {
        struct pollfd p[2] = {{.fd = lfd, .events = POLLIN}, {.fd = sig_pipe[0], .events = POLLIN}};
        if (poll(p, 2, 1000) < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        reap(false);
        if (!(p[0].revents & POLLIN)) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) ||
            (!uid_allowed(cr.uid) && !uid_ro(cr.uid))) {
            logf_("refused a connection from uid %d (not in --allow-uid or --allow-uid-ro)",
                  (int)cr.uid);
            close(fd);
            continue;
        }
        conn *k = calloc(1, sizeof *k);
        if (!k) {
            close(fd);
            continue;
        }
        k->fd = fd;
        pthread_mutex_init(&k->ids_mu, NULL);
        k->salts = rule_of(cr.uid);
        k->uid = cr.uid;
        k->pid = cr.pid;
        k->rdonly = uid_ro(cr.uid);
        /* Bounded per-connection waits: a begun frame and a reply in
         * --client-timeout; a refused client's HELLO in a second. */
        struct timeval tv = {.tv_sec = (time_t)client_timeout};
        if (client_timeout && (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
                    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv)))
            logf_("setsockopt timeouts: %s", strerror(errno));
        pthread_mutex_lock(&conns_mu);
        size_t live = 0;
        for (const conn *q = conns; q; q = q->next) live += !atomic_load(&q->finished);
        if (live >= max_clients + REFUSING_MAX) { /* a flood: no thread for it */
            pthread_mutex_unlock(&conns_mu);
            close(fd);
            pthread_mutex_destroy(&k->ids_mu);
            free(k);
            continue;
        }
        if (live >= max_clients) {
            k->refuse = true;
            struct timeval one = {.tv_sec = 1};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &one, sizeof one);
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &one, sizeof one);
        }
        if (pthread_create(&k->th, NULL, conn_main, k)) {
            pthread_mutex_unlock(&conns_mu);
            close(fd);
            pthread_mutex_destroy(&k->ids_mu);
            free(k);
            continue;
        }
        k->next = conns;
        conns = k;
        pthread_mutex_unlock(&conns_mu);
    }
    logf_("shutting down");
    close(lfd);
    unlink(sock);
    atomic_store(&stopping, true);
    reap(true); /* every connection ends; nothing is released (rule W2) */
    if ((rc = pkv_checkpoint(cache))) logf_("checkpoint: %s", pkv_last_error());
    pkv_metrics_stop(msrv);
    pkv_close(cache);
    close(arena_fd);
    close(arena_ro_fd);
    for (size_t i = 0; i < n_rules; i++) free(rules[i].salts);
    return 0;
}
