/*
 * quantize.c - `moe-prep quantize`: Hugging Face checkpoint -> bundle (.moeb).
 *
 * Streams tensor by tensor from the mmapped checkpoint: every non-expert
 * matrix is quantized to the dense type (norms, biases and routers stay float32)
 * and written once; every routed expert is quantized to each requested
 * precision, its gate, up and down matrices packed into one blob per precision.
 * Source pages are released after use, so resident memory stays bounded by the
 * largest single output (see `bound` in usage()) whatever the model size.
 * The bundle is written to a temporary file and renamed only when complete.
 */
/*
 * quantize.c - checkpoint or GGUF -> bundle (.moeb): the library half of
 * `moe-prep quantize` (quantize.h; the command is quantize-cmd.c).
 *
 * Streams tensor by tensor from the mmapped checkpoint: every non-expert
 * matrix is quantized to the dense type (norms, biases and routers stay
 * float32) and written once; every routed expert is quantized to each
 * requested precision, its gate, up and down matrices packed into one blob per
 * precision. Source pages are released after use, so resident memory stays
 * bounded by the largest single output whatever the model size. The bundle is
 * written to a temporary file and renamed only when complete.
 */
#define _GNU_SOURCE
#include "quantize.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "moe-base.h"
#include "moe-bundle.h"
#include "moe-file.h"
#include "moe-gguf-model.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-safetensors.h"
#include "moe-threadpool.h"

#define MAX_PRECISIONS MOE_QUANTIZE_MAX_PRECISIONS
#define MAX_FALLBACKS 256

struct moe_quantize_params moe_quantize_default_params(void) {
    struct moe_quantize_params p;
    memset(&p, 0, sizeof p);
    p.experts[0] = MOE_QTYPE_Q8_0;
    p.experts[1] = MOE_QTYPE_Q4_K;
    p.experts[2] = MOE_QTYPE_Q2_K;
    p.n_experts = 3;
    p.dense = MOE_QTYPE_Q8_0;
    return p;
}

/* ---- type choice ------------------------------------------------------- */

/* fit_type: `want` if rows of n elements fit its blocks, else the fallback
 * llama.cpp uses (k-quants -> q4_0 or q8_0), else f16. */
static enum moe_qtype fit_type(enum moe_qtype want, int64_t n) {
    if (moe_qtype_row_bytes(want, n)) return want;
    enum moe_qtype fb = (want == MOE_QTYPE_Q5_K || want == MOE_QTYPE_Q6_K || want == MOE_QTYPE_Q8_0)
                            ? MOE_QTYPE_Q8_0
                            : MOE_QTYPE_Q4_0;
    if (moe_qtype_row_bytes(fb, n)) return fb;
    return MOE_QTYPE_F16;
}

/* ---- parallel quantization of one matrix -------------------------------- */

struct qctx {
    const struct moe_weight *src;
    enum moe_qtype type;
    char *dst;
    size_t dst_row;
    float *bufs; /* [threads x n_in] */
    enum moe_status st;
};

static void quant_rows(void *vctx, int64_t b, int64_t e, int tid) {
    struct qctx *c = vctx;
    const int64_t n = c->src->n_in;
    float *row = c->bufs + (size_t)tid * (size_t)n;
    const size_t src_row = moe_qtype_row_bytes(c->src->type, n);
    for (int64_t r = b; r < e; r++) {
        if (c->src->type == c->type) { /* the stored type is kept as it is (e.g. mxfp4 experts) */
            memcpy(c->dst + (size_t)r * c->dst_row, (const char *)c->src->data + (size_t)r * src_row, src_row);
            continue;
        }
        enum moe_status st = moe_dequantize_row(c->src->type, (const char *)c->src->data + (size_t)r * src_row, row, n);
        if (!st) st = moe_quantize_row(c->type, row, c->dst + (size_t)r * c->dst_row, n);
        if (st) c->st = st;
    }
}

/* quantize_matrix: all rows of src into dst (row_bytes(type, n_in) * n_out bytes). */
static enum moe_status quantize_matrix(struct moe_pool *pool, float *bufs, const struct moe_weight *src,
                                       enum moe_qtype type, void *dst) {
    struct qctx c = {src, type, dst, moe_qtype_row_bytes(type, src->n_in), bufs, MOE_OK};
    moe_pool_for(pool, src->n_out, 1, quant_rows, &c);
    return c.st;
}

/* release: drop the pages of a source range from memory (the file stays). */
static void release(const void *p, size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)pg - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

static size_t weight_bytes(const struct moe_weight *w) {
    return moe_qtype_row_bytes(w->type, w->n_in) * (size_t)w->n_out;
}

/* ---- metadata ----------------------------------------------------------- */

/* meta_file_text: store a small text file of the checkpoint under `key`, if present. */
static enum moe_status meta_file_text(struct moe_bundle_writer *w, const char *dir, const char *file,
                                      const char *key, int required) {
    char *path = moe_path_join(dir, file), *text = NULL;
    size_t len = 0;
    struct stat sb;
    enum moe_status st = MOE_OK;
    if (!path) return MOE_ERR_NOMEM;
    if (stat(path, &sb) != 0) {
        if (required) {
            MOE_LOGE("quantize: %s is missing", path);
            st = MOE_ERR_NOT_FOUND;
        }
    } else if (!(st = moe_read_file(path, 256u << 20, &text, &len))) {
        st = moe_bundle_writer_set_meta_str(w, key, text);
    }
    free(text);
    free(path);
    return st;
}

/* write_source_texts: the config, generation config and tokenizer texts the
 * runtime rebuilds the model from: the checkpoint's files, or for a GGUF the
 * texts made from its metadata. */
static enum moe_status write_source_texts(struct moe_bundle_writer *w, const struct moe_model *m, const char *model) {
    enum moe_status st;
    if (m->gguf) {
        const char *tj = moe_gguf_model_tokenizer_json(m->gguf_view), *tc = moe_gguf_model_tokenizer_config_json(m->gguf_view);
        if ((st = moe_bundle_writer_set_meta_str(w, "hf.config.json", moe_gguf_model_config_json(m->gguf_view)))) return st;
        if (tj && (st = moe_bundle_writer_set_meta_str(w, "hf.tokenizer.json", tj))) return st;
        if (tc && (st = moe_bundle_writer_set_meta_str(w, "hf.tokenizer_config.json", tc))) return st;
        /* the chat template (moe-chat.h reads it back): tokenizer.chat_template as its own text */
        const struct moe_gguf_kv *ct = moe_gguf_find_kv(m->gguf, "tokenizer.chat_template");
        struct moe_gguf_str cs;
        if (ct && moe_gguf_kv_str(ct, 0, &cs) && cs.n > 0 && !memchr(cs.p, 0, (size_t)cs.n)) {
            char *text = malloc((size_t)cs.n + 1);
            if (!text) return MOE_ERR_NOMEM;
            memcpy(text, cs.p, (size_t)cs.n), text[cs.n] = 0;
            st = moe_bundle_writer_set_meta_str(w, "hf.chat_template.jinja", text);
            free(text);
            if (st == MOE_ERR_NOMEM) return st;
            if (st) MOE_LOGW("quantize: the GGUF's tokenizer.chat_template is not valid text; the bundle goes without it");
        }
        return moe_bundle_writer_set_meta_str(w, "provenance.source_format", "gguf");
    }
    if ((st = meta_file_text(w, model, "config.json", "hf.config.json", 1))) return st;
    if ((st = meta_file_text(w, model, "generation_config.json", "hf.generation_config.json", 0))) return st;
    if ((st = meta_file_text(w, model, "tokenizer.json", "hf.tokenizer.json", 0))) return st;
    if ((st = meta_file_text(w, model, "chat_template.jinja", "hf.chat_template.jinja", 0))) return st;
    return meta_file_text(w, model, "tokenizer_config.json", "hf.tokenizer_config.json", 0);
}

/* cancelled: the caller's cancel flag is set. */
static int cancelled(const volatile sig_atomic_t *flag) { return flag && *flag; }

/* ---- hashing the source files alongside the quantization ---------------- */

/* How far (bytes) the hashing thread may read ahead of the quantizer, and its read size. */
#define HASH_AHEAD ((uint64_t)512 << 20)
#define HASH_CHUNK ((size_t)8 << 20)

/*
 * The provenance hashes (XXH3-64 of every source file) are computed by a
 * thread of their own while the pool quantizes, instead of a pass before it:
 * the thread reads each file once, in order, in large chunks, so it also
 * brings the pages the quantizer is about to touch into the page cache (which
 * the quantizer's mmap then finds), and the input is read from the disk once
 * instead of twice. It stays at most HASH_AHEAD bytes ahead of the input the
 * quantizer has consumed, so a model larger than the memory is not read ahead
 * only to be evicted before use.
 */
struct hasher {
    pthread_t thread;
    int running;
    const struct moe_model *m;
    const volatile sig_atomic_t *cancel;
    int n_files;
    uint64_t *hash;     /* [n_files] */
    pthread_mutex_t mu; /* guards allowed and stop */
    pthread_cond_t cv;
    uint64_t allowed;   /* bytes it may have read */
    int stop;           /* the job failed: give up */
    enum moe_status st; /* its result, read after the join */
    int failed;         /* set (atomically) when it failed, so the job stops early */
};

/* hasher_path: the i-th source file. */
static const char *hasher_path(const struct hasher *h, int i) {
    return h->m->gguf ? h->m->path : moe_safetensors_file_path(h->m->st, i);
}

/* hasher_wait: block until `have` bytes are below the allowance; 0 if told to stop. */
static int hasher_wait(struct hasher *h, uint64_t have) {
    pthread_mutex_lock(&h->mu);
    while (!h->stop && have >= h->allowed) pthread_cond_wait(&h->cv, &h->mu);
    const int go = !h->stop;
    pthread_mutex_unlock(&h->mu);
    return go;
}

/* hash_one: XXH3-64 of one file, mapped and hashed chunk by chunk (no copy
 * out of the page cache); the next chunk's read is started before a chunk is
 * hashed, and each chunk is unmapped from this thread after use (its pages
 * stay cached for the quantizer); *total counts the bytes hashed. */
static enum moe_status hash_one(struct hasher *h, const char *path, XXH3_state_t *s, uint64_t *total, uint64_t *out) {
    struct moe_mmap map;
    enum moe_status st = moe_mmap_open(path, &map);
    if (st) return st;
    const char *p = map.data;
    XXH3_64bits_reset(s);
    for (size_t off = 0; !st && off < map.size; off += HASH_CHUNK) {
        const size_t n = map.size - off < HASH_CHUNK ? map.size - off : HASH_CHUNK;
        if (!hasher_wait(h, *total) || cancelled(h->cancel)) {
            st = MOE_ERR_CANCELLED;
            break;
        }
        if (off + n < map.size) { /* read ahead: the next chunk */
            const size_t m = map.size - off - n < HASH_CHUNK ? map.size - off - n : HASH_CHUNK;
            long pg = sysconf(_SC_PAGESIZE);
            madvise((void *)((uintptr_t)(p + off + n) & ~((uintptr_t)pg - 1)), m, MADV_WILLNEED);
        }
        XXH3_64bits_update(s, p + off, n);
        release(p + off, n);
        *total += n;
    }
    if (!st) *out = XXH3_64bits_digest(s);
    moe_mmap_close(&map);
    return st;
}

/* hasher_main: the thread: every file in order. */
static void *hasher_main(void *arg) {
    struct hasher *h = arg;
    XXH3_state_t *s = XXH3_createState();
    uint64_t total = 0;
    enum moe_status st = s ? MOE_OK : MOE_ERR_NOMEM;
    for (int i = 0; !st && i < h->n_files; i++) {
        st = hash_one(h, hasher_path(h, i), s, &total, &h->hash[i]);
        if (st && st != MOE_ERR_CANCELLED) MOE_LOGE("quantize: cannot hash %s", hasher_path(h, i));
    }
    XXH3_freeState(s);
    h->st = st;
    if (st) __atomic_store_n(&h->failed, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* hasher_start: start hashing the model's source files. */
static enum moe_status hasher_start(struct hasher *h, const struct moe_model *m, const volatile sig_atomic_t *cancel) {
    memset(h, 0, sizeof *h);
    h->m = m;
    h->cancel = cancel;
    h->n_files = m->gguf ? 1 : moe_safetensors_n_files(m->st);
    h->allowed = HASH_AHEAD;
    if (!(h->hash = calloc((size_t)h->n_files, sizeof *h->hash))) return MOE_ERR_NOMEM;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (pthread_create(&h->thread, NULL, hasher_main, h) != 0) {
        MOE_LOGE("quantize: cannot start the hashing thread");
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        return MOE_ERR_NOMEM;
    }
    h->running = 1;
    return MOE_OK;
}

/* hasher_allow: the quantizer has consumed `consumed` input bytes. */
static void hasher_allow(struct hasher *h, uint64_t consumed) {
    if (!h->running) return;
    pthread_mutex_lock(&h->mu);
    h->allowed = consumed > UINT64_MAX - HASH_AHEAD ? UINT64_MAX : consumed + HASH_AHEAD;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* hasher_failed: the hashing thread gave up (its error is logged). */
static int hasher_failed(struct hasher *h) { return __atomic_load_n(&h->failed, __ATOMIC_ACQUIRE); }

/* hasher_finish: let a started hasher finish (or, with stop, make it give
 * up) and join it; its result. The hashes stay (free h->hash). */
static enum moe_status hasher_finish(struct hasher *h, int stop) {
    pthread_mutex_lock(&h->mu);
    h->allowed = UINT64_MAX;
    h->stop = stop;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    h->running = 0;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    return h->st;
}

/* write_provenance: source files and their hashes, tool, command line, time. */
static enum moe_status write_provenance(struct moe_bundle_writer *w, const struct moe_model *m,
                                        const struct moe_quantize_params *qp, const uint64_t *hashes) {
    enum moe_status st;
    int nf = m->gguf ? 1 : moe_safetensors_n_files(m->st);
    const char **names = calloc((size_t)nf, sizeof *names);
    char(*hex)[17] = calloc((size_t)nf, sizeof *hex);
    const char **hexp = calloc((size_t)nf, sizeof *hexp);
    if (!names || !hex || !hexp) {
        st = MOE_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        const char *p = m->gguf ? m->path : moe_safetensors_file_path(m->st, i);
        const char *slash = strrchr(p, '/');
        names[i] = slash ? slash + 1 : p;
        snprintf(hex[i], sizeof hex[i], "%016llx", (unsigned long long)hashes[i]);
        hexp[i] = hex[i];
    }
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    char *src = realpath(m->path, NULL);
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.source", src ? src : m->path))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str_array(w, "provenance.files", names, (size_t)nf))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str_array(w, "provenance.files_xxh3", hexp, (size_t)nf))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.tool", "moe-prep " MOE_VERSION))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.command_line",
                                              qp->command_line ? qp->command_line : ""))) goto done_src;
    st = moe_bundle_writer_set_meta_str(w, "provenance.created", when);
done_src:
    free(src);
done:
    free(names);
    free(hex);
    free(hexp);
    return st;
}

/* ---- the job ------------------------------------------------------------ */

struct job {
    const struct moe_quantize_params *a;
    struct moe_model *m;
    struct moe_bundle_writer *w;
    struct moe_pool *pool;
    float *bufs;
    uint64_t done, total; /* source bytes processed (progress) */
    uint64_t consumed;    /* source bytes read (each once; paces the hasher) */
    struct hasher hs;
    const char *fallbacks[MAX_FALLBACKS];
    char fallback_text[MAX_FALLBACKS][320];
    int n_fallbacks;
};

/* job_stop: why the job must stop now (cancelled, or the hasher failed), else MOE_OK. */
static enum moe_status job_stop(struct job *j) {
    if (cancelled(j->a->cancel)) return MOE_ERR_CANCELLED;
    return hasher_failed(&j->hs) ? MOE_ERR_IO : MOE_OK;
}

/* consumed_add: count source bytes the quantizer is done with; the hasher may read further. */
static void consumed_add(struct job *j, uint64_t bytes) {
    j->consumed += bytes;
    hasher_allow(&j->hs, j->consumed);
}

/* progress_add: count source bytes processed and tell the caller. */
static void progress_add(struct job *j, uint64_t bytes) {
    j->done += bytes;
    if (j->a->on_progress) j->a->on_progress(j->done, j->total, j->a->user);
}

/* note_fallback: remember (and tell the caller once) that a matrix could not use a type. */
static void note_fallback(struct job *j, const char *what, enum moe_qtype want, enum moe_qtype got, int64_t n) {
    if (want == got || j->n_fallbacks == MAX_FALLBACKS) return;
    char *s = j->fallback_text[j->n_fallbacks];
    snprintf(s, 320, "%s: %s -> %s (rows of %lld)", what, moe_qtype_name(want), moe_qtype_name(got), (long long)n);
    j->fallbacks[j->n_fallbacks++] = s;
    if (j->a->on_fallback) j->a->on_fallback(s, j->a->user);
}

/* write_dense: every non-expert tensor, once. */
static enum moe_status write_dense(struct job *j) {
    enum moe_status st = MOE_OK;
    for (int i = 0; i < j->m->n_refs; i++) {
        if ((st = job_stop(j))) return st;
        const struct moe_tensor_ref *r = &j->m->refs[i];
        enum moe_qtype t = r->role == MOE_ROLE_MATRIX ? fit_type(j->a->dense, r->w.n_in) : MOE_QTYPE_F32;
        if (r->role == MOE_ROLE_MATRIX) note_fallback(j, r->name, j->a->dense, t, r->w.n_in);
        size_t nbytes = moe_qtype_row_bytes(t, r->w.n_in) * (size_t)r->w.n_out;
        void *buf = malloc(nbytes ? nbytes : 1);
        if (!buf) return MOE_ERR_NOMEM;
        st = quantize_matrix(j->pool, j->bufs, &r->w, t, buf);
        uint64_t shape[2] = {(uint64_t)r->w.n_out, (uint64_t)r->w.n_in};
        if (r->n_dims == 1) shape[0] = (uint64_t)r->w.n_in;
        if (!st) st = moe_bundle_writer_add_tensor(j->w, r->name, (uint32_t)t, (uint32_t)r->n_dims, shape, buf, nbytes);
        free(buf);
        if (st) {
            MOE_LOGE("quantize: cannot write tensor %s", r->name);
            return st;
        }
        if (r->role != MOE_ROLE_VECTOR) release(r->w.data, weight_bytes(&r->w));
        consumed_add(j, weight_bytes(&r->w));
        progress_add(j, weight_bytes(&r->w));
    }
    return st;
}

/* expert_layout: per precision, the parts of a blob with fitted types (gate,
 * up, down; gpt-oss also an f32 row of their biases). */
static enum moe_status expert_layout(struct job *j, struct moe_bundle_precision *prec) {
    const struct moe_config *c = &j->m->cfg;
    for (int p = 0; p < j->a->n_experts; p++) {
        enum moe_qtype want = j->a->experts[p];
        enum moe_qtype tg = fit_type(want, c->n_embd), td = fit_type(want, c->n_ff_expert);
        char what[64];
        snprintf(what, sizeof what, "experts gate/up (%s)", moe_qtype_name(want));
        note_fallback(j, what, want, tg, c->n_embd);
        snprintf(what, sizeof what, "experts down (%s)", moe_qtype_name(want));
        note_fallback(j, what, want, td, c->n_ff_expert);
        struct moe_bundle_precision *d = &prec[p];
        memset(d, 0, sizeof *d);
        d->name = moe_qtype_name(want);
        d->n_parts = 3;
        uint64_t F = (uint64_t)c->n_ff_expert, H = (uint64_t)c->n_embd;
        d->parts[0] = (struct moe_bundle_part){(uint32_t)tg, F, H, moe_qtype_row_bytes(tg, (int64_t)H) * F, 0};
        d->parts[1] = (struct moe_bundle_part){(uint32_t)tg, F, H, moe_qtype_row_bytes(tg, (int64_t)H) * F, 0};
        d->parts[2] = (struct moe_bundle_part){(uint32_t)td, H, F, moe_qtype_row_bytes(td, (int64_t)F) * H, 0};
        if (c->expert_bias) { /* gpt-oss: the biases, gate | up | down, as one f32 row */
            d->n_parts = 4;
            d->parts[3] = (struct moe_bundle_part){MOE_QTYPE_F32, 1, 2 * F + H, 4 * (2 * F + H), 0};
        }
        enum moe_status st = moe_bundle_precision_layout(d);
        if (st) return st;
    }
    return moe_bundle_writer_set_expert_layout(j->w, (uint32_t)c->n_layer, (uint32_t)c->n_expert,
                                               (uint32_t)j->a->n_experts, prec);
}

/* ---- writing expert blobs on a second thread ---------------------------- */

/*
 * An expert blob is written (checksum, optional zstd, the write itself) by a
 * thread of its own while the pool quantizes the next blob into the other of
 * two buffers: blob_submit hands one over once the previous one is written,
 * so the buffer filled next is always free.
 */
struct blob_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct moe_bundle_writer *w;
    int zstd_level;
    int full, quit;           /* a blob is handed over and not yet written; the thread must end */
    uint32_t l, e, p;         /* the blob handed over */
    const char *buf, *pname;
    size_t n;
    enum moe_status st;       /* the first failure */
};

/* blob_main: the writer thread: write what is handed over until told to quit. */
static void *blob_main(void *arg) {
    struct blob_writer *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->full && !b->quit) pthread_cond_wait(&b->cv, &b->mu);
        if (!b->full) break;
        pthread_mutex_unlock(&b->mu);
        enum moe_status st = b->st ? b->st
                                   : moe_bundle_writer_add_expert(b->w, b->l, b->e, b->p, b->buf, b->n, b->zstd_level);
        if (st && !b->st) MOE_LOGE("quantize: layer %u expert %u (%s) failed", b->l, b->e, b->pname);
        pthread_mutex_lock(&b->mu);
        b->st = st;
        b->full = 0;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* blob_idle: wait until the handed-over blob is written; the first failure. */
static enum moe_status blob_idle(struct blob_writer *b) {
    pthread_mutex_lock(&b->mu);
    while (b->full) pthread_cond_wait(&b->cv, &b->mu);
    enum moe_status st = b->st;
    pthread_mutex_unlock(&b->mu);
    return st;
}

/* blob_submit: hand a filled blob over (after the previous one is written). */
static enum moe_status blob_submit(struct blob_writer *b, uint32_t l, uint32_t e, uint32_t p, const char *pname,
                                   const char *buf, size_t n) {
    enum moe_status st = blob_idle(b);
    if (st) return st;
    pthread_mutex_lock(&b->mu);
    b->l = l, b->e = e, b->p = p, b->pname = pname, b->buf = buf, b->n = n;
    b->full = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return MOE_OK;
}

/* blob_start / blob_finish: start the writer thread; wait for the last blob, stop and join it. */
static enum moe_status blob_start(struct blob_writer *b, struct moe_bundle_writer *w, int zstd_level) {
    memset(b, 0, sizeof *b);
    b->w = w;
    b->zstd_level = zstd_level;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (pthread_create(&b->thread, NULL, blob_main, b) == 0) return MOE_OK;
    MOE_LOGE("quantize: cannot start the writing thread");
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    return MOE_ERR_NOMEM;
}
static enum moe_status blob_finish(struct blob_writer *b) {
    enum moe_status st = blob_idle(b);
    pthread_mutex_lock(&b->mu);
    b->quit = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    return st;
}

/* fill_blob: one expert at precision p into blob (zeroed padding between parts). */
static enum moe_status fill_blob(struct job *j, const struct moe_bundle_precision *prec, const struct moe_ffn *f,
                                 char *blob) {
    const struct moe_weight *parts[3] = {&f->gate, &f->up, &f->down};
    enum moe_status st = MOE_OK;
    /* zeros where no part lies (the padding before, between and after the
     * parts); the parts themselves are written whole below */
    uint64_t at = 0;
    for (uint32_t k = 0; k < prec->n_parts; k++) {
        memset(blob + at, 0, (size_t)(prec->parts[k].offset - at));
        at = prec->parts[k].offset + prec->parts[k].nbytes;
    }
    memset(blob + at, 0, (size_t)(prec->raw_size - at));
    for (int k = 0; k < 3 && !st; k++)
        st = quantize_matrix(j->pool, j->bufs, parts[k], (enum moe_qtype)prec->parts[k].type_id,
                             blob + prec->parts[k].offset);
    if (!st && prec->n_parts > 3) {
        if (f->bias)
            memcpy(blob + prec->parts[3].offset, f->bias, prec->parts[3].nbytes);
        else
            st = MOE_ERR_INVALID; /* the config promises biases the model did not bind */
    }
    return st;
}

/* write_experts: each routed expert at each precision, one blob each,
 * quantized into one buffer while the other is written. */
static enum moe_status write_experts(struct job *j, const struct moe_bundle_precision *prec) {
    const struct moe_config *c = &j->m->cfg;
    uint64_t max_raw = 0;
    for (int p = 0; p < j->a->n_experts; p++)
        if (prec[p].raw_size > max_raw) max_raw = prec[p].raw_size;
    const size_t cap = max_raw ? (size_t)max_raw : 1;
    char *blobs[2] = {NULL, NULL};
    struct blob_writer bw;
    enum moe_status st = MOE_OK;
    for (int l = 0; l < c->n_layer && !st; l++) /* before the writer thread runs */
        if (!c->layer_moe[l]) st = moe_bundle_writer_set_layer_has_experts(j->w, (uint32_t)l, false);
    if (st) return st;
    /* page-aligned buffers: the bundle writer sends them to the disk without a copy */
    if (posix_memalign((void **)&blobs[0], 4096, cap) != 0 || posix_memalign((void **)&blobs[1], 4096, cap) != 0) {
        free(blobs[0]);
        return MOE_ERR_NOMEM;
    }
    if ((st = blob_start(&bw, j->w, j->a->zstd_level))) goto done;
    int cur = 0;
    for (int l = 0; l < c->n_layer && !st; l++) {
        if (!c->layer_moe[l]) continue;
        for (int e = 0; e < c->n_expert && !st; e++) {
            struct moe_ffn ffn;
            if ((st = job_stop(j)) || (st = moe_model_expert(j->m, l, e, -1, &ffn))) break;
            const struct moe_ffn *f = &ffn;
            const struct moe_weight *parts[3] = {&f->gate, &f->up, &f->down};
            const uint64_t in_bytes = weight_bytes(parts[0]) + weight_bytes(parts[1]) + weight_bytes(parts[2]);
            for (int p = 0; p < j->a->n_experts && !st; p++) {
                st = fill_blob(j, &prec[p], f, blobs[cur]);
                if (st) MOE_LOGE("quantize: layer %d expert %d (%s) failed", l, e, prec[p].name);
                if (!st)
                    st = blob_submit(&bw, (uint32_t)l, (uint32_t)e, (uint32_t)p, prec[p].name, blobs[cur],
                                     prec[p].raw_size);
                cur ^= 1;
                progress_add(j, in_bytes);
            }
            for (int k = 0; k < 3; k++) release(parts[k]->data, weight_bytes(parts[k]));
            consumed_add(j, in_bytes);
        }
    }
    enum moe_status st2 = blob_finish(&bw);
    if (!st) st = st2;
done:
    free(blobs[0]);
    free(blobs[1]);
    return st;
}

/* input_bytes: bytes of the checkpoint's weights that are read (each once);
 * with expert_passes = number of precisions, the work the progress bar counts. */
static uint64_t input_bytes(const struct job *j, int expert_passes) {
    const struct moe_config *c = &j->m->cfg;
    uint64_t t = 0;
    for (int i = 0; i < j->m->n_refs; i++) t += weight_bytes(&j->m->refs[i].w);
    for (int l = 0; l < c->n_layer; l++)
        for (int e = 0; c->layer_moe[l] && e < c->n_expert; e++) {
            struct moe_ffn ffn;
            if (moe_model_expert(j->m, l, e, -1, &ffn)) continue;
            const struct moe_ffn *f = &ffn;
            t += (uint64_t)expert_passes * (weight_bytes(&f->gate) + weight_bytes(&f->up) + weight_bytes(&f->down));
        }
    return t;
}


/* check_params: the parameters a call can work with (logged if not). */
static int check_params(const struct moe_quantize_params *p) {
    if (p->n_experts < 1 || p->n_experts > MAX_PRECISIONS) {
        MOE_LOGE("quantize: 1 to %d expert precisions, not %d", MAX_PRECISIONS, p->n_experts);
        return 0;
    }
    for (int i = 0; i < p->n_experts; i++)
        for (int k = 0; k < i; k++)
            if (p->experts[k] == p->experts[i]) {
                MOE_LOGE("quantize: expert precision %s is listed twice", moe_qtype_name(p->experts[i]));
                return 0;
            }
    if (p->zstd_level < 0 || p->zstd_level > 22 || p->n_threads < 0 || p->n_threads > 1024) {
        MOE_LOGE("quantize: zstd level must be 0..22 and threads 0..1024");
        return 0;
    }
    return 1;
}

/* job_open: load the model, check the output path, make the thread pool and
 * the row buffers. On failure *refused tells a caller's mistake apart. */
static enum moe_status job_open(struct job *j, const char *in, const char *out, int *refused) {
    if (moe_output_check(out, 0)) { /* a bundle needs a regular file in a writable directory */
        *refused = 1;
        return MOE_ERR_INVALID;
    }
    enum moe_status st = moe_model_load_source(in, &j->m);
    if (st) {
        MOE_LOGE("quantize: cannot load %s", in);
        return st;
    }
    if (moe_model_check_output(j->m, out)) {
        *refused = 1; /* -o naming a shard or config.json */
        return MOE_ERR_INVALID;
    }
    if ((st = moe_pool_create(j->a->n_threads, &j->pool))) return st;
    const struct moe_config *c = &j->m->cfg;
    int64_t max_in = c->n_embd > c->n_ff_expert ? c->n_embd : c->n_ff_expert;
    for (int i = 0; i < j->m->n_refs; i++)
        if (j->m->refs[i].w.n_in > max_in) max_in = j->m->refs[i].w.n_in;
    j->bufs = malloc(sizeof(float) * (size_t)max_in * (size_t)moe_pool_n_threads(j->pool));
    return j->bufs ? MOE_OK : MOE_ERR_NOMEM;
}

/* write_bundle: metadata, layout, dense tensors, experts and the recipe; the
 * writer is finished (renamed into place) only when all of it succeeded. */
static enum moe_status write_bundle(struct job *j, const char *in, struct moe_bundle_precision *prec) {
    const struct moe_config *c = &j->m->cfg;
    const struct moe_quantize_params *a = j->a;
    enum moe_status st;
    /* metadata: what the runtime needs to rebuild the model, recipe, provenance */
    if ((st = write_source_texts(j->w, j->m, in))) return st;
    if ((st = moe_bundle_writer_set_meta_str(j->w, "general.architecture", c->arch_name))) return st;
    if ((st = expert_layout(j, prec))) return st;
    j->total = input_bytes(j, a->n_experts);
    if ((st = hasher_start(&j->hs, j->m, a->cancel))) return st;
    if (!(st = write_dense(j))) st = write_experts(j, prec);
    const enum moe_status hst = hasher_finish(&j->hs, st != MOE_OK);
    if (!st && hst) st = hst;
    if (st) return st;
    if ((st = write_provenance(j->w, j->m, a, j->hs.hash))) return st;
    const char *names[MAX_PRECISIONS];
    for (int p = 0; p < a->n_experts; p++) names[p] = moe_qtype_name(a->experts[p]);
    if ((st = moe_bundle_writer_set_meta_str_array(j->w, "quant.experts", names, (size_t)a->n_experts)) ||
        (st = moe_bundle_writer_set_meta_str(j->w, "quant.dense", moe_qtype_name(a->dense))) ||
        (st = moe_bundle_writer_set_meta_i64(j->w, "quant.zstd_level", a->zstd_level)) ||
        (st = moe_bundle_writer_set_meta_str_array(j->w, "quant.fallbacks", j->fallbacks, (size_t)j->n_fallbacks)))
        return st;
    if (cancelled(a->cancel)) return MOE_ERR_CANCELLED;
    return moe_bundle_writer_finish(j->w);
}

/* fill_result: what the caller reports of a finished bundle. */
static void fill_result(const struct job *j, const char *out, const struct moe_bundle_precision *prec,
                        struct moe_quantize_result *r) {
    const struct moe_config *c = &j->m->cfg;
    struct stat sb;
    r->input_bytes = input_bytes(j, 1);
    r->file_bytes = stat(out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    r->n_fallbacks = j->n_fallbacks;
    r->n_experts = j->a->n_experts;
    for (int p = 0; p < j->a->n_experts; p++) {
        r->bits_per_weight[p] = 8.0 * (double)(prec[p].parts[0].nbytes + prec[p].parts[1].nbytes +
                                               prec[p].parts[2].nbytes) /
                                (3.0 * (double)c->n_embd * (double)c->n_ff_expert);
        r->layer_bytes[p] = prec[p].raw_size * (uint64_t)c->n_expert;
    }
}

enum moe_status moe_quantize_model(const char *in, const char *out, const struct moe_quantize_params *params,
                                   struct moe_quantize_result *result) {
    struct moe_quantize_result local;
    struct moe_quantize_result *r = result ? result : &local;
    memset(r, 0, sizeof *r);
    const double t0 = moe_now_s();
    if (!in || !out || !params || !check_params(params)) {
        r->refused = 1;
        return MOE_ERR_INVALID;
    }
    struct job *j = calloc(1, sizeof *j); /* ~80 KB of fallback notes: not on the stack */
    if (!j) return MOE_ERR_NOMEM;
    j->a = params;
    struct moe_bundle_precision prec[MAX_PRECISIONS];
    enum moe_status st = job_open(j, in, out, &r->refused);
    if (!st && cancelled(params->cancel)) st = MOE_ERR_CANCELLED;
    if (!st) st = moe_bundle_writer_open(out, &j->w);
    if (!st) st = write_bundle(j, in, prec);
    if (!st) {
        fill_result(j, out, prec, r);
        r->seconds = moe_now_s() - t0;
    }
    moe_bundle_writer_free(j->w); /* unlinks the temporary file unless finished */
    free(j->bufs);
    free(j->hs.hash);
    moe_pool_free(j->pool);
    moe_model_free(j->m);
    free(j);
    return st;
}
