/*
 * dlpack.c — KVView.__dlpack__ / __dlpack_device__: K/V in the mapped arena
 * exported as a DLPack tensor (torch.from_dlpack, numpy.from_dlpack), zero-copy.
 *
 * Owns the managed tensors it hands out. A zero-copy tensor holds a strong
 * reference to its view (hence to the Handle and the mapping) and counts as one
 * export on the view and the Handle, exactly like a buffer-protocol export:
 * close() raises BufferError while a tensor (or an unconsumed capsule) exists,
 * so no tensor ever points into an unmapped arena. The consumer's call of the
 * deleter drops both, taking the GIL itself (a consumer may free a tensor on a
 * thread that does not hold it). A copy (copy=True) owns its bytes and holds
 * nothing.
 * Versions: a consumer that passes max_version >= (1, 0) gets a
 * DLManagedTensorVersioned in a "dltensor_versioned" capsule, flagged READ_ONLY
 * for a read-only view (a sealed block); others get the legacy DLManagedTensor
 * ("dltensor"), which cannot say read-only, so a read-only view refuses it with
 * BufferError unless copy=True (what numpy does for its read-only arrays).
 * Capsule rules (DLPack Python spec): a consumer renames the capsule to
 * "used_dltensor[_versioned]" and owns the tensor from then on; a capsule
 * still carrying its first name when collected was never consumed, and its
 * destructor calls the deleter.
 */
#include "pyext.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack.h"

/* The spec's ABI, checked where the compiler can (x86-64 and aarch64 LP64). */
_Static_assert(sizeof(pyx_DLTensor) == 48, "DLTensor layout");
_Static_assert(sizeof(pyx_DLManagedTensorVersioned) == 80, "DLManagedTensorVersioned layout");
_Static_assert(offsetof(pyx_DLManagedTensorVersioned, dl_tensor) == 32, "dl_tensor offset");

static const char CAP_LEGACY[] = "dltensor";
static const char CAP_VERSIONED[] = "dltensor_versioned";

/* One allocation per export: the managed tensor (legacy or versioned, one of
 * them used), its shape and strides, and for a copy the bytes themselves at
 * the first 256-byte boundary after the header (DLPack's recommended alignment). */
typedef struct {
    union {
        pyx_DLManagedTensor legacy;
        pyx_DLManagedTensorVersioned versioned;
    } m;
    KVViewObject *view; /* zero-copy: the view this export is counted on; NULL for a copy */
    int64_t shape[5], strides[5];
} dl_export;

#define DL_DATA_ALIGN 256
#define DL_HEADER_SIZE ((sizeof(dl_export) + DL_DATA_ALIGN - 1) / DL_DATA_ALIGN * DL_DATA_ALIGN)

static void dl_free(dl_export *e)
{
    if (e->view) {
        /* The consumer may free its tensor on any thread, with or without the
         * GIL; after finalization there is no interpreter left to give the
         * reference back to, and the mapping goes with the process. */
        if (Py_IsInitialized()) {
            PyGILState_STATE g = PyGILState_Ensure();
            e->view->exports--;
            e->view->h->exports--;
            Py_DECREF(e->view);
            PyGILState_Release(g);
        }
    }
    free(e);
}

static void dl_deleter_legacy(pyx_DLManagedTensor *m)
{
    dl_free((dl_export *)m->manager_ctx);
}

static void dl_deleter_versioned(pyx_DLManagedTensorVersioned *m)
{
    dl_free((dl_export *)m->manager_ctx);
}

/* A capsule collected under its first name was never consumed: delete its tensor.
 * Runs with the GIL; an exception may be in flight and must survive. */
static void dl_capsule_destructor(PyObject *cap)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
#endif
    if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
        pyx_DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, CAP_VERSIONED);
        if (m->deleter) m->deleter(m);
    } else if (PyCapsule_IsValid(cap, CAP_LEGACY)) {
        pyx_DLManagedTensor *m = PyCapsule_GetPointer(cap, CAP_LEGACY);
        if (m->deleter) m->deleter(m);
    } /* else renamed "used_...": the consumer owns the tensor */
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(t, v, tb);
#endif
}

int pyx_dlpack_max_version(PyObject *o)
{
    if (o == Py_None) return 0;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
        PyErr_SetString(PyExc_TypeError, "max_version must be None or a (major, minor) tuple");
        return -1;
    }
    long major = PyLong_AsLong(PyTuple_GET_ITEM(o, 0));
    if (major == -1 && PyErr_Occurred()) return -1;
    long minor = PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
    if (minor == -1 && PyErr_Occurred()) return -1;
    return major >= PYX_DLPACK_MAJOR;
}

int pyx_dlpack_check_device(PyObject *o, int type, int id)
{
    if (o == Py_None) return 0;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "dl_device must be None or a (device_type, device_id) tuple");
        return -1;
    }
    long t = PyLong_AsLong(PyTuple_GET_ITEM(o, 0)); /* an IntEnum member works too */
    if (t == -1 && PyErr_Occurred()) return -1;
    long i = PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
    if (i == -1 && PyErr_Occurred()) return -1;
    if (t != type || i != id) {
        PyErr_Format(PyExc_BufferError,
                     "this memory lives on DLPack device (%d, %d)%s and is exported there "
                     "only; dl_device=(%ld, %ld) asked for another device",
                     type, id, type == PYX_kDLCPU ? " (kDLCPU: host memory)" : " (kDLCUDA)",
                     t, i);
        return -1;
    }
    return 0;
}

PyObject *pyx_dlpack_capsule(void *managed, int versioned)
{
    return PyCapsule_New(managed, versioned ? CAP_VERSIONED : CAP_LEGACY, dl_capsule_destructor);
}

static pyx_DLDataType dl_dtype(pkv_dtype d)
{
    pyx_DLDataType t = {PYX_kDLFloat, 32, 1};
    if (d == PKV_F16) t.bits = 16;
    if (d == PKV_BF16) {
        t.code = PYX_kDLBfloat;
        t.bits = 16;
    }
    return t;
}

PyObject *pyx_view_dlpack(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    KVViewObject *v = (KVViewObject *)self;
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy_o))
        return NULL;
    if (pyx_view_closed(v)) return NULL;
    int versioned = pyx_dlpack_max_version(max_version);
    if (versioned < 0) return NULL;
    if (pyx_dlpack_check_device(dl_device, PYX_kDLCPU, 0) < 0) return NULL;
    if (stream != Py_None) {
        /* Array API: "On CPU and other device types without streams, only None
         * is accepted"; a stream here is the caller's mistake, not an export failure. */
        PyErr_SetString(PyExc_ValueError,
                        "stream must be None for a K/V view (host memory has no streams)");
        return NULL;
    }
    int copy = 0; /* None (copy only if needed: never, here) and False: zero-copy */
    if (copy_o != Py_None) {
        copy = PyObject_IsTrue(copy_o);
        if (copy < 0) return NULL;
    }
    if (v->readonly && !versioned && !copy) {
        PyErr_SetString(PyExc_BufferError,
                        "a read-only K/V view (a sealed block) cannot be exported as a legacy "
                        "DLPack tensor, which cannot say read-only: the consumer must pass "
                        "max_version=(1, 0) or newer, or copy=True");
        return NULL;
    }

    size_t bytes = DL_HEADER_SIZE + (copy ? (size_t)v->len : 0);
    bytes = (bytes + DL_DATA_ALIGN - 1) / DL_DATA_ALIGN * DL_DATA_ALIGN; /* aligned_alloc's rule */
    dl_export *e = aligned_alloc(DL_DATA_ALIGN, bytes);
    if (!e) return PyErr_NoMemory();
    memset(e, 0, sizeof *e);
    for (int i = 0; i < v->ndim; i++) {
        e->shape[i] = v->shape[i];
        e->strides[i] = v->strides[i] / v->itemsize;
    }
    pyx_DLTensor t = {
        .data = v->ptr,
        .device = {PYX_kDLCPU, 0},
        .ndim = v->ndim,
        .dtype = dl_dtype(v->h->info.dtype),
        .shape = e->shape,
        .strides = e->strides,
        .byte_offset = 0, /* as numpy and torch produce and expect */
    };
    uint64_t flags = 0;
    if (copy) {
        t.data = (char *)e + DL_HEADER_SIZE;
        memcpy(t.data, v->ptr, (size_t)v->len);
        flags = PYX_DLPACK_FLAG_IS_COPIED; /* a private copy: writable */
    } else if (v->readonly) {
        flags = PYX_DLPACK_FLAG_READ_ONLY;
    }

    void *m;
    if (versioned) {
        e->m.versioned.version = (pyx_DLPackVersion){PYX_DLPACK_MAJOR, PYX_DLPACK_MINOR};
        e->m.versioned.manager_ctx = e;
        e->m.versioned.deleter = dl_deleter_versioned;
        e->m.versioned.flags = flags;
        e->m.versioned.dl_tensor = t;
        m = &e->m.versioned;
    } else {
        e->m.legacy.dl_tensor = t;
        e->m.legacy.manager_ctx = e;
        e->m.legacy.deleter = dl_deleter_legacy;
        m = &e->m.legacy;
    }
    PyObject *cap = pyx_dlpack_capsule(m, versioned);
    if (!cap) {
        free(e);
        return NULL;
    }
    if (!copy) {
        /* Counted from here: the capsule's destructor or the consumer's deleter uncounts. */
        e->view = (KVViewObject *)Py_NewRef(self);
        v->exports++;
        v->h->exports++;
    }
    return cap;
}

PyObject *pyx_view_dlpack_device(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("(ii)", PYX_kDLCPU, 0);
}
