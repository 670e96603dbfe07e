/*
 * histogram.h — fixed-bucket latency histograms for the metrics (src/metrics.c).
 *
 * Owns: pkv_hist, a set of per-bucket counters plus a sum, and the two bucket
 * layouts the library uses (latencies from 100 us to 1 s; checkpoint durations
 * from 1 ms to 60 s). The code that measures an event calls pkv_hist_observe;
 * pkv_metrics_text reads the buckets and renders them cumulatively.
 *
 * Invariants: a bucket counts the observations <= its bound and > the bound
 * before it (not cumulative); the last one counts those above every bound
 * (le="+Inf"). Every field is an independent relaxed atomic counter, so an
 * observer never takes a lock for it and a reader may run concurrently: the
 * reader derives the total count from the buckets it read, so the rendered
 * _count always equals the +Inf bucket (the _sum may be one observation off
 * from them, which Prometheus tolerates). No other lock-free protocol is
 * involved: nothing is ordered against these counters.
 */
#ifndef PKV_HISTOGRAM_H
#define PKV_HISTOGRAM_H

#include <stdatomic.h>
#include <stdint.h>

#define PKV_HIST_BOUNDS 13u

typedef struct pkv_hist_layout {
    uint64_t bound_ns[PKV_HIST_BOUNDS]; /* ascending */
    const char *le[PKV_HIST_BOUNDS];    /* the same bounds in seconds, as text */
} pkv_hist_layout;

/* 100 us .. 1 s: group-commit delay, log write+fdatasync. */
extern const pkv_hist_layout pkv_hist_latency;
/* 1 ms .. 60 s: checkpoint duration. */
extern const pkv_hist_layout pkv_hist_long;

typedef struct pkv_hist {
    _Atomic uint64_t n[PKV_HIST_BOUNDS + 1]; /* last: above every bound */
    _Atomic uint64_t sum_ns;
} pkv_hist;

static inline void pkv_hist_observe(pkv_hist *h, const pkv_hist_layout *l, uint64_t ns) {
    unsigned i = 0;
    while (i < PKV_HIST_BOUNDS && ns > l->bound_ns[i]) i++;
    atomic_fetch_add_explicit(&h->n[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

#endif /* PKV_HISTOGRAM_H */
