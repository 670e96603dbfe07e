/*
 * kvdump_cli.c — kvdump's command-line program (tools/kvdump.c) with its main()
 * renamed kvdump_main(), so fuzz_kvdump.c can run its commands in-process.
 */
int kvdump_main(int argc, char **argv);
#define main kvdump_main
#include "../tools/kvdump.c"
