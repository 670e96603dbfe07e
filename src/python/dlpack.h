/*
 * dlpack.h — the few DLPack declarations the extension exports K/V with.
 *
 * Written from the DLPack specification, version 1.0 (dlpack.h of
 * https://github.com/dmlc/dlpack, v1.0, Apache License 2.0; the Python
 * exchange protocol: https://dmlc.github.io/dlpack/latest/python_spec.html and
 * the array API standard's __dlpack__). Only what pagedkv produces is declared:
 * CPU and CUDA devices, float and bfloat16 element types, the legacy
 * DLManagedTensor ("dltensor" capsules) and DLManagedTensorVersioned
 * ("dltensor_versioned", DLPack >= 1.0). The layouts must match the spec's
 * exactly: consumers (numpy, torch) read these structs through the capsule.
 * Field order and types are the ABI; names carry a pyx_ prefix where they
 * could clash with a consumer's copy of the real header.
 */
#ifndef PAGEDKV_PY_DLPACK_H
#define PAGEDKV_PY_DLPACK_H

#include <stdint.h>

/* The DLPack ABI version this producer fills in (flags READ_ONLY, IS_COPIED). */
#define PYX_DLPACK_MAJOR 1
#define PYX_DLPACK_MINOR 0

#define PYX_DLPACK_FLAG_READ_ONLY (UINT64_C(1) << 0)
#define PYX_DLPACK_FLAG_IS_COPIED (UINT64_C(1) << 1)

enum { PYX_kDLCPU = 1, PYX_kDLCUDA = 2 };     /* DLDeviceType */
enum { PYX_kDLFloat = 2, PYX_kDLBfloat = 4 }; /* DLDataTypeCode */

typedef struct {
    uint32_t major;
    uint32_t minor;
} pyx_DLPackVersion;

typedef struct {
    int32_t device_type; /* DLDeviceType: a C enum, int-sized on every ABI we build for */
    int32_t device_id;
} pyx_DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} pyx_DLDataType;

typedef struct {
    void *data;
    pyx_DLDevice device;
    int32_t ndim;
    pyx_DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} pyx_DLTensor;

typedef struct pyx_DLManagedTensor {
    pyx_DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct pyx_DLManagedTensor *self);
} pyx_DLManagedTensor;

typedef struct pyx_DLManagedTensorVersioned {
    pyx_DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct pyx_DLManagedTensorVersioned *self);
    uint64_t flags;
    pyx_DLTensor dl_tensor;
} pyx_DLManagedTensorVersioned;

#endif /* PAGEDKV_PY_DLPACK_H */
