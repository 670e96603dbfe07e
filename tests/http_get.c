/*
 * http_get.c — see http_get.h.
 */
#include "http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

int ht_request(int port, const char *method, const char *path, char *body, size_t cap,
               size_t *body_len, int timeout_ms) {
    if (body_len) *body_len = 0;
    if (cap) body[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char req[8192];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n",
                     method, path, port);
    if (n <= 0 || (size_t)n >= sizeof req || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    size_t rcap = 1 << 16, len = 0;
    char *r = malloc(rcap);
    long deadline = now_ms() + timeout_ms;
    int status = -1;
    for (;;) {
        long left = deadline - now_ms();
        if (left <= 0) goto out;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)left) <= 0) goto out;
        if (len + 4096 > rcap) {
            char *nr = realloc(r, rcap * 2);
            if (!nr) goto out;
            r = nr;
            rcap *= 2;
        }
        ssize_t k = recv(fd, r + len, rcap - len - 1, 0);
        if (k < 0) goto out;
        if (k == 0) break;
        len += (size_t)k;
    }
    r[len] = '\0';
    int major, minor;
    if (sscanf(r, "HTTP/%d.%d %d", &major, &minor, &status) != 3) {
        status = -1;
        goto out;
    }
    char *b = strstr(r, "\r\n\r\n");
    if (!b) {
        status = -1;
        goto out;
    }
    b += 4;
    size_t bl = len - (size_t)(b - r);
    if (body_len) *body_len = bl;
    if (cap) {
        size_t c = bl < cap - 1 ? bl : cap - 1;
        memcpy(body, b, c);
        body[c] = '\0';
    }
out:
    free(r);
    close(fd);
    return status;
}

void ht_urlencode(const char *s, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '_' || ch == '.' || ch == '~') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    if (cap) out[o] = '\0';
}

int ht_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &l) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}
