/*
 * view.c — pagedkv._pagedkv.KVView: a buffer-protocol object over K/V in the
 * mapped arena (one (block, layer, kind, head) run, or a whole block).
 *
 * Owns nothing but a strong reference to its Handle, which keeps the cache open
 * while the view lives. Each exported buffer (and DLPack tensor, dlpack.c) is
 * counted on the view and on the Handle (Handle.exports): the Handle refuses
 * close() while any exist, so a numpy array, memoryview or tensor over the
 * arena never outlives the mapping. A view whose Handle was closed raises
 * ValueError on every use instead of touching unmapped memory. Read-only
 * views refuse writable buffers (sealed blocks are immutable: their checksum
 * was taken when they were sealed).
 * Layout (pagedkv.h): a block's payload is [layer][K|V][kv_head][token][head_dim],
 * contiguous, so both view shapes are C-contiguous.
 */
#include "pyext.h"

#include <string.h>

PyObject *pyx_view_new(HandleObject *h, void *ptr, int ndim, const Py_ssize_t *shape,
                       int readonly, uint32_t block)
{
    KVViewObject *v = PyObject_New(KVViewObject, &pyx_KVViewType);
    if (!v) return NULL;
    v->h = (HandleObject *)Py_NewRef((PyObject *)h);
    v->ptr = ptr;
    v->ndim = ndim;
    v->readonly = readonly;
    v->block = block;
    v->itemsize = (Py_ssize_t)h->info.elem_size;
    v->exports = 0;
    Py_ssize_t s = v->itemsize;
    for (int i = ndim - 1; i >= 0; i--) {
        v->shape[i] = shape[i];
        v->strides[i] = s;
        s *= shape[i];
    }
    v->len = s;
    v->nitems = s / v->itemsize;
    v->one = 1;
    return (PyObject *)v;
}

int pyx_view_closed(KVViewObject *v)
{
    if (!v->h->c || v->h->closing) {
        PyErr_SetString(PyExc_ValueError, "K/V view of a closed pagedkv cache");
        return 1;
    }
    return 0;
}

static void view_dealloc(KVViewObject *v)
{
    Py_DECREF(v->h);
    PyObject_Free(v);
}

static int view_getbuffer(KVViewObject *v, Py_buffer *b, int flags)
{
    if (pyx_view_closed(v)) {
        b->obj = NULL;
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && v->readonly) {
        PyErr_SetString(PyExc_BufferError, "read-only K/V view (a sealed block, or writable "
                                           "not requested)");
        b->obj = NULL;
        return -1;
    }
    b->buf = v->ptr;
    b->obj = Py_NewRef((PyObject *)v);
    b->len = v->len;
    b->readonly = v->readonly;
    b->suboffsets = NULL;
    b->internal = NULL;
    if (flags & PyBUF_FORMAT) {
        b->format = (char *)pyx_format(v->h->info.dtype);
        b->itemsize = v->itemsize;
    } else {
        b->format = NULL;
        b->itemsize = 1;
    }
    if ((flags & PyBUF_ND) == PyBUF_ND && (flags & PyBUF_FORMAT)) {
        b->ndim = v->ndim;
        b->shape = v->shape;
        b->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? v->strides : NULL;
    } else {
        /* Items (or bytes) in one dimension: the view is contiguous. */
        int items = (flags & PyBUF_FORMAT) != 0;
        b->ndim = 1;
        b->shape = (flags & PyBUF_ND) == PyBUF_ND ? (items ? &v->nitems : &v->len) : NULL;
        b->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? (items ? &v->itemsize : &v->one)
                                                              : NULL;
    }
    v->exports++;
    v->h->exports++;
    return 0;
}

static void view_releasebuffer(KVViewObject *v, Py_buffer *b)
{
    (void)b;
    v->exports--;
    v->h->exports--;
}

static PyBufferProcs view_as_buffer = {
    (getbufferproc)view_getbuffer,
    (releasebufferproc)view_releasebuffer,
};

static PyObject *v_get_shape(KVViewObject *v, void *unused)
{
    (void)unused;
    PyObject *t = PyTuple_New(v->ndim);
    for (int i = 0; t && i < v->ndim; i++) {
        PyObject *o = PyLong_FromSsize_t(v->shape[i]);
        if (!o) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

static PyObject *v_get_readonly(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyBool_FromLong(v->readonly);
}

static PyObject *v_get_format(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(pyx_format(v->h->info.dtype));
}

static PyObject *v_get_dtype(KVViewObject *v, void *unused)
{
    (void)unused;
    pkv_dtype d = v->h->info.dtype;
    return PyUnicode_FromString(d == PKV_F32 ? "f32" : d == PKV_F16 ? "f16" : "bf16");
}

static PyObject *v_get_nbytes(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(v->len);
}

static PyObject *v_get_block(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLong(v->block);
}

static PyObject *v_get_closed(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyBool_FromLong(!v->h->c || v->h->closing);
}

static PyObject *v_get_exports(KVViewObject *v, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(v->exports);
}

static PyObject *v_tobytes(KVViewObject *v, PyObject *unused)
{
    (void)unused;
    if (pyx_view_closed(v)) return NULL;
    return PyBytes_FromStringAndSize(v->ptr, v->len);
}

static PyObject *v_repr(KVViewObject *v)
{
    return PyUnicode_FromFormat("<pagedkv.KVView block %u, %d-D, %s%s>", (unsigned)v->block,
                                v->ndim, v->readonly ? "read-only" : "writable",
                                (!v->h->c || v->h->closing) ? ", closed" : "");
}

static PyMethodDef v_methods[] = {
    {"tobytes", (PyCFunction)v_tobytes, METH_NOARGS, "A copy of the view's bytes."},
    {"__dlpack__", (PyCFunction)(void (*)(void))pyx_view_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> capsule\n"
     "The view as a DLPack tensor (torch.from_dlpack, numpy.from_dlpack), zero-copy\n"
     "unless copy=True. max_version >= (1, 0): a versioned tensor, flagged read-only\n"
     "for a read-only view; else the legacy one, refused (BufferError) for a\n"
     "read-only view unless copy=True. The tensor keeps the cache open and counts\n"
     "as an export: close() raises BufferError while it lives. stream must be None;\n"
     "dl_device other than (1, 0) (kDLCPU) raises BufferError."},
    {"__dlpack_device__", (PyCFunction)pyx_view_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (1, 0): kDLCPU, device 0 (host memory)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef v_getset[] = {
    {"shape", (getter)v_get_shape, NULL,
     "(block_size, head_dim) for kv(); (layers, 2, kv_heads, block_size, head_dim) for block().",
     NULL},
    {"readonly", (getter)v_get_readonly, NULL, "True unless the block was being filled.", NULL},
    {"format", (getter)v_get_format, NULL,
     "struct format of an element: 'e' (f16), 'f' (f32), 'H' (bf16 bits as uint16).", NULL},
    {"dtype", (getter)v_get_dtype, NULL, "The cache's dtype: 'f16', 'f32' or 'bf16'.", NULL},
    {"nbytes", (getter)v_get_nbytes, NULL, "Bytes the view spans.", NULL},
    {"block", (getter)v_get_block, NULL, "The block id.", NULL},
    {"closed", (getter)v_get_closed, NULL, "True once the cache was closed.", NULL},
    {"exports", (getter)v_get_exports, NULL,
     "Buffers and DLPack tensors exported by this view now.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pyx_KVViewType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pagedkv.KVView",
    .tp_basicsize = sizeof(KVViewObject),
    .tp_dealloc = (destructor)view_dealloc,
    .tp_repr = (reprfunc)v_repr,
    .tp_as_buffer = &view_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Zero-copy view of K/V in the cache's mapped arena (buffer protocol and\n"
              "DLPack): numpy.asarray(view), memoryview(view), numpy.from_dlpack(view) or\n"
              "torch.from_dlpack(view) read it in place. Read-only for sealed blocks.\n"
              "Keeps the cache alive; raises ValueError once it is closed.",
    .tp_methods = v_methods,
    .tp_getset = v_getset,
};
