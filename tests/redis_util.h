/*
 * redis_util.h — redis-server processes for the tier tests that run outside
 * test_tier.c (tests/test_tier_model.c): start one server or a 3-master cluster
 * on free loopback ports in the test's temp directory (pt_dir), and kill them
 * at the end. The same steps as test_tier.c's own helpers (docs/remote.md,
 * "Setup"): each server is a child with PR_SET_PDEATHSIG, so a test that dies
 * leaves no server behind.
 */
#ifndef PKV_TEST_REDIS_UTIL_H
#define PKV_TEST_REDIS_UTIL_H

#include <stdbool.h>
#include <stddef.h>

/* Whether redis-server and redis-cli are on PATH; asserts they are when
 * CI=true (scripts/bootstrap.sh installs them), so CI never skips. */
bool ru_have_redis(void);
/* A redis-server on a free port below 55000 (the cluster bus is port + 10000),
 * answering PING; cluster mode or standalone. Returns the port. */
int ru_start_server(bool cluster);
/* Three cluster masters, every slot assigned, each node's view "ok"; the seed
 * list "127.0.0.1:P1,127.0.0.1:P3" into nodes. */
void ru_start_cluster(char *nodes, size_t cap);
/* Kill every server started (a suite's .fini, before pt_teardown). */
void ru_stop_all(void);

#endif
