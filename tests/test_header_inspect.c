/* pagedkv_inspect.h is self-contained: it is the first and only header of this
 * file, which tests/meson.build compiles with -pedantic -Werror as C11 and C99.
 * It also links, so the declarations it uses exist in the library. */
#include "pagedkv_inspect.h"

int main(void)
{
    pkv_block_info bi;
    pkv_cache_info g;
    return pkv_inspect_block(0, 0, &bi) == PKV_EINVAL &&
                   pkv_inspect_geometry(0, &g) == PKV_EINVAL && PKV_NO_BLOCK == UINT32_MAX
               ? 0
               : 1;
}
