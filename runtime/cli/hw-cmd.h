/*
 * hw-cmd.h - the shared body of `moe-prep hw` and `moe-run --measure-hw`.
 */
#ifndef MOE_HW_CMD_H
#define MOE_HW_CMD_H

/* moe_hw_command: measure bundle on `threads` (0: all online CPUs) and the
 * backend `device` (NULL / "cpu", "cuda:1", ...; device_options its options)
 * into the table at `table` (NULL: moe_hw_default_path), or with show != 0
 * only print the table's entries for it; messages name `who`. Prints the
 * entries on stdout and progress on stderr. Returns the exit status: 0, 1
 * failure, 2 usage. */
int moe_hw_command(const char *bundle, int threads, const char *device, const void *device_options, const char *table,
                   int show, const char *who);

#endif
