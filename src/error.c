/*
 * error.c — error codes, their descriptions, the thread-local detailed message
 * behind pkv_last_error(), and the library's version.
 *
 * Every failing path calls pkv_err(code, fmt, ...) once, at the place that knows
 * why, and returns its result. Internal assertion failures (bugs, never user
 * errors) end in pkv_assert_fail().
 */
#include "internal.h"

#include <stdarg.h>
#include <stdlib.h>

static _Thread_local char last_error[512];

const char *pkv_strerror(int err) {
    switch (err) {
    case PKV_OK:        return "success";
    case PKV_EINVAL:    return "invalid argument";
    case PKV_ENOMEM:    return "out of memory";
    case PKV_EFULL:     return "cache full: no free block and nothing evictable";
    case PKV_ENOSEQ:    return "no such sequence";
    case PKV_EEXIST:    return "sequence id already exists";
    case PKV_ERANGE:    return "index out of range or buffer too small";
    case PKV_ESTATE:    return "operation not valid in the sequence's state";
    case PKV_EIO:       return "I/O error";
    case PKV_ENOSPC:    return "no space left on device";
    case PKV_EGEOMETRY: return "cache geometry differs from the requested one";
    case PKV_EMODEL:    return "cache model identity differs from the requested one";
    case PKV_ECORRUPT:  return "corrupted cache or broken invariant";
    case PKV_EBUSY:     return "cache directory is open elsewhere (locked)";
    case PKV_EVERSION:  return "unsupported format or protocol version";
    case PKV_ENOTSUP:   return "not supported";
    case PKV_ERDONLY:   return "cache opened read-only";
    case PKV_EFAILED:   return "cache in failed state after an I/O error; reopen to recover";
    case PKV_EDISCONNECTED: return "the connection to pkvd is lost; close the handle and reconnect";
    default:            return "unknown error";
    }
}

const char *pkv_last_error(void) { return last_error; }

const char *pkv_version(int *major, int *minor, int *patch) {
    if (major) *major = PKV_VERSION_MAJOR;
    if (minor) *minor = PKV_VERSION_MINOR;
    if (patch) *patch = PKV_VERSION_PATCH;
    return PKV_VERSION_STRING;
}

void pkv_err_clear(void) { last_error[0] = '\0'; }

int pkv_err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

void pkv_assert_fail(const char *expr, const char *file, int line, const char *func) {
    fprintf(stderr, "pagedkv: internal assertion failed: %s (%s:%d, %s)\n", expr, file,
            line, func);
    abort();
}
