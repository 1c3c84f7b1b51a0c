/*
 * shard.h - which slice of a job this process is: "--shard I/N" written by
 * hand, or "--shard auto" taken from a cluster's job-array environment, so
 * that one command line serves every task of a Slurm job array or a
 * Kubernetes Indexed Job (docs/distributed.md).
 *
 * Thread safety: moe_shard_parse reads the environment (getenv); do not call
 * it while another thread changes the environment.
 */
#ifndef MOE_SHARD_H
#define MOE_SHARD_H

#include <stddef.h>

/* moe_shard_parse: turn a --shard value into a 0-based *index and a *count
 * (0 <= *index < *count). Accepted values:
 *   "I/N"    I-th of N shards, I from 1 (as profile has always taken it);
 *   "auto"   from the environment:
 *            - Slurm job arrays: SLURM_ARRAY_TASK_ID, minus SLURM_ARRAY_TASK_MIN
 *              when that is set (so --array=1-8 and --array=0-7 both work);
 *              the count is SLURM_ARRAY_TASK_COUNT, or MAX - MIN + 1 from
 *              SLURM_ARRAY_TASK_MAX/MIN when the count is absent; an array
 *              with a step or a list (COUNT != MAX - MIN + 1) is refused;
 *            - Kubernetes Indexed Jobs: JOB_COMPLETION_INDEX (0-based); the
 *              count is count_opt (the job's completions: Kubernetes sets no
 *              count variable), so count_opt must be > 0;
 *   "auto/N" the same with the count N given inline (count_opt is then 0 or N).
 * count_opt (from a --shard-count option; 0 when not given) must agree with
 * Slurm's count when both are known. Both environments at once, neither, a
 * value that is not a whole number, or an index outside [0, count) is an
 * error. Returns 1 on success; 0 with a one-line reason in err (when err is
 * not NULL and errsz > 0), nothing printed. */
int moe_shard_parse(const char *spec, int count_opt, int *index, int *count, char *err, size_t errsz);

#endif
