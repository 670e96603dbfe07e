/*
 * remote.c — the client side of pkvd (docs/pkvd.md): pkv_connect, and the
 * forms of the public calls that a connected handle forwards to the daemon.
 *
 * Owns a connected handle's socket, its request counter and its mapping of the
 * arena file (received with SCM_RIGHTS at HELLO). A connected pkv_cache has
 * `remote` set and only the arena part filled (geometry, model id, mapping), so
 * pkv_kv, pkv_kv_view_of and pkv_info work on it unchanged and return
 * addresses in this process's own mapping; every other call that has a remote
 * form forwards here after its own argument checks (so errors come in the
 * documented order), and the calls without one return PKV_ENOTSUP.
 * Invariants:
 *  - one request is in flight per handle (the handle's mutex is held from the
 *    send to the end of the reply), so replies pair with requests by order, and
 *    the echoed request number checks it;
 *  - every reply is length-checked like a request (pkvd_hdr_get, pkvd_rd): a
 *    short, oversized or mismatched reply, or any send/receive failure, marks
 *    the handle dead, and every later call returns PKV_EDISCONNECTED; so does
 *    a slot outside the geometry (the caller writes K/V where a slot says);
 *  - the mapping covers exactly data_offset + capacity * slot_bytes bytes of a
 *    file at least that long, with a geometry recomputed here from the
 *    daemon's figures and required to match them.
 */
#include "internal.h"
#include "wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct pkv_remote {
    int fd;
    pthread_mutex_t mu;
    uint32_t req;
    bool dead;
    bool rdonly; /* the daemon passed an O_RDONLY arena: mapped PROT_READ */
};

static int dead(pkv_remote *r, const char *what, int err) {
    r->dead = true;
    return pkv_err(PKV_EDISCONNECTED, "pkvd connection lost (%s: %s)", what,
                   err ? strerror(err) : "end of stream");
}

static int send_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k < 0 ? errno : EPIPE;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Header and payload in one sendmsg (one wake-up of the daemon), the rest of a
 * partial send piece by piece. 0 or an errno. */
static int send2(int fd, const uint8_t h[PKVD_HDR], const uint8_t *p, size_t n) {
    struct iovec iov[2] = {{.iov_base = (void *)h, .iov_len = PKVD_HDR},
                           {.iov_base = (void *)p, .iov_len = n}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = n ? 2 : 1};
    ssize_t k;
    do k = sendmsg(fd, &m, MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0) return errno;
    size_t sent = (size_t)k;
    if (sent < PKVD_HDR) {
        int e = send_all(fd, h + sent, PKVD_HDR - sent);
        if (e) return e;
        sent = PKVD_HDR;
    }
    return n ? send_all(fd, p + (sent - PKVD_HDR), n - (sent - PKVD_HDR)) : 0;
}

/* Read n bytes; a descriptor passed with them (SCM_RIGHTS) goes to *fd_out
 * (if not NULL; else it is closed). 0, or an errno (0 bytes at EOF: -1). */
static int recv_all(int fd, uint8_t *p, size_t n, int *fd_out) {
    while (n) {
        struct iovec iov = {.iov_base = p, .iov_len = n};
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int))];
        } cm;
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
                           .msg_controllen = sizeof cm.b};
        ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno;
        if (k == 0) return -1;
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
            if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
            int got;
            memcpy(&got, CMSG_DATA(h), sizeof got);
            if (fd_out && *fd_out < 0) *fd_out = got;
            else close(got);
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One round trip: send `op` with payload w, receive its reply into *buf (the
 * caller frees it) positioned after rc in *rd. Returns the reply's rc (its
 * message made pkv_last_error), or PKV_EDISCONNECTED / PKV_ENOMEM. The caller
 * holds r->mu. */
static int call_locked(pkv_remote *r, uint16_t op, const pkvd_wr *w, uint8_t **buf,
                       pkvd_rd *rd, int *fd_out) {
    *buf = NULL;
    if (r->dead) return pkv_err(PKV_EDISCONNECTED, "pkvd connection was lost earlier");
    if (w->oom) return pkv_err(PKV_ENOMEM, "request of op %u", op);
    if (w->len > PKVD_MAX_PAYLOAD)
        return pkv_err(PKV_ERANGE, "request of %zu bytes exceeds pkvd's %u", w->len,
                       PKVD_MAX_PAYLOAD);
    uint8_t h[PKVD_HDR];
    uint32_t req = ++r->req;
    pkvd_hdr_put(h, op, (uint32_t)w->len, req);
    int e = send2(r->fd, h, w->p, w->len);
    if (e) return dead(r, "send", e);
    e = recv_all(r->fd, h, sizeof h, fd_out);
    if (e) return dead(r, "receive", e < 0 ? 0 : e);
    pkvd_hdr hd;
    if (pkvd_hdr_get(h, &hd, true, op) || hd.req != req || hd.len < 4) {
        r->dead = true;
        return pkv_err(PKV_EDISCONNECTED, "pkvd sent a malformed reply to op %u", op);
    }
    uint8_t *b = malloc(hd.len);
    if (!b) {
        r->dead = true; /* the stream position is lost with the unread reply */
        return pkv_err(PKV_ENOMEM, "reply of %u bytes", hd.len);
    }
    e = recv_all(r->fd, b, hd.len, NULL);
    if (e) {
        free(b);
        return dead(r, "receive", e < 0 ? 0 : e);
    }
    *buf = b;
    *rd = (pkvd_rd){.p = b, .left = hd.len};
    int rc = (int32_t)pkvd_get_u32(rd);
    if (hd.version != PKVD_VERSION) {
        /* Only a HELLO's reply gets here (pkvd_hdr_get): a daemon of another
         * release. Its refusal (rc and message: the same in every version) is
         * read; nothing else of its reply is, nor any later frame. */
        r->dead = true;
        uint16_t ml = rc ? pkvd_get_u16(rd) : 0;
        const uint8_t *m = rc ? pkvd_get_bytes(rd, ml) : NULL;
        return pkv_err(PKV_EVERSION, "pkvd speaks protocol version %u, expected %u (a pkvd "
                       "of another pagedkv release%s%.*s)", hd.version, PKVD_VERSION,
                       m ? "; it said: " : "", m ? (int)ml : 0, m ? (const char *)m : "");
    }
    if (rc == 0) return 0;
    if (rc < PKV_ERR_LAST || rc > PKV_ERR_FIRST) rc = PKV_ECORRUPT;
    uint16_t ml = pkvd_get_u16(rd);
    const uint8_t *m = pkvd_get_bytes(rd, ml);
    return pkv_err(rc, "%.*s", m ? (int)ml : 0, m ? (const char *)m : "");
}

/* A reply whose results did not have the expected size: the daemon and client
 * disagree about the protocol, so nothing more on the stream is trusted. */
static int bad_reply(pkv_remote *r, uint16_t op) {
    r->dead = true;
    return pkv_err(PKV_EDISCONNECTED, "pkvd's reply to op %u has the wrong size", op);
}

/* call_locked with the mutex taken; the reply must then be consumed and freed
 * by the caller, which releases the mutex with done(). */
static int call(pkv_remote *r, uint16_t op, pkvd_wr *w, uint8_t **buf, pkvd_rd *rd) {
    pthread_mutex_lock(&r->mu);
    int rc = call_locked(r, op, w, buf, rd, NULL);
    pkvd_wr_free(w);
    return rc;
}
static int done(pkv_remote *r, uint8_t *buf, int rc) {
    free(buf);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void put_tokens(pkvd_wr *w, const uint32_t *t, size_t n) {
    pkvd_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) pkvd_put_u32(w, t[i]);
}

static int too_many(size_t n, const char *what, uint32_t limit) {
    return pkv_err(PKV_ERANGE, "%zu %s exceed pkvd's limit of %u per call", n, what, limit);
}

/* ---- Connecting ----------------------------------------------------------- */

static int hello(pkv_cache *c, pkv_remote *r, bool want_ro) {
    pkvd_wr w = {0};
    pkvd_put_u16(&w, PKVD_VERSION);
    pkvd_put_u16(&w, PKVD_VERSION);
    pkvd_put_u32(&w, want_ro ? PKVD_HELLO_RDONLY : 0);
    uint8_t *buf;
    pkvd_rd rd;
    int afd = -1;
    pthread_mutex_lock(&r->mu);
    int rc = call_locked(r, PKVD_HELLO, &w, &buf, &rd, &afd);
    pthread_mutex_unlock(&r->mu);
    pkvd_wr_free(&w);
    if (rc) goto out;
    pkv_options o;
    pkv_options_init(&o);
    uint16_t ver = pkvd_get_u16(&rd);
    o.num_layers = pkvd_get_u32(&rd);
    o.num_kv_heads = pkvd_get_u32(&rd);
    o.head_dim = pkvd_get_u32(&rd);
    o.block_size = pkvd_get_u32(&rd);
    o.dtype = (pkv_dtype)pkvd_get_u32(&rd);
    uint32_t elem = pkvd_get_u32(&rd);
    o.capacity = pkvd_get_u64(&rd);
    uint64_t block_bytes = pkvd_get_u64(&rd), slot_bytes = pkvd_get_u64(&rd),
             run_bytes = pkvd_get_u64(&rd);
    uint16_t ml = pkvd_get_u16(&rd);
    const uint8_t *mid = pkvd_get_bytes(&rd, ml);
    uint64_t data_offset = pkvd_get_u64(&rd);
    if (ver != PKVD_VERSION) {
        r->dead = true;
        rc = pkv_err(PKV_EVERSION, "pkvd agreed on protocol version %u, expected %u", ver,
                     PKVD_VERSION);
        goto out;
    }
    if (rd.bad || rd.left || ml == 0 || ml > PKV_MODEL_ID_MAX || afd < 0) {
        rc = bad_reply(r, PKVD_HELLO);
        goto out;
    }
    pkv_arena *a = &c->arena;
    memcpy(a->model_id, mid, ml);
    a->model_id[ml] = '\0';
    o.model_id = a->model_id;
    if ((rc = pkv_geometry_from_options(&o, &a->geo))) goto out;
    /* The stride is the daemon's arena's: either legal one (version 1 or 2). */
    if (a->geo.elem_size != elem || a->geo.block_bytes != block_bytes ||
        !pkv_slot_bytes_legal(pkv_arena_version(block_bytes, slot_bytes), block_bytes,
                              slot_bytes) ||
        a->geo.run_bytes != run_bytes || data_offset != PKV_PAGE) {
        rc = pkv_err(PKV_EGEOMETRY, "pkvd's geometry does not derive as this library's");
        goto out;
    }
    a->geo.slot_bytes = slot_bytes;
    struct stat st;
    uint64_t need = data_offset + a->geo.capacity * a->geo.slot_bytes;
    if (fstat(afd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < need) {
        rc = pkv_err(PKV_ECORRUPT, "the arena pkvd passed is not a file of %llu bytes",
                     (unsigned long long)need);
        goto out;
    }
    /* The descriptor's access mode says whether this connection is read-only
     * (asked for, or pkvd --allow-uid-ro): then the mapping is PROT_READ, the
     * only one the kernel allows. A read-write descriptor after a read-only
     * request means the daemon did not honour it: refused. */
    int fl = fcntl(afd, F_GETFL);
    r->rdonly = fl >= 0 && (fl & O_ACCMODE) == O_RDONLY;
    if (want_ro && !r->rdonly) {
        r->dead = true;
        rc = pkv_err(PKV_EDISCONNECTED, "pkvd passed a writable arena to a read-only "
                     "connect (a daemon without read-only connections)");
        goto out;
    }
    void *m = mmap(NULL, need, r->rdonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED,
                   afd, 0);
    if (m == MAP_FAILED) {
        rc = pkv_err(errno == ENOMEM ? PKV_ENOMEM : PKV_EIO, "mmap of the arena: %s",
                     strerror(errno));
        goto out;
    }
    /* The stride and geometry every slot address is computed from
     * are the file's own (format.md, "Header page"), whatever the daemon said. */
    a->data_offset = data_offset;
    if ((rc = pkv_arena_check_header(a, m, "the arena pkvd passed"))) {
        munmap(m, need);
        r->dead = true;
        goto out;
    }
    a->map = m;
    a->map_len = need;
    a->fd = afd;
    a->valid_blocks = a->geo.capacity;
    afd = -1;
out:
    if (afd >= 0) close(afd);
    free(buf);
    return rc;
}

static int connect_as(const char *path, pkv_cache **out, bool want_ro) {
    if (!out) return pkv_err(PKV_EINVAL, "out is NULL");
    *out = NULL;
    pkv_err_clear();
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path || !path[0] || strlen(path) >= sizeof sa.sun_path)
        return pkv_err(PKV_EINVAL, "socket path is NULL, empty or longer than %zu bytes",
                       sizeof sa.sun_path - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    pkv_cache *c = aligned_alloc(_Alignof(pkv_cache), sizeof *c);
    pkv_remote *r = calloc(1, sizeof *r);
    if (!c || !r) {
        free(c);
        free(r);
        return pkv_err(PKV_ENOMEM, "connected handle");
    }
    memset(c, 0, sizeof *c);
    c->arena.fd = c->arena.lock_fd = c->arena.dir_fd = -1;
    c->remote = r;
    c->rdonly = true; /* the gate PKV_REMOTE tests first (internal.h) */
    pthread_mutex_init(&r->mu, NULL);
    r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc;
    if (r->fd < 0) {
        rc = pkv_err(PKV_EIO, "socket: %s", strerror(errno));
    } else if (connect(r->fd, (struct sockaddr *)&sa, sizeof sa)) {
        rc = pkv_err(PKV_EDISCONNECTED, "connect to %s: %s", path, strerror(errno));
    } else {
        rc = hello(c, r, want_ro);
    }
    if (rc) {
        pkv_remote_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int pkv_connect(const char *path, pkv_cache **out) { return connect_as(path, out, false); }

int pkv_connect_rdonly(const char *path, pkv_cache **out) {
    return connect_as(path, out, true);
}

void pkv_remote_close(pkv_cache *c) {
    pkv_remote *r = c->remote;
    /* The arena first (docs/pkvd.md, rules W1 and W3): pkvd reuses this
     * connection's blocks once the socket closes, and a restarted pkvd recovers
     * once no descriptor or mapping of the arena it handed out is left. */
    if (c->arena.map) munmap(c->arena.map, c->arena.map_len);
    if (c->arena.fd >= 0) close(c->arena.fd);
    if (r->fd >= 0) close(r->fd); /* pkvd releases this connection's sequences */
    pthread_mutex_destroy(&r->mu);
    free(r);
    free(c);
}

/* ---- The forwarded calls ---------------------------------------------------- */

int pkv_remote_lookup(pkv_cache *c, uint64_t salt, const uint32_t *prompt, size_t n,
                      size_t *n_cached) {
    if (n > PKVD_MAX_TOKENS) return too_many(n, "tokens", PKVD_MAX_TOKENS);
    pkvd_wr w = {0};
    pkvd_put_u64(&w, salt);
    put_tokens(&w, prompt, n);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, PKVD_LOOKUP, &w, &buf, &rd);
    if (!rc) {
        uint64_t k = pkvd_get_u64(&rd);
        if (rd.bad || rd.left || k > n) rc = bad_reply(c->remote, PKVD_LOOKUP);
        else *n_cached = (size_t)k;
    }
    return done(c->remote, buf, rc);
}

int pkv_remote_seq_open(pkv_cache *c, uint64_t id, uint64_t salt, const uint32_t *prompt,
                        size_t n, size_t *n_cached) {
    if (n > PKVD_MAX_TOKENS) return too_many(n, "tokens", PKVD_MAX_TOKENS);
    pkvd_wr w = {0};
    pkvd_put_u64(&w, id);
    pkvd_put_u64(&w, salt);
    put_tokens(&w, prompt, n);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, PKVD_SEQ_OPEN, &w, &buf, &rd);
    if (!rc) {
        uint64_t k = pkvd_get_u64(&rd);
        if (rd.bad || rd.left || k > n) rc = bad_reply(c->remote, PKVD_SEQ_OPEN);
        else if (n_cached) *n_cached = (size_t)k;
    }
    return done(c->remote, buf, rc);
}

/* The slots of a reply. The caller writes K/V at pkv_kv(block) + offset, so a
 * slot outside the geometry (block >= capacity, offset >= block size) is a
 * malformed reply: a broken or hostile daemon cannot make this process write
 * outside its mapping of the arena, or into a neighbouring block's runs. */
static int read_slots(const pkv_cache *c, uint16_t op, pkvd_rd *rd, pkv_slot *slots, size_t n) {
    if (rd->left != n * 8) return bad_reply(c->remote, op);
    const pkv_geometry *g = &c->arena.geo;
    for (size_t i = 0; i < n; i++) {
        slots[i].block = pkvd_get_u32(rd);
        slots[i].offset = pkvd_get_u32(rd);
        if (slots[i].block >= g->capacity || slots[i].offset >= g->block_size)
            return bad_reply(c->remote, op);
    }
    return 0;
}

int pkv_remote_commit_append(pkv_cache *c, uint64_t id, size_t n_commit,
                             const uint32_t *tokens, size_t n, pkv_slot *slots) {
    if (n > PKVD_MAX_SLOTS) return too_many(n, "appended tokens", PKVD_MAX_SLOTS);
    pkvd_wr w = {0};
    uint16_t op = n_commit == 0 ? PKVD_APPEND : n == 0 ? PKVD_COMMIT : PKVD_COMMIT_APPEND;
    pkvd_put_u64(&w, id);
    if (op != PKVD_APPEND) pkvd_put_u64(&w, n_commit);
    if (op != PKVD_COMMIT) put_tokens(&w, tokens, n);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, op, &w, &buf, &rd);
    if (!rc) rc = read_slots(c, op, &rd, slots, n);
    return done(c->remote, buf, rc);
}

int pkv_remote_step_batch(pkv_cache *c, pkv_step *steps, size_t n, size_t *done_out) {
    if (n > PKVD_MAX_STEPS)
        return pkv_err(PKV_ERANGE, "a batch of %zu steps exceeds pkvd's %u", n, PKVD_MAX_STEPS);
    pkvd_wr w = {0};
    pkvd_put_u32(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        pkvd_put_u64(&w, steps[i].id);
        pkvd_put_u32(&w, steps[i].n_commit);
        pkvd_put_u32(&w, steps[i].token);
    }
    uint8_t *buf;
    pkvd_rd rd;
    pkv_remote *r = c->remote;
    int rc = call(r, PKVD_STEP_BATCH, &w, &buf, &rd);
    /* success and a failing step both carry done and the done steps' slots */
    if (buf && (rc == 0 || rc != PKV_EDISCONNECTED)) {
        char why[512];
        snprintf(why, sizeof why, "%s", pkv_last_error());
        uint32_t k = pkvd_get_u32(&rd);
        if (rd.bad || k > n || (rc == 0 && k != n)) {
            rc = bad_reply(r, PKVD_STEP_BATCH);
        } else {
            pkv_slot *tmp = malloc((k ? k : 1) * sizeof *tmp);
            int e = tmp ? read_slots(c, PKVD_STEP_BATCH, &rd, tmp, k)
                        : pkv_err(PKV_ENOMEM, "slots");
            if (e) {
                rc = e;
            } else {
                for (uint32_t i = 0; i < k; i++) steps[i].slot = tmp[i];
                if (done_out) *done_out = k;
                if (rc) pkv_err(rc, "%s", why);
            }
            free(tmp);
        }
    }
    return done(r, buf, rc);
}

static int simple(pkv_cache *c, uint16_t op, uint64_t a, uint64_t b, int nargs) {
    pkvd_wr w = {0};
    if (nargs > 0) pkvd_put_u64(&w, a);
    if (nargs > 1) pkvd_put_u64(&w, b);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, op, &w, &buf, &rd);
    if (!rc && rd.left) rc = bad_reply(c->remote, op);
    return done(c->remote, buf, rc);
}

int pkv_remote_fork(pkv_cache *c, uint64_t parent, uint64_t child) {
    return simple(c, PKVD_FORK, parent, child, 2);
}
int pkv_remote_truncate(pkv_cache *c, uint64_t id, size_t new_len) {
    return simple(c, PKVD_TRUNCATE, id, new_len, 2);
}
int pkv_remote_seq_close(pkv_cache *c, uint64_t id) { return simple(c, PKVD_CLOSE, id, 0, 1); }
int pkv_remote_sync(pkv_cache *c) { return simple(c, PKVD_SYNC, 0, 0, 0); }

int pkv_remote_get_info(pkv_cache *c, uint64_t id, pkv_seq_info *out) {
    pkvd_wr w = {0};
    pkvd_put_u64(&w, id);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, PKVD_INFO, &w, &buf, &rd);
    if (!rc) {
        pkv_seq_info si;
        si.len = pkvd_get_u64(&rd);
        si.committed = pkvd_get_u64(&rd);
        si.n_blocks = pkvd_get_u64(&rd);
        si.salt = pkvd_get_u64(&rd);
        if (rd.bad || rd.left) rc = bad_reply(c->remote, PKVD_INFO);
        else *out = si;
    }
    return done(c->remote, buf, rc);
}

/* BLOCKS and TOKENS: u64 n, then min(n, cap) entries; rc PKV_ERANGE when cap < n
 * (the entries still come). */
int pkv_remote_list(pkv_cache *c, bool tokens, uint64_t id, uint32_t *out, size_t cap,
                    size_t *n) {
    uint16_t op = tokens ? PKVD_TOKENS : PKVD_BLOCKS;
    uint32_t wcap = cap > PKVD_MAX_LIST ? PKVD_MAX_LIST : (uint32_t)cap;
    pkvd_wr w = {0};
    pkvd_put_u64(&w, id);
    pkvd_put_u32(&w, wcap);
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, op, &w, &buf, &rd);
    if (buf && (rc == 0 || rc == PKV_ERANGE)) {
        char why[512];
        snprintf(why, sizeof why, "%s", pkv_last_error());
        uint64_t total = pkvd_get_u64(&rd);
        uint64_t m = total < wcap ? total : wcap;
        if (rd.bad || rd.left != m * 4 || (rc == 0) != (total <= wcap)) {
            rc = bad_reply(c->remote, op);
        } else {
            for (uint64_t i = 0; i < m; i++) out[i] = pkvd_get_u32(&rd);
            if (n) *n = (size_t)total;
            if (rc) pkv_err(rc, "%s", why);
        }
    }
    return done(c->remote, buf, rc);
}

int pkv_remote_stats(pkv_cache *c, pkv_stats *out) {
    pkvd_wr w = {0};
    uint8_t *buf;
    pkvd_rd rd;
    int rc = call(c->remote, PKVD_STATS, &w, &buf, &rd);
    if (!rc) {
        pkv_stats st;
        if (!pkvd_get_stats(&rd, &st)) rc = bad_reply(c->remote, PKVD_STATS);
        else *out = st;
    }
    return done(c->remote, buf, rc);
}
