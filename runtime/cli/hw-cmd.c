/*
 * hw-cmd.c - what `moe-prep hw` and `moe-run --measure-hw` do after parsing
 * their options (both CLIs compile this file; the runtime library prints
 * nothing): measure a bundle into the hardware table, or show its entries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hw-cmd.h"
#include "moe-hw.h"

int moe_hw_command(const char *bundle, int threads, const char *device, const void *device_options, const char *table,
                   int show, const char *who) {
    char path[1024], mkey[256], dev[32];
    if (!table) {
        if (moe_hw_default_path(path, sizeof path)) {
            fprintf(stderr, "%s: neither XDG_CACHE_HOME nor HOME is set; give the table's path\n", who);
            return 2;
        }
        table = path;
    }
    struct moe_hw *hw = calloc(1, sizeof *hw);
    if (!hw) return 1;
    int rc = 1;
    enum moe_status st = moe_hw_load(table, hw);
    if (st && st != MOE_ERR_NOT_FOUND) {
        fprintf(stderr, "%s: %s is damaged; measuring into a new table\n", who, table);
        memset(hw, 0, sizeof *hw);
    }
    if (moe_hw_model_key(bundle, mkey, sizeof mkey) || moe_hw_storage_key(bundle, dev, sizeof dev)) goto done;
    moe_hw_device_key(mkey, sizeof mkey, device);
    if (!threads) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (!show) {
        fprintf(stderr, "%s: measuring storage, memory and %s on %d threads, backend %s (keep the machine otherwise "
                        "idle)\n", who, bundle, threads, device ? device : "cpu");
        if (moe_hw_measure_bundle(bundle, threads, device, device_options, hw)) {
            fprintf(stderr, "%s: the measurement failed (see the message above)\n", who);
            goto done;
        }
        if (moe_hw_save(table, hw)) goto done;
        fprintf(stderr, "%s: written to %s\n", who, table);
    } else if (!moe_hw_find_model(hw, mkey, threads)) {
        fprintf(stderr, "%s: %s has no entry for %s on %d threads (measure it: moe-prep hw %s -t %d)\n", who, table,
                mkey, threads, bundle, threads);
        goto done;
    }
    moe_hw_print(hw, mkey, threads, dev, stdout);
    rc = 0;
done:
    free(hw);
    return rc;
}
