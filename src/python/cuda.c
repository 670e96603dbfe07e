/*
 * cuda.c — the CUDA layer (include/pagedkv.h, docs/cuda.md) from Python: a
 * device handle (pkv_cuda) on a cache, its page-in batches, and the device
 * memory a batch pins exported as DLPack tensors (kDLCUDA) for
 * torch.from_dlpack: the pool, the batch's block tables and lengths.
 *
 * Owns one pkv_cuda per CudaHandle and one pkv_cuda_batch per CudaBatch.
 * Lifetime is a chain of strong references, each link refusing to be cut
 * while something below it lives: a DLPack tensor holds its DeviceArray,
 * which holds its CudaBatch; release() raises BufferError while tensors of
 * the batch exist (a released batch's slots may be reused for other blocks
 * and its tables are freed). A batch holds its CudaHandle, whose close()
 * raises BufferError while unreleased batches exist; a CudaHandle holds the
 * cache Handle, whose close() raises BufferError while CUDA handles are open
 * ("A pkv_cuda handle must be closed before its cache"). Objects collected
 * unreleased / unclosed are released / closed by their dealloc.
 * Streams (the array API's __dlpack__ rules for CUDA): None and 1 are the
 * legacy default stream, 2 the per-thread default stream, -1 "do not
 * synchronize", any other value a cudaStream_t; 0 is refused. The batch's
 * copies were enqueued on its page-in stream; an export to another stream
 * makes that stream wait for them (an event), so the consumer never reads a
 * slot before its copy lands.
 * Every pkv_cuda_* call exists in every build; without the CUDA layer (the
 * wheel) they return PKV_ENOTSUP, so cuda_open raises NotSupportedError and no
 * batch ever exists. This file has never run against a device (no GPU where it
 * was written): tests/gpu/run.sh runs its device test.
 */
#include "pyext.h"

#include <stdlib.h>
#include <string.h>

#include "dlpack.h"
#include "pkv_config.h"
#if PKV_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct {
    PyObject_HEAD
    HandleObject *h;   /* the cache */
    pkv_cuda *g;       /* NULL once closed */
    int device;
    Py_ssize_t batches; /* unreleased batches */
} CudaHandleObject;

typedef struct {
    PyObject_HEAD
    CudaHandleObject *gh;
    pkv_cuda_batch *b; /* NULL once released */
    void *stream;      /* the page-in stream */
    int writable;      /* paged in with PKV_CUDA_GPU_APPEND */
    pkv_cuda_batch_info info;
    Py_ssize_t exports; /* DLPack tensors of its arrays (under the GIL) */
} CudaBatchObject;

/* One device array of a batch: the pool, the tables or the lengths. */
typedef struct {
    PyObject_HEAD
    CudaBatchObject *batch;
    void *ptr;
    int ndim;
    int readonly;
    pyx_DLDataType dtype;
    int64_t shape[6], strides[6]; /* strides in elements */
} DeviceArrayObject;

static PyTypeObject CudaHandleType, CudaBatchType, DeviceArrayType;

/* ---- streams ------------------------------------------------------------ */

/* The array API's stream value as a cudaStream_t (void *): None and 1 the
 * legacy default stream (NULL), 2 cudaStreamPerThread (whose value is 2), any
 * other positive value a cudaStream_t. Where nosync is given (__dlpack__), -1
 * sets it: "do not synchronize". 0 or -1 with an exception. */
static int stream_arg(PyObject *o, void **out, int *nosync)
{
    *out = NULL;
    if (nosync) *nosync = 0;
    if (o == NULL || o == Py_None) return 0;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v == -1 && nosync) {
        *nosync = 1;
        return 0;
    }
    if (v <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        nosync ? "stream: None or 1 (legacy default stream), 2 (per-thread "
                                 "default), -1 (no synchronization) or a cudaStream_t; 0 is "
                                 "ambiguous"
                               : "stream: None or 1 (legacy default stream), 2 (per-thread "
                                 "default) or a cudaStream_t");
        return -1;
    }
    *out = v == 1 ? NULL : (void *)(uintptr_t)v; /* 2: cudaStreamPerThread's value */
    return 0;
}

/* Make `consumer` wait for the work enqueued on `producer` so far. 0 or -1. */
static int stream_wait(void *producer, void *consumer)
{
    if (producer == consumer) return 0;
#if PKV_WITH_CUDA
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev, (cudaStream_t)producer);
        if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)consumer, ev, 0);
        cudaEventDestroy(ev); /* freed once the wait is done */
    }
    if (e != cudaSuccess) {
        PyErr_Format(PyExc_BufferError, "cannot order the consumer's stream after the page-in: %s",
                     cudaGetErrorString(e));
        return -1;
    }
#endif
    return 0;
}

/* ---- CudaHandle --------------------------------------------------------- */

PyObject *pyx_cuda_open(HandleObject *h, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"device", "pool_blocks", "flags", NULL};
    int device = 0;
    unsigned int pool_blocks = 0, flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iII:cuda_open", kwlist, &device, &pool_blocks,
                                     &flags))
        return NULL;
    pkv_cuda_options opt;
    pkv_cuda_options_init(&opt);
    opt.device = device;
    opt.pool_blocks = pool_blocks;
    opt.flags = flags;
    if (handle_enter(h) < 0) return NULL;
    pkv_cuda *g = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_cuda_open(h->c, &opt, &g);
    Py_END_ALLOW_THREADS
    handle_leave(h);
    if (rc != 0) return pyx_raise(rc);
    CudaHandleObject *o = PyObject_New(CudaHandleObject, &CudaHandleType);
    if (!o) {
        Py_BEGIN_ALLOW_THREADS
        pkv_cuda_close(g);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    o->h = (HandleObject *)Py_NewRef((PyObject *)h);
    o->g = g;
    o->device = device;
    o->batches = 0;
    h->cuda_handles++;
    return (PyObject *)o;
}

static void cuda_do_close(CudaHandleObject *o)
{
    pkv_cuda *g = o->g;
    o->g = NULL;
    Py_BEGIN_ALLOW_THREADS
    pkv_cuda_close(g);
    Py_END_ALLOW_THREADS
    o->h->cuda_handles--;
}

static void cuda_dealloc(CudaHandleObject *o)
{
    if (o->g) cuda_do_close(o); /* no batch is left: each holds a reference */
    Py_DECREF(o->h);
    PyObject_Free(o);
}

static int cuda_live(CudaHandleObject *o)
{
    if (!o->g) {
        PyErr_SetString(PyExc_ValueError, "operation on a closed pagedkv CUDA handle");
        return 0;
    }
    return 1;
}

static PyObject *cuda_close(CudaHandleObject *o, PyObject *unused)
{
    (void)unused;
    if (!o->g) Py_RETURN_NONE;
    if (o->batches > 0)
        return PyErr_Format(PyExc_BufferError,
                            "cannot close the CUDA handle: %zd batch(es) not released", o->batches);
    cuda_do_close(o);
    Py_RETURN_NONE;
}

static PyObject *cuda_stats(CudaHandleObject *o, PyObject *unused)
{
    (void)unused;
    if (!cuda_live(o)) return NULL;
    pkv_cuda_stats s;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_cuda_get_stats(o->g, &s);
    Py_END_ALLOW_THREADS
    if (rc != 0) return pyx_raise(rc);
    return Py_BuildValue(
        "{s:s,s:s,s:s,s:i,s:i,s:K,s:I,s:d,s:I,s:K,s:I,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,"
        "s:K,s:K}",
        "mode", s.mode_name, "mode_note", s.mode_note, "device_name", s.device_name, "device",
        s.device, "batched_copy", s.batched_copy, "registered_bytes",
        (unsigned long long)s.registered_bytes, "register_chunks", s.register_chunks,
        "register_ms", s.register_ms, "pool_blocks", s.pool_blocks, "slot_bytes",
        (unsigned long long)s.slot_bytes, "slots_free", s.slots_free, "slots_cached",
        s.slots_cached, "slots_pinned", s.slots_pinned, "page_ins",
        (unsigned long long)s.page_ins, "page_in_failures",
        (unsigned long long)s.page_in_failures, "blocks_hit", (unsigned long long)s.blocks_hit,
        "blocks_copied", (unsigned long long)s.blocks_copied, "blocks_recopied",
        (unsigned long long)s.blocks_recopied, "evictions", (unsigned long long)s.evictions,
        "bytes_h2d", (unsigned long long)s.bytes_h2d, "writebacks",
        (unsigned long long)s.writebacks, "tokens_written_back",
        (unsigned long long)s.tokens_written_back, "bytes_d2h", (unsigned long long)s.bytes_d2h);
}

static PyObject *cuda_page_in(CudaHandleObject *o, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ids", "flags", "stream", NULL};
    PyObject *ids_o, *stream_o = Py_None;
    unsigned int flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|IO:page_in", kwlist, &ids_o, &flags,
                                     &stream_o))
        return NULL;
    if (!cuda_live(o)) return NULL;
    void *stream;
    if (stream_arg(stream_o, &stream, NULL) < 0) return NULL;
    PyObject *seq = PySequence_Fast(ids_o, "ids must be a sequence of sequence ids");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t *ids = PyMem_Malloc(sizeof *ids * (size_t)(n ? n : 1));
    if (!ids) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ix = PyNumber_Index(PySequence_Fast_GET_ITEM(seq, i)); /* numpy ints too */
        ids[i] = ix ? PyLong_AsUnsignedLongLong(ix) : (uint64_t)-1;
        Py_XDECREF(ix);
        if (ids[i] == (uint64_t)-1 && PyErr_Occurred()) {
            PyMem_Free(ids);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    if (handle_enter(o->h) < 0) {
        PyMem_Free(ids);
        return NULL;
    }
    pkv_cuda_batch *b = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_cuda_page_in(o->g, ids, (size_t)n, flags, stream, &b);
    Py_END_ALLOW_THREADS
    handle_leave(o->h);
    PyMem_Free(ids);
    if (rc != 0) return pyx_raise(rc);
    CudaBatchObject *bo = PyObject_New(CudaBatchObject, &CudaBatchType);
    if (!bo) {
        pkv_cuda_release(o->g, b, stream);
        return NULL;
    }
    bo->gh = (CudaHandleObject *)Py_NewRef((PyObject *)o);
    bo->b = b;
    bo->stream = stream;
    bo->writable = (flags & PKV_CUDA_GPU_APPEND) != 0;
    bo->exports = 0;
    pkv_cuda_batch_get_info(b, &bo->info);
    o->batches++;
    return (PyObject *)bo;
}

static PyObject *cuda_get_closed(CudaHandleObject *o, void *unused)
{
    (void)unused;
    return PyBool_FromLong(o->g == NULL);
}

static PyObject *cuda_get_device(CudaHandleObject *o, void *unused)
{
    (void)unused;
    return PyLong_FromLong(o->device);
}

static PyMethodDef cuda_methods[] = {
    {"close", (PyCFunction)cuda_close, METH_NOARGS,
     "close(): pkv_cuda_close; BufferError while batches are not released."},
    {"stats", (PyCFunction)cuda_stats, METH_NOARGS, "stats() -> dict: pkv_cuda_get_stats."},
    {"page_in", (PyCFunction)(void (*)(void))cuda_page_in, METH_VARARGS | METH_KEYWORDS,
     "page_in(ids, flags=0, stream=None) -> CudaBatch: pkv_cuda_page_in."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef cuda_getset[] = {
    {"closed", (getter)cuda_get_closed, NULL, "True once close() ran.", NULL},
    {"device", (getter)cuda_get_device, NULL, "The CUDA device ordinal.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CudaHandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.CudaHandle",
    .tp_basicsize = sizeof(CudaHandleObject),
    .tp_dealloc = (destructor)cuda_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A CUDA device attached to a cache (pkv_cuda_open): page_in() gives batches\n"
              "whose device memory exports DLPack. Keeps the cache open; the cache's\n"
              "close() raises BufferError while it is open.",
    .tp_methods = cuda_methods,
    .tp_getset = cuda_getset,
};

/* ---- CudaBatch ---------------------------------------------------------- */

static void batch_do_release(CudaBatchObject *bo, void *stream)
{
    pkv_cuda_batch *b = bo->b;
    bo->b = NULL;
    Py_BEGIN_ALLOW_THREADS
    pkv_cuda_release(bo->gh->g, b, stream); /* frees the batch even on PKV_EIO */
    Py_END_ALLOW_THREADS
    bo->gh->batches--;
}

static void batch_dealloc(CudaBatchObject *bo)
{
    /* No tensor is left (each holds a reference): release on the page-in stream. */
    if (bo->b) batch_do_release(bo, bo->stream);
    Py_DECREF(bo->gh);
    PyObject_Free(bo);
}

static int batch_live(CudaBatchObject *bo)
{
    if (!bo->b) {
        PyErr_SetString(PyExc_ValueError, "operation on a released pagedkv CUDA batch");
        return 0;
    }
    return 1;
}

static PyObject *batch_release(CudaBatchObject *bo, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:release", kwlist, &stream_o)) return NULL;
    if (!bo->b) Py_RETURN_NONE;
    void *stream;
    if (stream_arg(stream_o, &stream, NULL) < 0) return NULL;
    if (bo->exports > 0)
        return PyErr_Format(PyExc_BufferError,
                            "cannot release the batch: %zd DLPack tensor(s) of its device "
                            "memory still exist; release them first",
                            bo->exports);
    batch_do_release(bo, stream_o == Py_None ? bo->stream : stream);
    Py_RETURN_NONE;
}

static PyObject *batch_writeback(CudaBatchObject *bo, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", NULL};
    PyObject *stream_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:writeback", kwlist, &stream_o)) return NULL;
    if (!batch_live(bo)) return NULL;
    void *stream;
    if (stream_arg(stream_o, &stream, NULL) < 0) return NULL;
    if (stream_o == Py_None) stream = bo->stream;
    if (handle_enter(bo->gh->h) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_cuda_writeback(bo->gh->g, bo->b, stream);
    Py_END_ALLOW_THREADS
    handle_leave(bo->gh->h);
    if (rc != 0) return pyx_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *array_new(CudaBatchObject *bo, void *ptr, int ndim, const int64_t *shape,
                           const int64_t *strides, pyx_DLDataType dtype, int readonly)
{
    DeviceArrayObject *a = PyObject_New(DeviceArrayObject, &DeviceArrayType);
    if (!a) return NULL;
    a->batch = (CudaBatchObject *)Py_NewRef((PyObject *)bo);
    a->ptr = ptr;
    a->ndim = ndim;
    a->readonly = readonly;
    a->dtype = dtype;
    memcpy(a->shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(a->strides, strides, sizeof(int64_t) * (size_t)ndim);
    return (PyObject *)a;
}

/* The whole device pool, [slot][layer][K|V][head][token][dim]; slots are the
 * block ids of the batch's tables. */
static PyObject *batch_get_pool(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    if (!batch_live(bo)) return NULL;
    const pkv_kv_view *v = &bo->info.view;
    size_t es = v->dtype == PKV_F32 ? 4 : 2;
    size_t bytes[5] = {v->block_stride, v->layer_stride, v->kind_stride, v->head_stride,
                       v->token_stride};
    int64_t shape[6] = {(int64_t)v->num_blocks, v->num_layers, 2, v->num_kv_heads,
                        v->block_size, v->head_dim};
    int64_t strides[6];
    for (int i = 0; i < 5; i++) {
        if (bytes[i] % es) {
            PyErr_SetString(PyExc_BufferError, "the device pool's strides are not whole elements");
            return NULL;
        }
        strides[i] = (int64_t)(bytes[i] / es);
    }
    strides[5] = 1;
    pyx_DLDataType dt = {v->dtype == PKV_BF16 ? PYX_kDLBfloat : PYX_kDLFloat,
                         (uint8_t)(es * 8), 1};
    return array_new(bo, (void *)v->base, 6, shape, strides, dt, !bo->writable);
}

static PyObject *batch_get_tables(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    if (!batch_live(bo)) return NULL;
    const pkv_cuda_seqs *s = &bo->info.seqs;
    int64_t shape[2] = {(int64_t)s->n_seqs, (int64_t)s->table_stride};
    int64_t strides[2] = {(int64_t)s->table_stride, 1};
    pyx_DLDataType u32 = {1 /* kDLUInt */, 32, 1};
    return array_new(bo, (void *)s->tables, 2, shape, strides, u32, 1);
}

static PyObject *batch_get_lens(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    if (!batch_live(bo)) return NULL;
    const pkv_cuda_seqs *s = &bo->info.seqs;
    int64_t shape[1] = {(int64_t)s->n_seqs};
    int64_t strides[1] = {1};
    pyx_DLDataType u32 = {1 /* kDLUInt */, 32, 1};
    return array_new(bo, (void *)s->lens, 1, shape, strides, u32, 1);
}

static PyObject *batch_get_info(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    if (!batch_live(bo)) return NULL;
    const pkv_cuda_batch_info *i = &bo->info;
    return Py_BuildValue("{s:K,s:K,s:K,s:n,s:n,s:I,s:K}", "blocks", (unsigned long long)i->blocks,
                         "blocks_hit", (unsigned long long)i->blocks_hit, "blocks_copied",
                         (unsigned long long)i->blocks_copied, "n_seqs",
                         (Py_ssize_t)i->seqs.n_seqs, "table_stride",
                         (Py_ssize_t)i->seqs.table_stride, "max_len", i->seqs.max_len,
                         "pool_blocks", (unsigned long long)i->view.num_blocks);
}

static PyObject *batch_get_released(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    return PyBool_FromLong(bo->b == NULL);
}

static PyObject *batch_get_exports(CudaBatchObject *bo, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(bo->exports);
}

static PyMethodDef batch_methods[] = {
    {"release", (PyCFunction)(void (*)(void))batch_release, METH_VARARGS | METH_KEYWORDS,
     "release(stream=None): pkv_cuda_release (None: the page-in stream); BufferError\n"
     "while DLPack tensors of the batch exist."},
    {"writeback", (PyCFunction)(void (*)(void))batch_writeback, METH_VARARGS | METH_KEYWORDS,
     "writeback(stream=None): pkv_cuda_writeback (None: the page-in stream)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"pool", (getter)batch_get_pool, NULL,
     "The device pool (DLPack, kDLCUDA): (pool_blocks, layers, 2, kv_heads, block_size,\n"
     "head_dim); read-only unless paged in with GPU_APPEND.",
     NULL},
    {"tables", (getter)batch_get_tables, NULL,
     "Block tables (DLPack uint32, (n_seqs, table_stride)): pool slots, ids order.", NULL},
    {"lens", (getter)batch_get_lens, NULL, "Context lengths (DLPack uint32, (n_seqs,)).", NULL},
    {"info", (getter)batch_get_info, NULL, "dict: pkv_cuda_batch_get_info's counts.", NULL},
    {"released", (getter)batch_get_released, NULL, "True once release() ran.", NULL},
    {"exports", (getter)batch_get_exports, NULL, "DLPack tensors of the batch now.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CudaBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.CudaBatch",
    .tp_basicsize = sizeof(CudaBatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sequences paged into a CUDA handle's pool (pkv_cuda_page_in): pool, tables\n"
              "and lens export DLPack; the slots stay pinned until release().",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};

/* ---- DeviceArray: DLPack over a batch's device memory -------------------- */

static void array_dealloc(DeviceArrayObject *a)
{
    Py_DECREF(a->batch);
    PyObject_Free(a);
}

typedef struct {
    pyx_DLManagedTensorVersioned m; /* the versioned export, or else .legacy */
    pyx_DLManagedTensor legacy;
    DeviceArrayObject *owner;
    int64_t shape[6], strides[6];
} dev_export;

static void dev_free(dev_export *e)
{
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        e->owner->batch->exports--;
        Py_DECREF(e->owner);
        PyGILState_Release(g);
    }
    free(e);
}

static void dev_deleter_versioned(pyx_DLManagedTensorVersioned *m)
{
    dev_free((dev_export *)m->manager_ctx);
}

static void dev_deleter_legacy(pyx_DLManagedTensor *m)
{
    dev_free((dev_export *)m->manager_ctx);
}

static PyObject *array_dlpack(DeviceArrayObject *a, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream_o = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream_o,
                                     &max_version, &dl_device, &copy_o))
        return NULL;
    if (!batch_live(a->batch)) return NULL;
    int versioned = pyx_dlpack_max_version(max_version);
    if (versioned < 0) return NULL;
    if (pyx_dlpack_check_device(dl_device, PYX_kDLCUDA, a->batch->gh->device) < 0) return NULL;
    if (copy_o != Py_None) {
        int copy = PyObject_IsTrue(copy_o);
        if (copy < 0) return NULL;
        if (copy) {
            PyErr_SetString(PyExc_BufferError,
                            "the device pool is exported without a copy only (copy=True is not "
                            "supported): copy the tensor in the consumer");
            return NULL;
        }
    }
    if (a->readonly && !versioned) {
        PyErr_SetString(PyExc_BufferError,
                        "a read-only device array cannot be exported as a legacy DLPack tensor, "
                        "which cannot say read-only: pass max_version=(1, 0) or newer");
        return NULL;
    }
    void *stream;
    int nosync;
    if (stream_arg(stream_o, &stream, &nosync) < 0) return NULL;
    if (!nosync && stream_wait(a->batch->stream, stream) < 0) return NULL;

    dev_export *e = calloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    memcpy(e->shape, a->shape, sizeof e->shape);
    memcpy(e->strides, a->strides, sizeof e->strides);
    pyx_DLTensor t = {
        .data = a->ptr,
        .device = {PYX_kDLCUDA, a->batch->gh->device},
        .ndim = a->ndim,
        .dtype = a->dtype,
        .shape = e->shape,
        .strides = e->strides,
        .byte_offset = 0,
    };
    void *m;
    if (versioned) {
        e->m.version = (pyx_DLPackVersion){PYX_DLPACK_MAJOR, PYX_DLPACK_MINOR};
        e->m.manager_ctx = e;
        e->m.deleter = dev_deleter_versioned;
        e->m.flags = a->readonly ? PYX_DLPACK_FLAG_READ_ONLY : 0;
        e->m.dl_tensor = t;
        m = &e->m;
    } else {
        e->legacy.dl_tensor = t;
        e->legacy.manager_ctx = e;
        e->legacy.deleter = dev_deleter_legacy;
        m = &e->legacy;
    }
    PyObject *cap = pyx_dlpack_capsule(m, versioned);
    if (!cap) {
        free(e);
        return NULL;
    }
    e->owner = (DeviceArrayObject *)Py_NewRef((PyObject *)a);
    a->batch->exports++;
    return cap;
}

static PyObject *array_dlpack_device(DeviceArrayObject *a, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ii)", PYX_kDLCUDA, a->batch->gh->device);
}

static PyObject *array_get_shape(DeviceArrayObject *a, void *unused)
{
    (void)unused;
    PyObject *t = PyTuple_New(a->ndim);
    for (int i = 0; t && i < a->ndim; i++) {
        PyObject *o = PyLong_FromLongLong(a->shape[i]);
        if (!o) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

static PyObject *array_get_ptr(DeviceArrayObject *a, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(a->ptr);
}

static PyMethodDef array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> capsule\n"
     "The device memory as a DLPack tensor (kDLCUDA), never copied; the consumer's\n"
     "stream waits for the page-in's copies (stream=-1: no wait)."},
    {"__dlpack_device__", (PyCFunction)array_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (2, device): kDLCUDA."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef array_getset[] = {
    {"shape", (getter)array_get_shape, NULL, "The shape.", NULL},
    {"ptr", (getter)array_get_ptr, NULL, "The device address.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DeviceArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.DeviceArray",
    .tp_basicsize = sizeof(DeviceArrayObject),
    .tp_dealloc = (destructor)array_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Device memory of a CUDA batch (the pool, tables or lens), exported by\n"
              "DLPack: torch.from_dlpack(batch.pool). Keeps the batch pinned.",
    .tp_methods = array_methods,
    .tp_getset = array_getset,
};

/* ---- module ------------------------------------------------------------- */

PyObject *pyx_cuda_probe(PyObject *self, PyObject *args)
{
    (void)self;
    int device = 0;
    if (!PyArg_ParseTuple(args, "|i:cuda_probe", &device)) return NULL;
    char why[512] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_cuda_probe(device, why, sizeof why);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Os)", rc == 0 ? Py_True : Py_False, why);
}

int pyx_cuda_init(PyObject *m)
{
    if (PyType_Ready(&CudaHandleType) < 0 || PyType_Ready(&CudaBatchType) < 0 ||
        PyType_Ready(&DeviceArrayType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "CudaHandle", (PyObject *)&CudaHandleType) < 0 ||
        PyModule_AddObjectRef(m, "CudaBatch", (PyObject *)&CudaBatchType) < 0 ||
        PyModule_AddObjectRef(m, "DeviceArray", (PyObject *)&DeviceArrayType) < 0 ||
        PyModule_AddIntConstant(m, "CUDA_GPU_APPEND", PKV_CUDA_GPU_APPEND) < 0 ||
        PyModule_AddIntConstant(m, "CUDA_NO_REGISTER", PKV_CUDA_NO_REGISTER) < 0 ||
        PyModule_AddIntConstant(m, "CUDA_NO_RW_REGISTER", PKV_CUDA_NO_RW_REGISTER) < 0 ||
        PyModule_AddIntConstant(m, "CUDA_GATHER_KERNEL", PKV_CUDA_GATHER_KERNEL) < 0 ||
        PyModule_AddIntConstant(m, "WITH_CUDA", PKV_WITH_CUDA) < 0)
        return -1;
    return 0;
}
