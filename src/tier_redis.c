/*
 * tier_redis.c — a small Redis Cluster client over hiredis 0.14 (which has no
 * cluster support): seed nodes, the slot map from CLUSTER SLOTS, one blocking
 * connection per node, pipelined GET/SET/EXISTS (and a compare-and-delete
 * script) grouped by node, MOVED and ASK
 * followed once, nodes that fail marked down with exponential backoff.
 *
 * Owns its connections and slot map; one thread uses a client at a time (the
 * caller serialises: tier.c gives the publisher its own client and each
 * concurrent fetch one of a small pool). Invariant: a connection with replies
 * still owed is never reused — any error or timeout in the middle of a
 * pipeline frees it, so a late reply can never be taken for another command's.
 * Deadlines: every connect, write and recv gets the time left until the
 * caller's deadline as its socket timeout (at least 1 ms) and no recv starts
 * after it, so a slow or dead node costs at most the deadline (plus 1 ms).
 * A standalone server (CLUSTER SLOTS refused: cluster support disabled) serves
 * every slot.
 */
#include "tier.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <sys/socket.h>

#define RC_MAX_NODES 64
#define RC_NSLOTS 16384
#define RC_NOSLOT 0xff
enum { ST_PENDING = 1, ST_ERROR = -1 };

typedef struct rc_node {
    char host[64];
    int port;
    redisContext *ctx;
    uint64_t down_until; /* ns: no connect attempt before */
    uint32_t backoff_ms;
} rc_node;

struct pkv_rc {
    pkv_rc_conf conf;
    rc_node nodes[RC_MAX_NODES];
    int nnodes, nseeds;
    bool have_map;
    uint64_t map_retry; /* ns: no map refresh before */
    uint8_t slot[RC_NSLOTS];
    char rbuf[1 << 20]; /* replies are read in 1 MiB recvs (hiredis reads 16 KiB) */
};

/* CRC16-CCITT (XMODEM), as Redis Cluster's key slot uses. */
static uint16_t crc16(const char *s, size_t n) {
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)s[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

uint32_t pkv_rc_slot(const char *key, size_t len) {
    /* a non-empty {tag}: only the tag is hashed */
    for (size_t i = 0; i < len; i++)
        if (key[i] == '{') {
            for (size_t j = i + 1; j < len; j++)
                if (key[j] == '}') {
                    if (j > i + 1) return crc16(key + i + 1, j - i - 1) & (RC_NSLOTS - 1);
                    break;
                }
            break;
        }
    return crc16(key, len) & (RC_NSLOTS - 1);
}

static int node_index(pkv_rc *rc, const char *host, size_t hlen, int port) {
    for (int i = 0; i < rc->nnodes; i++)
        if (rc->nodes[i].port == port && strlen(rc->nodes[i].host) == hlen &&
            memcmp(rc->nodes[i].host, host, hlen) == 0)
            return i;
    if (rc->nnodes == RC_MAX_NODES || hlen == 0 || hlen >= sizeof rc->nodes[0].host ||
        port <= 0 || port > 65535)
        return -1;
    rc_node *n = &rc->nodes[rc->nnodes];
    memset(n, 0, sizeof *n);
    memcpy(n->host, host, hlen);
    n->port = port;
    return rc->nnodes++;
}

/* "host:port" -> node index, or -1 */
static int node_parse(pkv_rc *rc, const char *s, size_t len) {
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':') colon = s + i;
    if (!colon) return -1;
    int port = 0;
    for (const char *p = colon + 1; p < s + len; p++) {
        if (*p < '0' || *p > '9' || port > 65535) return -1;
        port = port * 10 + (*p - '0');
    }
    return node_index(rc, s, (size_t)(colon - s), port);
}

static struct timeval tv_left(uint64_t deadline, uint32_t cap_ms) {
    uint64_t now = pkv_now_ns();
    uint64_t left = deadline > now ? deadline - now : 0;
    if (cap_ms && left > (uint64_t)cap_ms * 1000000u) left = (uint64_t)cap_ms * 1000000u;
    if (left < 1000000u) left = 1000000u; /* 0 would mean no timeout at all */
    return (struct timeval){(time_t)(left / 1000000000u), (suseconds_t)(left % 1000000000u / 1000)};
}

static void node_down(rc_node *n) {
    if (n->ctx) redisFree(n->ctx);
    n->ctx = NULL;
    n->backoff_ms = n->backoff_ms ? (n->backoff_ms >= 2500 ? 5000 : n->backoff_ms * 2) : 50;
    n->down_until = pkv_now_ns() + (uint64_t)n->backoff_ms * 1000000u;
}

/* A usable connection to node i, or NULL (down, backing off, or out of time). */
static redisContext *node_conn(pkv_rc *rc, int i, uint64_t deadline) {
    rc_node *n = &rc->nodes[i];
    if (n->ctx) return n->ctx;
    uint64_t now = pkv_now_ns();
    if (now < n->down_until || now >= deadline) return NULL;
    redisContext *ctx =
        redisConnectWithTimeout(n->host, n->port, tv_left(deadline, rc->conf.connect_timeout_ms));
    if (!ctx || ctx->err) {
        if (ctx) redisFree(ctx);
        node_down(n);
        return NULL;
    }
    n->ctx = ctx;
    if (rc->conf.password[0]) {
        redisSetTimeout(ctx, tv_left(deadline, rc->conf.connect_timeout_ms));
        redisReply *r = rc->conf.user[0]
                            ? redisCommand(ctx, "AUTH %s %s", rc->conf.user, rc->conf.password)
                            : redisCommand(ctx, "AUTH %s", rc->conf.password);
        bool ok = r && r->type == REDIS_REPLY_STATUS;
        if (r) freeReplyObject(r);
        if (!ok) {
            node_down(n);
            return NULL;
        }
    }
    n->backoff_ms = 0;
    return ctx;
}

/* Read the slot map from the first node that answers. */
static void refresh_map(pkv_rc *rc, uint64_t deadline) {
    rc->map_retry = pkv_now_ns() + 100000000u; /* at most every 100 ms */
    for (int i = 0; i < rc->nnodes && pkv_now_ns() < deadline; i++) {
        redisContext *ctx = node_conn(rc, i, deadline);
        if (!ctx) continue;
        redisSetTimeout(ctx, tv_left(deadline, 0));
        redisReply *r = redisCommand(ctx, "CLUSTER SLOTS");
        if (!r) {
            node_down(&rc->nodes[i]);
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "cluster support disabled")) {
            memset(rc->slot, i, sizeof rc->slot); /* standalone */
            rc->have_map = true;
            freeReplyObject(r);
            return;
        }
        if (r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
            memset(rc->slot, RC_NOSLOT, sizeof rc->slot);
            for (size_t k = 0; k < r->elements; k++) {
                redisReply *e = r->element[k];
                if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                    e->element[0]->type != REDIS_REPLY_INTEGER ||
                    e->element[1]->type != REDIS_REPLY_INTEGER ||
                    e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
                    e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                    e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
                    continue;
                long long lo = e->element[0]->integer, hi = e->element[1]->integer;
                redisReply *m = e->element[2];
                int ni = node_index(rc, m->element[0]->str, m->element[0]->len,
                                    (int)m->element[1]->integer);
                if (ni < 0 || lo < 0 || hi >= RC_NSLOTS || lo > hi) continue;
                memset(rc->slot + lo, ni, (size_t)(hi - lo + 1));
            }
            rc->have_map = true;
            freeReplyObject(r);
            return;
        }
        freeReplyObject(r);
    }
}

pkv_rc *pkv_rc_new(const pkv_rc_conf *conf, int *err) {
    pkv_rc *rc = calloc(1, sizeof *rc);
    if (!rc) {
        *err = pkv_err(PKV_ENOMEM, "tier client");
        return NULL;
    }
    rc->conf = *conf;
    memset(rc->slot, RC_NOSLOT, sizeof rc->slot);
    const char *s = conf->nodes;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (node_parse(rc, s, len) < 0) {
            *err = pkv_err(PKV_EINVAL, "tier node '%.*s' is not HOST:PORT", (int)len, s);
            free(rc);
            return NULL;
        }
        s += len + (e ? 1 : 0);
    }
    if (rc->nnodes == 0) {
        *err = pkv_err(PKV_EINVAL, "no tier node given");
        free(rc);
        return NULL;
    }
    rc->nseeds = rc->nnodes;
    return rc;
}

void pkv_rc_free(pkv_rc *rc) {
    if (!rc) return;
    for (int i = 0; i < rc->nnodes; i++)
        if (rc->nodes[i].ctx) redisFree(rc->nodes[i].ctx);
    free(rc);
}

/* Parse "MOVED 3999 127.0.0.1:6381" / "ASK ...": the node index, or -1. */
static int redirect_target(pkv_rc *rc, const char *msg, uint32_t *slot) {
    const char *sp = strchr(msg, ' ');
    if (!sp) return -1;
    *slot = (uint32_t)strtoul(sp + 1, NULL, 10) & (RC_NSLOTS - 1);
    const char *sp2 = strchr(sp + 1, ' ');
    if (!sp2) return -1;
    return node_parse(rc, sp2 + 1, strlen(sp2 + 1));
}

/* The next reply on ctx, reading with large recvs, each with the time left to
 * the deadline as its timeout and none begun after it: REDIS_ERR on an I/O
 * error, a protocol error, end of stream or the deadline. */
static int get_reply(pkv_rc *rc, redisContext *ctx, redisReply **out, uint64_t deadline) {
    void *r = NULL;
    if (redisReaderGetReply(ctx->reader, &r) != REDIS_OK) return REDIS_ERR;
    while (!r) {
        if (pkv_now_ns() >= deadline) return REDIS_ERR;
        struct timeval tv = tv_left(deadline, 0);
        if (setsockopt(ctx->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) return REDIS_ERR;
        ssize_t k = recv(ctx->fd, rc->rbuf, sizeof rc->rbuf, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return REDIS_ERR;
        if (redisReaderFeed(ctx->reader, rc->rbuf, (size_t)k) != REDIS_OK ||
            redisReaderGetReply(ctx->reader, &r) != REDIS_OK)
            return REDIS_ERR;
    }
    *out = r;
    return REDIS_OK;
}

size_t pkv_rc_run(pkv_rc *rc, pkv_rc_cmd *cmds, size_t n, uint64_t deadline_ns,
                  pkv_rc_stats *st) {
    int16_t *target = malloc(n * sizeof *target);
    uint8_t *asking = calloc(n, 1);
    size_t answered = 0;
    if (!target || !asking) {
        for (size_t i = 0; i < n; i++) cmds[i].status = ST_ERROR;
        goto out;
    }
    if (!rc->have_map && pkv_now_ns() >= rc->map_retry) refresh_map(rc, deadline_ns);
    for (size_t i = 0; i < n; i++) {
        cmds[i].status = ST_PENDING;
        cmds[i].out = NULL;
        cmds[i].out_len = 0;
        cmds[i].integer = 0;
        uint8_t s = rc->slot[pkv_rc_slot(cmds[i].key, strlen(cmds[i].key))];
        target[i] = s == RC_NOSLOT ? -1 : s;
        if (target[i] < 0) cmds[i].status = ST_ERROR;
    }
    /* Round 0 sends everything; round 1 only what was redirected. */
    for (int round = 0; round < 2; round++) {
        bool sent_any = false;
        bool sent[RC_MAX_NODES] = {false};
        for (size_t i = 0; i < n; i++) {
            if (cmds[i].status != ST_PENDING) continue;
            int ni = target[i];
            redisContext *ctx = node_conn(rc, ni, deadline_ns);
            if (!ctx) {
                cmds[i].status = ST_ERROR;
                continue;
            }
            if (!sent[ni]) redisSetTimeout(ctx, tv_left(deadline_ns, 0));
            sent[ni] = true;
            if (asking[i]) redisAppendCommand(ctx, "ASKING");
            char ttl[24];
            if (cmds[i].del_if_equal) {
                /* the value a reader rejected, sent back so that the server deletes
                 * it only if no writer replaced it meanwhile (docs/remote.md) */
                static const char cad[] =
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                    "return redis.call('DEL', KEYS[1]) end return 0";
                const char *argv[5] = {"EVAL", cad, "1", cmds[i].key, (const char *)cmds[i].val};
                size_t argl[5] = {4, sizeof cad - 1, 1, strlen(cmds[i].key), cmds[i].val_len};
                redisAppendCommandArgv(ctx, 5, argv, argl);
            } else if (cmds[i].val) {
                snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)cmds[i].ttl_ms);
                const char *argv[5] = {"SET", cmds[i].key, (const char *)cmds[i].val, "PX", ttl};
                size_t argl[5] = {3, strlen(cmds[i].key), cmds[i].val_len, 2, strlen(ttl)};
                redisAppendCommandArgv(ctx, 5, argv, argl);
            } else {
                const char *argv[2] = {cmds[i].exists ? "EXISTS" : "GET", cmds[i].key};
                size_t argl[2] = {cmds[i].exists ? 6u : 3u, strlen(cmds[i].key)};
                redisAppendCommandArgv(ctx, 2, argv, argl);
            }
            sent_any = true;
        }
        if (!sent_any) break;
        /* Push every node's buffer out before reading any answer, so the nodes
         * work in parallel. */
        for (int ni = 0; ni < rc->nnodes; ni++) {
            if (!sent[ni] || !rc->nodes[ni].ctx) continue;
            int done = 0;
            while (!done) /* a blocking socket: each write waits at most SO_SNDTIMEO */
                if (pkv_now_ns() >= deadline_ns ||
                    redisBufferWrite(rc->nodes[ni].ctx, &done) != REDIS_OK) {
                    node_down(&rc->nodes[ni]); /* a partial command may be out */
                    break;
                }
        }
        for (size_t i = 0; i < n; i++) {
            if (cmds[i].status != ST_PENDING) continue;
            int ni = target[i];
            rc_node *nd = &rc->nodes[ni];
            if (!nd->ctx || !sent[ni]) { /* failed while writing */
                cmds[i].status = ST_ERROR;
                continue;
            }
            redisReply *r = NULL;
            if (asking[i]) {
                if (get_reply(rc, nd->ctx, &r, deadline_ns) != REDIS_OK) goto io_fail;
                freeReplyObject(r);
                r = NULL;
                asking[i] = 0;
            }
            if (get_reply(rc, nd->ctx, &r, deadline_ns) != REDIS_OK) goto io_fail;
            if (r->type == REDIS_REPLY_ERROR &&
                (strncmp(r->str, "MOVED ", 6) == 0 || strncmp(r->str, "ASK ", 4) == 0)) {
                uint32_t slot;
                bool moved = r->str[0] == 'M';
                int t = redirect_target(rc, r->str, &slot);
                if (st) st->redirects++;
                if (t < 0 || round == 1) {
                    cmds[i].status = ST_ERROR;
                } else {
                    if (moved) rc->slot[slot] = (uint8_t)t;
                    else asking[i] = 1;
                    target[i] = (int16_t)t;
                }
            } else if (r->type == REDIS_REPLY_STRING && !cmds[i].exists &&
                       !cmds[i].del_if_equal) { /* a GET's value; anything else's is an error */
                /* taken, not copied: hiredis 0.14 mallocs str and frees it with
                 * free() in freeReplyObject, which skips a NULL */
                cmds[i].out = (uint8_t *)r->str;
                cmds[i].out_len = r->len;
                r->str = NULL;
                cmds[i].status = 0;
            } else if (r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STATUS) {
                cmds[i].status = 0;
            } else if (r->type == REDIS_REPLY_INTEGER &&
                       (cmds[i].del_if_equal || cmds[i].exists)) {
                cmds[i].integer = r->integer;
                cmds[i].status = 0;
            } else {
                cmds[i].status = ST_ERROR; /* OOM, READONLY, CLUSTERDOWN, ... */
                if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "CLUSTERDOWN", 11) == 0)
                    rc->have_map = false;
            }
            freeReplyObject(r);
            continue;
        io_fail:
            if (r) freeReplyObject(r);
            /* replies still owed on this connection: drop it (see the header) */
            node_down(nd);
            rc->have_map = false; /* the node may have failed over */
            for (size_t j = i; j < n; j++)
                if (cmds[j].status == ST_PENDING && target[j] == ni) cmds[j].status = ST_ERROR;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].status == ST_PENDING) cmds[i].status = ST_ERROR;
        if (cmds[i].status == 0) answered++;
    }
out:
    free(target);
    free(asking);
    return answered;
}
