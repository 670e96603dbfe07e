/*
 * test_ckpt_policy.c — when automatic checkpoints are taken (src/wal/log.c,
 * ckpt_due). With the default checkpoint_bytes (0) the log may grow to 64 MiB or
 * to the raw size of the newest checkpoint, whichever is larger; an explicit
 * checkpoint_bytes is an exact threshold. Testing the default's proportional part
 * at a size a unit test can afford needs a smaller floor than 64 MiB, so this file
 * links the library's internals and lowers the floor of an adaptive handle
 * (c->wal.ckpt_bytes) right after the open.
 */
#include "pkv_test.h"

#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>

TestSuite(ckpt_policy, .init = pt_setup, .fini = pt_teardown);

#define BS 16u
#define NPROMPT 1500u  /* distinct cached 2-block prompts: a snapshot of ~0.4 MB */

static pkv_stats stats(pkv_cache *c) {
    pkv_stats st;
    PT_OK(pkv_get_stats(c, &st));
    return st;
}

static void prompt(uint32_t i, uint32_t *t) {
    for (uint32_t k = 0; k < 2 * BS + 1; k++) t[k] = i * 1000u + k + 1;
}

/* Fill the cache with NPROMPT sealed, cached 2-block prompts. */
static void fill(pkv_cache *c) {
    uint32_t t[2 * BS + 1];
    pkv_slot slots[2 * BS + 1];
    for (uint32_t i = 0; i < NPROMPT; i++) {
        prompt(i, t);
        size_t hit = 0;
        PT_OK(pkv_seq_open(c, i + 1, 0, t, 2 * BS + 1, &hit));
        PT_OK(pkv_seq_append(c, i + 1, t, 2 * BS + 1, slots));
        PT_OK(pkv_seq_commit(c, i + 1, 2 * BS + 1));
        PT_OK(pkv_seq_close(c, i + 1));
    }
}

/* Log traffic that leaves the snapshot's size alone: open a cached prompt (a hit,
 * nothing sealed) and close it again. Returns once the log holds `bytes` more. */
static void churn(pkv_cache *c, uint64_t bytes, uint64_t *next_id) {
    uint64_t start = stats(c).wal_bytes;
    uint32_t t[2 * BS + 1];
    for (uint32_t i = 0;; i = (i + 1) % NPROMPT) {
        prompt(i, t);
        size_t hit = 0;
        uint64_t id = (*next_id)++;
        PT_OK(pkv_seq_open(c, id, 0, t, 2 * BS + 1, &hit));
        cr_assert_eq(hit, 2 * BS, "prompt %u not cached", i);
        PT_OK(pkv_seq_close(c, id));
        if (i % 64 == 63) {
            PT_OK(pkv_sync(c));
            if (stats(c).wal_bytes - start >= bytes) return;
        }
    }
}

/* The checkpoint thread takes a due checkpoint asynchronously: wait for it. */
static bool wait_checkpoints(pkv_cache *c, uint64_t n) {
    for (int i = 0; i < 500; i++) {
        if (stats(c).checkpoints >= n) return true;
        PT_OK(pkv_sync(c));
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return false;
}

Test(ckpt_policy, default_threshold_follows_the_snapshot_size)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F16, 4096);
    /* 1,500 prompts of 3 blocks in 4,096: the closed tails must come back from
     * limbo, not be replaced by evicting cached prompts (the default), or which
     * prompts stay cached would depend on flush timing */
    o.flags = PKV_OPEN_LIMBO_WAIT;
    o.durability = PKV_DURABLE_GROUP;
    cr_assert_eq(o.checkpoint_bytes, 0, "default checkpoint_bytes");
    pkv_cache *c = pt_open_sub("adaptive", &o);
    pkv_lock(c);
    cr_assert(c->wal.ckpt_adaptive && c->wal.ckpt_bytes == 64ull << 20);
    c->wal.ckpt_bytes = 16u << 10; /* the floor, lowered from 64 MiB for the test */
    pkv_unlock(c);
    fill(c);
    /* Everything logged so far in this checkpoint's count: log the fill's tail
     * flushed only while the checkpoint waits would count toward the next one. */
    PT_OK(pkv_sync(c));
    PT_OK(pkv_checkpoint(c));
    PT_CHECK(c);
    pkv_stats st = stats(c);
    pkv_lock(c);
    uint64_t raw = c->wal.ckpt_raw;
    pkv_unlock(c);
    cr_assert(raw > 16 * (16u << 10), "snapshot of %llu bytes, want well above the floor",
              (unsigned long long)raw);
    uint64_t n0 = st.checkpoints, id = 1u << 20;
    /* Up to 3/4 of the snapshot's size in log: well past the floor, no checkpoint. */
    churn(c, raw * 3 / 4, &id);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    st = stats(c);
    cr_assert_eq(st.checkpoints, n0,
                 "a checkpoint after %llu bytes of log; the snapshot holds %llu",
                 (unsigned long long)st.wal_bytes, (unsigned long long)raw);
    /* Past the snapshot's size: one is taken. */
    churn(c, raw / 2, &id);
    cr_assert(wait_checkpoints(c, n0 + 1), "no checkpoint after %llu bytes of log past a "
              "%llu-byte snapshot", (unsigned long long)(stats(c).wal_bytes),
              (unsigned long long)raw);
    PT_CHECK(c);
    /* Reopened, the threshold comes from the checkpoint recovery loaded. */
    pt_close(c);
    c = pt_open_sub("adaptive", &o);
    pkv_lock(c);
    cr_assert(c->wal.ckpt_raw > 16 * (16u << 10), "ckpt_raw %llu after reopen",
              (unsigned long long)c->wal.ckpt_raw);
    pkv_unlock(c);
    PT_CHECK(c);
}

Test(ckpt_policy, explicit_threshold_is_exact)
{
    pkv_options o;
    pt_opts(&o, PT_LAYERS, PT_HEADS, PT_HDIM, BS, PKV_F16, 4096);
    /* 1,500 prompts of 3 blocks in 4,096: the closed tails must come back from
     * limbo, not be replaced by evicting cached prompts (the default), or which
     * prompts stay cached would depend on flush timing */
    o.flags = PKV_OPEN_LIMBO_WAIT;
    o.durability = PKV_DURABLE_GROUP;
    o.checkpoint_bytes = 16u << 10;
    pkv_cache *c = pt_open_sub("explicit", &o);
    cr_assert(!c->wal.ckpt_adaptive);
    fill(c);
    /* Everything logged so far in this checkpoint's count: log the fill's tail
     * flushed only while the checkpoint waits would count toward the next one. */
    PT_OK(pkv_sync(c));
    PT_OK(pkv_checkpoint(c));
    pkv_lock(c);
    uint64_t raw = c->wal.ckpt_raw;
    pkv_unlock(c);
    cr_assert(raw > 16 * (16u << 10));
    uint64_t n0 = stats(c).checkpoints, id = 1u << 20;
    churn(c, 64u << 10, &id); /* 4x the threshold, far below the snapshot's size */
    cr_assert(wait_checkpoints(c, n0 + 1), "checkpoint_bytes 16 KiB: no checkpoint after "
              "64 KiB of log");
    PT_CHECK(c);
}
