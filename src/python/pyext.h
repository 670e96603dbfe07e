/*
 * pyext.h — shared declarations of the CPython extension pagedkv._pagedkv.
 *
 * The extension is a thin C11 layer over the public API (include/pagedkv.h,
 * pagedkv_inspect.h) and nothing else: module.c (errors, token conversion, the
 * CPU attention), handle.c (one open or connected cache: the Handle type),
 * view.c (buffer-protocol views of K/V in the mapped arena), dlpack.c (the
 * same views as DLPack tensors). The Python package
 * (python/pagedkv/) wraps it in the documented API.
 *
 * Invariants:
 *  - Every library call that may block (header "Blocks:" other than "never")
 *    runs with the GIL released, between handle_enter() and handle_leave(), so
 *    close() can wait for calls in flight before pkv_close (which must not run
 *    concurrently with any other call on the handle).
 *  - A Handle is not closed while buffers exported by its views exist
 *    (h->exports > 0, DLPack tensors included): close() raises BufferError, as
 *    mmap.close() does; so no numpy array, memoryview or DLPack tensor ever
 *    points into an unmapped arena. A view whose
 *    handle is closed raises ValueError on use.
 *  - Every view holds a strong reference to its Handle (views keep the cache
 *    alive); a Handle dropped while open is closed by its dealloc.
 */
#ifndef PAGEDKV_PYEXT_H
#define PAGEDKV_PYEXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>

#include "pagedkv.h"
#include "pagedkv_inspect.h"

typedef struct {
    PyObject_HEAD
    pkv_cache *c;          /* NULL once closed */
    pkv_cache_info info;   /* immutable geometry, read at open */
    pkv_kv_view kv;        /* the arena's layout */
    int remote;            /* from pkv_connect: no inspection API */
    int rdonly;            /* PKV_OPEN_RDONLY: the arena may be mapped read-only */
    int closing;           /* close() began: new calls raise ValueError */
    Py_ssize_t exports;    /* buffers exported by this handle's views (under the GIL) */
    Py_ssize_t cuda_handles; /* open CudaHandles (cuda.c; under the GIL) */
    pthread_mutex_t mu;    /* guards inflight */
    pthread_cond_t idle;   /* signalled when inflight drops to 0 */
    long inflight;         /* library calls running with the GIL released */
    PyObject *weakrefs;
} HandleObject;

/* A K/V view (view.c); dlpack.c exports it as DLPack too. */
typedef struct {
    PyObject_HEAD
    HandleObject *h;
    char *ptr;
    int ndim;
    int readonly;
    uint32_t block;
    Py_ssize_t itemsize, len;
    Py_ssize_t shape[5], strides[5];
    Py_ssize_t nitems, one; /* the flat (1-D) shape in items, a stride of 1 byte */
    Py_ssize_t exports;     /* buffers and DLPack tensors exported now (under the GIL) */
} KVViewObject;

extern PyTypeObject pyx_HandleType;
extern PyTypeObject pyx_KVViewType;

/* Raise the exception class of PKV code rc with pkv_last_error()'s message
 * (pkv_strerror's when empty); returns NULL. */
PyObject *pyx_raise(int rc);
/* The same with an explicit message. */
PyObject *pyx_raise_msg(int rc, const char *msg);

/* Token ids from any sequence of ints or a 1-D buffer of integers. */
typedef struct {
    const uint32_t *p;
    size_t n;
    uint32_t *owned;   /* converted copy (PyMem), or NULL */
    Py_buffer view;
    int has_view;
} pyx_tokens;
int pyx_tokens_get(PyObject *o, pyx_tokens *t);   /* 0 or -1 with an exception set */
void pyx_tokens_release(pyx_tokens *t);

/* Enter a library call on h (raises ValueError when closed): -1 or 0. */
int handle_enter(HandleObject *h);
void handle_leave(HandleObject *h);

/* A new view object over [ptr, ptr + nbytes) of h's arena. */
PyObject *pyx_view_new(HandleObject *h, void *ptr, int ndim, const Py_ssize_t *shape,
                       int readonly, uint32_t block);

/* ValueError and 1 when v's Handle is closed (or closing), else 0. */
int pyx_view_closed(KVViewObject *v);
/* KVView.__dlpack__(*, stream, max_version, dl_device, copy) and
 * __dlpack_device__() (dlpack.c). */
PyObject *pyx_view_dlpack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pyx_view_dlpack_device(PyObject *self, PyObject *unused);
/* DLPack helpers shared with cuda.c. max_version: None or (major, minor) -> 1
 * versioned, 0 legacy, -1 error. dl_device: None or (type, id), else
 * BufferError (TypeError when malformed): 0 or -1. A capsule named for the
 * version whose destructor deletes an unconsumed tensor. */
int pyx_dlpack_max_version(PyObject *o);
int pyx_dlpack_check_device(PyObject *o, int type, int id);
PyObject *pyx_dlpack_capsule(void *managed, int versioned);

/* The CUDA layer (cuda.c): Handle.cuda_open, cuda_probe, and the types. */
PyObject *pyx_cuda_open(HandleObject *h, PyObject *args, PyObject *kw);
PyObject *pyx_cuda_probe(PyObject *self, PyObject *args);
int pyx_cuda_init(PyObject *m);

/* The Slot class (a NamedTuple registered by the Python package). */
extern PyObject *pyx_slot_type;
PyObject *pyx_slot(uint32_t block, uint32_t offset);

/* pkv_dtype as a struct-module format character ("e", "f"; bf16: "H"). */
const char *pyx_format(pkv_dtype d);

#endif /* PAGEDKV_PYEXT_H */
