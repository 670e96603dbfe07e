/*
 * common.c — the parts of the CUDA-layer API that need no CUDA (compiled into
 * every build).
 */
#include "internal.h"

const char *pkv_cuda_mode_name(pkv_cuda_mode mode) {
    switch (mode) {
    case PKV_CUDA_MODE_NONE:          return "none";
    case PKV_CUDA_MODE_REGISTERED:    return "registered";
    case PKV_CUDA_MODE_REGISTERED_RO: return "registered-ro";
    case PKV_CUDA_MODE_STAGING:       return "staging";
    default:                          return "?";
    }
}

void pkv_cuda_options_init(pkv_cuda_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
}
