/*
 * handle.c — pagedkv._pagedkv.Handle: one cache opened by pkv_open or
 * pkv_connect, and every call on it.
 *
 * Owns the pkv_cache pointer and the bookkeeping that makes it safe from
 * several Python threads: each library call that may block runs with the GIL
 * released between handle_enter() and handle_leave(), which count calls in
 * flight under a plain mutex; close() first refuses new calls (closing), then
 * waits for that count to reach 0, then runs pkv_close (with the GIL released),
 * because pkv_close must not run concurrently with another call on the handle.
 * close() raises BufferError while views of this handle have buffers exported
 * (numpy arrays, memoryviews, DLPack tensors): the arena must stay mapped under
 * them; and while CUDA handles (cuda.c) are open on it, as the C API requires.
 * Methods mirror the C calls one to one; the Python package gives them their
 * documented names and types.
 */
#include "pyext.h"

#include <string.h>

int handle_enter(HandleObject *h)
{
    if (!h->c || h->closing) {
        PyErr_SetString(PyExc_ValueError, "operation on a closed pagedkv cache");
        return -1;
    }
    pthread_mutex_lock(&h->mu);
    h->inflight++;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

void handle_leave(HandleObject *h)
{
    pthread_mutex_lock(&h->mu);
    if (--h->inflight == 0) pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
}

/* Run `expr` (an int-returning library call) with the GIL released. */
#define CALL(h, rc, expr)                                                                     \
    do {                                                                                      \
        if (handle_enter(h) < 0) return NULL;                                                 \
        Py_BEGIN_ALLOW_THREADS rc = (expr);                                                   \
        Py_END_ALLOW_THREADS handle_leave(h);                                                 \
    } while (0)

/* Integer arguments accept anything with __index__ (numpy integers too). */
static unsigned long long as_ull(PyObject *o)
{
    PyObject *ix = PyNumber_Index(o);
    if (!ix) return (unsigned long long)-1;
    unsigned long long v = PyLong_AsUnsignedLongLong(ix);
    Py_DECREF(ix);
    return v;
}

static int u64_conv(PyObject *o, void *p)
{
    unsigned long long v = as_ull(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    *(uint64_t *)p = (uint64_t)v;
    return 1;
}

static int size_conv(PyObject *o, void *p)
{
    unsigned long long v = as_ull(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    if (v > SIZE_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit in size_t");
        return 0;
    }
    *(size_t *)p = (size_t)v;
    return 1;
}

static int u32_conv(PyObject *o, void *p)
{
    unsigned long long v = as_ull(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    if (v > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit in 32 bits");
        return 0;
    }
    *(uint32_t *)p = (uint32_t)v;
    return 1;
}

static HandleObject *handle_alloc(void)
{
    HandleObject *h = PyObject_New(HandleObject, &pyx_HandleType);
    if (!h) return NULL;
    h->c = NULL;
    memset(&h->info, 0, sizeof h->info);
    memset(&h->kv, 0, sizeof h->kv);
    h->remote = h->closing = h->rdonly = 0;
    h->exports = 0;
    h->cuda_handles = 0;
    h->inflight = 0;
    h->weakrefs = NULL;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    return h;
}

static PyObject *handle_ready(HandleObject *h, int rc, pkv_cache *c)
{
    if (rc) {
        Py_DECREF(h);
        return pyx_raise(rc);
    }
    h->c = c;
    if ((rc = pkv_info(c, &h->info)) || (rc = pkv_kv_view_of(c, &h->kv))) {
        pyx_raise(rc);
        Py_DECREF(h); /* dealloc closes it */
        return NULL;
    }
    return (PyObject *)h;
}

PyObject *pyx_open(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"dir", "layers", "kv_heads", "head_dim", "capacity", "model_id",
                          "block_size", "dtype", "durability", "flags", "group_commit_us",
                          "checkpoint_bytes", "arena_dir", "seal_threads",
                          "log_segment_bytes", "eviction", "evict_protect_pct", NULL};
    pkv_options o;
    pkv_options_init(&o);
    PyObject *dir;
    const char *model_id = NULL, *arena_dir = NULL;
    unsigned int layers = 0, heads = 0, hd = 0, bs = o.block_size, gcu = 0, st = 0, epp = 0,
                 flags = 0;
    int dtype = (int)o.dtype, dur = (int)o.durability, ev = 0;
    unsigned long long cap = 0, ckb = 0, lsb = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$IIIKzIiiIIKzIKiI", kwl, PyUnicode_FSConverter,
                                     &dir, &layers, &heads, &hd, &cap, &model_id, &bs, &dtype,
                                     &dur, &flags, &gcu, &ckb, &arena_dir, &st, &lsb, &ev, &epp))
        return NULL;
    o.num_layers = layers;
    o.num_kv_heads = heads;
    o.head_dim = hd;
    o.capacity = cap;
    o.model_id = model_id;
    o.block_size = bs;
    o.dtype = (pkv_dtype)dtype;
    o.durability = (pkv_durability)dur;
    o.flags = flags;
    o.group_commit_us = gcu;
    o.checkpoint_bytes = ckb;
    o.arena_dir = arena_dir;
    o.seal_threads = st;
    o.log_segment_bytes = lsb;
    o.eviction = (pkv_eviction)ev;
    o.evict_protect_pct = epp;
    HandleObject *h = handle_alloc();
    if (!h) {
        Py_DECREF(dir);
        return NULL;
    }
    h->rdonly = (flags & PKV_OPEN_RDONLY) != 0;
    pkv_cache *c = NULL;
    int rc;
    const char *path = PyBytes_AS_STRING(dir);
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_open(path, &o, &c);
    Py_END_ALLOW_THREADS
    Py_DECREF(dir);
    return handle_ready(h, rc, c);
}

PyObject *pyx_connect(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path)) return NULL;
    HandleObject *h = handle_alloc();
    if (!h) {
        Py_DECREF(path);
        return NULL;
    }
    h->remote = 1;
    pkv_cache *c = NULL;
    int rc;
    const char *p = PyBytes_AS_STRING(path);
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_connect(p, &c);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    return handle_ready(h, rc, c);
}

/* Wait for calls in flight, then pkv_close; the GIL is released meanwhile. */
static void handle_do_close(HandleObject *h)
{
    pkv_cache *c = h->c;
    h->closing = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&h->mu);
    while (h->inflight > 0) pthread_cond_wait(&h->idle, &h->mu);
    pthread_mutex_unlock(&h->mu);
    pkv_close(c);
    Py_END_ALLOW_THREADS
    h->c = NULL;
}

static void handle_dealloc(HandleObject *h)
{
    if (h->weakrefs) PyObject_ClearWeakRefs((PyObject *)h);
    if (h->c) handle_do_close(h); /* no view is left: each holds a reference */
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
    PyObject_Free(h);
}

static PyObject *h_close(HandleObject *h, PyObject *unused)
{
    (void)unused;
    if (!h->c || h->closing) Py_RETURN_NONE;
    if (h->cuda_handles > 0)
        return PyErr_Format(PyExc_BufferError,
                            "cannot close the cache: %zd CUDA handle(s) on it are open; close "
                            "them first",
                            h->cuda_handles);
    if (h->exports > 0)
        return PyErr_Format(PyExc_BufferError,
                            "cannot close the cache: %zd buffer(s) exported by its K/V views "
                            "still exist (numpy arrays, memoryviews, DLPack tensors); release "
                            "them first",
                            h->exports);
    handle_do_close(h);
    Py_RETURN_NONE;
}

static PyObject *h_get_closed(HandleObject *h, void *unused)
{
    (void)unused;
    return PyBool_FromLong(!h->c || h->closing);
}

static PyObject *h_get_remote(HandleObject *h, void *unused)
{
    (void)unused;
    return PyBool_FromLong(h->remote);
}

static PyObject *h_get_exports(HandleObject *h, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(h->exports);
}

static PyObject *h_info(HandleObject *h, PyObject *unused)
{
    (void)unused;
    if (handle_enter(h) < 0) return NULL;
    handle_leave(h);
    const pkv_cache_info *i = &h->info;
    return Py_BuildValue("{s:I,s:I,s:I,s:I,s:i,s:I,s:K,s:K,s:K,s:K,s:s}", "layers",
                         i->num_layers, "kv_heads", i->num_kv_heads, "head_dim", i->head_dim,
                         "block_size", i->block_size, "dtype", (int)i->dtype, "elem_size",
                         i->elem_size, "capacity", (unsigned long long)i->capacity,
                         "block_bytes", (unsigned long long)i->block_bytes, "slot_bytes",
                         (unsigned long long)i->slot_bytes, "run_bytes",
                         (unsigned long long)i->run_bytes, "model_id", i->model_id);
}

static PyObject *h_seq_open(HandleObject *h, PyObject *args)
{
    uint64_t id, salt = 0;
    PyObject *toks;
    if (!PyArg_ParseTuple(args, "O&O|O&", u64_conv, &id, &toks, u64_conv, &salt)) return NULL;
    pyx_tokens t;
    if (pyx_tokens_get(toks, &t) < 0) return NULL;
    size_t nc = 0;
    int rc;
    if (handle_enter(h) < 0) {
        pyx_tokens_release(&t);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_seq_open(h->c, id, salt, t.p, t.n, &nc);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    pyx_tokens_release(&t);
    if (rc) return pyx_raise(rc);
    return PyLong_FromSize_t(nc);
}

static PyObject *h_lookup(HandleObject *h, PyObject *args)
{
    uint64_t salt = 0;
    PyObject *toks;
    if (!PyArg_ParseTuple(args, "O|O&", &toks, u64_conv, &salt)) return NULL;
    pyx_tokens t;
    if (pyx_tokens_get(toks, &t) < 0) return NULL;
    size_t nc = 0;
    int rc;
    if (handle_enter(h) < 0) {
        pyx_tokens_release(&t);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_prefix_lookup(h->c, salt, t.p, t.n, &nc);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    pyx_tokens_release(&t);
    if (rc) return pyx_raise(rc);
    return PyLong_FromSize_t(nc);
}

static PyObject *slot_list(const pkv_slot *s, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *o = pyx_slot(s[i].block, s[i].offset);
        if (!o) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, o);
    }
    return l;
}

/* commit_append(id, n_commit, tokens) with n_commit 0 and tokens None is not
 * allowed by the library either; append is commit_append with n_commit = 0. */
static PyObject *do_commit_append(HandleObject *h, uint64_t id, size_t n_commit, PyObject *toks,
                                  int plain_append)
{
    pyx_tokens t;
    memset(&t, 0, sizeof t);
    if (toks != Py_None && pyx_tokens_get(toks, &t) < 0) return NULL;
    pkv_slot *slots = PyMem_Malloc((t.n ? t.n : 1) * sizeof *slots);
    if (!slots) {
        pyx_tokens_release(&t);
        return PyErr_NoMemory();
    }
    int rc;
    if (handle_enter(h) < 0) {
        pyx_tokens_release(&t);
        PyMem_Free(slots);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (plain_append)
        rc = pkv_seq_append(h->c, id, t.p ? t.p : (const uint32_t *)slots, t.n, slots);
    else
        rc = pkv_seq_commit_append(h->c, id, n_commit, t.n ? t.p : NULL, t.n,
                                   t.n ? slots : NULL);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    PyObject *ret = rc ? pyx_raise(rc) : slot_list(slots, t.n);
    pyx_tokens_release(&t);
    PyMem_Free(slots);
    return ret;
}

static PyObject *h_append(HandleObject *h, PyObject *args)
{
    uint64_t id;
    PyObject *toks;
    if (!PyArg_ParseTuple(args, "O&O", u64_conv, &id, &toks)) return NULL;
    return do_commit_append(h, id, 0, toks, 1);
}

static PyObject *h_commit_append(HandleObject *h, PyObject *args)
{
    uint64_t id;
    size_t n;
    PyObject *toks = Py_None;
    if (!PyArg_ParseTuple(args, "O&O&|O", u64_conv, &id, size_conv, &n, &toks)) return NULL;
    return do_commit_append(h, id, n, toks, 0);
}

static PyObject *h_commit(HandleObject *h, PyObject *args)
{
    uint64_t id;
    size_t n;
    if (!PyArg_ParseTuple(args, "O&O&", u64_conv, &id, size_conv, &n)) return NULL;
    int rc;
    CALL(h, rc, pkv_seq_commit(h->c, id, n));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_step_batch(HandleObject *h, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "step_batch: a list of (seq_id, n_commit, token)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    pkv_step *steps = PyMem_Calloc((size_t)n + 1, sizeof *steps);
    if (!steps) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyArg_ParseTuple(it, "O&O&O&;step_batch: each step is (seq_id, n_commit, token)",
                              u64_conv, &steps[i].id, u32_conv, &steps[i].n_commit, u32_conv,
                              &steps[i].token)) {
            Py_DECREF(seq);
            PyMem_Free(steps);
            return NULL;
        }
    }
    Py_DECREF(seq);
    size_t done = 0;
    int rc;
    if (handle_enter(h) < 0) {
        PyMem_Free(steps);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_seq_step_batch(h->c, steps, (size_t)n, &done);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    PyObject *ret = NULL;
    if (rc) {
        /* The exception says how many steps took effect (steps [0, done)). */
        pyx_raise(rc);
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *d = PyLong_FromSize_t(done);
        PyObject *sl = slot_list(NULL, 0);
        if (d && sl && ev) {
            for (size_t i = 0; i < done; i++) {
                PyObject *o = pyx_slot(steps[i].slot.block, steps[i].slot.offset);
                if (!o || PyList_Append(sl, o) < 0) {
                    Py_XDECREF(o);
                    break;
                }
                Py_DECREF(o);
            }
            PyObject_SetAttrString(ev, "done", d);
            PyObject_SetAttrString(ev, "slots", sl);
        }
        Py_XDECREF(d);
        Py_XDECREF(sl);
        PyErr_Restore(et, ev, tb);
    } else {
        ret = PyList_New(n);
        for (Py_ssize_t i = 0; ret && i < n; i++) {
            PyObject *o = pyx_slot(steps[i].slot.block, steps[i].slot.offset);
            if (!o) Py_CLEAR(ret);
            else PyList_SET_ITEM(ret, i, o);
        }
    }
    PyMem_Free(steps);
    return ret;
}

static PyObject *h_fork(HandleObject *h, PyObject *args)
{
    uint64_t parent, child;
    if (!PyArg_ParseTuple(args, "O&O&", u64_conv, &parent, u64_conv, &child)) return NULL;
    int rc;
    CALL(h, rc, pkv_seq_fork(h->c, parent, child));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_truncate(HandleObject *h, PyObject *args)
{
    uint64_t id;
    size_t n;
    if (!PyArg_ParseTuple(args, "O&O&", u64_conv, &id, size_conv, &n)) return NULL;
    int rc;
    CALL(h, rc, pkv_seq_truncate(h->c, id, n));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_seq_close(HandleObject *h, PyObject *args)
{
    uint64_t id;
    if (!PyArg_ParseTuple(args, "O&", u64_conv, &id)) return NULL;
    int rc;
    CALL(h, rc, pkv_seq_close(h->c, id));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_seq_info(HandleObject *h, PyObject *args)
{
    uint64_t id;
    if (!PyArg_ParseTuple(args, "O&", u64_conv, &id)) return NULL;
    pkv_seq_info i;
    int rc;
    CALL(h, rc, pkv_seq_get_info(h->c, id, &i));
    if (rc) return pyx_raise(rc);
    return Py_BuildValue("(KKKK)", (unsigned long long)i.len, (unsigned long long)i.committed,
                         (unsigned long long)i.n_blocks, (unsigned long long)i.salt);
}

enum { L_BLOCKS, L_TOKENS, L_SEQS };

/* The block table, token ids or sequence ids, grown until they fit. */
static PyObject *get_list(HandleObject *h, int what, uint64_t id)
{
    size_t cap = 256, n = 0;
    for (;;) {
        size_t es = what == L_SEQS ? sizeof(uint64_t) : sizeof(uint32_t);
        void *buf = PyMem_Malloc(cap * es);
        if (!buf) return PyErr_NoMemory();
        int rc;
        if (handle_enter(h) < 0) {
            PyMem_Free(buf);
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        rc = what == L_BLOCKS ? pkv_seq_blocks(h->c, id, buf, cap, &n)
           : what == L_TOKENS ? pkv_seq_tokens(h->c, id, buf, cap, &n)
                              : pkv_seq_list(h->c, buf, cap, &n);
        Py_END_ALLOW_THREADS
        handle_leave(h);
        if (rc == PKV_ERANGE && n > cap) {
            PyMem_Free(buf);
            cap = n + n / 8 + 16; /* it may grow meanwhile */
            continue;
        }
        if (rc) {
            PyMem_Free(buf);
            return pyx_raise(rc);
        }
        PyObject *l = PyList_New((Py_ssize_t)n);
        for (size_t i = 0; l && i < n; i++) {
            PyObject *o = what == L_SEQS
                              ? PyLong_FromUnsignedLongLong(((uint64_t *)buf)[i])
                              : PyLong_FromUnsignedLong(((uint32_t *)buf)[i]);
            if (!o) Py_CLEAR(l);
            else PyList_SET_ITEM(l, (Py_ssize_t)i, o);
        }
        PyMem_Free(buf);
        return l;
    }
}

static PyObject *h_seq_blocks(HandleObject *h, PyObject *args)
{
    uint64_t id;
    if (!PyArg_ParseTuple(args, "O&", u64_conv, &id)) return NULL;
    return get_list(h, L_BLOCKS, id);
}

static PyObject *h_seq_tokens(HandleObject *h, PyObject *args)
{
    uint64_t id;
    if (!PyArg_ParseTuple(args, "O&", u64_conv, &id)) return NULL;
    return get_list(h, L_TOKENS, id);
}

static PyObject *h_seq_list(HandleObject *h, PyObject *unused)
{
    (void)unused;
    return get_list(h, L_SEQS, 0);
}

static int dset(PyObject *d, const char *k, PyObject *v)
{
    if (!v) return -1;
    int r = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return r;
}

#define U(d, s, f) (dset(d, #f, PyLong_FromUnsignedLongLong((unsigned long long)(s).f)) < 0)
#define I(d, s, f) (dset(d, #f, PyLong_FromLongLong((long long)(s).f)) < 0)
#define D(d, s, f) (dset(d, #f, PyFloat_FromDouble((s).f)) < 0)

static PyObject *h_stats(HandleObject *h, PyObject *unused)
{
    (void)unused;
    pkv_stats s;
    int rc;
    CALL(h, rc, pkv_get_stats(h->c, &s));
    if (rc) return pyx_raise(rc);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (U(d, s, capacity) || U(d, s, blocks_free) || U(d, s, blocks_cached) ||
        U(d, s, blocks_used) || U(d, s, blocks_sealed) || U(d, s, sequences) ||
        U(d, s, hit_tokens) || U(d, s, miss_tokens) || U(d, s, hit_blocks) ||
        U(d, s, miss_blocks) || U(d, s, evictions) || U(d, s, cow_copies) ||
        U(d, s, dedupes) || U(d, s, seals) || U(d, s, verify_failures) ||
        U(d, s, wal_records) || U(d, s, wal_frames) || U(d, s, wal_syncs) ||
        U(d, s, wal_bytes) || U(d, s, last_lsn) || U(d, s, durable_lsn) ||
        U(d, s, checkpoints) || U(d, s, checkpoint_deltas) || U(d, s, checkpoint_lsn) ||
        U(d, s, cuda_handles) || U(d, s, cuda_mode) || U(d, s, seal_sums_ahead) ||
        U(d, s, wal_max_delay_us) || U(d, s, checkpoint_failures) ||
        I(d, s, checkpoint_error) || U(d, s, checkpoint_backoff_ms) ||
        U(d, s, waits_limbo) || U(d, s, waits_seal) || U(d, s, waits_backlog) ||
        U(d, s, wait_limbo_us) || U(d, s, wait_seal_us) || U(d, s, wait_backlog_us) ||
        U(d, s, limbo_evict_max) || U(d, s, blocks_limbo) || U(d, s, tier_published) ||
        U(d, s, tier_publish_dropped) || U(d, s, tier_publish_errors) ||
        U(d, s, tier_fetches) || U(d, s, tier_fetch_blocks) || U(d, s, tier_fetch_found) ||
        U(d, s, tier_imported) || U(d, s, tier_rejected) || U(d, s, tier_errors) ||
        U(d, s, tier_deadline_misses) || U(d, s, tier_redirects) || U(d, s, tier_deleted) ||
        U(d, s, tier_delete_failed) || U(d, s, tier_lookups) || U(d, s, tier_lookup_blocks) ||
        U(d, s, tier_lookup_found)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *h_recovery(HandleObject *h, PyObject *unused)
{
    (void)unused;
    pkv_recovery r;
    int rc;
    CALL(h, rc, pkv_get_recovery(h->c, &r));
    if (rc) return pyx_raise(rc);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (U(d, r, checkpoint_lsn) || U(d, r, checkpoint_deltas) || U(d, r, records_replayed) ||
        U(d, r, last_lsn) || U(d, r, torn_bytes) || U(d, r, corrupt_lsn) ||
        U(d, r, blocks_sealed) || U(d, r, sequences) || U(d, r, blocks_dropped) ||
        U(d, r, sequences_dropped) || U(d, r, seq_blocks_bad) || U(d, r, sequences_cut) ||
        I(d, r, repaired) || D(d, r, ms_checkpoint) || D(d, r, ms_replay) ||
        D(d, r, ms_rebuild) || D(d, r, ms_verify) ||
        dset(d, "note", PyUnicode_DecodeUTF8(r.note, (Py_ssize_t)strnlen(r.note, sizeof r.note),
                                             "replace")) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *h_check(HandleObject *h, PyObject *unused)
{
    (void)unused;
    char why[512] = "";
    int rc;
    CALL(h, rc, pkv_check(h->c, why, sizeof why));
    if (rc == PKV_ECORRUPT) return pyx_raise_msg(rc, why);
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_sync(HandleObject *h, PyObject *unused)
{
    (void)unused;
    int rc;
    CALL(h, rc, pkv_sync(h->c));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_checkpoint(HandleObject *h, PyObject *unused)
{
    (void)unused;
    int rc;
    CALL(h, rc, pkv_checkpoint(h->c));
    if (rc) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *h_metrics_text(HandleObject *h, PyObject *unused)
{
    (void)unused;
    size_t cap = 16384, need = 0;
    for (;;) {
        char *buf = PyMem_Malloc(cap);
        if (!buf) return PyErr_NoMemory();
        int rc;
        if (handle_enter(h) < 0) {
            PyMem_Free(buf);
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        rc = pkv_metrics_text(h->c, buf, cap, &need);
        Py_END_ALLOW_THREADS
        handle_leave(h);
        if (rc == PKV_ERANGE) {
            PyMem_Free(buf);
            cap = need + 4096;
            continue;
        }
        PyObject *r = rc ? pyx_raise(rc) : PyUnicode_FromString(buf);
        PyMem_Free(buf);
        return r;
    }
}

/* The block's state through the inspection API (not on connected handles). */
static int block_state(HandleObject *h, uint32_t b, pkv_block_info *bi)
{
    int rc;
    if (handle_enter(h) < 0) return -1;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_inspect_block(h->c, b, bi);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    if (rc) {
        pyx_raise(rc);
        return -1;
    }
    return 0;
}

static PyObject *h_block_info(HandleObject *h, PyObject *args)
{
    uint32_t b;
    if (!PyArg_ParseTuple(args, "O&", u32_conv, &b)) return NULL;
    pkv_block_info bi;
    if (block_state(h, b, &bi) < 0) return NULL;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (I(d, bi, state) || U(d, bi, ref) || U(d, bi, flags) || U(d, bi, parent) ||
        U(d, bi, children) || U(d, bi, salt) || U(d, bi, payload_sum) || U(d, bi, release_lsn)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Read-only unless the block is being filled (OPEN) or the caller asks for a
 * writable view (`writable` True); connected handles cannot inspect, so their
 * views are read-only unless asked. */
static int view_readonly(HandleObject *h, uint32_t b, PyObject *writable, int *ro)
{
    int want = writable == Py_None ? -1 : PyObject_IsTrue(writable);
    if (want == -1 && PyErr_Occurred()) return -1;
    if (h->rdonly) { /* its arena may be mapped without write permission */
        if (want == 1) {
            pyx_raise_msg(PKV_ERDONLY, "a cache opened read-only has no writable views");
            return -1;
        }
        *ro = 1;
        return 0;
    }
    if (h->remote) {
        *ro = want != 1;
        return 0;
    }
    pkv_block_info bi;
    if (block_state(h, b, &bi) < 0) return -1;
    if (want == 1 && bi.state != PKV_BLOCK_OPEN) {
        pyx_raise_msg(PKV_ESTATE, bi.state == PKV_BLOCK_SEALED
                                      ? "a sealed block is immutable: no writable view"
                                      : "a free block has no slot handed out: no writable view");
        return -1;
    }
    *ro = want == 0 || bi.state != PKV_BLOCK_OPEN;
    return 0;
}

static PyObject *h_kv(HandleObject *h, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"block", "layer", "kind", "head", "writable", NULL};
    uint32_t b, l, k, hd;
    PyObject *writable = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&O&|O", kwl, u32_conv, &b, u32_conv, &l,
                                     u32_conv, &k, u32_conv, &hd, &writable))
        return NULL;
    if (handle_enter(h) < 0) return NULL;
    handle_leave(h);
    if (k > 1) return pyx_raise_msg(PKV_EINVAL, "kind must be pagedkv.K (0) or pagedkv.V (1)");
    void *p = pkv_kv(h->c, b, l, (pkv_kind)k, hd);
    if (!p)
        return pyx_raise_msg(PKV_ERANGE, "block, layer or head out of range for this cache");
    int ro;
    if (view_readonly(h, b, writable, &ro) < 0) return NULL;
    Py_ssize_t shape[2] = {h->info.block_size, h->info.head_dim};
    return pyx_view_new(h, p, 2, shape, ro, b);
}

static PyObject *h_block(HandleObject *h, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"block", "writable", NULL};
    uint32_t b;
    PyObject *writable = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O", kwl, u32_conv, &b, &writable))
        return NULL;
    if (handle_enter(h) < 0) return NULL;
    handle_leave(h);
    void *p = pkv_kv(h->c, b, 0, PKV_K, 0);
    if (!p) return pyx_raise_msg(PKV_ERANGE, "block out of range for this cache");
    int ro;
    if (view_readonly(h, b, writable, &ro) < 0) return NULL;
    Py_ssize_t shape[5] = {h->info.num_layers, 2, h->info.num_kv_heads, h->info.block_size,
                           h->info.head_dim};
    return pyx_view_new(h, p, 5, shape, ro, b);
}

static PyMethodDef h_methods[] = {
    {"close", (PyCFunction)h_close, METH_NOARGS, "close(): pkv_close."},
    {"cuda_open", (PyCFunction)(void (*)(void))pyx_cuda_open, METH_VARARGS | METH_KEYWORDS,
     "cuda_open(device=0, pool_blocks=0, flags=0) -> CudaHandle: pkv_cuda_open."},
    {"info", (PyCFunction)h_info, METH_NOARGS, "info() -> dict: pkv_info."},
    {"seq_open", (PyCFunction)h_seq_open, METH_VARARGS, "seq_open(id, tokens, salt=0) -> int."},
    {"lookup", (PyCFunction)h_lookup, METH_VARARGS, "lookup(tokens, salt=0) -> int."},
    {"append", (PyCFunction)h_append, METH_VARARGS, "append(id, tokens) -> list[Slot]."},
    {"commit", (PyCFunction)h_commit, METH_VARARGS, "commit(id, n)."},
    {"commit_append", (PyCFunction)h_commit_append, METH_VARARGS,
     "commit_append(id, n_commit, tokens=None) -> list[Slot]."},
    {"step_batch", (PyCFunction)h_step_batch, METH_O,
     "step_batch([(id, n_commit, token), ...]) -> list[Slot]."},
    {"fork", (PyCFunction)h_fork, METH_VARARGS, "fork(parent, child)."},
    {"truncate", (PyCFunction)h_truncate, METH_VARARGS, "truncate(id, new_len)."},
    {"seq_close", (PyCFunction)h_seq_close, METH_VARARGS, "seq_close(id)."},
    {"seq_info", (PyCFunction)h_seq_info, METH_VARARGS,
     "seq_info(id) -> (len, committed, n_blocks, salt)."},
    {"seq_blocks", (PyCFunction)h_seq_blocks, METH_VARARGS, "seq_blocks(id) -> list[int]."},
    {"seq_tokens", (PyCFunction)h_seq_tokens, METH_VARARGS, "seq_tokens(id) -> list[int]."},
    {"seq_list", (PyCFunction)h_seq_list, METH_NOARGS, "seq_list() -> list[int]."},
    {"stats", (PyCFunction)h_stats, METH_NOARGS, "stats() -> dict: pkv_get_stats."},
    {"recovery", (PyCFunction)h_recovery, METH_NOARGS, "recovery() -> dict."},
    {"check", (PyCFunction)h_check, METH_NOARGS, "check(): pkv_check."},
    {"sync", (PyCFunction)h_sync, METH_NOARGS, "sync(): pkv_sync."},
    {"checkpoint", (PyCFunction)h_checkpoint, METH_NOARGS, "checkpoint(): pkv_checkpoint."},
    {"metrics_text", (PyCFunction)h_metrics_text, METH_NOARGS, "metrics_text() -> str."},
    {"block_info", (PyCFunction)h_block_info, METH_VARARGS,
     "block_info(block) -> dict: pkv_inspect_block."},
    {"kv", (PyCFunction)(void (*)(void))h_kv, METH_VARARGS | METH_KEYWORDS,
     "kv(block, layer, kind, head, writable=None) -> KVView."},
    {"block", (PyCFunction)(void (*)(void))h_block, METH_VARARGS | METH_KEYWORDS,
     "block(block, writable=None) -> KVView."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef h_getset[] = {
    {"closed", (getter)h_get_closed, NULL, "True once close() ran.", NULL},
    {"remote", (getter)h_get_remote, NULL, "True for a pkv_connect handle.", NULL},
    {"exports", (getter)h_get_exports, NULL, "Buffers its views have exported now.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pyx_HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv._pagedkv.Handle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_weaklistoffset = offsetof(HandleObject, weakrefs),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An open pkv_cache (low level; use pagedkv.Cache).",
    .tp_methods = h_methods,
    .tp_getset = h_getset,
};
