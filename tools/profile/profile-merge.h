/*
 * profile-merge.h - joining the shards of one profiling run
 * (moe_profile_record with shard_i/shard_n, `moe-prep profile --shard I/N`)
 * into the profile a single run gives.
 *
 * Threads: reads files through moe_profile_read (which forks a reader
 * process); call from one thread at a time.
 */
#ifndef MOE_PROFILE_MERGE_H
#define MOE_PROFILE_MERGE_H

#include "moe-status.h"
#include "profile-h5.h"
#include "profile-results.h"

#ifdef __cplusplus
extern "C" {
#endif

/* moe_profile_merge_files: read the n >= 1 shard files at paths (any order),
 * put them in sequence order by their `shard` ranges, which must join without
 * gaps or overlaps and come from runs of the same length, and merge them
 * (moe_profile_merge: counts and sum.* arrays added, other derived arrays
 * dropped for moe_profile_derive to compute again). The merged `shard` array
 * spans the shards' ranges (the whole run only when every shard is there).
 * *out receives the merged profile (caller frees with moe_profile_free);
 * *first_targets (may be NULL) the first shard's `targets` array, or
 * moe_profile_default_targets() when it has none.
 *
 * Errors (logged, naming the file; *out NULL): moe_profile_read's for an
 * unreadable or foreign file; MOE_ERR_FORMAT for a file without a valid
 * sequence range, or ranges that overlap, leave a gap or come from runs of
 * different length; moe_profile_merge's for shards of other models or
 * settings; MOE_ERR_INVALID for n < 1; MOE_ERR_NOMEM. */
enum moe_status moe_profile_merge_files(const char *const *paths, int n, struct moe_profile **out,
                                        struct moe_profile_targets *first_targets);

#ifdef __cplusplus
}
#endif

#endif
