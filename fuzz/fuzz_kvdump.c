/*
 * fuzz_kvdump.c — libFuzzer target for kvdump's read-only commands on a damaged
 * or forged cache directory: its arena-header check, its own log scanner
 * (tools/kvdump_wal.c, which re-implements the reading rules of recovery), the
 * read-only open and every report built on it (summary, blocks, block, seqs,
 * seq, prefixes, wal, verify; text and JSON).
 *
 * Input: a cache directory as built by fuzz_dir.c (format in fuzz_dir.h; the
 * recover corpus is valid input). Flags, beyond fuzz_dir's: 4 --point-in-time;
 * bits 4-6 choose the command; bit 7 --json. The command must return one of
 * kvdump's exit codes (0-3) and must not crash, read out of bounds or leak;
 * a SIGBUS while reading a mapped file ends the process (kvdump's handler exits
 * with status 2), which libFuzzer reports.
 * Built against libpagedkv_fuzz, so every on-disk checksum matches.
 */
#include "fuzz_dir.h"

#include <stdio.h>
#include <stdlib.h>

int kvdump_main(int argc, char **argv);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool quiet;
    if (!quiet) { /* the reports go nowhere; errors and harness failures stay on stderr */
        FZ_ASSERT(freopen("/dev/null", "w", stdout), "freopen stdout");
        quiet = true;
    }
    fz_cachedir cd;
    if (!fz_cachedir_build(&cd, "kvdump", data, size)) return 0;
    static const char *const cmds[8][2] = {
        {"summary", NULL}, {"blocks", NULL}, {"block", "0"},  {"seqs", NULL},
        {"seq", "1"},      {"prefixes", NULL}, {"wal", NULL}, {"verify", NULL},
    };
    const char *const *cmd = cmds[(cd.flags >> 4) & 7];
    char *argv[8];
    int argc = 0;
    argv[argc++] = (char *)"kvdump";
    argv[argc++] = (char *)cmd[0];
    argv[argc++] = (char *)cd.dir;
    if (cmd[1]) argv[argc++] = (char *)cmd[1];
    if (cd.flags & 4) argv[argc++] = (char *)"--point-in-time";
    if (cd.flags & 0x80) argv[argc++] = (char *)"--json";
    argv[argc] = NULL;
    int rc = kvdump_main(argc, argv);
    fflush(stdout);
    FZ_ASSERT(rc >= 0 && rc <= 3, "kvdump %s returned %d", cmd[0], rc);
    return 0;
}
