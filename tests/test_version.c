/* One version, stated three times: meson.build's project version (passed in as
 * PKV_MESON_VERSION), the header's PKV_VERSION_* macros and pkv_version() of the
 * library; the shared library's soname is libpagedkv.so.MAJOR. */
#include "pkv_test.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

Test(version, header_library_and_build_agree)
{
    int ma = -1, mi = -1, pa = -1;
    const char *v = pkv_version(&ma, &mi, &pa);
    cr_assert_str_eq(v, PKV_VERSION_STRING);
    cr_assert_str_eq(v, PKV_MESON_VERSION);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", PKV_VERSION_MAJOR, PKV_VERSION_MINOR,
             PKV_VERSION_PATCH);
    cr_assert_str_eq(v, want);
    cr_assert(ma == PKV_VERSION_MAJOR && mi == PKV_VERSION_MINOR && pa == PKV_VERSION_PATCH);
    cr_assert_str_eq(pkv_version(NULL, NULL, NULL), v);
}

/* The library file meson built (argv[1] via PKV_LIB) is named for its soname. */
Test(version, the_soname_is_the_major_version)
{
    const char *lib = getenv("PKV_LIB");
    cr_assert_not_null(lib, "PKV_LIB names the built libpagedkv.so");
    char cmd[4200], line[512] = "";
    snprintf(cmd, sizeof cmd, "objdump -p '%s' 2>/dev/null | awk '$1==\"SONAME\"{print $2}'", lib);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    pclose(f);
    line[strcspn(line, "\n")] = 0;
    char want[64];
    snprintf(want, sizeof want, "libpagedkv.so.%d", PKV_VERSION_MAJOR);
    cr_assert_str_eq(line, want, "SONAME of %s", lib);
}
