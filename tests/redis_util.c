/* redis_util.c — see redis_util.h. */
#include "redis_util.h"

#include "http_get.h"
#include "pkv_test.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t ru_pid[RU_MAX];
int ru_port[RU_MAX];
int ru_n;

bool ru_have_redis(void) {
    if (system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1") ==
        0)
        return true;
    bool ci = getenv("CI") && strcmp(getenv("CI"), "true") == 0;
    cr_assert(!ci, "redis-server/redis-cli missing: CI requires them (scripts/bootstrap.sh)");
    return false;
}

void ru_stop_all(void) {
    for (int i = 0; i < ru_n; i++)
        if (ru_pid[i] > 0) {
            kill(ru_pid[i], SIGKILL);
            waitpid(ru_pid[i], NULL, 0);
            ru_pid[i] = 0;
        }
    ru_n = 0;
}

redisContext *ru_connect(int port) {
    struct timeval tv = {1, 0};
    redisContext *x = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (x && x->err) {
        redisFree(x);
        return NULL;
    }
    if (x) redisSetTimeout(x, tv);
    return x;
}

static int ru_pick_port(void) {
    for (int i = 0; i < 100; i++) {
        int p = ht_free_port();
        if (p > 1024 && p < 55000) return p;
    }
    cr_assert(false, "no free port below 55000");
    return -1;
}

int ru_start_server(bool cluster) {
    cr_assert(ru_n < RU_MAX);
    int port = ru_pick_port();
    char ps[16], cfg[64], log[64];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(cfg, sizeof cfg, "nodes-%d.conf", port);
    snprintf(log, sizeof log, "redis-%d.log", port);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (chdir(pt_dir) != 0) _exit(126);
        if (cluster)
            execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--protected-mode", "no", "--enable-debug-command",
                   "yes", "--logfile", log, "--cluster-enabled", "yes", "--cluster-config-file", cfg,
                   "--cluster-node-timeout", "5000", (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--protected-mode", "no", "--enable-debug-command",
                   "yes", "--logfile", log, (char *)NULL);
        _exit(127);
    }
    ru_pid[ru_n] = pid;
    ru_port[ru_n] = port;
    ru_n++;
    for (int i = 0; i < 500; i++) {
        redisContext *x = ru_connect(port);
        if (x) {
            redisReply *r = redisCommand(x, "PING");
            bool ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(x);
            if (ok) return port;
        }
        usleep(10000);
    }
    cr_assert(false, "redis-server on port %d did not start (see %s/%s)", port, pt_dir, log);
    return -1;
}

static bool ru_cluster_ok(int port) {
    redisContext *x = ru_connect(port);
    if (!x) return false;
    redisReply *r = redisCommand(x, "CLUSTER INFO");
    bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r) freeReplyObject(r);
    redisFree(x);
    return ok;
}

void ru_start_cluster(char *nodes, size_t cap) {
    int p[3];
    for (int i = 0; i < 3; i++) p[i] = ru_start_server(true);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "redis-cli --cluster create 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d "
             "--cluster-replicas 0 --cluster-yes >%s/create.log 2>&1",
             p[0], p[1], p[2], pt_dir);
    cr_assert_eq(system(cmd), 0, "redis-cli --cluster create failed (%s/create.log)", pt_dir);
    for (int i = 0; i < 3; i++) {
        int k = 0;
        while (!ru_cluster_ok(p[i]) && k++ < 1000) usleep(10000);
        cr_assert(ru_cluster_ok(p[i]), "cluster node %d never reached state ok", p[i]);
    }
    snprintf(nodes, cap, "127.0.0.1:%d,127.0.0.1:%d", p[0], p[2]);
}
