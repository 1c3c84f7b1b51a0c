/*
 * quantize.h - pack a Hugging Face checkpoint or a llama.cpp GGUF file into a
 * multi-precision bundle (.moeb): the library half of `moe-prep quantize`,
 * one call as llama.cpp's llama_model_quantize().
 *
 * Streams tensor by tensor from the mmapped source: every non-expert matrix is
 * quantized to the dense type (norms, biases and routers stay float32) and
 * written once; every routed expert is quantized to each requested precision,
 * its gate, up and down matrices (and gpt-oss's biases) packed into one blob
 * per precision. A matrix whose rows do not fit a type's block size falls back
 * as llama.cpp does (k-quants -> q4_0 / q8_0, then f16); a matrix already
 * stored in the requested type is copied block for block. Source pages are
 * released after use, so resident memory stays below about: the largest
 * non-expert matrix at the dense type + two expert blobs at the largest
 * precision (one is quantized while the other is written) + threads x (a row
 * of floats), whatever the model size. The provenance hashes of the source
 * files are computed by a thread that reads them alongside the quantization
 * (a little ahead of it, so the quantizer finds its pages in the page cache).
 *
 * The bundle is written to a temporary file next to `out` and renamed only
 * when complete; a failed or cancelled call leaves nothing at `out`.
 *
 * Thread safety: one call uses its own thread pool and touches no global
 * state other than the logging callback (moe-status.h); calls with different
 * outputs may run concurrently. The callbacks run on the calling thread; log
 * messages may also come from the call's hashing and writing threads.
 */
#ifndef MOE_QUANTIZE_H
#define MOE_QUANTIZE_H

#include <signal.h>
#include <stdint.h>

#include "moe-quant.h"
#include "moe-status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most expert precisions one bundle holds side by side. */
#define MOE_QUANTIZE_MAX_PRECISIONS 8

struct moe_quantize_params {
    enum moe_qtype experts[MOE_QUANTIZE_MAX_PRECISIONS]; /* expert precisions, distinct */
    int n_experts;                                       /* 1..MOE_QUANTIZE_MAX_PRECISIONS */
    enum moe_qtype dense;   /* type of the non-expert matrices */
    int zstd_level;         /* 0 = no compression; 1..22: zstd-compress expert blobs
                             * where it saves at least 3 % of the bytes */
    int n_threads;          /* quantization threads; 0 = all online CPUs */
    /* Recorded in the bundle as provenance.command_line (NULL: ""). */
    const char *command_line;
    /* Optional: called after each matrix (non-expert) or expert precision
     * with the source bytes processed so far and in all (an expert's bytes
     * count once per precision). */
    void (*on_progress)(uint64_t done, uint64_t total, void *user);
    /* Optional: called once per type fallback, before anything is quantized,
     * with a line such as "experts down (q4_k): q4_k -> q4_0 (rows of 96)";
     * the same lines are stored in the bundle as quant.fallbacks. */
    void (*on_fallback)(const char *note, void *user);
    void *user;
    /* Optional cancellation: when *cancel becomes non-zero (a signal handler
     * may set it) the call stops at the next matrix, removes its temporary
     * file and returns MOE_ERR_CANCELLED. */
    const volatile sig_atomic_t *cancel;
};

/* moe_quantize_default_params: experts q8_0, q4_k, q2_k; dense q8_0; no
 * compression; all CPUs; no callbacks. */
struct moe_quantize_params moe_quantize_default_params(void);

/* What a finished (or refused) call reports. */
struct moe_quantize_result {
    int refused;             /* 1: the failure was the caller's (invalid parameters, or `out`
                              * is one of the files the model is read from); nothing written */
    double seconds;          /* wall time from the start of the call */
    uint64_t input_bytes;    /* the source's weight bytes, each counted once */
    uint64_t file_bytes;     /* size of the written bundle */
    int n_fallbacks;         /* matrices stored in another type than requested */
    int n_experts;           /* precisions written, as in the params */
    double bits_per_weight[MOE_QUANTIZE_MAX_PRECISIONS]; /* of each precision's gate/up/down */
    uint64_t layer_bytes[MOE_QUANTIZE_MAX_PRECISIONS];   /* one MoE layer's experts at it */
};

/* moe_quantize_model: quantize the model at `in` (a checkpoint directory or a
 * .gguf file) into the bundle `out`. Returns MOE_OK, or (logged) the first
 * error: the model's load error; MOE_ERR_INVALID with result->refused set for
 * bad parameters or an `out` that names one of the model's files (checked
 * before anything is written); MOE_ERR_IO, MOE_ERR_NOMEM, ... from reading,
 * quantizing or writing; MOE_ERR_CANCELLED when params->cancel was set. On
 * any failure nothing is left at `out` (a previous file there is kept).
 * `result` may be NULL; it is filled on success (and `refused` on failure).
 * All arguments are borrowed for the call only. */
enum moe_status moe_quantize_model(const char *in, const char *out, const struct moe_quantize_params *params,
                                   struct moe_quantize_result *result);

#ifdef __cplusplus
}
#endif

#endif
