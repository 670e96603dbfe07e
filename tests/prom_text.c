/*
 * prom_text.c — see prom_text.h.
 */
#include "prom_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fam {
    char name[128];
    char type[16];
} fam;

typedef struct pst {
    pm_doc *d;
    fam *f;
    size_t nf, fcap;
    int line;
} pst;

static int fail(pst *p, const char *fmt, ...) {
    int k = snprintf(p->d->err, sizeof p->d->err, "line %d: ", p->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->d->err + k, sizeof p->d->err - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static bool name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }

/* A metric name at *s into out; advances *s. */
static int read_name(pst *p, const char **s, char *out, size_t cap, bool label) {
    const char *q = *s;
    if (!name_start(*q) || (label && *q == ':')) return fail(p, "bad name at \"%.20s\"", q);
    size_t n = 0;
    while (name_char(*q) && !(label && *q == ':')) {
        if (n + 1 >= cap) return fail(p, "name too long");
        out[n++] = *q++;
    }
    out[n] = '\0';
    *s = q;
    return 0;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static fam *cur_fam(pst *p) { return p->nf ? &p->f[p->nf - 1] : NULL; }

static bool fam_seen(pst *p, const char *name) {
    for (size_t i = 0; i < p->nf; i++)
        if (strcmp(p->f[i].name, name) == 0) return true;
    return false;
}

/* Checks of a histogram family once its samples are complete. */
static int check_hist(pst *p, const fam *f, size_t first) {
    char bucket[160], sum[160], count[160];
    snprintf(bucket, sizeof bucket, "%s_bucket", f->name);
    snprintf(sum, sizeof sum, "%s_sum", f->name);
    snprintf(count, sizeof count, "%s_count", f->name);
    double prev_le = -INFINITY, prev_v = 0, inf_v = -1;
    bool have_sum = false, have_count = false, have_inf = false;
    double count_v = 0;
    for (size_t i = first; i < p->d->n; i++) {
        const pm_sample *s = &p->d->s[i];
        if (strcmp(s->name, bucket) == 0) {
            if (have_inf) return fail(p, "%s: bucket after le=\"+Inf\"", f->name);
            if (strncmp(s->labels, "le=", 3) != 0 || strchr(s->labels, ','))
                return fail(p, "%s: bucket labels \"%s\" are not just le", f->name, s->labels);
            char *end;
            double le = strtod(s->labels + 3, &end);
            if (*end || end == s->labels + 3)
                return fail(p, "%s: le \"%s\" is not a number", f->name, s->labels + 3);
            if (!(le > prev_le)) return fail(p, "%s: le %s not ascending", f->name, s->labels + 3);
            if (s->v < prev_v) return fail(p, "%s: buckets not cumulative at le=%s", f->name, s->labels + 3);
            prev_le = le;
            prev_v = s->v;
            if (isinf(le)) {
                have_inf = true;
                inf_v = s->v;
            }
        } else if (strcmp(s->name, sum) == 0) {
            have_sum = true;
        } else if (strcmp(s->name, count) == 0) {
            have_count = true;
            count_v = s->v;
        } else {
            return fail(p, "%s: sample %s is not a histogram part", f->name, s->name);
        }
    }
    if (!have_inf) return fail(p, "%s: no le=\"+Inf\" bucket", f->name);
    if (!have_sum || !have_count) return fail(p, "%s: _sum or _count missing", f->name);
    if (count_v != inf_v)
        return fail(p, "%s: _count %g != +Inf bucket %g", f->name, count_v, inf_v);
    return 0;
}

static size_t fam_first; /* index of the current family's first sample */

static int close_fam(pst *p) {
    fam *f = cur_fam(p);
    if (!f) return 0;
    if (p->d->n == fam_first) return fail(p, "family %s has no samples", f->name);
    if (strcmp(f->type, "histogram") == 0) return check_hist(p, f, fam_first);
    return 0;
}

static int sample_line(pst *p, const char *s) {
    pm_sample smp;
    memset(&smp, 0, sizeof smp);
    if (read_name(p, &s, smp.name, sizeof smp.name, false)) return -1;
    size_t lo = 0;
    if (*s == '{') {
        s++;
        for (;;) {
            char ln[128];
            if (read_name(p, &s, ln, sizeof ln, true)) return -1;
            if (strncmp(ln, "__", 2) == 0) return fail(p, "reserved label name %s", ln);
            if (*s++ != '=' || *s++ != '"') return fail(p, "label %s: expected =\"", ln);
            int k = snprintf(smp.labels + lo, sizeof smp.labels - lo, "%s%s=", lo ? "," : "", ln);
            lo += (size_t)k;
            while (*s != '"') {
                char c = *s;
                if (!c || c == '\n') return fail(p, "unterminated label value");
                if (c == '\\') {
                    s++;
                    if (*s == '\\') c = '\\';
                    else if (*s == '"') c = '"';
                    else if (*s == 'n') c = '\n';
                    else return fail(p, "bad escape \\%c in label value", *s);
                }
                if (lo + 2 >= sizeof smp.labels) return fail(p, "labels too long");
                smp.labels[lo++] = c;
                s++;
            }
            s++;
            if (*s == ',') {
                s++;
                continue;
            }
            if (*s != '}') return fail(p, "expected , or } after a label");
            s++;
            break;
        }
    }
    if (*s++ != ' ') return fail(p, "expected one space before the value");
    char *end;
    smp.v = strtod(s, &end);
    if (end == s || *end) return fail(p, "value \"%s\" is not a float", s);
    fam *f = cur_fam(p);
    if (!f) return fail(p, "sample %s before any # TYPE", smp.name);
    bool mine = strcmp(f->type, "histogram") == 0
                    ? strncmp(smp.name, f->name, strlen(f->name)) == 0 &&
                          (strcmp(smp.name + strlen(f->name), "_bucket") == 0 ||
                           strcmp(smp.name + strlen(f->name), "_sum") == 0 ||
                           strcmp(smp.name + strlen(f->name), "_count") == 0)
                    : strcmp(smp.name, f->name) == 0;
    if (!mine) return fail(p, "sample %s outside its family (current: %s)", smp.name, f->name);
    if (pm_find(p->d, smp.name, smp.labels)) return fail(p, "duplicate sample %s{%s}", smp.name, smp.labels);
    if (p->d->n == p->d->cap) {
        size_t nc = p->d->cap ? 2 * p->d->cap : 64;
        pm_sample *ns = realloc(p->d->s, nc * sizeof *ns);
        if (!ns) return fail(p, "out of memory");
        p->d->s = ns;
        p->d->cap = nc;
    }
    p->d->s[p->d->n++] = smp;
    return 0;
}

int pm_parse(const char *text, pm_doc *d) {
    memset(d, 0, sizeof *d);
    pst p = {d, NULL, 0, 0, 0};
    fam_first = 0;
    int rc = 0;
    char pending_help[128] = "";
    size_t tl = strlen(text);
    if (tl == 0 || text[tl - 1] != '\n') {
        rc = fail(&p, "the text does not end with a newline");
        goto out;
    }
    for (const char *s = text; *s;) {
        p.line++;
        const char *nl = strchr(s, '\n');
        size_t len = (size_t)(nl - s);
        char line[4096];
        if (len >= sizeof line) {
            rc = fail(&p, "line too long");
            goto out;
        }
        memcpy(line, s, len);
        line[len] = '\0';
        s = nl + 1;
        if (!len) {
            rc = fail(&p, "empty line");
            goto out;
        }
        if (line[0] == '#') {
            const char *q = line;
            char name[128];
            if (strncmp(line, "# HELP ", 7) == 0) {
                if (pending_help[0]) {
                    rc = fail(&p, "HELP %s not followed by its TYPE", pending_help);
                    goto out;
                }
                q += 7;
                if ((rc = read_name(&p, &q, name, sizeof name, false))) goto out;
                if (*q != ' ' || !q[1]) {
                    rc = fail(&p, "HELP %s without text", name);
                    goto out;
                }
                for (const char *e = q; *e; e++)
                    if (*e == '\\' && e[1] != '\\' && e[1] != 'n') {
                        rc = fail(&p, "bad escape in HELP %s", name);
                        goto out;
                    } else if (*e == '\\') {
                        e++;
                    }
                if (fam_seen(&p, name)) {
                    rc = fail(&p, "second HELP for %s", name);
                    goto out;
                }
                snprintf(pending_help, sizeof pending_help, "%s", name);
            } else if (strncmp(line, "# TYPE ", 7) == 0) {
                q += 7;
                if ((rc = read_name(&p, &q, name, sizeof name, false))) goto out;
                if (strcmp(pending_help, name) != 0) {
                    rc = fail(&p, "TYPE %s not right after its HELP", name);
                    goto out;
                }
                pending_help[0] = '\0';
                if (*q++ != ' ') {
                    rc = fail(&p, "TYPE %s: no type", name);
                    goto out;
                }
                if (strcmp(q, "counter") && strcmp(q, "gauge") && strcmp(q, "histogram") &&
                    strcmp(q, "summary") && strcmp(q, "untyped")) {
                    rc = fail(&p, "TYPE %s: unknown type %s", name, q);
                    goto out;
                }
                if (strcmp(q, "counter") == 0 && !ends_with(name, "_total")) {
                    rc = fail(&p, "counter %s does not end in _total", name);
                    goto out;
                }
                if (fam_seen(&p, name)) {
                    rc = fail(&p, "second TYPE for %s", name);
                    goto out;
                }
                if ((rc = close_fam(&p))) goto out;
                if (p.nf == p.fcap) {
                    size_t nc = p.fcap ? 2 * p.fcap : 32;
                    fam *nf = realloc(p.f, nc * sizeof *nf);
                    if (!nf) {
                        rc = fail(&p, "out of memory");
                        goto out;
                    }
                    p.f = nf;
                    p.fcap = nc;
                }
                snprintf(p.f[p.nf].name, sizeof p.f[p.nf].name, "%s", name);
                snprintf(p.f[p.nf].type, sizeof p.f[p.nf].type, "%s", q);
                p.nf++;
                fam_first = d->n;
            } else {
                rc = fail(&p, "comment that is neither HELP nor TYPE");
                goto out;
            }
            continue;
        }
        if (pending_help[0]) {
            rc = fail(&p, "HELP %s not followed by its TYPE", pending_help);
            goto out;
        }
        if ((rc = sample_line(&p, line))) goto out;
    }
    if (pending_help[0]) {
        rc = fail(&p, "HELP %s without TYPE at the end", pending_help);
        goto out;
    }
    rc = close_fam(&p);
    d->families = p.nf;
out:
    free(p.f);
    if (rc) {
        free(d->s);
        d->s = NULL;
        d->n = d->cap = 0;
    }
    return rc;
}

void pm_free(pm_doc *d) {
    free(d->s);
    d->s = NULL;
    d->n = d->cap = 0;
}

const pm_sample *pm_find(const pm_doc *d, const char *name, const char *labels) {
    if (!labels) labels = "";
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->s[i].name, name) == 0 && strcmp(d->s[i].labels, labels) == 0)
            return &d->s[i];
    return NULL;
}
