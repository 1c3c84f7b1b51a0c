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
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "moe-bundle.h"
#include "moe-mmap.h"
#include "moe-model.h"
#include "moe-prep.h"
#include "moe-quant.h"
#include "moe-safetensors.h"
#include "moe-threadpool.h"

#define MAX_PRECISIONS 8

static void usage(FILE *f) {
    fprintf(f,
"usage: moe-prep quantize MODEL_DIR -o OUT.moeb [options]\n"
"\n"
"Pack a Hugging Face MoE checkpoint into a bundle: every routed expert stored at\n"
"each requested precision side by side (one contiguous, checksummed blob per\n"
"expert and precision), every other weight stored once.\n"
"\n"
"  -o, --output PATH       the bundle to write (replaced atomically when done)\n"
"      --experts LIST      expert precisions, comma-separated (default q8_0,q4_k,q2_k)\n"
"      --dense TYPE        type of non-expert matrices (default q8_0); norms,\n"
"                          biases and routers always stay float32\n"
"      --compress[=LEVEL]  zstd-compress expert blobs (default level 3) where it\n"
"                          saves at least 3 %% of the bytes\n"
"  -t, --threads N         quantization threads (default: all CPUs)\n"
"  -h, --help              this help\n"
"\n"
"types: f32 f16 bf16 q8_0 q4_0 q4_k q3_k q2_k (also q5_k q6_k mxfp4). A matrix whose\n"
"rows do not fit a type's block size falls back as llama.cpp does (k-quants ->\n"
"q4_0 / q8_0, then f16); fallbacks are printed and recorded in the bundle. A\n"
"matrix already stored in the requested type (gpt-oss's mxfp4 experts) is copied.\n"
"\n"
"memory: the checkpoint is read through mmap and each tensor's pages are released\n"
"after use; resident memory stays below about: the largest non-expert matrix at\n"
"the dense type + one expert blob at each precision + THREADS x (row of floats),\n"
"plus the model's norm vectors - independent of the number of layers and experts.\n"
"\n"
"examples:\n"
"  moe-prep quantize ./Mixtral-8x7B-v0.1 -o mixtral.moeb\n"
"  moe-prep quantize ./OLMoE-1B-7B-0924 -o olmoe.moeb --experts q8_0,q4_k,q2_k --dense q8_0 -t 8\n"
"  moe-prep quantize tests/fixtures/models/mixtral-f32 -o /tmp/m.moeb --experts f32 --dense f32\n");
}

struct qargs {
    const char *model, *out;
    enum moe_qtype experts[MAX_PRECISIONS];
    int n_experts;
    enum moe_qtype dense;
    int zstd_level, n_threads;
};

/* parse_types: "q8_0,q4_k" -> distinct types. */
static int parse_types(const char *list, enum moe_qtype *out, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        enum moe_qtype t;
        if (moe_qtype_from_name(tok, &t) != MOE_OK) return 0;
        for (int i = 0; i < *n; i++)
            if (out[i] == t) {
                fprintf(stderr, "moe-prep quantize: --experts lists %s twice\n", tok);
                return 0;
            }
        if (*n == MAX_PRECISIONS) {
            fprintf(stderr, "moe-prep quantize: at most %d expert precisions\n", MAX_PRECISIONS);
            return 0;
        }
        out[(*n)++] = t;
    }
    return *n > 0;
}

/* parse_args: 0 ok, 1 help shown, 2 usage error. */
static int parse_args(int argc, char **argv, struct qargs *a) {
    memset(a, 0, sizeof *a);
    a->dense = MOE_QTYPE_Q8_0;
    const char *experts = "q8_0,q4_k,q2_k";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 1;
        } else if ((!strcmp(o, "-o") || !strcmp(o, "--output")) && i + 1 < argc) {
            a->out = argv[++i];
        } else if (!strcmp(o, "--experts") && i + 1 < argc) {
            experts = argv[++i];
        } else if (!strcmp(o, "--dense") && i + 1 < argc) {
            if (moe_qtype_from_name(argv[++i], &a->dense) != MOE_OK) return 2;
        } else if (!strcmp(o, "--compress")) {
            a->zstd_level = 3;
        } else if (!strncmp(o, "--compress=", 11)) {
            char *end;
            long v = strtol(o + 11, &end, 10);
            if (*end || v < 1 || v > 22) {
                fprintf(stderr, "moe-prep quantize: --compress level must be 1..22\n");
                return 2;
            }
            a->zstd_level = (int)v;
        } else if ((!strcmp(o, "-t") || !strcmp(o, "--threads")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1024) {
                fprintf(stderr, "moe-prep quantize: --threads must be 1..1024\n");
                return 2;
            }
            a->n_threads = (int)v;
        } else if (o[0] == '-') {
            fprintf(stderr, "moe-prep quantize: unknown option or missing value: %s\n", o);
            return 2;
        } else if (!a->model) {
            a->model = o;
        } else {
            fprintf(stderr, "moe-prep quantize: unexpected argument \"%s\"\n", o);
            return 2;
        }
    }
    if (!a->model || !a->out) {
        fprintf(stderr, "moe-prep quantize: need MODEL_DIR and -o OUT.moeb (see --help)\n");
        return 2;
    }
    if (!parse_types(experts, a->experts, &a->n_experts)) {
        fprintf(stderr, "moe-prep quantize: bad --experts list \"%s\"\n", experts);
        return 2;
    }
    return 0;
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

/* ---- progress ----------------------------------------------------------- */

struct progress {
    double t0, last;
    uint64_t done, total;
    int tty, last_decile;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* progress_add: count source bytes processed; a line on a terminal (with ETA),
 * one line per 10 % otherwise. */
static void progress_add(struct progress *p, uint64_t bytes) {
    p->done += bytes;
    double t = now_s(), el = t - p->t0;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    double rate = el > 0 ? (double)p->done / el : 0;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    if (p->tty) {
        if (t - p->last < 0.2 && p->done < p->total) return;
        p->last = t;
        fprintf(stderr, "\rquantize: %5.1f%% %.2f/%.2f GB  %.0f MB/s  ETA %d:%02d   ", 100 * frac,
                (double)p->done / 1e9, (double)p->total / 1e9, rate / 1e6, (int)eta / 60, (int)eta % 60);
        if (p->done >= p->total) fputc('\n', stderr);
    } else if ((int)(frac * 10) > p->last_decile) {
        p->last_decile = (int)(frac * 10);
        fprintf(stderr, "quantize: %3.0f%% (%.2f GB of %.2f GB, %.0f MB/s)\n", 100 * frac, (double)p->done / 1e9,
                (double)p->total / 1e9, rate / 1e6);
    }
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
            fprintf(stderr, "moe-prep quantize: %s is missing\n", path);
            st = MOE_ERR_NOT_FOUND;
        }
    } else if (!(st = moe_read_file(path, 256u << 20, &text, &len))) {
        st = moe_bundle_writer_set_meta_str(w, key, text);
    }
    free(text);
    free(path);
    return st;
}

/* hash_file: XXH3-64 of a file, read in chunks (not mapped: memory stays flat). */
static enum moe_status hash_file(const char *path, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return MOE_ERR_IO;
    XXH3_state_t *s = XXH3_createState();
    char *buf = malloc(1 << 20);
    enum moe_status st = (s && buf) ? MOE_OK : MOE_ERR_NOMEM;
    if (!st) XXH3_64bits_reset(s);
    for (ssize_t n; !st && (n = read(fd, buf, 1 << 20)) != 0;) {
        if (n < 0) {
            if (errno == EINTR) continue;
            st = MOE_ERR_IO;
        } else {
            XXH3_64bits_update(s, buf, (size_t)n);
        }
    }
    if (!st) *out = XXH3_64bits_digest(s);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    free(buf);
    XXH3_freeState(s);
    return st;
}

/* write_provenance: source files and their hashes, tool, command line, time. */
static enum moe_status write_provenance(struct moe_bundle_writer *w, const struct moe_model *m, int argc,
                                        char **argv) {
    enum moe_status st;
    int nf = moe_safetensors_n_files(m->st);
    const char **names = calloc((size_t)nf, sizeof *names);
    char(*hex)[17] = calloc((size_t)nf, sizeof *hex);
    const char **hexp = calloc((size_t)nf, sizeof *hexp);
    if (!names || !hex || !hexp) {
        st = MOE_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        const char *p = moe_safetensors_file_path(m->st, i);
        uint64_t h = 0;
        if ((st = hash_file(p, &h))) {
            fprintf(stderr, "moe-prep quantize: cannot hash %s\n", p);
            goto done;
        }
        const char *slash = strrchr(p, '/');
        names[i] = slash ? slash + 1 : p;
        snprintf(hex[i], sizeof hex[i], "%016llx", (unsigned long long)h);
        hexp[i] = hex[i];
    }
    char cmd[8192] = "";
    for (int i = 0; i < argc; i++)
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s%s", i ? " " : "moe-prep ", argv[i]);
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    char *src = realpath(m->path, NULL);
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.source", src ? src : m->path))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str_array(w, "provenance.files", names, (size_t)nf))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str_array(w, "provenance.files_xxh3", hexp, (size_t)nf))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.tool", "moe-prep " MOE_VERSION))) goto done_src;
    if ((st = moe_bundle_writer_set_meta_str(w, "provenance.command_line", cmd))) goto done_src;
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
    const struct qargs *a;
    struct moe_model *m;
    struct moe_bundle_writer *w;
    struct moe_pool *pool;
    float *bufs;
    struct progress prog;
    const char *fallbacks[256];
    char fallback_text[256][320];
    int n_fallbacks;
};

/* note_fallback: remember (and print once) that a matrix could not use a type. */
static void note_fallback(struct job *j, const char *what, enum moe_qtype want, enum moe_qtype got, int64_t n) {
    if (want == got || j->n_fallbacks == 256) return;
    char *s = j->fallback_text[j->n_fallbacks];
    snprintf(s, 320, "%s: %s -> %s (rows of %lld)", what, moe_qtype_name(want), moe_qtype_name(got), (long long)n);
    j->fallbacks[j->n_fallbacks++] = s;
    fprintf(stderr, "moe-prep quantize: note: %s\n", s);
}

/* write_dense: every non-expert tensor, once. */
static enum moe_status write_dense(struct job *j) {
    enum moe_status st = MOE_OK;
    for (int i = 0; i < j->m->n_refs; i++) {
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
            fprintf(stderr, "moe-prep quantize: cannot write tensor %s\n", r->name);
            return st;
        }
        if (r->role != MOE_ROLE_VECTOR) release(r->w.data, weight_bytes(&r->w));
        progress_add(&j->prog, weight_bytes(&r->w));
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

/* write_experts: each routed expert at each precision, one blob each. */
static enum moe_status write_experts(struct job *j, const struct moe_bundle_precision *prec) {
    const struct moe_config *c = &j->m->cfg;
    uint64_t max_raw = 0;
    for (int p = 0; p < j->a->n_experts; p++)
        if (prec[p].raw_size > max_raw) max_raw = prec[p].raw_size;
    char *blob = malloc(max_raw ? max_raw : 1);
    if (!blob) return MOE_ERR_NOMEM;
    enum moe_status st = MOE_OK;
    for (int l = 0; l < c->n_layer && !st; l++) {
        if (!c->layer_moe[l]) {
            st = moe_bundle_writer_set_layer_has_experts(j->w, (uint32_t)l, false);
            continue;
        }
        for (int e = 0; e < c->n_expert && !st; e++) {
            struct moe_ffn ffn;
            if ((st = moe_model_expert(j->m, l, e, -1, &ffn))) break;
            const struct moe_ffn *f = &ffn;
            const struct moe_weight *parts[3] = {&f->gate, &f->up, &f->down};
            for (int p = 0; p < j->a->n_experts && !st; p++) {
                memset(blob, 0, prec[p].raw_size); /* padding between parts */
                for (int k = 0; k < 3 && !st; k++)
                    st = quantize_matrix(j->pool, j->bufs, parts[k], (enum moe_qtype)prec[p].parts[k].type_id,
                                         blob + prec[p].parts[k].offset);
                if (!st && prec[p].n_parts > 3) {
                    if (f->bias)
                        memcpy(blob + prec[p].parts[3].offset, f->bias, prec[p].parts[3].nbytes);
                    else
                        st = MOE_ERR_INVALID; /* the config promises biases the model did not bind */
                }
                if (!st)
                    st = moe_bundle_writer_add_expert(j->w, (uint32_t)l, (uint32_t)e, (uint32_t)p, blob,
                                                      prec[p].raw_size, j->a->zstd_level);
                if (st) fprintf(stderr, "moe-prep quantize: layer %d expert %d (%s) failed\n", l, e, prec[p].name);
                progress_add(&j->prog, weight_bytes(parts[0]) + weight_bytes(parts[1]) + weight_bytes(parts[2]));
            }
            for (int k = 0; k < 3; k++) release(parts[k]->data, weight_bytes(parts[k]));
        }
    }
    free(blob);
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

static volatile sig_atomic_t g_interrupted;
static char g_tmp_path[4200];

/* on_signal: an interrupted run leaves nothing: remove the temporary file. */
static void on_signal(int sig) {
    if (g_tmp_path[0]) unlink(g_tmp_path);
    g_interrupted = 1;
    signal(sig, SIG_DFL);
    raise(sig);
}

int moe_prep_quantize(int argc, char **argv) {
    struct qargs a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    moe_log_set_level(MOE_LOG_WARN);
    struct job j;
    memset(&j, 0, sizeof j);
    j.a = &a;
    enum moe_status st;
    double t0 = now_s();
    if ((st = moe_model_load_hf(a.model, &j.m))) {
        fprintf(stderr, "moe-prep quantize: cannot load %s\n", a.model);
        return 1;
    }
    const struct moe_config *c = &j.m->cfg;
    if ((st = moe_pool_create(a.n_threads, &j.pool))) goto fail;
    int64_t max_in = c->n_embd > c->n_ff_expert ? c->n_embd : c->n_ff_expert;
    for (int i = 0; i < j.m->n_refs; i++)
        if (j.m->refs[i].w.n_in > max_in) max_in = j.m->refs[i].w.n_in;
    j.bufs = malloc(sizeof(float) * (size_t)max_in * (size_t)moe_pool_n_threads(j.pool));
    if (!j.bufs) {
        st = MOE_ERR_NOMEM;
        goto fail;
    }
    if ((st = moe_bundle_writer_open(a.out, &j.w))) goto fail;
    snprintf(g_tmp_path, sizeof g_tmp_path, "%s.tmp.%ld", a.out, (long)getpid());
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    /* metadata: what the runtime needs to rebuild the model, recipe, provenance */
    if ((st = meta_file_text(j.w, a.model, "config.json", "hf.config.json", 1))) goto fail;
    if ((st = meta_file_text(j.w, a.model, "generation_config.json", "hf.generation_config.json", 0))) goto fail;
    if ((st = meta_file_text(j.w, a.model, "tokenizer.json", "hf.tokenizer.json", 0))) goto fail;
    if ((st = meta_file_text(j.w, a.model, "tokenizer_config.json", "hf.tokenizer_config.json", 0))) goto fail;
    if ((st = moe_bundle_writer_set_meta_str(j.w, "general.architecture", c->arch_name))) goto fail;
    if ((st = write_provenance(j.w, j.m, argc, argv))) goto fail;

    struct moe_bundle_precision prec[MAX_PRECISIONS];
    if ((st = expert_layout(&j, prec))) goto fail;
    j.prog = (struct progress){now_s(), 0, 0, input_bytes(&j, a.n_experts), isatty(2), 0};
    if ((st = write_dense(&j))) goto fail;
    if ((st = write_experts(&j, prec))) goto fail;

    const char *names[MAX_PRECISIONS];
    for (int p = 0; p < a.n_experts; p++) names[p] = moe_qtype_name(a.experts[p]);
    if ((st = moe_bundle_writer_set_meta_str_array(j.w, "quant.experts", names, (size_t)a.n_experts))) goto fail;
    if ((st = moe_bundle_writer_set_meta_str(j.w, "quant.dense", moe_qtype_name(a.dense)))) goto fail;
    if ((st = moe_bundle_writer_set_meta_i64(j.w, "quant.zstd_level", a.zstd_level))) goto fail;
    if ((st = moe_bundle_writer_set_meta_str_array(j.w, "quant.fallbacks", j.fallbacks, (size_t)j.n_fallbacks)))
        goto fail;
    if ((st = moe_bundle_writer_finish(j.w))) goto fail;
    moe_bundle_writer_free(j.w);
    j.w = NULL;
    g_tmp_path[0] = 0;

    double el = now_s() - t0;
    struct stat sb;
    stat(a.out, &sb);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "moe-prep quantize: wrote %s: %.1f MB in %.2f s (%.0f MB/s of input), peak RSS %.0f MB\n", a.out,
            (double)sb.st_size / 1e6, el, el > 0 ? (double)input_bytes(&j, 1) / el / 1e6 : 0,
            (double)ru.ru_maxrss / 1024.0);
    for (int p = 0; p < a.n_experts; p++)
        fprintf(stderr, "  experts %-5s %6.3f bits/weight, %.1f MB per layer\n", names[p],
                8.0 * (double)(prec[p].parts[0].nbytes + prec[p].parts[1].nbytes + prec[p].parts[2].nbytes) /
                    (3.0 * (double)c->n_embd * (double)c->n_ff_expert),
                (double)prec[p].raw_size * c->n_expert / 1e6);
    free(j.bufs);
    moe_pool_free(j.pool);
    moe_model_free(j.m);
    return 0;
fail:
    fprintf(stderr, "moe-prep quantize: failed (%s); nothing written to %s\n", moe_status_str(st), a.out);
    moe_bundle_writer_abort(j.w);
    free(j.bufs);
    moe_pool_free(j.pool);
    moe_model_free(j.m);
    return 1;
}
