/*
 * gguf.h — a validating, read-only reader of GGUF model files (versions 2 and 3).
 *
 * Owns: the parsing of a GGUF file's header, metadata key/values and tensor infos,
 * and the conversion of tensor rows to f32. The file is mapped read-only; every
 * string, array and tensor handed out points into that mapping and lives until
 * pkv_gguf_close.
 *
 * Invariants after a successful open (a file that breaks any of them is refused
 * at open with PKV_ECORRUPT or PKV_EVERSION and a message naming what is wrong and
 * at which byte offset; nothing is ever read outside the mapping):
 *  - magic "GGUF", version 2 or 3, little-endian;
 *  - every count, string length and array length fits in the bytes that remain;
 *  - keys are 1..65535 bytes and unique; value types are the 13 of the spec;
 *    arrays of arrays are refused;
 *  - general.alignment, when present, is a u32 power of two (default 32);
 *  - tensor names are 1..64 bytes and unique; 1 <= n_dims <= 4; every dim >= 1;
 *    the type is one of ggml's (its block size and bytes per block known); dim 0
 *    is a whole number of blocks; the offset is aligned; the data range lies inside
 *    the file; no size computation overflows.
 * Tensor types are checked for being known at open, not for being supported:
 * converting a row of a type without a converter (anything but F32, F16, BF16,
 * Q8_0, Q4_1, Q4_0) fails then with PKV_ENOTSUP ("unsupported tensor type").
 *
 * Part of the model library (src/model/), not of libpagedkv. Functions return 0 or
 * a negative PKV_E* code; pkv_gguf_last_error() has the message of the last
 * failure on the calling thread. Nothing blocks except open (file I/O).
 */
#ifndef PKV_GGUF_H
#define PKV_GGUF_H

#include "pagedkv.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types (the GGUF spec's numbering). */
typedef enum pkv_gguf_vtype {
    PKV_GGUF_U8 = 0,
    PKV_GGUF_I8 = 1,
    PKV_GGUF_U16 = 2,
    PKV_GGUF_I16 = 3,
    PKV_GGUF_U32 = 4,
    PKV_GGUF_I32 = 5,
    PKV_GGUF_F32 = 6,
    PKV_GGUF_BOOL = 7,
    PKV_GGUF_STRING = 8,
    PKV_GGUF_ARRAY = 9,
    PKV_GGUF_U64 = 10,
    PKV_GGUF_I64 = 11,
    PKV_GGUF_F64 = 12,
} pkv_gguf_vtype;

/* Tensor types with a converter (ggml's numbering). */
#define PKV_GGUF_T_F32 0u
#define PKV_GGUF_T_F16 1u
#define PKV_GGUF_T_Q4_0 2u
#define PKV_GGUF_T_Q4_1 3u
#define PKV_GGUF_T_Q8_0 8u
#define PKV_GGUF_T_BF16 30u

#define PKV_GGUF_MAX_DIMS 4
#define PKV_GGUF_MAX_NAME 64

/* A string inside the file: not NUL-terminated. */
typedef struct pkv_gguf_str {
    const char *ptr;
    size_t len;
} pkv_gguf_str;

typedef struct pkv_gguf pkv_gguf;

/* An array value: n elements of `type` (never PKV_GGUF_ARRAY). */
typedef struct pkv_gguf_arr {
    const pkv_gguf *g;
    pkv_gguf_vtype type;
    uint64_t n;
    const unsigned char *data; /* first element (fixed-size types) */
    uint32_t idx;              /* which key/value it is */
} pkv_gguf_arr;

typedef struct pkv_gguf_tensor {
    pkv_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[PKV_GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
    uint32_t type;                  /* ggml type */
    uint64_t offset;                /* from the start of the data section */
    const void *data;               /* inside the mapping */
    uint64_t nbytes;
    uint64_t n_rows;                /* ne[1] * ne[2] * ne[3] */
    uint64_t row_bytes;             /* bytes of one row of ne[0] elements */
} pkv_gguf_tensor;

/* Map and validate the file at `path`. Blocks (open, fstat, mmap). PKV_EINVAL
 * (NULL argument), PKV_EIO (cannot open or map), PKV_ECORRUPT (malformed or
 * truncated), PKV_EVERSION (not version 2 or 3, or big-endian), PKV_ENOMEM. */
int pkv_gguf_open(const char *path, pkv_gguf **out);
/* Validate a GGUF image in memory (not copied: it must outlive the handle).
 * Same errors as pkv_gguf_open but PKV_EIO. */
int pkv_gguf_open_mem(const void *buf, size_t len, pkv_gguf **out);
void pkv_gguf_close(pkv_gguf *g);
/* Message of the last failing pkv_gguf_* call on this thread. */
const char *pkv_gguf_last_error(void);

uint32_t pkv_gguf_version(const pkv_gguf *g);
uint64_t pkv_gguf_n_kv(const pkv_gguf *g);
uint64_t pkv_gguf_n_tensors(const pkv_gguf *g);
uint32_t pkv_gguf_alignment(const pkv_gguf *g);
/* The whole file (for hashing it). */
const void *pkv_gguf_bytes(const pkv_gguf *g, size_t *len);

/* ---- Metadata ---------------------------------------------------------------- */

/* Index of `key`, or -1 when absent. */
int64_t pkv_gguf_find(const pkv_gguf *g, const char *key);
pkv_gguf_str pkv_gguf_key(const pkv_gguf *g, uint64_t idx);
pkv_gguf_vtype pkv_gguf_type(const pkv_gguf *g, uint64_t idx);

/* Typed getters: 0, or PKV_EINVAL when the key is absent or of another type (the
 * message says which). get_u32 accepts any integer type whose value fits; get_f32
 * accepts F32 and F64. */
int pkv_gguf_get_u32(const pkv_gguf *g, const char *key, uint32_t *out);
int pkv_gguf_get_f32(const pkv_gguf *g, const char *key, float *out);
int pkv_gguf_get_bool(const pkv_gguf *g, const char *key, int *out);
int pkv_gguf_get_str(const pkv_gguf *g, const char *key, pkv_gguf_str *out);
/* An array whose elements are of type `elem`. */
int pkv_gguf_get_arr(const pkv_gguf *g, const char *key, pkv_gguf_vtype elem,
                     pkv_gguf_arr *out);
/* Element i < a->n (i out of range or a wrong element type is a caller bug:
 * asserted in debug builds, an empty string / 0 otherwise). */
pkv_gguf_str pkv_gguf_arr_str(const pkv_gguf_arr *a, uint64_t i);
int32_t pkv_gguf_arr_i32(const pkv_gguf_arr *a, uint64_t i);
float pkv_gguf_arr_f32(const pkv_gguf_arr *a, uint64_t i);

/* ---- Tensors ----------------------------------------------------------------- */

const pkv_gguf_tensor *pkv_gguf_tensor_at(const pkv_gguf *g, uint64_t i);
/* The tensor called `name`, or NULL. */
const pkv_gguf_tensor *pkv_gguf_tensor_find(const pkv_gguf *g, const char *name);
/* "F32", "Q4_1", ... or "unknown". */
const char *pkv_gguf_type_name(uint32_t type);
/* Whether rows of `type` can be converted to f32. */
int pkv_gguf_type_supported(uint32_t type);

/* Row `row` < t->n_rows as t->ne[0] floats. PKV_ERANGE (row out of range),
 * PKV_ENOTSUP (no converter for the type), PKV_EINVAL (NULL). */
int pkv_gguf_row_f32(const pkv_gguf_tensor *t, uint64_t row, float *out);
/* The whole tensor, n_rows * ne[0] floats, row after row. */
int pkv_gguf_tensor_f32(const pkv_gguf_tensor *t, float *out);

/* IEEE half and bfloat16 to float (exact). */
float pkv_gguf_f16(uint16_t h);
float pkv_gguf_bf16(uint16_t h);

#endif
