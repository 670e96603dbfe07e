/* pagedkv_log.h is self-contained: it is the first and only header of this file,
 * which tests/meson.build compiles with -pedantic -Werror as C11 and C99. It also
 * links, so the declarations it uses exist in the shared library (exported). */
#include "pagedkv_log.h"

int main(void)
{
    pkv_logview *log = 0;
    pkv_log_arena a = {0, 16, 1};
    int rc = pkv_logview_open(0, &a, 0, &log); /* NULL directory: PKV_EINVAL */
    pkv_logview_close(log);
    return rc == PKV_EINVAL && log == 0 && pkv_logview_type_name(PKV_LOG_SEAL)[0] == 'S' ? 0 : 1;
}
