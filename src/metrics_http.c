/*
 * metrics_http.c — the /metrics endpoint: pkv_metrics_serve and friends.
 *
 * Owns a pkv_metrics_server: a libmicrohttpd daemon (its own polling thread) on
 * one IPv4 address, and the response buffer it renders into. HTTP parsing is
 * libmicrohttpd's; this file only routes: GET or HEAD /metrics gets
 * pkv_metrics_text of the cache followed by pkv_cuda_metrics_text of the handle
 * set with pkv_metrics_serve_cuda, any other path 404, any other method 405.
 *
 * Invariants: the server mutex `mu` guards buf and cuda; a request renders and
 * copies its response under it, so pkv_metrics_serve_cuda(srv, NULL) returning
 * means no request reads the old handle any more. The cache links its servers
 * (pkv_cache.metrics_servers); pkv_close detaches them by clearing srv->cache,
 * after which requests get 503, so a server left running past pkv_close never
 * touches the freed cache. `registry_mu` (one per process) guards every list
 * and every srv->cache write, and is held across pkv_metrics_detach_all's walk
 * and pkv_metrics_stop's unlink, so a stop racing a close can neither lock a
 * freed cache nor let the walk reach a freed server. Lock order: registry_mu,
 * then `mu` or the cache lock; a request takes `mu`, then the cache lock.
 *
 * Built without libmicrohttpd (meson option metrics_http; the build defines
 * PKV_WITH_MICROHTTPD to 0 or 1), every call but pkv_metrics_stop returns
 * PKV_ENOTSUP after its argument checks.
 */
#include "internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

#if PKV_WITH_MICROHTTPD
#include <microhttpd.h>
#endif

/* "a.b.c.d:port" -> *sa. 0 or PKV_EINVAL. */
static int parse_addr(const char *addr, struct sockaddr_in *sa) {
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= 64 || !colon[1])
        return pkv_err(PKV_EINVAL, "address \"%s\" is not IPV4:PORT", addr);
    char host[64];
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    unsigned long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9' || port > 65535)
            return pkv_err(PKV_EINVAL, "address \"%s\": bad port", addr);
        port = port * 10 + (unsigned long)(*p - '0');
    }
    if (port > 65535) return pkv_err(PKV_EINVAL, "address \"%s\": port above 65535", addr);
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return pkv_err(PKV_EINVAL, "address \"%s\": \"%s\" is not an IPv4 address", addr, host);
    return 0;
}

#if PKV_WITH_MICROHTTPD

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;

struct pkv_metrics_server {
    pkv_cache *cache; /* written under registry_mu and mu; NULL once detached */
    pkv_metrics_server *next; /* the cache's list (its lock) */
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;
    struct pkv_cuda *cuda; /* mu */
    char *buf;      /* mu: the response text */
    size_t cap;
};

/* Render into srv->buf from offset `at`, growing it; mu held. Returns the text
 * length past `at` or a negative PKV_E* code. */
static long render(pkv_metrics_server *srv, size_t at, bool cuda) {
    for (int tries = 0; tries < 8; tries++) {
        size_t need = 0;
        int rc = cuda ? pkv_cuda_metrics_text(srv->cuda, srv->buf + at, srv->cap - at, &need)
                      : pkv_metrics_text(srv->cache, srv->buf + at, srv->cap - at, &need);
        if (rc == 0) return (long)(need - 1);
        if (rc != PKV_ERANGE) return rc;
        size_t cap = at + need + 4096; /* slack: the values may grow meanwhile */
        char *nb = realloc(srv->buf, cap);
        if (!nb) return PKV_ENOMEM;
        srv->buf = nb;
        srv->cap = cap;
    }
    return PKV_ERANGE;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *text,
                             size_t len, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, mode);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            status == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
                                                  : "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **state) {
    (void)version;
    (void)upload;
    pkv_metrics_server *srv = cls;
    /* A request with a body arrives in several calls; answer on the first and
     * ignore the body (only GET and HEAD are served, and they have none). */
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    (void)state;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        static const char m[] = "only GET and HEAD are served\n";
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, m, sizeof m - 1, MHD_RESPMEM_PERSISTENT);
    }
    if (strcmp(url, "/metrics") != 0) {
        static const char m[] = "not found: the metrics are at /metrics\n";
        return reply(conn, MHD_HTTP_NOT_FOUND, m, sizeof m - 1, MHD_RESPMEM_PERSISTENT);
    }
    pthread_mutex_lock(&srv->mu);
    if (!srv->cache) {
        static const char m[] = "the cache was closed\n";
        enum MHD_Result r = reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, m, sizeof m - 1,
                                  MHD_RESPMEM_PERSISTENT);
        pthread_mutex_unlock(&srv->mu);
        return r;
    }
    long n = render(srv, 0, false), n2 = 0;
    if (n >= 0 && srv->cuda) n2 = render(srv, (size_t)n, true);
    enum MHD_Result ok;
    if (n >= 0 && n2 >= 0) {
        ok = reply(conn, MHD_HTTP_OK, srv->buf, (size_t)(n + n2), MHD_RESPMEM_MUST_COPY);
    } else {
        char m[320];
        int len = snprintf(m, sizeof m, "metrics failed: %s\n",
                           pkv_strerror(n < 0 ? (int)n : (int)n2));
        ok = reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, m, (size_t)len, MHD_RESPMEM_MUST_COPY);
    }
    pthread_mutex_unlock(&srv->mu);
    return ok;
}

int pkv_metrics_serve(pkv_cache *c, const char *addr, pkv_metrics_server **out) {
    if (out) *out = NULL;
    if (!c || !addr || !out) return pkv_err(PKV_EINVAL, "cache, addr or out is NULL");
    PKV_LOCAL_ONLY(c, "pkv_metrics_serve");
    struct sockaddr_in sa;
    int rc = parse_addr(addr, &sa);
    if (rc) return rc;
    pkv_metrics_server *srv = calloc(1, sizeof *srv);
    if (!srv) return pkv_err(PKV_ENOMEM, "metrics server");
    srv->cache = c;
    pthread_mutex_init(&srv->mu, NULL);
    /* MHD_USE_AUTO: epoll or poll. The default, select(), refuses every socket
     * numbered FD_SETSIZE (1024) or above, so a process holding many files
     * (an inference server's connections) could not serve at all. */
    srv->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD, ntohs(sa.sin_port), NULL, NULL,
                              on_request, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!srv->d) {
        pthread_mutex_destroy(&srv->mu);
        free(srv);
        return pkv_err(PKV_EIO, "cannot serve metrics on %s (address in use or not local?)", addr);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : ntohs(sa.sin_port);
    pthread_mutex_lock(&registry_mu);
    pkv_lock(c);
    srv->next = c->metrics_servers;
    c->metrics_servers = srv;
    pkv_unlock(c);
    pthread_mutex_unlock(&registry_mu);
    *out = srv;
    return 0;
}

int pkv_metrics_port(const pkv_metrics_server *srv) {
    if (!srv) return pkv_err(PKV_EINVAL, "server is NULL");
    return srv->port;
}

int pkv_metrics_serve_cuda(pkv_metrics_server *srv, struct pkv_cuda *g) {
    if (!srv) return pkv_err(PKV_EINVAL, "server is NULL");
    pthread_mutex_lock(&srv->mu);
    srv->cuda = g;
    pthread_mutex_unlock(&srv->mu);
    return 0;
}

void pkv_metrics_stop(pkv_metrics_server *srv) {
    if (!srv) return;
    MHD_stop_daemon(srv->d); /* joins the thread: no request runs after this */
    pthread_mutex_lock(&registry_mu);
    pkv_cache *c = srv->cache; /* NULL if pkv_close detached it */
    if (c) {
        pkv_lock(c);
        for (pkv_metrics_server **pp = &c->metrics_servers; *pp; pp = &(*pp)->next)
            if (*pp == srv) {
                *pp = srv->next;
                break;
            }
        pkv_unlock(c);
    }
    pthread_mutex_unlock(&registry_mu);
    pthread_mutex_destroy(&srv->mu);
    free(srv->buf);
    free(srv);
}

void pkv_metrics_detach_all(pkv_cache *c) {
    pthread_mutex_lock(&registry_mu);
    pkv_lock(c);
    pkv_metrics_server *list = c->metrics_servers;
    c->metrics_servers = NULL;
    pkv_unlock(c);
    for (pkv_metrics_server *srv = list; srv; srv = srv->next) {
        pthread_mutex_lock(&srv->mu);
        srv->cache = NULL;
        pthread_mutex_unlock(&srv->mu);
    }
    pthread_mutex_unlock(&registry_mu);
}

#else /* built without libmicrohttpd */

void pkv_metrics_detach_all(pkv_cache *c) {
    (void)c; /* no server was ever started */
}


int pkv_metrics_serve(pkv_cache *c, const char *addr, pkv_metrics_server **out) {
    if (out) *out = NULL;
    if (!c || !addr || !out) return pkv_err(PKV_EINVAL, "cache, addr or out is NULL");
    struct sockaddr_in sa;
    int rc = parse_addr(addr, &sa);
    if (rc) return rc;
    return pkv_err(PKV_ENOTSUP, "built without libmicrohttpd (meson option metrics_http)");
}

int pkv_metrics_port(const pkv_metrics_server *srv) {
    if (!srv) return pkv_err(PKV_EINVAL, "server is NULL");
    return pkv_err(PKV_ENOTSUP, "built without libmicrohttpd");
}

int pkv_metrics_serve_cuda(pkv_metrics_server *srv, struct pkv_cuda *g) {
    (void)g;
    if (!srv) return pkv_err(PKV_EINVAL, "server is NULL");
    return pkv_err(PKV_ENOTSUP, "built without libmicrohttpd");
}

void pkv_metrics_stop(pkv_metrics_server *srv) { (void)srv; }

#endif
