/* pagedkv.h is self-contained: it is the first and only header of this file, which
 * tests/meson.build compiles with -pedantic -Werror as C11 and C99. It also links,
 * so the declarations it uses exist in the library. */
#include "pagedkv.h"

int main(void)
{
    int major = -1;
    const char *v = pkv_version(&major, 0, 0);
    return v && major == PKV_VERSION_MAJOR && pkv_strerror(PKV_EINVAL) ? 0 : 1;
}
