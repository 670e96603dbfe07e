/*
 * redis_util.h — redis-server processes for the tier tests (test_tier.c,
 * test_tier_model.c): start one server or a 3-master cluster
 * on free loopback ports in the test's temp directory (pt_dir), and kill them
 * at the end (docs/remote.md, "Setup"); DEBUG is enabled for the fault tests'
 * DEBUG SLEEP. Each server is a child with PR_SET_PDEATHSIG, so a test that dies
 * leaves no server behind.
 */
#ifndef PKV_TEST_REDIS_UTIL_H
#define PKV_TEST_REDIS_UTIL_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The servers started, in order (a cluster's masters are its first three
 * when it is started first); a test that kills one sets its pid to 0. */
#define RU_MAX 4
extern pid_t ru_pid[RU_MAX];
extern int ru_port[RU_MAX];
extern int ru_n;

/* Whether redis-server and redis-cli are on PATH; asserts they are when
 * CI=true (scripts/bootstrap.sh installs them), so CI never skips. */
bool ru_have_redis(void);
/* A redis-server on a free port below 55000 (the cluster bus is port + 10000),
 * answering PING; cluster mode or standalone. Returns the port. */
int ru_start_server(bool cluster);
/* Three cluster masters, every slot assigned, each node's view "ok"; the seed
 * list "127.0.0.1:P1,127.0.0.1:P3" into nodes. */
void ru_start_cluster(char *nodes, size_t cap);
/* A connection to 127.0.0.1:port with 1 s timeouts, or NULL. */
redisContext *ru_connect(int port);
/* Kill every server started (a suite's .fini, before pt_teardown). */
void ru_stop_all(void);

#endif
