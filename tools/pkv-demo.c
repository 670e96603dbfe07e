/*
 * pkv-demo.c — the main job: a restarted inference process serves the same chat
 * requests faster, with identical output, because its KV cache survived on disk.
 *
 * One command runs a scripted multi-user chat workload twice, each time in a new
 * process (the demo re-executes itself) on the same pagedkv cache directory (by
 * default a new one under $TMPDIR, removed after a successful run):
 *   1. cold: the cache directory is emptied first; the process computes every
 *      prompt token it cannot find in the cache (the shared system prompt once,
 *      then whatever each conversation adds);
 *   2. warm: a new process opens the same directory, recovers the cache and runs
 *      the same requests, which now find almost all of their prompts cached.
 * The model is the reference Llama-style transformer of src/model/, by default on
 * the real weights, tokenizer and ChatML template of a GGUF file (--model; the
 * SmolLM2 file scripts/get-model.sh fetches), serving a real chat: the system
 * prompt and the users' questions are text files (tools/demo/), the answers are
 * decoded and printed; or with weights from a seed and byte tokens (--preset),
 * serving generated text. Either is run the way an inference engine runs one on pagedkv:
 * pkv_seq_open attaches the cached prefix, the rest of the prompt is appended, each
 * layer's K/V is written into the returned slots and committed; decode is batched
 * over every open sequence; one request samples several answers in parallel
 * (pkv_seq_fork). Then it prints per run: requests, prompt tokens computed vs
 * reused, hit rate, time to first token (median, p90) and total time; then the
 * warm/cold TTFT ratio and whether every generated token sequence of the warm run
 * equals the cold run's; for the real chat, the questions and answers as text.
 * See docs/demo.md.
 *
 * Exit status: 0 when both runs succeed and their outputs are identical, 1 on an
 * error or a mismatch, 2 on a bad command line.
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
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Options ------------------------------------------------------------------ */

enum { RUN_BOTH = 0, RUN_COLD = 1, RUN_WARM = 2 };

static struct opts {
    char cache_dir[PATH_MAX - 64];
    const char *preset;      /* the seeded model, or NULL for the GGUF */
    const char *model_path;  /* the GGUF (when preset is NULL) */
    const char *questions_file;
    uint32_t users, turns, samples, answer, sys_tokens, msg_min, msg_max, block_size;
    uint32_t threads;
    uint64_t seed, capacity;
    const char *prompt_file;
    const char *arena_dir;
    const char *metrics_addr; /* --metrics: serve /metrics there during each pass */
    const char *socket;       /* --socket: each pass is a client of this pkvd */
    bool pkvd_args;           /* --pkvd-args: print the pkvd options this demo needs */
    uint32_t metrics_linger;  /* --metrics-linger: seconds to keep serving after it */
    pkv_durability durability;
    pkv_dtype kv;
    pkvm_kernel kernel;
    bool json, quiet;
    bool own_dir; /* cache_dir was created by this run (no --cache-dir) */
    int run;
    int result_fd;
} opt = {
    .users = 0, /* 0: the default of the model kind (resolve_defaults) */
    .sys_tokens = 2400,
    .msg_min = 256,
    .msg_max = 768,
    .block_size = 16,
    .threads = 0,
    .seed = 1,
    .durability = PKV_DURABLE_GROUP,
    .kv = PKV_F16,
    .kernel = PKVM_KERNEL_Q8,
    .run = RUN_BOTH,
    .result_fd = -1,
};

static const char *prog = "pkv-demo";

#ifndef PKV_DEMO_DATA_DIR
#define PKV_DEMO_DATA_DIR "tools/demo" /* meson names the source tree's */
#endif
#ifndef PKV_DEMO_SHARE_DIR
#define PKV_DEMO_SHARE_DIR "/usr/local/share/pagedkv/demo" /* meson names the installed one */
#endif
#define SYSTEM_FILE "system-prompt.md"
#define QUESTIONS_FILE "questions.txt"

/* The real chat's text: the source tree's copy when this binary was built from a
 * tree that is still there, else the installed copy. */
static const char *demo_data_dir(void) {
    return access(PKV_DEMO_DATA_DIR "/" SYSTEM_FILE, R_OK) == 0 ? PKV_DEMO_DATA_DIR
                                                                 : PKV_DEMO_SHARE_DIR;
}

/* Where scripts/get-model.sh puts the SmolLM2 file. */
static const char *default_model_path(void) {
    static char buf[PATH_MAX];
    if (buf[0]) return buf;
    const char *cache = getenv("PKV_MODEL_CACHE"), *home = getenv("HOME");
    if (cache && cache[0])
        snprintf(buf, sizeof buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/pagedkv/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 home && home[0] ? home : "/tmp");
    return buf;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pkv-demo [options]\n"
            "Runs a multi-user chat twice on one pagedkv cache directory, cold (emptied\n"
            "first) and then as a warm restart in a new process, and compares time to first\n"
            "token and the generated tokens; prints the answers. See docs/demo.md.\n"
            "\n"
            "  --model PATH          a GGUF model (llama architecture, gpt2 BPE tokenizer,\n"
            "                        ChatML template); default: %s\n"
            "  --preset NAME         the seeded model instead: %s (random weights, byte\n"
            "                        tokens, generated text)\n"
            "  --prompt-file FILE    the system prompt (default for --model: %s/%s;\n"
            "                        with --preset the generated text is replaced by FILE's bytes)\n"
            "  --questions-file FILE the users' questions, one a line (--model; default\n"
            "                        %s/%s)\n"
            "  --cache-dir DIR       cache directory (default: a new one under $TMPDIR or /tmp,\n"
            "                        removed after a successful run); the cold run empties it,\n"
            "                        and refuses if it holds non-pagedkv files or another\n"
            "                        process has it open\n"
            "  --arena-dir DIR       keep the arena file in DIR (e.g. /dev/shm), the log in the\n"
            "                        cache directory (pkv_options.arena_dir)\n"
            "  --users N             conversations (default 3 with --model, 4 with --preset)\n"
            "  --turns N             turns per conversation (default 2 / 3)\n"
            "  --samples N           parallel samples of the forked request (default 2 / 3;\n"
            "                        1: none)\n"
            "  --answer-tokens N     tokens generated per answer at most (default 48 / 32)\n"
            "  --system-tokens N     --preset: length of the generated system prompt (2400)\n"
            "  --message-tokens A-B  --preset: user message length range (256-768)\n"
            "  --durability MODE     group, none or always (default group)\n"
            "  --kv-dtype TYPE       f16, bf16 or f32 K/V storage (default f16)\n"
            "  --kernel exact|q8     --model: products with the quantized weights on 8-bit\n"
            "                        activations, as llama.cpp (q8, the default), or on f32\n"
            "                        activations (exact; slower)\n"
            "  --block-size N        tokens per cache block (default 16)\n"
            "  --capacity N          cache blocks (default: sized for the workload)\n"
            "  --threads N           compute threads per process (default: 2 with --model\n"
            "                        when there are 2 CPUs or more, else 1)\n"
            "  --seed N              --preset: model weights and workload text (default 1)\n"
            "  --metrics ADDR        serve Prometheus metrics at http://ADDR/metrics (IPV4:PORT,\n"
            "                        e.g. 127.0.0.1:9464) while each run has the cache open\n"
            "  --metrics-linger S    keep serving S seconds after each run's work (default 0),\n"
            "                        so a scraper sees the final values\n"
            "  --socket PATH         run each pass as a client of the pkvd on PATH (pkv_connect)\n"
            "                        instead of opening a cache directory; start that pkvd\n"
            "                        with the options --pkvd-args prints (docs/pkvd.md)\n"
            "  --pkvd-args           print the pkvd geometry options this model and workload\n"
            "                        need (--layers ... --model-id ...) and exit\n"
            "  --run cold|warm       run one pass only, in this process\n"
            "  --json                print the summary as JSON on stdout\n"
            "  --quiet               no progress on stderr\n"
            "  --help                this text\n",
            default_model_path(), pkvm_preset_names(), demo_data_dir(), SYSTEM_FILE,
            demo_data_dir(), QUESTIONS_FILE);
}

static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void bad_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    usage(stderr);
    exit(2);
}

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static uint64_t parse_num(const char *s, const char *what, uint64_t lo, uint64_t hi) {
    char *end;
    errno = 0;
    if (!s[0] || s[0] == '-' || s[0] == '+') bad_usage("bad %s '%s'", what, s);
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        bad_usage("bad %s '%s' (expected %" PRIu64 "..%" PRIu64 ")", what, s, lo, hi);
    return v;
}

/* Options left unset take the default of the model kind: the real model's
 * workload is smaller, since each of its tokens costs far more than a seeded one. */
static void resolve_defaults(void) {
    const bool real = !opt.preset;
    if (real && !opt.model_path) opt.model_path = default_model_path();
    if (!opt.users) opt.users = real ? 3 : 4;
    if (!opt.turns) opt.turns = real ? 2 : 3;
    if (!opt.samples) opt.samples = real ? 2 : 3;
    if (!opt.answer) opt.answer = real ? 48 : 32;
    if (!opt.threads) opt.threads = real && sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
    static char sys_path[4200], q_path[4200];
    if (real && !opt.prompt_file) {
        snprintf(sys_path, sizeof sys_path, "%s/%s", demo_data_dir(), SYSTEM_FILE);
        opt.prompt_file = sys_path;
    }
    if (real && !opt.questions_file) {
        snprintf(q_path, sizeof q_path, "%s/%s", demo_data_dir(), QUESTIONS_FILE);
        opt.questions_file = q_path;
    }
}

static void parse_args(int argc, char **argv) {
    static const struct option lo[] = {
        {"cache-dir", 1, 0, 'c'},      {"preset", 1, 0, 'p'},        {"users", 1, 0, 'u'},
        {"turns", 1, 0, 't'},          {"samples", 1, 0, 's'},       {"answer-tokens", 1, 0, 'a'},
        {"system-tokens", 1, 0, 'S'},  {"prompt-file", 1, 0, 'f'},   {"message-tokens", 1, 0, 'm'},
        {"durability", 1, 0, 'd'},     {"kv-dtype", 1, 0, 'k'},      {"block-size", 1, 0, 'b'},
        {"capacity", 1, 0, 'C'},       {"threads", 1, 0, 'T'},       {"seed", 1, 0, 'e'},
        {"run", 1, 0, 'r'},            {"json", 0, 0, 'j'},          {"quiet", 0, 0, 'q'},
        {"result-fd", 1, 0, 'R'},      {"help", 0, 0, 'h'},          {"arena-dir", 1, 0, 'A'},
        {"model", 1, 0, 'M'},          {"questions-file", 1, 0, 'Q'},   {"kernel", 1, 0, 'K'},
        {"metrics", 1, 0, 'X'},        {"metrics-linger", 1, 0, 'L'},
        {"socket", 1, 0, 'P'},         {"pkvd-args", 0, 0, 'G'},
        {0, 0, 0, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case 'c':
            if (!optarg[0] || strlen(optarg) >= sizeof opt.cache_dir)
                bad_usage("bad --cache-dir '%s'", optarg);
            snprintf(opt.cache_dir, sizeof opt.cache_dir, "%s", optarg);
            break;
        case 'p': {
            pkvm_config cfg;
            if (pkvm_preset(optarg, &cfg)) bad_usage("unknown --preset '%s'", optarg);
            opt.preset = optarg;
            break;
        }
        case 'u': opt.users = (uint32_t)parse_num(optarg, "--users", 1, 64); break;
        case 't': opt.turns = (uint32_t)parse_num(optarg, "--turns", 1, 64); break;
        case 's': opt.samples = (uint32_t)parse_num(optarg, "--samples", 1, 16); break;
        case 'a': opt.answer = (uint32_t)parse_num(optarg, "--answer-tokens", 1, 4096); break;
        case 'S': opt.sys_tokens = (uint32_t)parse_num(optarg, "--system-tokens", 2, 1u << 20); break;
        case 'f': opt.prompt_file = optarg; break;
        case 'Q': opt.questions_file = optarg; break;
        case 'M':
            if (!optarg[0]) bad_usage("bad --model ''");
            opt.model_path = optarg;
            break;
        case 'A':
            if (!optarg[0]) bad_usage("bad --arena-dir ''");
            opt.arena_dir = optarg;
            break;
        case 'm': {
            const char *dash = strchr(optarg, '-');
            char a[32];
            if (!dash || (size_t)(dash - optarg) >= sizeof a)
                bad_usage("bad --message-tokens '%s' (expected A-B)", optarg);
            memcpy(a, optarg, (size_t)(dash - optarg));
            a[dash - optarg] = '\0';
            opt.msg_min = (uint32_t)parse_num(a, "--message-tokens", 1, 1u << 16);
            opt.msg_max = (uint32_t)parse_num(dash + 1, "--message-tokens", 1, 1u << 16);
            if (opt.msg_max < opt.msg_min) bad_usage("bad --message-tokens '%s'", optarg);
            break;
        }
        case 'd':
            if (!strcmp(optarg, "group")) opt.durability = PKV_DURABLE_GROUP;
            else if (!strcmp(optarg, "none")) opt.durability = PKV_DURABLE_NONE;
            else if (!strcmp(optarg, "always")) opt.durability = PKV_DURABLE_ALWAYS;
            else bad_usage("bad --durability '%s' (group, none or always)", optarg);
            break;
        case 'k':
            if (!strcmp(optarg, "f16")) opt.kv = PKV_F16;
            else if (!strcmp(optarg, "bf16")) opt.kv = PKV_BF16;
            else if (!strcmp(optarg, "f32")) opt.kv = PKV_F32;
            else bad_usage("bad --kv-dtype '%s' (f16, bf16 or f32)", optarg);
            break;
        case 'K':
            if (!strcmp(optarg, "q8")) opt.kernel = PKVM_KERNEL_Q8;
            else if (!strcmp(optarg, "exact")) opt.kernel = PKVM_KERNEL_EXACT;
            else bad_usage("bad --kernel '%s' (q8 or exact)", optarg);
            break;
        case 'b': opt.block_size = (uint32_t)parse_num(optarg, "--block-size", 1, PKV_BLOCK_SIZE_MAX); break;
        case 'C': opt.capacity = parse_num(optarg, "--capacity", 1, 1u << 31); break;
        case 'T': opt.threads = (uint32_t)parse_num(optarg, "--threads", 1, 64); break;
        case 'e': opt.seed = parse_num(optarg, "--seed", 0, UINT64_MAX); break;
        case 'r':
            if (!strcmp(optarg, "cold")) opt.run = RUN_COLD;
            else if (!strcmp(optarg, "warm")) opt.run = RUN_WARM;
            else bad_usage("bad --run '%s' (cold or warm)", optarg);
            break;
        case 'j': opt.json = true; break;
        case 'q': opt.quiet = true; break;
        case 'X':
            if (!optarg[0]) bad_usage("bad --metrics ''");
            opt.metrics_addr = optarg;
            break;
        case 'P':
            if (!optarg[0]) bad_usage("bad --socket ''");
            opt.socket = optarg;
            break;
        case 'G': opt.pkvd_args = true; break;
        case 'L': opt.metrics_linger = (uint32_t)parse_num(optarg, "--metrics-linger", 0, 3600); break;
        case 'R': opt.result_fd = (int)parse_num(optarg, "--result-fd", 3, 1 << 20); break;
        case 'h': usage(stdout); exit(0);
        case ':': bad_usage("option '%s' needs a value", argv[optind - 1]);
        default: bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) bad_usage("unexpected argument '%s'", argv[optind]);
    if (opt.preset && opt.model_path) bad_usage("--model and --preset exclude each other");
    if (opt.socket && (opt.cache_dir[0] || opt.arena_dir || opt.metrics_addr))
        bad_usage("--socket: the cache is pkvd's (its --dir, its --metrics), so --cache-dir, "
                  "--arena-dir and --metrics do not apply");
    if (opt.preset && opt.questions_file) bad_usage("--questions-file needs the GGUF model, not --preset");
    resolve_defaults();
    if (!opt.cache_dir[0] && opt.run == RUN_WARM && !opt.socket)
        bad_usage("--run warm needs --cache-dir DIR, the directory of an earlier --run cold");
}

/* ---- Small helpers ----------------------------------------------------------------- */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

#define PKV(call)                                                                          \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) die("%s failed: %s (%s)", #call, pkv_strerror(rc_), pkv_last_error());     \
    } while (0)

#define PKVM(call)                                                                         \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) die("%s failed: %s (%s)", #call, pkv_strerror(rc_), pkvm_last_error());    \
    } while (0)

/* A growable token list. */
typedef struct toks {
    uint32_t *t;
    size_t n, cap;
} toks;

static void tpush(toks *a, uint32_t v) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 256;
        a->t = xrealloc(a->t, a->cap * sizeof *a->t);
    }
    a->t[a->n++] = v;
}

static void tappend(toks *a, const uint32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) tpush(a, v[i]);
}

static void tbytes(toks *a, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) tpush(a, (uint8_t)s[i]);
}

static char *fmt_int(char *buf, uint64_t v) { /* 1234567 -> "1,234,567" */
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), o = 0;
    for (int i = 0; i < n; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i < n - 1) buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

static char *fmt_time(char *buf, double ns) {
    if (ns >= 1e9) snprintf(buf, 32, "%.2f s", ns / 1e9);
    else if (ns >= 1e6) snprintf(buf, 32, "%.1f ms", ns / 1e6);
    else snprintf(buf, 32, "%.0f us", ns / 1e3);
    return buf;
}

/* ---- The workload ------------------------------------------------------------------ */

static uint64_t wl_state;
static uint32_t wl_below(uint32_t n) {
    uint64_t z = (wl_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) % n);
}

static const char *WORDS[] = {
    "the", "cache", "block", "token", "prompt", "answer", "user", "model", "always",
    "never", "please", "reply", "clearly", "with", "short", "sentences", "and", "cite",
    "sources", "when", "asked", "about", "memory", "disk", "restart", "prefix", "page",
    "sequence", "attention", "layer", "head", "value", "key", "fast", "slow", "latency",
    "throughput", "policy", "rule", "must", "should", "may", "not", "explain", "code",
    "examples", "in", "of", "to", "a", "is", "are", "for", "each", "every", "request",
    "system", "assistant", "conversation", "history", "turn", "sample", "fork", "commit"};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

/* About `len` bytes of sentence-like text (exactly len bytes). */
static void gen_text(toks *out, size_t len) {
    char buf[64];
    size_t done = 0;
    int start = 1;
    while (done < len) {
        const char *w = WORDS[wl_below(N_WORDS)];
        int n = snprintf(buf, sizeof buf, "%s%c%s", start ? "" : " ",
                         start ? (char)(w[0] - 32) : w[0], w + 1);
        start = 0;
        if (wl_below(9) == 0) {
            buf[n++] = '.';
            start = 1;
        }
        for (int i = 0; i < n && done < len; i++, done++) tpush(out, (uint8_t)buf[i]);
    }
}

typedef struct workload {
    toks system;    /* BOS SYSTEM text, or the rendered system message */
    toks *msg;      /* [turn * users + user]: USER text ASSISTANT, or the rendered
                       user message and generation prompt */
    char **question; /* [turn * users + user]: the user's text (GGUF model) */
    char **qlist;   /* the questions file's lines */
    size_t n_q;
    uint32_t fork_user, fork_turn;
} workload;

/* ---- The real model's text: tokenizer, chat template, prompt files ---------------- */

static pkv_gguf *g_gguf; /* open for the whole process: the tokenizer points into it */
static pkv_tok *g_tok;
static uint32_t g_stop = PKVM_EOS; /* ends an answer: <|im_end|> for the GGUF model */
static toks g_turn_end;            /* follows the stop token in the history ("\n") */

static char *read_file(const char *path, const char *what, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open %s %s: %s", what, path, strerror(errno));
    size_t cap = 65536, n = 0, r;
    char *b = xmalloc(cap);
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n > (1u << 24)) die("%s %s is too large", what, path);
        if (cap - n < 2) b = xrealloc(b, cap *= 2);
    }
    if (ferror(f)) die("cannot read %s %s", what, path);
    fclose(f);
    b[n] = '\0';
    if (len) *len = n;
    return b;
}

static void tok_encode(const char *text, size_t len, toks *out) {
    uint32_t *ids;
    size_t n;
    int rc = pkv_tok_encode(g_tok, text, len, 1, &ids, &n);
    if (rc) die("tokenizing: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
    tappend(out, ids, n);
    free(ids);
}

/* The answer's text: its tokens decoded, the stop token left out. */
static char *tok_decode(const toks *a) {
    size_t n = a->n;
    if (n && a->t[n - 1] == g_stop) n--;
    char *text;
    size_t len;
    int rc = pkv_tok_decode(g_tok, a->t, n, &text, &len);
    if (rc) die("decoding an answer: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
    return text;
}

static char *render(const pkv_chat_msg *msgs, size_t n, int gen_prompt, size_t *len) {
    char *text;
    int rc = pkv_tok_chat(g_tok, msgs, n, gen_prompt, &text, len);
    if (rc) die("the chat template of %s: %s (%s)", opt.model_path, pkv_strerror(rc),
                pkv_tok_last_error());
    return text;
}

/* Open the GGUF and build its tokenizer (the model's weights load in run_pass). */
static void open_gguf(void) {
    struct stat st;
    if (stat(opt.model_path, &st))
        die("no model file %s: %s. Fetch it with scripts/get-model.sh (scripts/demo.sh does), "
            "pass --model PATH, or run the seeded model with --preset NAME", opt.model_path,
            strerror(errno));
    int rc = pkv_gguf_open(opt.model_path, &g_gguf);
    if (rc) die("%s: %s (%s)", opt.model_path, pkv_strerror(rc), pkv_gguf_last_error());
    rc = pkv_tok_load(g_gguf, &g_tok);
    if (rc) die("the tokenizer of %s: %s (%s)", opt.model_path, pkv_strerror(rc),
                pkv_tok_last_error());
    g_stop = pkv_tok_find(g_tok, "<|im_end|>");
    if (g_stop == PKV_TOK_NONE) g_stop = pkv_tok_eos(g_tok);
    if (g_stop == PKV_TOK_NONE) die("%s has neither <|im_end|> nor an end-of-sequence token",
                                    opt.model_path);
    tok_encode("\n", 1, &g_turn_end);
}

static void close_gguf(void) {
    pkv_tok_free(g_tok);
    pkv_gguf_close(g_gguf);
    free(g_turn_end.t);
}

/* The questions file: one question a line; blank lines and lines starting with '#'
 * are skipped. */
static void read_questions(workload *w) {
    char *text = read_file(opt.questions_file, "--questions-file", NULL);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = '\0';
        if (!n || line[0] == '#') continue;
        w->qlist = xrealloc(w->qlist, (w->n_q + 1) * sizeof *w->qlist);
        w->qlist[w->n_q++] = strdup(line);
    }
    free(text);
    if (!w->n_q) die("--questions-file %s holds no question", opt.questions_file);
}

/* The chat as the template renders it, cut into the pieces a conversation adds:
 * the system message, then per turn the user message with the generation prompt.
 * Each piece is rendered as the end of the conversation it closes, so that the
 * pieces put together are the template's rendering. */
static void build_chat(workload *w) {
    size_t sys_len;
    char *sys = read_file(opt.prompt_file, "--prompt-file", &sys_len);
    if (!sys_len) die("--prompt-file %s is empty", opt.prompt_file);
    read_questions(w);
    const pkv_chat_msg m0 = {"system", sys};
    size_t len0;
    char *head = render(&m0, 1, 0, &len0);
    tok_encode(head, len0, &w->system);
    w->question = calloc((size_t)opt.users * opt.turns, sizeof *w->question);
    if (!w->question) die("out of memory");
    for (uint32_t t = 0; t < opt.turns; t++)
        for (uint32_t u = 0; u < opt.users; u++) {
            const size_t k = (size_t)t * opt.users + u;
            w->question[k] = w->qlist[((size_t)u * opt.turns + t) % w->n_q];
            const pkv_chat_msg m[2] = {{"system", sys}, {"user", w->question[k]}};
            size_t len;
            char *full = render(m, 2, 1, &len);
            if (len < len0 || memcmp(full, head, len0))
                die("the chat template of %s does not render a conversation as its system "
                    "message followed by the rest", opt.model_path);
            tok_encode(full + len0, len - len0, &w->msg[k]);
            free(full);
        }
    free(head);
    free(sys);
}

static void build_workload(workload *w) {
    memset(w, 0, sizeof *w);
    if (!opt.preset) {
        w->msg = calloc((size_t)opt.users * opt.turns, sizeof *w->msg);
        if (!w->msg) die("out of memory");
        build_chat(w);
        w->fork_user = 0;
        w->fork_turn = opt.turns > 1 ? 1 : 0;
        return;
    }
    wl_state = opt.seed * 0x2545F4914F6CDD1Dull + 17;
    tpush(&w->system, PKVM_BOS);
    tpush(&w->system, PKVM_SYSTEM);
    if (opt.prompt_file) {
        FILE *f = fopen(opt.prompt_file, "rb");
        if (!f) die("cannot open --prompt-file %s: %s", opt.prompt_file, strerror(errno));
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            tbytes(&w->system, buf, n);
            if (w->system.n > (1u << 22)) die("--prompt-file %s is too large", opt.prompt_file);
        }
        if (ferror(f)) die("cannot read --prompt-file %s", opt.prompt_file);
        fclose(f);
        if (w->system.n == 2) die("--prompt-file %s is empty", opt.prompt_file);
    } else {
        static const char intro[] =
            "You are Pagey, the assistant of the pagedkv demo. Follow every rule below in "
            "every conversation. ";
        tbytes(&w->system, intro, sizeof intro - 1);
        if (opt.sys_tokens > w->system.n) gen_text(&w->system, opt.sys_tokens - w->system.n);
    }
    w->msg = calloc((size_t)opt.users * opt.turns, sizeof *w->msg);
    if (!w->msg) die("out of memory");
    for (uint32_t t = 0; t < opt.turns; t++)
        for (uint32_t u = 0; u < opt.users; u++) {
            toks *m = &w->msg[t * opt.users + u];
            char head[64];
            int n = snprintf(head, sizeof head, "User %u, turn %u: ", u + 1, t + 1);
            tpush(m, PKVM_USER);
            tbytes(m, head, (size_t)n);
            gen_text(m, opt.msg_min + wl_below(opt.msg_max - opt.msg_min + 1));
            tpush(m, PKVM_ASSISTANT);
        }
    /* The request with parallel samples: the first user's second turn (or first). */
    w->fork_user = 0;
    w->fork_turn = opt.turns > 1 ? 1 : 0;
}

/* ---- One pass (cold or warm) ----------------------------------------------------- */

typedef struct req_rec {
    uint32_t user, turn, prompt, cached, samples;
    uint64_t ttft_ns;
} req_rec;

typedef struct gen_rec {
    uint32_t user, turn, sample;
    toks tok;
} gen_rec;

typedef struct pass_result {
    char name[8];
    long pid;
    uint64_t total_ns, model_ns, open_ns, decode_ns, decode_tokens;
    uint64_t rec_blocks, rec_seqs, rec_records, leftover;
    double rec_ms;
    uint64_t hit_tokens, miss_tokens, sealed;
    req_rec *req;
    size_t n_req;
    gen_rec *gen;
    size_t n_gen;
} pass_result;

static _Noreturn void die_busy(const char *dir, const char *what) {
    die("the cache directory %s is in use: another process has it open for writing "
        "(PKV_EBUSY: %s). Wait for that process to finish, or run without --cache-dir "
        "(each run then gets a new directory under $TMPDIR), or choose another --cache-dir",
        dir, what);
}

/* Take the flocks a pagedkv writer holds (on the directory itself and on its
 * LOCK file), or stop with PKV_EBUSY's meaning: emptying a directory that a live
 * process has open deletes that process's files under it, and the LOCK created
 * next would be another file, so two writers would share the path. Held while
 * the directory is emptied, so that no writer opens it meanwhile; closed before
 * this process opens it. A file system without flock on directories leaves the
 * LOCK file's lock alone to go by. */
static void lock_or_refuse(const char *dir, int fds[2]) {
    fds[0] = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds[0] >= 0 && flock(fds[0], LOCK_EX | LOCK_NB)) {
        if (errno == EWOULDBLOCK) die_busy(dir, "its directory lock is held");
        close(fds[0]);
        fds[0] = -1;
    }
    char lock[PATH_MAX];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    fds[1] = open(lock, O_RDONLY | O_CLOEXEC); /* never created here */
    if (fds[1] >= 0 && flock(fds[1], LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK)
        die_busy(dir, "its LOCK file is held");
}

/* Empty the cache directory; refuse if it holds anything but pagedkv's files,
 * or if another process has it open. */
static void wipe_cache_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return;
        die("cannot open the cache directory %s: %s", dir, strerror(errno));
    }
    int locks[2];
    lock_or_refuse(dir, locks);
    static const char *exact[] = {"arena", "arena.tmp", "LOCK", "ckpt.tmp", "arena.link.tmp",
                                  "cuda.status", "cuda.status.tmp"};
    static const char *prefix[] = {"wal-", "ckpt-", "delta-"};
    char (*names)[256] = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool ok = false;
        for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) ok |= !strcmp(e->d_name, exact[i]);
        for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
            ok |= !strncmp(e->d_name, prefix[i], strlen(prefix[i]));
        if (!ok || strlen(e->d_name) >= 256) {
            closedir(d);
            die("refusing to empty %s: it holds '%s', which is not a pagedkv file "
                "(choose another --cache-dir)", dir, e->d_name);
        }
        names = xrealloc(names, (n + 1) * sizeof *names);
        snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        /* An arena kept elsewhere (--arena-dir): remove the file the link names. */
        char target[PATH_MAX];
        ssize_t tl = strcmp(names[i], "arena") ? -1 : readlink(path, target, sizeof target - 1);
        if (tl > 0) {
            target[tl] = '\0';
            if (unlink(target) && errno != ENOENT) die("cannot remove %s: %s", target, strerror(errno));
        }
        if (unlink(path) && errno != ENOENT) die("cannot remove %s: %s", path, strerror(errno));
    }
    free(names);
    for (int i = 0; i < 2; i++)
        if (locks[i] >= 0) close(locks[i]); /* releases the flocks */
}

static bool own_dir_done; /* the run succeeded and removed its directory */

/* At exit after a failure (die() included): a directory this run created is
 * removed if it holds no arena yet (at most the LOCK a failed pkv_open leaves),
 * else kept and named, so that a failed run neither leaves litter nor hides
 * what it left. Never dies: it runs inside exit(). */
static void own_dir_at_exit(void) {
    if (!opt.own_dir || own_dir_done) return;
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/arena", opt.cache_dir);
    if (lstat(path, &st) && errno == ENOENT) {
        snprintf(path, sizeof path, "%s/LOCK", opt.cache_dir);
        unlink(path);
        if (rmdir(opt.cache_dir) == 0) return;
    }
    fprintf(stderr, "%s: the cache directory %s is kept for inspection (kvdump summary %s; "
            "rm -r it when done)\n", prog, opt.cache_dir, opt.cache_dir);
}

/* No --cache-dir: a new directory per run, so that two demos never share one. */
static void make_own_dir(void) {
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0]) tmp = "/tmp";
    if (snprintf(opt.cache_dir, sizeof opt.cache_dir, "%s/pkv-demo-XXXXXX", tmp) >=
        (int)sizeof opt.cache_dir)
        die("TMPDIR %s is too long for a cache directory path (pass --cache-dir)", tmp);
    if (!mkdtemp(opt.cache_dir))
        die("cannot create a cache directory under %s: %s (set TMPDIR or pass --cache-dir)",
            tmp, strerror(errno));
    opt.own_dir = true;
    atexit(own_dir_at_exit);
}

typedef struct progress_ctx {
    const char *name;
    uint32_t user, turn;
    size_t cached, prompt;
} progress_ctx;

static void on_progress(void *arg, size_t done, size_t total) {
    const progress_ctx *p = arg;
    if (opt.quiet || total <= 256 || !isatty(2)) return;
    fprintf(stderr, "\r  [%s] turn %u/%u, user %u/%u: computing prompt %zu/%zu tokens ",
            p->name, p->turn + 1, opt.turns, p->user + 1, opt.users, done, total);
    fflush(stderr);
}

typedef struct active {
    uint64_t id;
    uint32_t next;
    gen_rec *out;
    bool done;
} active;

static uint64_t cache_capacity(const workload *w) {
    if (opt.capacity) return opt.capacity;
    uint64_t tokens = w->system.n;
    for (size_t i = 0; i < (size_t)opt.users * opt.turns; i++) tokens += w->msg[i].n + opt.answer + 2;
    tokens += (uint64_t)opt.samples * opt.turns * (opt.answer + 2) + 64;
    return tokens / opt.block_size * 2 + 64;
}

/* The model of a pass and its cache identity (model_id: PKV_MODEL_ID_MAX + 1
 * bytes): the seeded preset, or the GGUF with the kernel named in its id. */
static void make_model(pkvm_model **mp, char *model_id) {
    if (opt.preset) {
        pkvm_config pc;
        PKVM(pkvm_preset(opt.preset, &pc));
        pc.seed = opt.seed;
        PKVM(pkvm_create(&pc, mp));
        pkvm_model_id(*mp, opt.kv, model_id, PKV_MODEL_ID_MAX + 1);
    } else {
        PKVM(pkvm_create_gguf(g_gguf, mp));
        PKVM(pkvm_set_kernel(*mp, opt.kernel));
        const int rc = pkv_tok_model_id(g_gguf, g_tok, model_id, PKV_MODEL_ID_MAX + 1);
        if (rc) die("pkv_tok_model_id: %s (%s)", pkv_strerror(rc), pkv_tok_last_error());
        /* The kernel's rounding is part of what the K/V is, and sealing relies
         * on K/V being a function of (model, token prefix) (docs/design.md,
         * sealing, step 3): a cache built with the other kernel is refused
         * (PKV_EMODEL), never mixed in. */
        const size_t len = strlen(model_id);
        if (snprintf(model_id + len, PKV_MODEL_ID_MAX + 1 - len, ";kernel=%s",
                     pkvm_kernel_name(opt.kernel)) >= (int)(PKV_MODEL_ID_MAX + 1 - len))
            die("the model id is too long");
    }
}

/* pkv_connect to --socket, and the check that the daemon's cache is this model's:
 * its geometry and model identity (else its K/V would be another model's). */
static pkv_cache *connect_pkvd(const pkv_options *o) {
    pkv_cache *c = NULL;
    int rc = pkv_connect(opt.socket, &c);
    if (rc)
        die("pkv_connect(%s): %s (%s). Start pkvd first: pkvd --dir DIR --socket %s "
            "$(pkv-demo --pkvd-args ...same model options...)", opt.socket, pkv_strerror(rc),
            pkv_last_error(), opt.socket);
    pkv_cache_info in;
    PKV(pkv_info(c, &in));
    if (in.num_layers != o->num_layers || in.num_kv_heads != o->num_kv_heads ||
        in.head_dim != o->head_dim || in.block_size != o->block_size || in.dtype != o->dtype ||
        strcmp(in.model_id, o->model_id))
        die("the pkvd on %s serves another geometry or model (%u layers, %u K/V heads, "
            "head_dim %u, blocks of %u, model id %s), not this demo's: restart it with the "
            "options pkv-demo --pkvd-args prints", opt.socket, in.num_layers, in.num_kv_heads,
            in.head_dim, in.block_size, in.model_id);
    return c;
}

static void run_pass(int which, const workload *w, pass_result *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", which == RUN_COLD ? "cold" : "warm");
    r->pid = (long)getpid();
    const uint64_t t_start = now_ns();
    if (which == RUN_COLD && !opt.socket) wipe_cache_dir(opt.cache_dir);

    pkvm_model *m;
    char model_id[PKV_MODEL_ID_MAX + 1];
    make_model(&m, model_id);
    const pkvm_config cfg = *pkvm_config_of(m);
    pkvm_set_threads(m, opt.threads);
    r->model_ns = now_ns() - t_start;

    pkv_options o;
    pkv_options_init(&o);
    pkvm_cache_geometry(m, &o);
    o.block_size = opt.block_size;
    o.dtype = opt.kv;
    o.capacity = which == RUN_COLD ? cache_capacity(w) : 0;
    o.model_id = model_id;
    o.durability = opt.durability;
    o.arena_dir = opt.arena_dir;
    if (which == RUN_WARM && !opt.socket) { /* do not create anything: there must be a cache */
        char arena[PATH_MAX];
        struct stat sb;
        snprintf(arena, sizeof arena, "%s/arena", opt.cache_dir);
        if (stat(arena, &sb))
            die("no cache in %s to restart from (run the cold pass first)", opt.cache_dir);
    }
    const uint64_t t_open = now_ns();
    pkv_cache *c = NULL;
    int rc = 0;
    if (opt.socket) c = connect_pkvd(&o); /* pkvd owns the cache: its recovery, its log */
    else rc = pkv_open(opt.cache_dir, &o, &c);
    if (rc == PKV_EBUSY) die_busy(opt.cache_dir, pkv_last_error());
    if (rc == PKV_EMODEL)
        die("the cache in %s was built with another model, so its K/V is refused rather than "
            "served (PKV_EMODEL: %s). Run cold to rebuild it, or choose another --cache-dir",
            opt.cache_dir, pkv_last_error());
    if (rc) die("pkv_open(%s): %s (%s)", opt.cache_dir, pkv_strerror(rc), pkv_last_error());
    r->open_ns = now_ns() - t_open;
    pkv_metrics_server *msrv = NULL;
    if (opt.metrics_addr) {
        rc = pkv_metrics_serve(c, opt.metrics_addr, &msrv);
        if (rc)
            die("--metrics %s: %s (%s)", opt.metrics_addr, pkv_strerror(rc), pkv_last_error());
        if (!opt.quiet)
            fprintf(stderr, "  [%s] metrics at http://%s/metrics\n", r->name, opt.metrics_addr);
    }
    pkv_recovery rec;
    memset(&rec, 0, sizeof rec);
    if (!opt.socket) PKV(pkv_get_recovery(c, &rec)); /* local only: pkvd recovered */
    pkv_stats st0;
    PKV(pkv_get_stats(c, &st0));
    r->rec_blocks = rec.blocks_sealed;
    r->rec_seqs = rec.sequences;
    r->rec_records = rec.records_replayed;
    r->rec_ms = rec.ms_checkpoint + rec.ms_replay + rec.ms_rebuild + rec.ms_verify;
    if (!opt.quiet) {
        char a[32], b[32];
        fprintf(stderr, "  [%s] pid %ld: model ready in %s; cache %s%s %s in %s", r->name,
                r->pid, fmt_time(a, (double)r->model_ns), opt.socket ? "of the pkvd on " : "",
                opt.socket ? opt.socket : opt.cache_dir, opt.socket ? "connected" : "opened",
                fmt_time(b, (double)r->open_ns));
        if (rec.blocks_sealed || rec.records_replayed || rec.checkpoint_lsn)
            fprintf(stderr, ", recovered %" PRIu64 " cached blocks (%" PRIu64
                            " log records replayed)", rec.blocks_sealed, rec.records_replayed);
        fputc('\n', stderr);
        if (rec.note[0]) fprintf(stderr, "  [%s] recovery: %s\n", r->name, rec.note);
    }
    /* Sequences left open by an interrupted earlier run: an engine would resume or
     * drop them; this workload drops them. (A pkvd closes a dead client's.) */
    if (!opt.socket) {
        size_t n = 0;
        rc = pkv_seq_list(c, NULL, 0, &n);
        if (rc && rc != PKV_ERANGE) die("pkv_seq_list: %s", pkv_strerror(rc));
        if (n) {
            uint64_t *ids = xmalloc(n * sizeof *ids);
            PKV(pkv_seq_list(c, ids, n, &n));
            for (size_t i = 0; i < n; i++) PKV(pkv_seq_close(c, ids[i]));
            free(ids);
            r->leftover = n;
        }
    }

    pkvm_engine *e;
    PKVM(pkvm_engine_create(m, c, &e));
    progress_ctx pc = {.name = r->name};
    pkvm_engine_set_progress(e, on_progress, &pc);

    const uint32_t U = opt.users, V = cfg.vocab;
    toks *hist = calloc(U, sizeof *hist);
    active *act = xmalloc(((size_t)U + opt.samples) * sizeof *act);
    float *logits = xmalloc(((size_t)U + opt.samples) * V * sizeof(float));
    uint64_t *ids = xmalloc(((size_t)U + opt.samples) * sizeof *ids);
    uint32_t *next = xmalloc(((size_t)U + opt.samples) * sizeof *next);
    size_t *map = xmalloc(((size_t)U + opt.samples) * sizeof *map);
    if (!hist) die("out of memory");
    r->req = xmalloc((size_t)U * opt.turns * sizeof *r->req);
    r->gen = calloc((size_t)U * opt.turns + opt.samples, sizeof *r->gen);
    if (!r->gen) die("out of memory");
    toks prompt = {0};

    for (uint32_t t = 0; t < opt.turns; t++) {
        size_t nact = 0;
        for (uint32_t u = 0; u < U; u++) {
            /* The request: the conversation so far plus the new user message. */
            prompt.n = 0;
            if (t == 0) tappend(&hist[u], w->system.t, w->system.n);
            tappend(&prompt, hist[u].t, hist[u].n);
            const toks *msg = &w->msg[t * U + u];
            tappend(&prompt, msg->t, msg->n);
            const bool fork = u == w->fork_user && t == w->fork_turn && opt.samples > 1;
            const uint64_t id = ((uint64_t)(t * U + u) << 8);
            pc.user = u, pc.turn = t, pc.prompt = prompt.n;

            const uint64_t t0 = now_ns();
            size_t cached = 0;
            PKVM(pkvm_prefill(e, id, 0, prompt.t, prompt.n, logits, &cached));
            const uint32_t first = pkvm_argmax(logits, V);
            const uint64_t ttft = now_ns() - t0;

            req_rec *q = &r->req[r->n_req++];
            *q = (req_rec){u, t, (uint32_t)prompt.n, (uint32_t)cached, fork ? opt.samples : 1,
                           ttft};
            if (!opt.quiet) {
                char a[32], b[32], d[32], f[32];
                fprintf(stderr,
                        "%s  [%s] turn %u/%u, user %u/%u: prompt %s tokens, %s reused, %s "
                        "computed; first token after %s%s\n",
                        isatty(2) ? "\r\033[K" : "", r->name, t + 1, opt.turns, u + 1, U,
                        fmt_int(a, prompt.n), fmt_int(b, cached), fmt_int(d, prompt.n - cached),
                        fmt_time(f, (double)ttft), fork ? " (+ parallel samples)" : "");
            }
            const uint32_t ns = fork ? opt.samples : 1;
            for (uint32_t s = 0; s < ns; s++) {
                if (s) PKV(pkv_seq_fork(c, id, id + s));
                gen_rec *g = &r->gen[r->n_gen++];
                g->user = u, g->turn = t, g->sample = s;
                /* Sample s starts from the s-th most likely first token. */
                const uint32_t tok = s ? pkvm_rank(logits, V, s) : first;
                tpush(&g->tok, tok);
                act[nact++] = (active){id + s, tok, g, tok == g_stop || opt.answer == 1};
            }
            /* The history continues with the prompt (sample 0's answer follows). */
            tappend(&hist[u], msg->t, msg->n);
        }

        /* Batched greedy decode of every sequence of this turn. */
        const uint64_t td = now_ns();
        for (;;) {
            size_t n = 0;
            for (size_t i = 0; i < nact; i++)
                if (!act[i].done) ids[n] = act[i].id, next[n] = act[i].next, map[n++] = i;
            if (!n) break;
            PKVM(pkvm_step(e, ids, next, n, logits));
            r->decode_tokens += n;
            for (size_t k = 0; k < n; k++) {
                active *a = &act[map[k]];
                const uint32_t tok = pkvm_argmax(logits + k * V, V);
                tpush(&a->out->tok, tok);
                a->next = tok;
                if (tok == g_stop || a->out->tok.n >= opt.answer) a->done = true;
            }
        }
        r->decode_ns += now_ns() - td;
        if (!opt.quiet) {
            char a[32];
            fprintf(stderr, "  [%s] turn %u/%u: decoded %zu answers in one batch in %s\n",
                    r->name, t + 1, opt.turns, nact, fmt_time(a, (double)(now_ns() - td)));
        }
        for (size_t i = 0; i < nact; i++) {
            PKV(pkv_seq_close(c, act[i].id));
            if (act[i].out->sample == 0) {
                toks *h = &hist[act[i].out->user];
                tappend(h, act[i].out->tok.t, act[i].out->tok.n);
                if (act[i].out->tok.t[act[i].out->tok.n - 1] != g_stop) tpush(h, g_stop);
                tappend(h, g_turn_end.t, g_turn_end.n);
            }
        }
    }

    pkv_stats st;
    PKV(pkv_get_stats(c, &st));
    r->hit_tokens = st.hit_tokens - st0.hit_tokens;
    r->miss_tokens = st.miss_tokens - st0.miss_tokens;
    r->sealed = st.blocks_sealed;
    pkvm_engine_free(e);
    if (msrv) {
        if (opt.metrics_linger) {
            PKV(pkv_sync(c)); /* the final values, group commits included, before the wait */
            if (!opt.quiet)
                fprintf(stderr, "  [%s] serving metrics %u s more\n", r->name, opt.metrics_linger);
            sleep(opt.metrics_linger);
        }
        pkv_metrics_stop(msrv);
    }
    pkv_close(c); /* makes everything durable */
    r->total_ns = now_ns() - t_start;
    pkvm_free(m);
    for (uint32_t u = 0; u < U; u++) free(hist[u].t);
    free(hist), free(act), free(logits), free(ids), free(next), free(map), free(prompt.t);
}

/* ---- Results between processes ---------------------------------------------------- */

static void write_result(FILE *f, const pass_result *r) {
    fprintf(f, "pass %s %ld\n", r->name, r->pid);
    fprintf(f, "time %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r->total_ns,
            r->model_ns, r->open_ns, r->decode_ns, r->decode_tokens);
    fprintf(f, "recovery %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.6f\n", r->rec_blocks,
            r->rec_seqs, r->rec_records, r->leftover, r->rec_ms);
    fprintf(f, "stats %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", r->hit_tokens, r->miss_tokens,
            r->sealed);
    for (size_t i = 0; i < r->n_req; i++) {
        const req_rec *q = &r->req[i];
        fprintf(f, "req %u %u %u %u %u %" PRIu64 "\n", q->user, q->turn, q->prompt, q->cached,
                q->samples, q->ttft_ns);
    }
    for (size_t i = 0; i < r->n_gen; i++) {
        const gen_rec *g = &r->gen[i];
        fprintf(f, "gen %u %u %u %zu", g->user, g->turn, g->sample, g->tok.n);
        for (size_t k = 0; k < g->tok.n; k++) fprintf(f, " %u", g->tok.t[k]);
        fputc('\n', f);
    }
    fprintf(f, "end\n");
}

static bool read_result(FILE *f, pass_result *r) {
    memset(r, 0, sizeof *r);
    char *line = NULL;
    size_t cap = 0;
    bool end = false;
    size_t req_cap = 0, gen_cap = 0;
    while (getline(&line, &cap, f) > 0) {
        char *p = line;
        if (!strncmp(p, "pass ", 5)) {
            if (sscanf(p + 5, "%7s %ld", r->name, &r->pid) != 2) break;
        } else if (!strncmp(p, "time ", 5)) {
            if (sscanf(p + 5, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                       &r->total_ns, &r->model_ns, &r->open_ns, &r->decode_ns,
                       &r->decode_tokens) != 5)
                break;
        } else if (!strncmp(p, "recovery ", 9)) {
            if (sscanf(p + 9, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %lf",
                       &r->rec_blocks, &r->rec_seqs, &r->rec_records, &r->leftover,
                       &r->rec_ms) != 5)
                break;
        } else if (!strncmp(p, "stats ", 6)) {
            if (sscanf(p + 6, "%" SCNu64 " %" SCNu64 " %" SCNu64, &r->hit_tokens,
                       &r->miss_tokens, &r->sealed) != 3)
                break;
        } else if (!strncmp(p, "req ", 4)) {
            if (r->n_req == req_cap) {
                req_cap = req_cap ? 2 * req_cap : 16;
                r->req = xrealloc(r->req, req_cap * sizeof *r->req);
            }
            req_rec *q = &r->req[r->n_req];
            if (sscanf(p + 4, "%u %u %u %u %u %" SCNu64, &q->user, &q->turn, &q->prompt,
                       &q->cached, &q->samples, &q->ttft_ns) != 6)
                break;
            r->n_req++;
        } else if (!strncmp(p, "gen ", 4)) {
            if (r->n_gen == gen_cap) {
                gen_cap = gen_cap ? 2 * gen_cap : 16;
                r->gen = xrealloc(r->gen, gen_cap * sizeof *r->gen);
            }
            gen_rec *g = &r->gen[r->n_gen];
            memset(g, 0, sizeof *g);
            size_t n;
            int used = 0;
            if (sscanf(p + 4, "%u %u %u %zu%n", &g->user, &g->turn, &g->sample, &n, &used) != 4)
                break;
            p += 4 + used;
            for (size_t k = 0; k < n; k++) {
                char *endp;
                unsigned long v = strtoul(p, &endp, 10);
                if (endp == p) break;
                tpush(&g->tok, (uint32_t)v);
                p = endp;
            }
            if (g->tok.n != n) break;
            r->n_gen++;
        } else if (!strncmp(p, "end", 3)) {
            end = true;
            break;
        } else {
            break;
        }
    }
    free(line);
    return end;
}

static void free_result(pass_result *r) {
    for (size_t i = 0; i < r->n_gen; i++) free(r->gen[i].tok.t);
    free(r->gen);
    free(r->req);
}

/* Run one pass as a new process (this program, re-executed) and read its result. */
static void run_child(int which, char **argv, int argc, pass_result *r) {
    int fds[2];
    if (pipe(fds)) die("pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", fds[1]);
        char **av = calloc((size_t)argc + 8, sizeof *av);
        if (!av) _exit(1);
        int k = 0;
        av[k++] = argv[0];
        for (int i = 1; i < argc; i++) av[k++] = argv[i];
        if (!opt.socket) {
            av[k++] = "--cache-dir"; /* the last one given wins: this run's directory */
            av[k++] = opt.cache_dir;
        }
        av[k++] = "--run";
        av[k++] = which == RUN_COLD ? "cold" : "warm";
        av[k++] = "--result-fd";
        av[k++] = fdarg;
        av[k] = NULL;
        execv("/proc/self/exe", av);
        fprintf(stderr, "%s: exec /proc/self/exe: %s\n", prog, strerror(errno));
        _exit(1);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    if (!f) die("fdopen: %s", strerror(errno));
    const bool ok = read_result(f, r);
    fclose(f);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) die("waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFSIGNALED(status))
            die("the %s run (pid %ld) was killed by signal %d", which == RUN_COLD ? "cold" : "warm",
                (long)pid, WTERMSIG(status));
        die("the %s run (pid %ld) failed with status %d", which == RUN_COLD ? "cold" : "warm",
            (long)pid, WEXITSTATUS(status));
    }
    if (!ok) die("the %s run (pid %ld) sent an unreadable result", which == RUN_COLD ? "cold" : "warm",
                 (long)pid);
}

/* ---- Report ----------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_dbl(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double pct_u64(const uint64_t *v, size_t n, double p) {
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    if (k < 1) k = 1;
    return (double)v[k - 1];
}

typedef struct summary {
    uint64_t computed, reused, prompt;
    double ttft_med, ttft_p90, total, first_ttft;
    size_t n_gen, gen_tokens;
} summary;

static void summarize(const pass_result *r, summary *s) {
    memset(s, 0, sizeof *s);
    uint64_t *t = xmalloc(r->n_req * sizeof *t);
    for (size_t i = 0; i < r->n_req; i++) {
        s->computed += r->req[i].prompt - r->req[i].cached;
        s->reused += r->req[i].cached;
        s->prompt += r->req[i].prompt;
        t[i] = r->req[i].ttft_ns;
    }
    s->first_ttft = r->n_req ? (double)r->req[0].ttft_ns : 0;
    qsort(t, r->n_req, sizeof *t, cmp_u64);
    s->ttft_med = r->n_req ? pct_u64(t, r->n_req, 50) : 0;
    s->ttft_p90 = r->n_req ? pct_u64(t, r->n_req, 90) : 0;
    s->total = (double)r->total_ns;
    s->n_gen = r->n_gen;
    for (size_t i = 0; i < r->n_gen; i++) s->gen_tokens += r->gen[i].tok.n;
    free(t);
}

static void print_pass(FILE *f, const pass_result *r, const summary *s, const char *title) {
    char a[32], b[32], d[32];
    size_t forked = 0;
    for (size_t i = 0; i < r->n_req; i++) forked += r->req[i].samples > 1;
    fprintf(f, "%s (pid %ld)\n", title, r->pid);
    if (!strcmp(r->name, "warm") && !opt.socket) /* with pkvd, the daemon recovered */
        fprintf(f, "  recovered           %s cached blocks, %s log records replayed, in %.1f ms%s\n",
                fmt_int(a, r->rec_blocks), fmt_int(b, r->rec_records), r->rec_ms,
                r->leftover ? " (open sequences from an earlier run dropped)" : "");
    fprintf(f, "  requests            %zu (%u users x %u turns", r->n_req, opt.users, opt.turns);
    if (forked) fprintf(f, "; %zu with %u parallel samples", forked, opt.samples);
    fprintf(f, ")\n");
    fprintf(f, "  prompt tokens       %s computed, %s reused: hit rate %.1f%%\n",
            fmt_int(a, s->computed), fmt_int(b, s->reused),
            s->prompt ? 100.0 * (double)s->reused / (double)s->prompt : 0.0);
    fprintf(f, "  time to first token median %s, p90 %s (first request: %s)\n",
            fmt_time(a, s->ttft_med), fmt_time(b, s->ttft_p90), fmt_time(d, s->first_ttft));
    fprintf(f, "  decode              %s tokens in %s (%zu answers, batched)\n",
            fmt_int(a, r->decode_tokens), fmt_time(b, (double)r->decode_ns), s->n_gen);
    fprintf(f, "  total time          %s (model weights %s, cache open %s)\n",
            fmt_time(a, s->total), fmt_time(b, (double)r->model_ns),
            fmt_time(d, (double)r->open_ns));
}

/* Do both runs generate the same tokens? Returns the number of mismatching answers. */
static size_t compare_gen(const pass_result *a, const pass_result *b, char *why, size_t cap) {
    size_t bad = 0;
    why[0] = '\0';
    if (a->n_gen != b->n_gen) {
        snprintf(why, cap, "%zu answers vs %zu", a->n_gen, b->n_gen);
        return a->n_gen > b->n_gen ? a->n_gen : b->n_gen;
    }
    for (size_t i = 0; i < a->n_gen; i++) {
        const gen_rec *x = &a->gen[i], *y = &b->gen[i];
        bool same = x->user == y->user && x->turn == y->turn && x->sample == y->sample &&
                    x->tok.n == y->tok.n &&
                    !memcmp(x->tok.t, y->tok.t, x->tok.n * sizeof *x->tok.t);
        if (!same && !bad++)
            snprintf(why, cap, "first difference: user %u, turn %u, sample %u", x->user + 1,
                     x->turn + 1, x->sample);
    }
    return bad;
}

static const char *dur_name(void) {
    return opt.durability == PKV_DURABLE_GROUP ? "group"
           : opt.durability == PKV_DURABLE_NONE ? "none" : "always";
}
static const char *model_name(void) {
    if (opt.preset) return opt.preset;
    const char *slash = strrchr(opt.model_path, '/');
    return slash ? slash + 1 : opt.model_path;
}
static const char *kv_name(void) {
    return opt.kv == PKV_F32 ? "f32" : opt.kv == PKV_F16 ? "f16" : "bf16";
}

static void json_pass(FILE *f, const pass_result *r, const summary *s) {
    fprintf(f,
            "{\"pid\": %ld, \"requests\": %zu, \"prompt_tokens\": %" PRIu64
            ", \"computed_tokens\": %" PRIu64 ", \"reused_tokens\": %" PRIu64
            ", \"hit_rate\": %.4f, \"ttft_median_ms\": %.3f, \"ttft_p90_ms\": %.3f, "
            "\"ttft_first_request_ms\": %.3f, \"decode_tokens\": %" PRIu64
            ", \"decode_ms\": %.3f, \"total_ms\": %.3f, \"model_ms\": %.3f, \"open_ms\": %.3f, "
            "\"recovered_blocks\": %" PRIu64 ", \"recovered_records\": %" PRIu64
            ", \"recovery_ms\": %.3f, \"ttft_ms\": [",
            r->pid, r->n_req, s->prompt, s->computed, s->reused,
            s->prompt ? (double)s->reused / (double)s->prompt : 0.0, s->ttft_med / 1e6,
            s->ttft_p90 / 1e6, s->first_ttft / 1e6, r->decode_tokens, (double)r->decode_ns / 1e6,
            s->total / 1e6, (double)r->model_ns / 1e6, (double)r->open_ns / 1e6, r->rec_blocks,
            r->rec_records, r->rec_ms);
    for (size_t i = 0; i < r->n_req; i++)
        fprintf(f, "%s%.3f", i ? ", " : "", (double)r->req[i].ttft_ns / 1e6);
    fprintf(f, "]}");
}

#define TARGET_RATIO 20.0

/* A JSON string literal. */
static void json_str(FILE *f, const char *v) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static size_t g_sys_tokens; /* length of the system prompt, BOS and SYSTEM included */

/* The warm run's answers as text, with their questions (GGUF model). */
static void json_answers(FILE *f, const workload *w, const pass_result *warm) {
    fprintf(f, ",\n  \"answer_texts\": [");
    for (size_t i = 0; i < warm->n_gen; i++) {
        const gen_rec *g = &warm->gen[i];
        char *text = tok_decode(&g->tok);
        fprintf(f, "%s\n    {\"user\": %u, \"turn\": %u, \"sample\": %u, \"question\": ",
                i ? "," : "", g->user + 1, g->turn + 1, g->sample);
        json_str(f, w->question[(size_t)g->turn * opt.users + g->user]);
        fprintf(f, ", \"answer\": ");
        json_str(f, text);
        fprintf(f, ", \"complete\": %s}",
                g->tok.n && g->tok.t[g->tok.n - 1] == g_stop ? "true" : "false");
        free(text);
    }
    fprintf(f, "]");
}

static int report(const workload *w, const pass_result *cold, const pass_result *warm) {
    summary sc, sw;
    summarize(cold, &sc);
    summarize(warm, &sw);
    /* Per request: cold TTFT / warm TTFT of the same request. */
    const size_t n = cold->n_req < warm->n_req ? cold->n_req : warm->n_req;
    double *ratio = xmalloc((n ? n : 1) * sizeof *ratio);
    for (size_t i = 0; i < n; i++)
        ratio[i] = (double)cold->req[i].ttft_ns / (double)(warm->req[i].ttft_ns ? warm->req[i].ttft_ns : 1);
    const double first_ratio = n ? ratio[0] : 0;
    qsort(ratio, n, sizeof *ratio, cmp_dbl);
    const double med_ratio = n ? ratio[(n - 1) / 2] : 0, min_ratio = n ? ratio[0] : 0;
    const double ratio_of_medians = sw.ttft_med > 0 ? sc.ttft_med / sw.ttft_med : 0;
    char why[128];
    const size_t bad = compare_gen(cold, warm, why, sizeof why);
    const bool met = ratio_of_medians >= TARGET_RATIO;

    if (opt.json) {
        FILE *f = stdout;
        fprintf(f, "{\n  \"config\": {\"preset\": \"%s\", \"users\": %u, \"turns\": %u, "
                   "\"samples\": %u, \"answer_tokens\": %u, \"system_prompt_tokens\": %zu, "
                   "\"message_tokens\": [%u, %u], \"block_size\": %u, \"kv_dtype\": \"%s\", "
                   "\"durability\": \"%s\", \"threads\": %u, \"kernel\": \"%s\", "
                   "\"seed\": %" PRIu64 ", \"model\": ",
                model_name(), opt.users, opt.turns, opt.samples, opt.answer, g_sys_tokens,
                opt.msg_min, opt.msg_max, opt.block_size, kv_name(), dur_name(), opt.threads,
                opt.preset ? "f32" : pkvm_kernel_name(opt.kernel), opt.seed);
        if (opt.preset) fprintf(f, "null");
        else json_str(f, opt.model_path);
        fprintf(f, ", \"cache_dir\": ");
        json_str(f, opt.cache_dir);
        fprintf(f, "},\n");
        fprintf(f, "  \"cold\": ");
        json_pass(f, cold, &sc);
        fprintf(f, ",\n  \"warm\": ");
        json_pass(f, warm, &sw);
        fprintf(f,
                ",\n  \"ttft_speedup_median\": %.3f, \"ttft_speedup_per_request_median\": %.3f, "
                "\"ttft_speedup_per_request_min\": %.3f, \"ttft_speedup_first_request\": %.3f, "
                "\"target_speedup\": %.1f, \"target_met\": %s,\n  \"answers\": %zu, "
                "\"answers_identical\": %s, \"mismatches\": %zu",
                ratio_of_medians, med_ratio, min_ratio, first_ratio, TARGET_RATIO,
                met ? "true" : "false", cold->n_gen, bad ? "false" : "true", bad);
        if (!opt.preset) json_answers(f, w, warm);
        fprintf(f, "\n}\n");
    } else {
        char a[32], b[32];
        printf("\n");
        print_pass(stdout, cold, &sc, opt.socket ? "cold run: new client process of pkvd"
                                                 : "cold run: new process, empty cache");
        printf("\n");
        print_pass(stdout, warm, &sw, opt.socket ? "warm run: another new client process of pkvd"
                                                 : "warm run: new process, restarted on the same cache");
        printf("\nwarm vs cold\n");
        /* The target is the seeded workload's, whose user messages are hundreds of
         * tokens; a real chat's short questions are computed in both runs. */
        printf("  TTFT median         %s vs %s: %.1fx faster", fmt_time(a, sw.ttft_med),
               fmt_time(b, sc.ttft_med), ratio_of_medians);
        if (opt.preset) printf(" (target >= %.0fx: %s)", TARGET_RATIO, met ? "met" : "NOT met");
        printf("\n");
        printf("  TTFT per request    median %.1fx, min %.1fx faster\n", med_ratio, min_ratio);
        printf("  first request       %s vs %s: %.1fx faster (its system prompt was computed "
               "cold, restored warm)\n",
               fmt_time(a, sw.first_ttft), fmt_time(b, sc.first_ttft), first_ratio);
        printf("  total time          %s vs %s\n", fmt_time(a, sw.total), fmt_time(b, sc.total));
        if (!bad)
            printf("  generated tokens    identical in both runs: yes (%zu answers, %zu tokens)\n",
                   sc.n_gen, sc.gen_tokens);
        else
            printf("  generated tokens    identical in both runs: NO (%zu of %zu answers differ; "
                   "%s)\n", bad, sc.n_gen, why);
    }
    free(ratio);
    return bad ? 1 : 0;
}

static void free_workload(workload *w) {
    for (size_t i = 0; i < (size_t)opt.users * opt.turns; i++) free(w->msg[i].t);
    free(w->msg);
    free(w->system.t);
    for (size_t i = 0; i < w->n_q; i++) free(w->qlist[i]);
    free(w->qlist);
    free(w->question);
    if (!opt.preset) close_gguf();
}

/* Print text with every line after the first indented by `ind`. */
static void print_indented(const char *text, const char *ind) {
    for (const char *p = text; *p; p++) {
        putchar(*p);
        if (*p == '\n' && p[1] && p[1] != '\n') fputs(ind, stdout);
    }
}

/* The conversations as text: each question and its answer (the warm run's, which
 * is the cold run's unless the report said otherwise; then both are shown). */
static void print_answers(const workload *w, const pass_result *cold, const pass_result *warm) {
    printf("\nanswers (greedy; the warm run's, token-identical to the cold run's unless "
           "marked)\n");
    for (uint32_t u = 0; u < opt.users; u++) {
        printf("\n  user %u\n", u + 1);
        for (size_t i = 0; i < warm->n_gen; i++) {
            const gen_rec *g = &warm->gen[i];
            if (g->user != u) continue;
            if (g->sample == 0)
                printf("  Q%u: %s\n", g->turn + 1, w->question[(size_t)g->turn * opt.users + u]);
            char *text = tok_decode(&g->tok);
            const bool cut = g->tok.n && g->tok.t[g->tok.n - 1] != g_stop;
            if (g->sample == 0) printf("  A%u: ", g->turn + 1);
            else printf("  A%u, sample %u (its first token of rank %u): ", g->turn + 1, g->sample,
                        g->sample + 1);
            print_indented(text, "      ");
            printf("%s\n", cut ? " [...]" : "");
            free(text);
            const gen_rec *c = i < cold->n_gen ? &cold->gen[i] : NULL;
            if (c && (c->tok.n != g->tok.n ||
                      memcmp(c->tok.t, g->tok.t, g->tok.n * sizeof *g->tok.t))) {
                text = tok_decode(&c->tok);
                printf("      DIFFERS from the cold run's: ");
                print_indented(text, "      ");
                putchar('\n');
                free(text);
            }
        }
    }
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    if (!opt.preset) open_gguf();
    if (!opt.cache_dir[0] && !opt.socket && !opt.pkvd_args) make_own_dir();
    workload w;
    build_workload(&w);
    g_sys_tokens = w.system.n;
    if (opt.pkvd_args) { /* what `pkvd` needs to serve this demo's K/V */
        pkvm_model *m;
        char model_id[PKV_MODEL_ID_MAX + 1];
        make_model(&m, model_id);
        pkv_options o;
        pkv_options_init(&o);
        pkvm_cache_geometry(m, &o);
        printf("--layers %u --kv-heads %u --head-dim %u --block-size %u --dtype %s "
               "--capacity %" PRIu64 " --durability %s --model-id %s\n", o.num_layers,
               o.num_kv_heads, o.head_dim, opt.block_size, kv_name(), cache_capacity(&w),
               dur_name(), model_id);
        pkvm_free(m);
        free_workload(&w);
        return 0;
    }

    if (opt.run != RUN_BOTH) { /* one pass, in this process */
        pass_result r;
        run_pass(opt.run, &w, &r);
        if (opt.result_fd >= 0) {
            FILE *f = fdopen(opt.result_fd, "w");
            if (!f) die("fdopen(%d): %s", opt.result_fd, strerror(errno));
            write_result(f, &r);
            if (fclose(f)) die("writing the result: %s", strerror(errno));
        } else {
            summary s;
            summarize(&r, &s);
            print_pass(stdout, &r, &s, opt.run == RUN_COLD ? "cold run" : "warm run");
        }
        if (opt.own_dir) { /* a new directory, kept for the warm run to come */
            own_dir_done = true;
            fflush(stdout);
            fprintf(stderr, "%s: the cache is in %s (restart on it with --run warm "
                    "--cache-dir %s)\n", prog, opt.cache_dir, opt.cache_dir);
        }
        free_result(&r);
        free_workload(&w);
        return 0;
    }

    pkvm_config cfg;
    uint64_t params = 0;
    if (opt.preset) {
        pkvm_model *m;
        pkvm_preset(opt.preset, &cfg);
        cfg.seed = opt.seed;
        PKVM(pkvm_create(&cfg, &m));
        params = pkvm_params(m);
        pkvm_free(m);
    } else { /* the hyper-parameters only: the weights load in each run */
        PKVM(pkvm_config_from_gguf(g_gguf, &cfg));
        for (uint64_t i = 0; i < pkv_gguf_n_tensors(g_gguf); i++) {
            const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g_gguf, i);
            params += t->ne[0] * t->n_rows;
        }
    }
    char a[32], b[32];
    FILE *info = opt.json ? stderr : stdout;
    if (!opt.quiet || !opt.json) {
        fprintf(info,
                "pkv-demo: %s model (%u layers, width %u, %u query / %u K/V heads, %s "
                "parameters%s), K/V %s in blocks of %u tokens, durability %s, %u thread%s\n",
                model_name(), cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
                fmt_int(a, params), opt.preset ? ""
                : opt.kernel == PKVM_KERNEL_Q8
                    ? ", quantized weights, 8-bit activations"
                    : ", quantized weights, f32 activations",
                kv_name(), opt.block_size, dur_name(), opt.threads, opt.threads > 1 ? "s" : "");
        if (opt.preset)
            fprintf(info,
                    "workload: %u users x %u turns sharing a %s-token system prompt, user "
                    "messages of %u-%u tokens, answers of up to %u tokens, %u parallel samples "
                    "on one request\n",
                    opt.users, opt.turns, fmt_int(b, w.system.n), opt.msg_min, opt.msg_max,
                    opt.answer, opt.samples);
        else
            fprintf(info,
                    "chat: %u users x %u turns sharing a %s-token system prompt (%s), "
                    "questions from %s, answers of up to %u tokens (greedy, ending at "
                    "<|im_end|>), %u parallel samples on one request\n",
                    opt.users, opt.turns, fmt_int(b, w.system.n), opt.prompt_file,
                    opt.questions_file, opt.answer, opt.samples);
        if (opt.socket)
            fprintf(info, "cache: served by the pkvd on %s (each run is a new client process)\n\n",
                    opt.socket);
        else
            fprintf(info, "cache directory: %s%s\n\n", opt.cache_dir,
                    opt.own_dir ? " (new for this run)" : "");
        fflush(info);
    }
    pass_result cold, warm;
    if (!opt.quiet)
        fprintf(stderr, opt.socket ? "cold run: a new client process (cold only if the pkvd's "
                                     "cache is new)\n"
                                   : "cold run: a new process on an emptied cache directory\n");
    run_child(RUN_COLD, argv, argc, &cold);
    if (!opt.quiet)
        fprintf(stderr, opt.socket ? "\nwarm run: another new client process of the same pkvd\n"
                                   : "\nwarm run: a new process restarted on the same cache directory\n");
    run_child(RUN_WARM, argv, argc, &warm);
    const int rc = report(&w, &cold, &warm);
    if (!opt.preset && !opt.json) print_answers(&w, &cold, &warm);
    fflush(stdout); /* the summary before what follows on stderr */
    if (opt.own_dir && rc == 0) {
        wipe_cache_dir(opt.cache_dir);
        if (rmdir(opt.cache_dir)) die("cannot remove %s: %s", opt.cache_dir, strerror(errno));
        own_dir_done = true;
        if (!opt.quiet)
            fprintf(stderr, "removed the cache directory %s (pass --cache-dir DIR to keep "
                    "one, e.g. for kvdump)\n", opt.cache_dir);
    }
    free_result(&cold);
    free_result(&warm);
    free_workload(&w);
    return rc;
}
