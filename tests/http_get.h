/*
 * http_get.h — a minimal HTTP/1.0 client for the metrics tests: one request on
 * 127.0.0.1, the whole response read until the server closes. Only for talking
 * to the library's /metrics endpoint and to a local Prometheus in tests; it
 * parses nothing but the status line and the header/body boundary.
 */
#ifndef PKV_TEST_HTTP_GET_H
#define PKV_TEST_HTTP_GET_H

#include <stddef.h>

/* Send `method` `path` to 127.0.0.1:port and read the reply. Returns the HTTP
 * status (e.g. 200), or -1 if the connection or the read failed. The body, NUL
 * terminated, goes to body[0..cap) (cut if longer); *body_len (may be NULL) gets
 * its full length. Waits at most timeout_ms for the whole exchange. */
int ht_request(int port, const char *method, const char *path, char *body, size_t cap,
               size_t *body_len, int timeout_ms);

/* A loopback TCP port nothing listened on a moment ago (the kernel's choice),
 * for a server the test starts next; -1 if the probe socket failed. */
int ht_free_port(void);

/* Percent-encode s for a URL query value into out[0..cap) (NUL terminated). */
void ht_urlencode(const char *s, char *out, size_t cap);

#endif
