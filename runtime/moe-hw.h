/*
 * moe-hw.h - this machine's numbers for planning an offloaded run: storage
 * direct-read latency and bandwidth, host memory bandwidth, and, per model,
 * the time of one expert at each stored precision as a function of the
 * tokens routed to it and the time of the rest of a decode step. Measured
 * once (moe_hw_measure_*), kept in a small JSON table (by default
 * $XDG_CACHE_HOME/moe/hw.json, else ~/.cache/moe/hw.json) and read back by
 * `moe-prep plan` (docs/cli.md, "moe-prep hw" and "moe-prep plan").
 *
 * The latency model is Twiddler's, measured at start-up: a read of b bytes
 * takes lat + b / bw; an expert with n routed tokens takes a + b n seconds
 * (the CPU backend; a GPU build would add transfer and device times, not
 * measured yet). Storage is keyed by the file system's device (st_dev) of
 * the file read; model entries by the bundle's file name and data size and
 * the thread count.
 *
 * Measurements read and time; they print nothing (errors through moe_log).
 * A table is a plain struct: no handles, nothing to free. Not thread-safe
 * per table.
 */
#ifndef MOE_HW_H
#define MOE_HW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe-model.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_HW_MAX_STORAGE 8
#define MOE_HW_MAX_MODELS 16
#define MOE_HW_MAX_PREC 16
#define MOE_HW_MAX_POINTS 8

/* One measured point: x (bytes or tokens) and seconds. */
struct moe_hw_point {
    double x, s;
};

/* Direct reads from one file system. */
struct moe_hw_storage {
    char device[32];       /* "major:minor" of st_dev */
    char path[512];        /* the file that was read */
    int direct;            /* 1: O_DIRECT reads; 0: buffered after dropping the file's pages */
    double lat_s;          /* per-read latency: the intercept of the fit */
    double bw;             /* bytes/s of one reader: 1 / slope */
    int n_par;             /* readers of the parallel measurement */
    double bw_par;         /* bytes/s of n_par readers together */
    int n_points;
    struct moe_hw_point points[MOE_HW_MAX_POINTS]; /* x = block bytes, s = mean seconds per read */
};

/* One stored precision of a model's routed experts on the CPU backend. */
struct moe_hw_expert {
    char precision[24];
    int64_t bytes;         /* raw bytes of one expert copy */
    double a_s, b_s;       /* seconds for n routed tokens: a + b n (measured alone) */
    double decode_s;       /* one token in a decode step: the time in place (from decode steps
                            * with top-K and top-1 at the bound precision), scaled to this
                            * precision by the measured-alone times at one token */
    int n_points;
    struct moe_hw_point points[MOE_HW_MAX_POINTS]; /* x = tokens */
};

/* One model (a bundle) at one thread count. */
struct moe_hw_model {
    char key[256];         /* bundle file name:size */
    int threads;
    int k;                 /* experts per token of the measured decode step */
    double step_s;         /* one decode step, every expert resident (median) */
    double fixed_s;        /* step_s less its routed-expert time (top-K step - top-1 step =
                            * (K - 1) experts per layer): attention, dense and shared FFNs,
                            * router, LM head, per token */
    double store_step_s;   /* the expert store's own work per MoE layer step (planning,
                            * locks, slot bookkeeping), measured with every expert
                            * cached; 0 when not measured */
    int n_prec;
    struct moe_hw_expert prec[MOE_HW_MAX_PREC];
};

struct moe_hw {
    double mem_bw;         /* host memory copy bandwidth, bytes/s (0: not measured) */
    int n_storage, n_models;
    struct moe_hw_storage storage[MOE_HW_MAX_STORAGE];
    struct moe_hw_model models[MOE_HW_MAX_MODELS];
};

/* moe_hw_default_path: the table's path, $XDG_CACHE_HOME/moe/hw.json or
 * $HOME/.cache/moe/hw.json; MOE_ERR_NOT_FOUND when neither variable is set,
 * MOE_ERR_RANGE when it does not fit in n bytes. */
enum moe_status moe_hw_default_path(char *buf, size_t n);

/* moe_hw_load: read a table. MOE_ERR_NOT_FOUND (not logged) when the file
 * does not exist; MOE_ERR_FORMAT (logged) when it is not a table this
 * version wrote (each field is checked: types, ranges, counts). */
enum moe_status moe_hw_load(const char *path, struct moe_hw *out);

/* moe_hw_save: write hw to path atomically (a temporary file renamed),
 * creating the directory if needed. MOE_ERR_IO (logged). */
enum moe_status moe_hw_save(const char *path, const struct moe_hw *hw);

/* moe_hw_storage_key: the device key ("major:minor") of the file system
 * holding path. MOE_ERR_IO (logged) when it cannot be examined. */
enum moe_status moe_hw_storage_key(const char *path, char *key, size_t n);

/* moe_hw_model_key: the model key of a bundle file: its name and the bytes of
 * its tensors and blobs (not the file size, which grows as tuning is
 * rewritten). Errors of moe_bundle_open. */
enum moe_status moe_hw_model_key(const char *path, char *key, size_t n);

/* moe_hw_find_storage / moe_hw_find_model: the entry for a device key, or
 * for a model key and thread count; NULL when the table has none. */
const struct moe_hw_storage *moe_hw_find_storage(const struct moe_hw *hw, const char *device);
const struct moe_hw_model *moe_hw_find_model(const struct moe_hw *hw, const char *key, int threads);

/* moe_hw_find_expert: a model entry's line for a precision name; NULL if absent. */
const struct moe_hw_expert *moe_hw_find_expert(const struct moe_hw_model *m, const char *precision);

/* moe_hw_put_storage / moe_hw_put_model: add an entry, replacing one with
 * the same key (and threads); the oldest is dropped when the table is full. */
void moe_hw_put_storage(struct moe_hw *hw, const struct moe_hw_storage *s);
void moe_hw_put_model(struct moe_hw *hw, const struct moe_hw_model *m);

/* moe_hw_read_s: the model's seconds for one read of `bytes` (lat + bytes / bw). */
double moe_hw_read_s(const struct moe_hw_storage *s, double bytes);

/* moe_hw_expert_s: seconds of one expert with n routed tokens: the measured
 * point at n if there is one, else a + b n. */
double moe_hw_expert_s(const struct moe_hw_expert *e, int n);

/* moe_hw_measure_storage: direct reads of `path` at random 4 KiB-aligned
 * offsets, blocks of 64 KiB, 1 MiB and block_bytes (e.g. one expert copy;
 * 0: 4 MiB), each at most max_bytes in all (0: 256 MiB), one reader; then
 * block_bytes with n_par readers. Fits lat and bw by least squares over the
 * mean time per read. MOE_ERR_IO (logged) when the file cannot be read. */
enum moe_status moe_hw_measure_storage(const char *path, int64_t block_bytes, int64_t max_bytes, int n_par,
                                       struct moe_hw_storage *out);

/* moe_hw_measure_memory: host memory copy bandwidth (bytes/s) over 64 MiB
 * buffers, best of a few rounds. MOE_ERR_NOMEM. */
enum moe_status moe_hw_measure_memory(double *bw);

/* moe_hw_measure_model: a bundle model's times on `threads` CPU threads (0:
 * all), on the backend `device` (moe_session_params.device: NULL or "cpu",
 * "cuda:1", ...; device_options its options, borrowed; the entry's key then
 * carries "@device", moe_hw_device_key): every stored precision's expert FFN for 1, 2, 4, ... 32 routed
 * tokens (rotating over up to 16 experts so the weights come from memory as
 * in a decode step, not from the CPU's caches), fitted to a + b n; one
 * decode step with every expert resident, and with every expert in a store
 * (when the model's experts fit in store_limit bytes; 0: 1 GiB), for
 * fixed_s and store_step_s. The model should be loaded with lazy_experts
 * (its pages are read as measured). MOE_ERR_INVALID (logged) for a
 * checkpoint directory. */
enum moe_status moe_hw_measure_model(const struct moe_model *m, int threads, int64_t store_limit, const char *device,
                                     const void *device_options, struct moe_hw_model *out);

/* moe_hw_device_key: append "@device" to a model key (key[n]) unless device
 * is NULL, empty or "cpu", so one table keeps a model's entries per backend. */
void moe_hw_device_key(char *key, size_t n, const char *device);

/* moe_hw_measure_bundle: everything for one bundle file into hw (entries
 * replaced): memory bandwidth, its file system's reads (blocks up to the
 * largest stored expert copy, 2 readers as the store's loaders), the model
 * (loaded lazily for the measurement) on `threads` threads and the backend
 * `device` (as moe_hw_measure_model). Seconds to a minute; errors logged. */
enum moe_status moe_hw_measure_bundle(const char *path, int threads, const char *device, const void *device_options,
                                      struct moe_hw *hw);

/* moe_hw_print: the table as text on f: the entries for device and for
 * model_key at `threads` (NULL / 0: all). */
void moe_hw_print(const struct moe_hw *hw, const char *model_key, int threads, const char *device, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
