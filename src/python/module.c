/*
 * module.c — the pagedkv._pagedkv module: its exception classes, token-id
 * conversion, pkv_attn_decode over buffers, and module initialization.
 *
 * Owns the exception hierarchy: pagedkv.Error and one subclass per PKV_E* code,
 * generated from the header's error enum (src/python/gen_errors.py), each with
 * the class attributes `code` (the PKV_E* value) and `name` ("PKV_EFULL"); a
 * raised instance carries pkv_last_error()'s message. Token arrays cross without
 * a Python loop when they are 1-D buffers of uint32 (zero copy) or of another
 * integer type (one C loop with range checks).
 */
#include "pyext.h"

#include <string.h>

typedef struct {
    int code;
    const char *name, *cls, *doc;
} err_def;

static const err_def err_defs[] = {
#include "pkv_py_errors.h"
};
#define N_ERRS (sizeof err_defs / sizeof err_defs[0])

static PyObject *Error;             /* pagedkv.Error */
static PyObject *err_class[N_ERRS]; /* parallel to err_defs */
PyObject *pyx_slot_type;

static PyObject *class_of(int rc)
{
    for (size_t i = 0; i < N_ERRS; i++)
        if (err_defs[i].code == rc) return err_class[i];
    return Error;
}

PyObject *pyx_raise_msg(int rc, const char *msg)
{
    PyObject *cls = class_of(rc);
    PyObject *exc = PyObject_CallFunction(cls, "s", msg && msg[0] ? msg : pkv_strerror(rc));
    if (!exc) return NULL;
    PyObject *code = PyLong_FromLong(rc);
    if (!code || PyObject_SetAttrString(exc, "code", code) < 0) {
        Py_XDECREF(code);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(code);
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *pyx_raise(int rc)
{
    return pyx_raise_msg(rc, pkv_last_error());
}

/* A Slot is a tuple subclass (a NamedTuple): allocated as tuple_subtype_new
 * does, without running its Python-level __new__ (10 µs a token otherwise). */
PyObject *pyx_slot(uint32_t block, uint32_t offset)
{
    PyObject *b = PyLong_FromUnsignedLong(block), *o = PyLong_FromUnsignedLong(offset);
    if (!b || !o) {
        Py_XDECREF(b);
        Py_XDECREF(o);
        return NULL;
    }
    PyTypeObject *t = pyx_slot_type ? (PyTypeObject *)pyx_slot_type : &PyTuple_Type;
    PyObject *r = t->tp_alloc(t, 2);
    if (!r) {
        Py_DECREF(b);
        Py_DECREF(o);
        return NULL;
    }
    PyTuple_SET_ITEM(r, 0, b);
    PyTuple_SET_ITEM(r, 1, o);
    return r;
}

const char *pyx_format(pkv_dtype d)
{
    return d == PKV_F32 ? "f" : d == PKV_F16 ? "e" : "H";
}

/* ---- Token ids ----------------------------------------------------------- */

/* A struct-module integer format: its signedness, or 0 if not an integer type. */
static int int_format(const char *f, int *is_signed)
{
    if (!f) f = "B";
    if (f[0] == '@' || f[0] == '=' || f[0] == '<' || f[0] == '|') f++;
    if (!f[0] || f[1]) return 0;
    if (strchr("bhilq", f[0])) { *is_signed = 1; return 1; }
    if (strchr("BHILQN", f[0])) { *is_signed = 0; return 1; }
    if (f[0] == 'n') { *is_signed = 1; return 1; }
    return 0;
}

static int token_range_error(Py_ssize_t i)
{
    PyErr_Format(PyExc_OverflowError, "token %zd is not in 0..2**32-1", i);
    return -1;
}

int pyx_tokens_get(PyObject *o, pyx_tokens *t)
{
    memset(t, 0, sizeof *t);
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "tokens: a sequence of ints or a 1-D integer array, "
                                         "not str/bytes");
        return -1;
    }
    /* A strided array (no contiguous buffer) takes the sequence path below. */
    if (PyObject_CheckBuffer(o) &&
        PyObject_GetBuffer(o, &t->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        /* numpy says ValueError ("ndarray is not C-contiguous") */
        if (!PyErr_ExceptionMatches(PyExc_BufferError) &&
            !PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
    } else if (PyObject_CheckBuffer(o)) {
        t->has_view = 1;
        int sg = 0;
        Py_buffer *v = &t->view;
        if (v->ndim > 1 || !int_format(v->format, &sg)) {
            pyx_tokens_release(t);
            PyErr_SetString(PyExc_TypeError, "tokens: a buffer must be 1-D of integers");
            return -1;
        }
        size_t n = (size_t)(v->len / v->itemsize);
        t->n = n;
        /* uint32, aligned: zero copy (a misaligned one, e.g. a sliced memoryview
         * cast, is copied: the C API reads it as uint32_t) */
        if (!sg && v->itemsize == 4 && ((uintptr_t)v->buf & 3) == 0) {
            t->p = v->buf;
            return 0;
        }
        t->owned = PyMem_Malloc((n ? n : 1) * sizeof(uint32_t));
        if (!t->owned) {
            pyx_tokens_release(t);
            PyErr_NoMemory();
            return -1;
        }
        const unsigned char *b = v->buf;
        for (size_t i = 0; i < n; i++) {
            int64_t sv = 0;
            uint64_t uv = 0;
            const unsigned char *e = b + i * (size_t)v->itemsize;
            switch (v->itemsize * (sg ? -1 : 1)) {
            case 1: uv = *(const uint8_t *)e; break;
            case 2: { uint16_t x; memcpy(&x, e, 2); uv = x; break; }
            case 4: { uint32_t x; memcpy(&x, e, 4); uv = x; break; }
            case 8: { uint64_t x; memcpy(&x, e, 8); uv = x; break; }
            case -1: sv = *(const int8_t *)e; break;
            case -2: { int16_t x; memcpy(&x, e, 2); sv = x; break; }
            case -4: { int32_t x; memcpy(&x, e, 4); sv = x; break; }
            case -8: { int64_t x; memcpy(&x, e, 8); sv = x; break; }
            default:
                pyx_tokens_release(t);
                PyErr_SetString(PyExc_TypeError, "tokens: unsupported integer size");
                return -1;
            }
            if (sg) {
                if (sv < 0 || sv > (int64_t)UINT32_MAX) {
                    pyx_tokens_release(t);
                    return token_range_error((Py_ssize_t)i);
                }
                uv = (uint64_t)sv;
            } else if (uv > UINT32_MAX) {
                pyx_tokens_release(t);
                return token_range_error((Py_ssize_t)i);
            }
            t->owned[i] = (uint32_t)uv;
        }
        t->p = t->owned;
        return 0;
    }
    PyObject *seq = PySequence_Fast(o, "tokens: a sequence of ints or a 1-D integer array");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    t->owned = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!t->owned) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ix = PyNumber_Index(items[i]); /* ints, numpy integer scalars */
        unsigned long long v = ix ? PyLong_AsUnsignedLongLong(ix) : 0;
        Py_XDECREF(ix);
        if (PyErr_Occurred() || v > UINT32_MAX) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError)) {
                Py_DECREF(seq);
                pyx_tokens_release(t);
                return -1;
            }
            PyErr_Clear();
            Py_DECREF(seq);
            pyx_tokens_release(t);
            return token_range_error(i);
        }
        t->owned[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    t->n = (size_t)n;
    t->p = t->owned;
    return 0;
}

void pyx_tokens_release(pyx_tokens *t)
{
    if (t->has_view) PyBuffer_Release(&t->view);
    PyMem_Free(t->owned);
    memset(t, 0, sizeof *t);
}

/* ---- pkv_attn_decode ----------------------------------------------------- */

/* Fill `v` from a 6-D buffer (num_blocks, layers, 2, kv_heads, block_size,
 * head_dim) of `dtype`. */
static int view_from_buffer(Py_buffer *b, int dtype, pkv_kv_view *v)
{
    if (b->ndim != 6) {
        PyErr_SetString(PyExc_ValueError, "attn_decode: a K/V array must have shape "
                        "(num_blocks, layers, 2, kv_heads, block_size, head_dim)");
        return -1;
    }
    size_t es = dtype == PKV_F32 ? 4 : 2;
    if ((size_t)b->itemsize != es) {
        PyErr_SetString(PyExc_ValueError, "attn_decode: the K/V array's item size does not "
                        "match dtype");
        return -1;
    }
    for (int i = 0; i < 6; i++)
        if (b->strides[i] < 0 || b->shape[i] > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "attn_decode: negative strides or too large a "
                            "dimension");
            return -1;
        }
    if (b->shape[2] != 2 || b->strides[5] != (Py_ssize_t)es) {
        PyErr_SetString(PyExc_ValueError, "attn_decode: axis 2 must be K|V (2) and rows "
                        "(head_dim) contiguous");
        return -1;
    }
    memset(v, 0, sizeof *v);
    v->base = b->buf;
    v->dtype = (pkv_dtype)dtype;
    v->num_blocks = (uint64_t)b->shape[0];
    v->num_layers = (uint32_t)b->shape[1];
    v->num_kv_heads = (uint32_t)b->shape[3];
    v->block_size = (uint32_t)b->shape[4];
    v->head_dim = (uint32_t)b->shape[5];
    v->block_stride = (size_t)b->strides[0];
    v->layer_stride = (size_t)b->strides[1];
    v->kind_stride = (size_t)b->strides[2];
    v->head_stride = (size_t)b->strides[3];
    v->token_stride = (size_t)b->strides[4];
    return 0;
}

static int f32_buffer(PyObject *o, Py_buffer *b, int writable, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS |
                                     (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *f = b->format ? b->format : "B";
    if (f[0] == '@' || f[0] == '=' || f[0] == '<') f++;
    if (strcmp(f, "f") != 0) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_TypeError, "attn_decode: %s must be a float32 buffer", what);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(attn_doc,
"attn_decode(source, layer, num_q_heads, scale, num_threads, flags, tables, lens, q, out,\n"
"            dtype=-1)\n"
"Low-level pkv_attn_decode; use pagedkv.attn_decode.");

static PyObject *m_attn_decode(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwl[] = {"source", "layer", "num_q_heads", "scale", "num_threads", "flags",
                          "tables", "lens", "q", "out", "dtype", NULL};
    PyObject *src, *tables, *lens, *qo, *oo;
    unsigned int layer, nqh, nthr, flags;
    float scale;
    int dtype = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIfIIOOOO|i", kwl, &src, &layer, &nqh, &scale,
                                     &nthr, &flags, &tables, &lens, &qo, &oo, &dtype))
        return NULL;
    PyObject *tl = PySequence_Fast(tables, "tables: a list of block tables");
    if (!tl) return NULL;
    PyObject *ll = PySequence_Fast(lens, "lens: a list of ints");
    if (!ll) {
        Py_DECREF(tl);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tl);
    PyObject *ret = NULL;
    pyx_tokens *tabs = NULL;
    pkv_attn_seq *seqs = NULL;
    Py_buffer kvb, qb, ob;
    int has_kvb = 0, has_qb = 0, has_ob = 0, entered = 0;
    HandleObject *h = NULL;
    pkv_kv_view view;
    if (PySequence_Fast_GET_SIZE(ll) != n) {
        PyErr_SetString(PyExc_ValueError, "attn_decode: tables and lens differ in length");
        goto out;
    }
    tabs = PyMem_Calloc((size_t)n + 1, sizeof *tabs);
    seqs = PyMem_Calloc((size_t)n + 1, sizeof *seqs);
    if (!tabs || !seqs) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pyx_tokens_get(PySequence_Fast_GET_ITEM(tl, i), &tabs[i]) < 0) goto out;
        size_t len = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(ll, i));
        if (len == (size_t)-1 && PyErr_Occurred()) goto out;
        seqs[i].blocks = tabs[i].p;
        seqs[i].n_blocks = tabs[i].n;
        seqs[i].len = len;
    }
    if (PyObject_TypeCheck(src, &pyx_HandleType)) {
        h = (HandleObject *)src;
        if (handle_enter(h) < 0) goto out;
        entered = 1;
        view = h->kv;
    } else {
        if (dtype < 0) {
            PyErr_SetString(PyExc_ValueError, "attn_decode: an array source needs a dtype");
            goto out;
        }
        if (PyObject_GetBuffer(src, &kvb, PyBUF_FORMAT | PyBUF_STRIDES) < 0) goto out;
        has_kvb = 1;
        if (view_from_buffer(&kvb, dtype, &view) < 0) goto out;
    }
    if (f32_buffer(qo, &qb, 0, "q") < 0) goto out;
    has_qb = 1;
    if (f32_buffer(oo, &ob, 1, "out") < 0) goto out;
    has_ob = 1;
    size_t need = (size_t)n * nqh * view.head_dim * sizeof(float);
    if ((size_t)qb.len < need || (size_t)ob.len < need) {
        PyErr_Format(PyExc_ValueError, "attn_decode: q and out need %zu float32 each "
                     "(n_seqs * num_q_heads * head_dim)", need / sizeof(float));
        goto out;
    }
    pkv_attn_params p = {.layer = layer, .num_q_heads = nqh, .scale = scale,
                         .num_threads = nthr, .flags = flags};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pkv_attn_decode(&view, &p, seqs, (size_t)n, qb.buf, ob.buf);
    Py_END_ALLOW_THREADS
    if (rc) {
        pyx_raise(rc);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    if (entered) handle_leave(h);
    if (has_kvb) PyBuffer_Release(&kvb);
    if (has_qb) PyBuffer_Release(&qb);
    if (has_ob) PyBuffer_Release(&ob);
    if (tabs)
        for (Py_ssize_t i = 0; i < n; i++) pyx_tokens_release(&tabs[i]);
    PyMem_Free(tabs);
    PyMem_Free(seqs);
    Py_DECREF(tl);
    Py_DECREF(ll);
    return ret;
}

/* ---- Small module functions ---------------------------------------------- */

static PyObject *m_strerror(PyObject *self, PyObject *arg)
{
    (void)self;
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(pkv_strerror((int)c));
}

static PyObject *m_set_slot_type(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg, &PyTuple_Type) ||
        ((PyTypeObject *)arg)->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "_set_slot_type: a NamedTuple class");
        return NULL;
    }
    Py_XSETREF(pyx_slot_type, Py_NewRef(arg));
    Py_RETURN_NONE;
}

/* Convert between float32 buffers and storage elements (pkv_kv_store/_load):
 * convert(dtype, dst, src, to_storage). */
static PyObject *m_convert(PyObject *self, PyObject *args)
{
    (void)self;
    int dtype, store;
    PyObject *dst, *src;
    if (!PyArg_ParseTuple(args, "iOOp", &dtype, &dst, &src, &store)) return NULL;
    Py_buffer d, s;
    if (PyObject_GetBuffer(dst, &d, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(src, &s, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    size_t es = dtype == PKV_F32 ? 4 : 2;
    size_t n = (size_t)(store ? s.len / 4 : s.len / (Py_ssize_t)es);
    int rc = 0;
    if ((size_t)d.len < n * (store ? es : 4)) {
        PyErr_SetString(PyExc_ValueError, "convert: destination too small");
        rc = 1;
    } else {
        rc = store ? pkv_kv_store((pkv_dtype)dtype, d.buf, s.buf, n)
                   : pkv_kv_load((pkv_dtype)dtype, d.buf, s.buf, n);
        if (rc) pyx_raise(rc);
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

PyObject *pyx_open(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pyx_connect(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"open", (PyCFunction)(void (*)(void))pyx_open, METH_VARARGS | METH_KEYWORDS,
     "open(dir, **options) -> Handle: pkv_open (low level; use pagedkv.Cache)."},
    {"connect", pyx_connect, METH_VARARGS,
     "connect(socket_path) -> Handle: pkv_connect (low level; use pagedkv.connect)."},
    {"attn_decode", (PyCFunction)(void (*)(void))m_attn_decode, METH_VARARGS | METH_KEYWORDS,
     attn_doc},
    {"strerror", m_strerror, METH_O, "strerror(code) -> str: pkv_strerror."},
    {"cuda_probe", pyx_cuda_probe, METH_VARARGS,
     "cuda_probe(device=0) -> (bool, str): pkv_cuda_probe (usable, why not)."},
    {"convert", m_convert, METH_VARARGS,
     "convert(dtype, dst, src, to_storage): pkv_kv_store (True) / pkv_kv_load (False)."},
    {"_set_slot_type", m_set_slot_type, METH_O, "Register the Slot class (internal)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "pagedkv._pagedkv",
    "C extension of the pagedkv package: a thin layer over libpagedkv's public API.\n"
    "Use the pagedkv package, which documents every call.",
    -1, methods, NULL, NULL, NULL, NULL,
};

static int add_int(PyObject *m, const char *name, long v)
{
    return PyModule_AddIntConstant(m, name, v);
}

PyMODINIT_FUNC PyInit__pagedkv(void)
{
    if (PyType_Ready(&pyx_HandleType) < 0 || PyType_Ready(&pyx_KVViewType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyObject *d = Py_BuildValue("{s:O,s:s}", "code", Py_None, "__module__", "pagedkv");
    if (!d) goto fail;
    Error = PyErr_NewExceptionWithDoc(
        "pagedkv.Error",
        "A pagedkv call failed. `code` is its PKV_E* value, `name` the code's name, and the\n"
        "message pkv_last_error()'s detail. One subclass per code.",
        NULL, d);
    Py_DECREF(d);
    if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0) goto fail;
    PyObject *codes = PyDict_New();
    if (!codes || PyModule_AddObject(m, "ERRORS", codes) < 0) {
        Py_XDECREF(codes);
        goto fail;
    }
    for (size_t i = 0; i < N_ERRS; i++) {
        char qual[96], doc[512];
        snprintf(qual, sizeof qual, "pagedkv.%s", err_defs[i].cls);
        snprintf(doc, sizeof doc, "%s: %s.", err_defs[i].name, err_defs[i].doc);
        PyObject *cd = Py_BuildValue("{s:i,s:s,s:s}", "code", err_defs[i].code, "name",
                                     err_defs[i].name, "__module__", "pagedkv");
        if (!cd) goto fail;
        err_class[i] = PyErr_NewExceptionWithDoc(qual, doc, Error, cd);
        Py_DECREF(cd);
        if (!err_class[i] || PyModule_AddObjectRef(m, err_defs[i].cls, err_class[i]) < 0)
            goto fail;
        PyObject *k = PyLong_FromLong(err_defs[i].code);
        if (!k || PyDict_SetItem(codes, k, err_class[i]) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
        if (add_int(m, err_defs[i].name + 4, err_defs[i].code) < 0) goto fail; /* EFULL, ... */
    }
    if (pyx_cuda_init(m) < 0) goto fail;
    if (PyModule_AddObjectRef(m, "Handle", (PyObject *)&pyx_HandleType) < 0 ||
        PyModule_AddObjectRef(m, "KVView", (PyObject *)&pyx_KVViewType) < 0)
        goto fail;
    if (add_int(m, "K", PKV_K) || add_int(m, "V", PKV_V) || add_int(m, "F32", PKV_F32) ||
        add_int(m, "F16", PKV_F16) || add_int(m, "BF16", PKV_BF16) ||
        add_int(m, "DURABLE_GROUP", PKV_DURABLE_GROUP) ||
        add_int(m, "DURABLE_NONE", PKV_DURABLE_NONE) ||
        add_int(m, "DURABLE_ALWAYS", PKV_DURABLE_ALWAYS) ||
        add_int(m, "OPEN_RDONLY", PKV_OPEN_RDONLY) ||
        add_int(m, "OPEN_POINT_IN_TIME", PKV_OPEN_POINT_IN_TIME) ||
        add_int(m, "OPEN_PREFAULT", PKV_OPEN_PREFAULT) ||
        add_int(m, "OPEN_FULL_CHECKPOINTS", PKV_OPEN_FULL_CHECKPOINTS) ||
        add_int(m, "OPEN_LIMBO_WAIT", PKV_OPEN_LIMBO_WAIT) ||
        add_int(m, "EVICT_LEAF_LRU", PKV_EVICT_LEAF_LRU) ||
        add_int(m, "EVICT_LEAF_SLRU", PKV_EVICT_LEAF_SLRU) ||
        add_int(m, "ATTN_PORTABLE", PKV_ATTN_PORTABLE) ||
        add_int(m, "BLOCK_FREE", PKV_BLOCK_FREE) || add_int(m, "BLOCK_OPEN", PKV_BLOCK_OPEN) ||
        add_int(m, "BLOCK_SEALED", PKV_BLOCK_SEALED) ||
        add_int(m, "ERR_FIRST", PKV_ERR_FIRST) || add_int(m, "ERR_LAST", PKV_ERR_LAST))
        goto fail;
    if (PyModule_AddStringConstant(m, "version", pkv_version(NULL, NULL, NULL)) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
