/*
 * pkv-modelbench.c — the model of src/model/ on a real GGUF, timed the way
 * bench/llama/race.py times llama.cpp on the same file, so that the two can be
 * raced (docs/benchmarks.md, "The real model against llama.cpp").
 *
 * Three commands; each prints one JSON object per measurement on stdout:
 *   tokens  the token ids of the chat the race uses: the system prompt rendered
 *           by the model's template ("system"), and the user question with the
 *           generation prompt that follows it ("question"), so that llama.cpp
 *           is fed exactly the same ids;
 *   speed   prefill of the first N system-prompt tokens (one per --prefill
 *           length, each on a fresh sequence of a fresh cache), then greedy
 *           decode of --decode tokens after the first length's prompt. Only the
 *           model calls are timed (pkvm_prefill, pkvm_step); the cache is a
 *           real pagedkv cache (f16 K/V, 16-token blocks, group commit), as in
 *           pkv-demo;
 *   ttft    one request as a new inference process serves it: load the model,
 *           open the cache directory (--cold empties it first), render and
 *           tokenize the system prompt and the question, prefill (reusing what
 *           the cache holds), first token. It reports the wall-clock time
 *           (CLOCK_REALTIME) of the first token, so that the caller can measure
 *           from before it started the process, and the parts: model load,
 *           cache open, compute. With --answer N it then decodes N tokens and
 *           prints the answer (not timed).
 *
 * Usage: pkv-modelbench tokens|speed|ttft --model GGUF [--threads N]
 *        [--kernel exact|q8] [--prompt-file FILE] [--question TEXT]
 *        [--prefill 512,2048] [--decode 64] [--cache-dir DIR] [--cold]
 *        [--answer N]
 * Exit status 0, 1 on an error, 2 on a bad command line.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "gguf.h"
#include "model.h"
#include "pagedkv.h"
#include "tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_LENS 8

static struct {
    const char *cmd, *model, *prompt_file, *question, *cache_dir;
    unsigned threads;
    pkvm_kernel kernel;
    size_t lens[MAX_LENS];
    int n_lens;
    size_t decode, answer;
    bool cold;
} opt = {
    .threads = 2,
    .kernel = PKVM_KERNEL_Q8,
    .lens = {512, 2048},
    .n_lens = 2,
    .decode = 64,
    .question = "What should a user do when the cache reports a checksum error?",
};

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("pkv-modelbench: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double real_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-modelbench tokens|speed|ttft --model GGUF [options]\n"
            "  --threads N         model threads (default 2)\n"
            "  --kernel exact|q8   products with the quantized weights: f32 activations\n"
            "                      (exact) or 8-bit activations (q8, the default)\n"
            "  --prompt-file FILE  the system prompt (default tools/demo/system-prompt.md)\n"
            "  --question TEXT     the user's question (tokens, ttft)\n"
            "  --prefill L1,L2,..  speed: prompt lengths (default 512,2048)\n"
            "  --decode N          speed: greedy tokens after the first length (default 64)\n"
            "  --cache-dir DIR     ttft: the cache directory (required)\n"
            "  --cold              ttft: empty it first\n"
            "  --answer N          ttft: then decode N tokens and print the answer\n");
}

/* ---- The model and its chat ------------------------------------------------------ */

static pkv_gguf *g_gguf;
static pkv_tok *g_tok;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, r;
    char *b = malloc(cap);
    if (!b) die("out of memory");
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            if (cap > (1u << 26)) die("%s is too large", path);
            b = realloc(b, cap *= 2);
            if (!b) die("out of memory");
        }
    }
    if (ferror(f)) die("cannot read %s", path);
    fclose(f);
    b[n] = '\0';
    return b;
}

static void encode(const char *text, size_t len, uint32_t **ids, size_t *n) {
    int rc = pkv_tok_encode(g_tok, text, len, 1, ids, n);
    if (rc) die("tokenizing: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
}

/* The system turn's ids, and the ids of the question turn with the generation
 * prompt that follow it (as pkv-demo cuts a chat). */
static void chat_ids(uint32_t **sys, size_t *n_sys, uint32_t **q, size_t *n_q) {
    char *prompt = read_text(opt.prompt_file);
    const pkv_chat_msg m[2] = {{"system", prompt}, {"user", opt.question}};
    char *head, *full;
    size_t len0, len;
    int rc = pkv_tok_chat(g_tok, m, 1, 0, &head, &len0);
    if (!rc) rc = pkv_tok_chat(g_tok, m, 2, 1, &full, &len);
    if (rc) die("chat template: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
    if (len < len0 || memcmp(full, head, len0))
        die("the template does not render the chat as its system turn and the rest");
    encode(head, len0, sys, n_sys);
    encode(full + len0, len - len0, q, n_q);
    free(head);
    free(full);
    free(prompt);
}

static void open_model(void) {
    int rc = pkv_gguf_open(opt.model, &g_gguf);
    if (rc) die("%s: %s (%s)", opt.model, pkv_strerror(rc), pkv_gguf_last_error());
    rc = pkv_tok_load(g_gguf, &g_tok);
    if (rc) die("tokenizer: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
}

static pkvm_model *load_weights(void) {
    pkvm_model *m;
    int rc = pkvm_create_gguf(g_gguf, &m);
    if (rc) die("pkvm_create_gguf: %s (%s)", pkv_strerror(rc), pkvm_last_error());
    if ((rc = pkvm_set_kernel(m, opt.kernel)))
        die("pkvm_set_kernel: %s (%s)", pkv_strerror(rc), pkvm_last_error());
    pkvm_set_threads(m, opt.threads);
    return m;
}

static void print_ids(const char *key, const uint32_t *ids, size_t n) {
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++) printf("%s%" PRIu32, i ? ", " : "", ids[i]);
    printf("]");
}

/* ---- Cache directories ----------------------------------------------------------- */

/* Remove the files of a flat cache directory (pagedkv keeps no subdirectories). */
static void empty_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return;
        die("cannot open %s: %s", dir, strerror(errno));
    }
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path)) die("cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

/* The cache's model identity: the file's hash and tokenizer, and the kernel. */
static void model_id(const pkvm_model *m, char *id, size_t cap) {
    int rc = pkv_tok_model_id(g_gguf, g_tok, id, cap);
    if (rc) die("pkv_tok_model_id: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
    /* K/V computed with 8-bit activations differ from the exact kernel's, and
     * sealing relies on K/V being a function of (model, token prefix)
     * (docs/design.md, sealing, step 3): another identity, never mixed. */
    size_t len = strlen(id);
    snprintf(id + len, cap - len, ";kernel=%s", pkvm_kernel_name(pkvm_kernel_of(m)));
}

static pkv_cache *open_cache(const char *dir, const char *id, pkvm_model *m, uint64_t capacity) {
    pkv_options o;
    pkv_options_init(&o);
    pkvm_cache_geometry(m, &o);
    o.block_size = 16;
    o.dtype = PKV_F16;
    o.capacity = capacity;
    o.model_id = id;
    pkv_cache *c;
    if (mkdir(dir, 0755) && errno != EEXIST) die("cannot create %s: %s", dir, strerror(errno));
    int rc = pkv_open(dir, &o, &c);
    if (rc) die("pkv_open(%s): %s (%s)", dir, pkv_strerror(rc), pkv_last_error());
    return c;
}

/* ---- Commands -------------------------------------------------------------------- */

static void cmd_tokens(void) {
    uint32_t *sys, *q;
    size_t n_sys, n_q;
    chat_ids(&sys, &n_sys, &q, &n_q);
    printf("{");
    print_ids("system", sys, n_sys);
    printf(", ");
    print_ids("question", q, n_q);
    printf(", \"stop\": %" PRIu32 "}\n", pkv_tok_find(g_tok, "<|im_end|>"));
    free(sys);
    free(q);
}

static void cmd_speed(void) {
    uint32_t *sys, *q;
    size_t n_sys, n_q;
    chat_ids(&sys, &n_sys, &q, &n_q);
    for (int i = 0; i < opt.n_lens; i++)
        if (opt.lens[i] > n_sys)
            die("--prefill %zu: the system prompt has only %zu tokens", opt.lens[i], n_sys);
    pkvm_model *m = load_weights();
    char id[PKV_MODEL_ID_MAX + 1];
    model_id(m, id, sizeof id);
    const uint32_t V = pkvm_config_of(m)->vocab;
    float *logits = malloc(V * sizeof *logits);
    const char *tmp = getenv("TMPDIR");
    char dirbuf[PATH_MAX];
    snprintf(dirbuf, sizeof dirbuf, "%s/pkv-modelbench-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!logits || !mkdtemp(dirbuf)) die("scratch directory or memory: %s", strerror(errno));
    for (int i = 0; i < opt.n_lens; i++) {
        const size_t n = opt.lens[i];
        empty_dir(dirbuf);
        pkv_cache *c = open_cache(dirbuf, id, m, (n + opt.decode) / 16 + 64);
        pkvm_engine *e;
        int rc = pkvm_engine_create(m, c, &e);
        if (rc) die("pkvm_engine_create: %s", pkvm_last_error());
        pkvm_engine_set_chunk(e, 512);
        size_t cached = 0;
        double t0 = mono_s();
        rc = pkvm_prefill(e, 1, 0, sys, n, logits, &cached);
        double t = mono_s() - t0;
        if (rc) die("pkvm_prefill: %s", pkvm_last_error());
        if (cached) die("a fresh cache reused %zu tokens", cached);
        printf("{\"impl\": \"pagedkv\", \"kernel\": \"%s\", \"threads\": %u, \"what\": "
               "\"prefill\", \"tokens\": %zu, \"seconds\": %.6f, \"tok_s\": %.2f}\n",
               pkvm_kernel_name(opt.kernel), opt.threads, n, t, (double)n / t);
        fflush(stdout);
        if (i == 0 && opt.decode) {
            uint64_t id = 1;
            uint32_t tok = pkvm_argmax(logits, V);
            uint32_t *out = malloc(opt.decode * sizeof *out);
            if (!out) die("out of memory");
            double td = 0;
            for (size_t k = 0; k < opt.decode; k++) {
                out[k] = tok;
                t0 = mono_s();
                rc = pkvm_step(e, &id, &tok, 1, logits);
                td += mono_s() - t0;
                if (rc) die("pkvm_step: %s", pkvm_last_error());
                tok = pkvm_argmax(logits, V);
            }
            printf("{\"impl\": \"pagedkv\", \"kernel\": \"%s\", \"threads\": %u, \"what\": "
                   "\"decode\", \"context\": %zu, \"tokens\": %zu, \"seconds\": %.6f, "
                   "\"tok_s\": %.2f, ",
                   pkvm_kernel_name(opt.kernel), opt.threads, n, opt.decode, td,
                   (double)opt.decode / td);
            print_ids("ids", out, opt.decode);
            printf("}\n");
            fflush(stdout);
            free(out);
        }
        pkvm_engine_free(e);
        pkv_close(c);
    }
    empty_dir(dirbuf);
    rmdir(dirbuf);
    free(logits);
    pkvm_free(m);
    free(sys);
    free(q);
}

static void cmd_ttft(double t_start) {
    if (!opt.cache_dir) die("ttft needs --cache-dir");
    if (opt.cold) empty_dir(opt.cache_dir);
    pkvm_model *m = load_weights();
    const double t_model = mono_s();
    char id[PKV_MODEL_ID_MAX + 1];
    model_id(m, id, sizeof id); /* hashes the whole file */
    const double t_id = mono_s();
    /* Capacity for a fresh cache: the chat and its answer, twice over. */
    pkv_cache *c = open_cache(opt.cache_dir, id, m, 512);
    const double t_open = mono_s();
    uint32_t *sys, *q;
    size_t n_sys, n_q;
    chat_ids(&sys, &n_sys, &q, &n_q);
    uint32_t *prompt = malloc((n_sys + n_q + opt.answer) * sizeof *prompt);
    const uint32_t V = pkvm_config_of(m)->vocab;
    float *logits = malloc(V * sizeof *logits);
    if (!prompt || !logits) die("out of memory");
    memcpy(prompt, sys, n_sys * sizeof *prompt);
    memcpy(prompt + n_sys, q, n_q * sizeof *prompt);
    const size_t n = n_sys + n_q;
    /* Sequences an earlier process left open are dropped (an engine would resume
     * or drop them). */
    size_t n_open = 0;
    int rc = pkv_seq_list(c, NULL, 0, &n_open);
    if (rc && rc != PKV_ERANGE) die("pkv_seq_list: %s", pkv_strerror(rc));
    if (n_open) {
        uint64_t *ids = malloc(n_open * sizeof *ids);
        if (!ids || pkv_seq_list(c, ids, n_open, &n_open)) die("pkv_seq_list");
        for (size_t i = 0; i < n_open; i++) pkv_seq_close(c, ids[i]);
        free(ids);
    }
    pkvm_engine *e;
    if ((rc = pkvm_engine_create(m, c, &e))) die("pkvm_engine_create: %s", pkvm_last_error());
    pkvm_engine_set_chunk(e, 512);
    const double t0 = mono_s();
    size_t cached = 0;
    if ((rc = pkvm_prefill(e, 1, 0, prompt, n, logits, &cached)))
        die("pkvm_prefill: %s", pkvm_last_error());
    uint32_t tok = pkvm_argmax(logits, V);
    const double t1 = mono_s(), first_real = real_s();
    const uint32_t stop = pkv_tok_find(g_tok, "<|im_end|>");
    size_t n_ans = 0;
    uint32_t *ans = prompt + n;
    for (uint64_t id = 1; n_ans < opt.answer; n_ans++) {
        ans[n_ans] = tok;
        if (tok == stop || n_ans + 1 == opt.answer) {
            n_ans++;
            break;
        }
        if ((rc = pkvm_step(e, &id, &tok, 1, logits))) die("pkvm_step: %s", pkvm_last_error());
        tok = pkvm_argmax(logits, V);
    }
    printf("{\"impl\": \"pagedkv\", \"kernel\": \"%s\", \"threads\": %u, \"mode\": \"%s\", "
           "\"prompt_tokens\": %zu, \"reused\": %zu, \"load_s\": %.6f, \"id_s\": %.6f, "
           "\"open_s\": %.6f, "
           "\"compute_s\": %.6f, \"since_main_s\": %.6f, \"first_token_realtime\": %.6f, "
           "\"first_token\": %" PRIu32,
           pkvm_kernel_name(opt.kernel), opt.threads, opt.cold ? "cold" : "warm", n, cached,
           t_model - t_start, t_id - t_model, t_open - t_id, t1 - t0, t1 - t_start, first_real,
           n_ans ? ans[0] : tok);
    if (n_ans) {
        char *text;
        size_t len;
        if (ans[n_ans - 1] == stop) n_ans--;
        if (pkv_tok_decode(g_tok, ans, n_ans, &text, &len)) die("decode");
        printf(", \"answer\": \"");
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)text[i];
            if (ch == '"' || ch == '\\') printf("\\%c", ch);
            else if (ch < 0x20) printf("\\u%04x", ch);
            else putchar(ch);
        }
        printf("\"");
        free(text);
    }
    printf("}\n");
    pkv_seq_close(c, 1);
    pkvm_engine_free(e);
    pkv_close(c);
    pkvm_free(m);
    free(prompt), free(logits), free(sys), free(q);
}

static size_t parse_size(const char *s, const char *what) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > (1u << 20)) {
        fprintf(stderr, "pkv-modelbench: %s: '%s' is not a count in 1..1048576\n", what, s);
        exit(2);
    }
    return (size_t)v;
}

int main(int argc, char **argv) {
    const double t_start = mono_s();
    enum { O_MODEL = 1, O_THREADS, O_KERNEL, O_PROMPT, O_QUESTION, O_PREFILL, O_DECODE,
           O_DIR, O_COLD, O_ANSWER, O_HELP };
    static const struct option lo[] = {
        {"model", required_argument, 0, O_MODEL},     {"threads", required_argument, 0, O_THREADS},
        {"kernel", required_argument, 0, O_KERNEL},   {"prompt-file", required_argument, 0, O_PROMPT},
        {"question", required_argument, 0, O_QUESTION}, {"prefill", required_argument, 0, O_PREFILL},
        {"decode", required_argument, 0, O_DECODE},   {"cache-dir", required_argument, 0, O_DIR},
        {"cold", no_argument, 0, O_COLD},             {"answer", required_argument, 0, O_ANSWER},
        {"help", no_argument, 0, O_HELP},             {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case O_MODEL: opt.model = optarg; break;
        case O_THREADS: opt.threads = (unsigned)parse_size(optarg, "--threads"); break;
        case O_KERNEL:
            if (!strcmp(optarg, "exact")) opt.kernel = PKVM_KERNEL_EXACT;
            else if (!strcmp(optarg, "q8")) opt.kernel = PKVM_KERNEL_Q8;
            else {
                fprintf(stderr, "pkv-modelbench: --kernel: exact or q8, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_PROMPT: opt.prompt_file = optarg; break;
        case O_QUESTION: opt.question = optarg; break;
        case O_PREFILL: {
            opt.n_lens = 0;
            char *s = strdup(optarg);
            for (char *p = strtok(s, ","); p; p = strtok(NULL, ",")) {
                if (opt.n_lens == MAX_LENS) {
                    fprintf(stderr, "pkv-modelbench: --prefill: at most %d lengths\n", MAX_LENS);
                    return 2;
                }
                opt.lens[opt.n_lens++] = parse_size(p, "--prefill");
            }
            free(s);
            if (!opt.n_lens) {
                fprintf(stderr, "pkv-modelbench: --prefill: no length\n");
                return 2;
            }
            break;
        }
        case O_DECODE: opt.decode = parse_size(optarg, "--decode"); break;
        case O_DIR: opt.cache_dir = optarg; break;
        case O_COLD: opt.cold = true; break;
        case O_ANSWER: opt.answer = parse_size(optarg, "--answer"); break;
        case O_HELP: case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || !opt.model) {
        usage(stderr);
        return 2;
    }
    opt.cmd = argv[optind];
    if (!opt.prompt_file) opt.prompt_file = PKV_MODELBENCH_DATA_DIR "/system-prompt.md";
    open_model();
    if (!strcmp(opt.cmd, "tokens")) cmd_tokens();
    else if (!strcmp(opt.cmd, "speed")) cmd_speed();
    else if (!strcmp(opt.cmd, "ttft")) cmd_ttft(t_start);
    else {
        usage(stderr);
        return 2;
    }
    pkv_tok_free(g_tok);
    pkv_gguf_close(g_gguf);
    return 0;
}
