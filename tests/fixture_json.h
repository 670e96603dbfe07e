/*
 * fixture_json.h — a small JSON reader for the test fixtures in tests/data/
 * (tests/data/smollm2-fixture.json), so the tests need no JSON library.
 *
 * Owns: parsing a whole document into a tree (objects, arrays, strings with
 * \uXXXX escapes and surrogate pairs decoded to UTF-8, numbers as double,
 * true/false/null). Strings keep their length (they may contain NUL). Parse
 * errors return NULL with a message; the tree is freed with fj_free.
 */
#ifndef PKV_FIXTURE_JSON_H
#define PKV_FIXTURE_JSON_H

#include <stddef.h>

typedef enum fj_kind { FJ_NULL, FJ_BOOL, FJ_NUM, FJ_STR, FJ_ARR, FJ_OBJ } fj_kind;

typedef struct fj {
    fj_kind kind;
    double num;      /* FJ_NUM, FJ_BOOL (0/1) */
    char *str;       /* FJ_STR (NUL-terminated), object member key */
    size_t len;      /* FJ_STR: bytes; FJ_ARR/FJ_OBJ: members */
    struct fj *item; /* FJ_ARR/FJ_OBJ: members */
    char *key;       /* set on object members */
} fj;

/* Parse text[0..n). NULL on error, *err (may be NULL) set to a static message. */
fj *fj_parse(const char *text, size_t n, const char **err);
/* Read and parse a file. */
fj *fj_load(const char *path, const char **err);
void fj_free(fj *v);
/* Member `key` of an object, or NULL. */
const fj *fj_get(const fj *obj, const char *key);

#endif
