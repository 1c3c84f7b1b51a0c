/*
 * inflate-moe - widen every routed expert of a Mixtral- or Qwen-named
 * checkpoint with zeros, so that expert bytes grow while the model computes
 * the same function.
 *
 *   inflate-moe IN_DIR OUT_DIR --ffn N
 *
 * Each expert's gate and up matrices (w1, w3 or gate_proj, up_proj: [F x H])
 * get N - F zero rows and its down matrix (w2 or down_proj: [H x F]) N - F
 * zero columns. The extra hidden units see
 * gate = up = 0, so silu(0) * 0 = 0 enters the zero columns of down: routing,
 * hidden states and logits stay those of the original model, while every
 * expert holds N/F times the bytes. Used to benchmark expert offloading with a
 * trained model's real routing locality (tests/bench/bench-offload.sh) and by
 * test-inflate, which checks the "same logits" claim through moe-run.
 *
 * Every other tensor is copied unchanged in its dtype and order; config.json is
 * rewritten with the routed experts' width = N (moe_intermediate_size when
 * config.json has it, as Qwen-MoE and DeepSeek, else intermediate_size; other
 * fields parsed and printed again by cJSON, same values); tokenizer.json,
 * tokenizer_config.json, generation_config.json and special_tokens_map.json
 * are copied when present. Output files are written to a temporary name in
 * OUT_DIR and renamed when complete. Two namings of per-expert tensors are
 * handled: Mixtral / Phi-MoE (model.layers.L.block_sparse_moe.experts.E.
 * w{1,2,3}.weight) and Qwen-MoE / OLMoE / DeepSeek (model.layers.L.mlp.
 * experts.E.{gate,up,down}_proj.weight; shared experts are not routed and stay
 * as they are); a checkpoint with other expert names (the fused gate_up_proj
 * layout) is refused with a message.
 *
 * Exit: 0 ok, 1 failure (bad input, I/O), 2 usage error.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe-file.h"
#include "moe-mmap.h"
#include "moe-safetensors.h"

#define INFLATE_MAX_CONFIG (16u << 20)

/* What an inflated tensor becomes: copied, rows appended, or columns appended. */
enum pad_kind { PAD_NONE = 0, PAD_ROWS, PAD_COLS };

static void usage(FILE *f) {
    fprintf(f,
            "usage: inflate-moe IN_DIR OUT_DIR --ffn N\n"
            "\n"
            "Widens every routed expert's FFN from F to N hidden units with zeros:\n"
            "gate/up ([F x H]) get zero rows, down ([H x F]) zero columns.\n"
            "The model's routing and logits stay the same; expert bytes grow N/F times.\n"
            "Writes OUT_DIR/model.safetensors (other tensors unchanged, same dtypes),\n"
            "config.json with moe_intermediate_size (when present, as Qwen-MoE) or else\n"
            "intermediate_size = N, and copies the tokenizer and generation files. Files\n"
            "are written to temporary names and renamed.\n"
            "\n"
            "Expert names handled: model.layers.L.block_sparse_moe.experts.E.w1|w2|w3.weight\n"
            "(Mixtral, Phi-MoE) and model.layers.L.mlp.experts.E.gate_proj|up_proj|down_proj.weight\n"
            "(Qwen-MoE, OLMoE, DeepSeek); the fused gate_up_proj layout is refused.\n"
            "\n"
            "options:\n"
            "  --ffn N     new expert FFN width (N >= the model's intermediate_size)\n"
            "  -h, --help  this text\n"
            "\n"
            "example:\n"
            "  inflate-moe datasets/models/tiny-moe-mixtral /tmp/moe-inflated --ffn 8192\n");
}

/* parse_expert_name: 1 and the matrix number in Mixtral's terms (1 gate,
 * 2 down, 3 up) when `name` is a routed-expert weight of either naming, else 0. */
static int parse_expert_name(const char *name, int *which) {
    int l, e, w, end = -1;
    if (sscanf(name, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight%n", &l, &e, &w, &end) == 3 && end >= 0 &&
        name[end] == 0 && l >= 0 && e >= 0 && w >= 1 && w <= 3) {
        *which = w;
        return 1;
    }
    static const char *const proj[3] = {"gate_proj.weight", "down_proj.weight", "up_proj.weight"};
    end = -1;
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%n", &l, &e, &end) != 2 || end < 0 || l < 0 || e < 0) return 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(name + end, proj[i])) {
            *which = i + 1;
            return 1;
        }
    return 0;
}

/* looks_like_other_expert: a tensor of routed experts under a naming this tool
 * does not handle (Qwen/OLMoE/DeepSeek *_proj, the fused layout). */
static int looks_like_other_expert(const char *name) {
    return strstr(name, ".experts.") != NULL || strstr(name, ".experts_") != NULL;
}

/* config_int: a non-negative integer field of config.json, or -1. */
static long long config_int(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e15 ||
        v->valuedouble != (double)(long long)v->valuedouble)
        return -1;
    return (long long)v->valuedouble;
}

/* write_all: fwrite that reports failure. */
static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }

/* write_zeros: n zero bytes. */
static int write_zeros(FILE *f, size_t n) {
    static const unsigned char zero[65536];
    while (n > 0) {
        size_t k = n < sizeof zero ? n : sizeof zero;
        if (write_all(f, zero, k)) return -1;
        n -= k;
    }
    return 0;
}

/* tmp_path: "dir/name.tmp.PID" (malloc'd). */
static char *tmp_path(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 40);
    if (p) sprintf(p, "%s/%s.tmp.%ld", dir, name, (long)getpid());
    return p;
}

/* create_tmp: a new temporary file (O_EXCL | O_NOFOLLOW: a file or symlink
 * already at the name is never reused or followed) as a stream. */
static FILE *create_tmp(const char *tmp) {
    int fd = tmp ? open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f) {
        close(fd);
        unlink(tmp);
    }
    return f;
}

/* finish_file: flush, sync and close f, then rename tmp over dir/name; on any
 * failure (or when `failed`) the temporary file is removed. Returns 0 on success. */
static int finish_file(FILE *f, const char *tmp, const char *dir, const char *name, int failed) {
    if (!failed && (fflush(f) != 0 || fsync(fileno(f)) != 0)) failed = 1;
    if (fclose(f) != 0) failed = 1;
    char *dst = moe_path_join(dir, name);
    if (!failed && (!dst || rename(tmp, dst) != 0)) {
        fprintf(stderr, "inflate-moe: rename %s -> %s: %s\n", tmp, dst ? dst : name, strerror(errno));
        failed = 1;
    }
    if (failed) unlink(tmp);
    free(dst);
    return failed ? -1 : 0;
}

/* write_bytes_file: write `len` bytes to dir/name atomically. */
static int write_bytes_file(const char *dir, const char *name, const void *data, size_t len) {
    char *tmp = tmp_path(dir, name);
    FILE *f = create_tmp(tmp);
    if (!f) {
        fprintf(stderr, "inflate-moe: cannot create %s: %s\n", tmp ? tmp : name, strerror(errno));
        free(tmp);
        return -1;
    }
    int bad = write_all(f, data, len);
    if (bad) fprintf(stderr, "inflate-moe: write %s: %s\n", tmp, strerror(errno));
    bad = finish_file(f, tmp, dir, name, bad);
    free(tmp);
    return bad;
}

/* copy_side_file: copy in_dir/name to out_dir/name if it exists. Returns 0 when
 * copied or absent (absent: *copied = 0), -1 on error. */
static int copy_side_file(const char *in_dir, const char *out_dir, const char *name, int *copied) {
    char *src = moe_path_join(in_dir, name), *text = NULL;
    size_t len = 0;
    struct stat sb;
    *copied = 0;
    if (!src) return -1;
    if (stat(src, &sb) != 0) {
        free(src);
        return 0;
    }
    int rc = moe_read_file(src, 1u << 30, &text, &len) == MOE_OK ? write_bytes_file(out_dir, name, text, len) : -1;
    *copied = rc == 0;
    free(text);
    free(src);
    return rc;
}

/* write_config: config.json with the experts' width (`key`) replaced by n_ffn. */
static int write_config(cJSON *cfg, const char *key, const char *out_dir, long long n_ffn) {
    cJSON *num = cJSON_CreateNumber((double)n_ffn);
    if (!num || !cJSON_ReplaceItemInObjectCaseSensitive(cfg, key, num)) {
        cJSON_Delete(num);
        return -1;
    }
    char *text = cJSON_Print(cfg);
    if (!text) return -1;
    size_t len = strlen(text);
    char *with_nl = malloc(len + 2);
    int rc = -1;
    if (with_nl) {
        memcpy(with_nl, text, len);
        with_nl[len] = '\n';
        rc = write_bytes_file(out_dir, "config.json", with_nl, len + 1);
    }
    free(with_nl);
    cJSON_free(text);
    return rc;
}

/* read_metadata: the "__metadata__" object of a safetensors file's header (a
 * copy the caller deletes), or NULL when it has none or cannot be read. */
static cJSON *read_metadata(const char *path) {
    FILE *f = NULL;
    unsigned char n8[8];
    cJSON *meta = NULL;
    if (moe_file_fopen_read(path, &f)) return NULL; /* regular files only, never blocks */
    if (fread(n8, 1, 8, f) == 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | n8[i];
        char *hdr = n <= MOE_ST_MAX_HEADER ? malloc((size_t)n + 1) : NULL;
        if (hdr && fread(hdr, 1, (size_t)n, f) == n) {
            hdr[n] = 0;
            cJSON *root = cJSON_Parse(hdr);
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
            if (cJSON_IsObject(m)) meta = cJSON_Duplicate(m, 1);
            cJSON_Delete(root);
        }
        free(hdr);
    }
    fclose(f);
    return meta;
}

/* plan: each tensor's padding and output shape; checks the expert shapes
 * against F and H. Returns 0, or -1 after printing what is wrong. */
static int plan(const struct moe_safetensors *st, long long F, long long H, enum pad_kind *kind, int *n_experts) {
    size_t n = moe_safetensors_count(st);
    *n_experts = 0;
    for (size_t i = 0; i < n; i++) {
        const struct moe_st_tensor *t = moe_safetensors_at(st, i);
        int w;
        kind[i] = PAD_NONE;
        if (!parse_expert_name(t->name, &w)) {
            if (looks_like_other_expert(t->name)) {
                fprintf(stderr,
                        "inflate-moe: tensor '%s' is a routed expert under a naming this tool does not handle; "
                        "only per-expert model.layers.L.block_sparse_moe.experts.E.w1|w2|w3.weight and "
                        "model.layers.L.mlp.experts.E.gate_proj|up_proj|down_proj.weight are supported\n",
                        t->name);
                return -1;
            }
            continue;
        }
        long long r = w == 2 ? H : F, c = w == 2 ? F : H;
        if (t->n_dims != 2 || t->shape[0] != r || t->shape[1] != c) {
            fprintf(stderr, "inflate-moe: %s has shape [%lld x %lld], expected [%lld x %lld] (F = %lld, H = %lld)\n",
                    t->name, t->n_dims > 0 ? (long long)t->shape[0] : 0LL,
                    t->n_dims > 1 ? (long long)t->shape[1] : 0LL, r, c, F, H);
            return -1;
        }
        kind[i] = w == 2 ? PAD_COLS : PAD_ROWS;
        *n_experts += w == 1;
    }
    if (*n_experts == 0) {
        fprintf(stderr, "inflate-moe: no routed expert tensors (model.layers.L.block_sparse_moe.experts.E.w1.weight "
                        "or model.layers.L.mlp.experts.E.gate_proj.weight) found\n");
        return -1;
    }
    return 0;
}

/* build_header: the output's JSON header (padded with spaces to a multiple of
 * 8 bytes) with each tensor's new shape and offsets. *len gets its length,
 * *data_bytes the size of the data section. */
static char *build_header(const struct moe_safetensors *st, const enum pad_kind *kind, long long N, cJSON *meta,
                          size_t *len, uint64_t *data_bytes) {
    cJSON *root = cJSON_CreateObject();
    uint64_t off = 0;
    if (!root) return NULL;
    if (meta) cJSON_AddItemToObject(root, "__metadata__", cJSON_Duplicate(meta, 1));
    for (size_t i = 0; i < moe_safetensors_count(st); i++) {
        const struct moe_st_tensor *t = moe_safetensors_at(st, i);
        int64_t shape[MOE_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (kind[i] == PAD_ROWS) shape[0] = N;
        if (kind[i] == PAD_COLS) shape[1] = N;
        uint64_t nb = moe_dtype_size(t->dtype);
        cJSON *e = cJSON_AddObjectToObject(root, t->name), *s = cJSON_CreateArray(), *o = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "dtype", moe_dtype_name(t->dtype));
        for (int d = 0; d < t->n_dims; d++) {
            cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[d]));
            nb *= (uint64_t)shape[d];
        }
        cJSON_AddItemToObject(e, "shape", s);
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + nb)));
        cJSON_AddItemToObject(e, "data_offsets", o);
        off += nb;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return NULL;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *hdr = malloc(padded + 1);
    if (hdr) {
        memcpy(hdr, text, n);
        memset(hdr + n, ' ', padded - n);
        hdr[padded] = 0;
        *len = padded;
        *data_bytes = off;
    }
    cJSON_free(text);
    return hdr;
}

/* write_tensor: one tensor's data, padded as its kind says (rows: zero bytes
 * after the data; columns: zeros after every row). */
static int write_tensor(FILE *f, const struct moe_st_tensor *t, enum pad_kind kind, long long N) {
    const size_t es = moe_dtype_size(t->dtype);
    if (kind == PAD_NONE) return write_all(f, t->data, t->nbytes);
    if (kind == PAD_ROWS)
        return write_all(f, t->data, t->nbytes) || write_zeros(f, (size_t)(N - t->shape[0]) * (size_t)t->shape[1] * es);
    const size_t row = (size_t)t->shape[1] * es, pad = (size_t)(N - t->shape[1]) * es;
    for (int64_t r = 0; r < t->shape[0]; r++)
        if (write_all(f, (const char *)t->data + (size_t)r * row, row) || write_zeros(f, pad)) return -1;
    return 0;
}

/* write_model: OUT_DIR/model.safetensors, atomically; *out_bytes gets the
 * size of its data section. */
static int write_model(const struct moe_safetensors *st, const enum pad_kind *kind, long long N, cJSON *meta,
                       const char *out_dir, uint64_t *out_bytes) {
    size_t hlen = 0;
    uint64_t data_bytes = 0;
    char *hdr = build_header(st, kind, N, meta, &hlen, &data_bytes);
    char *tmp = hdr ? tmp_path(out_dir, "model.safetensors") : NULL;
    FILE *f = create_tmp(tmp);
    if (!f) {
        fprintf(stderr, "inflate-moe: cannot create %s: %s\n", tmp ? tmp : "the header", strerror(errno));
        free(hdr);
        free(tmp);
        return -1;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int bad = write_all(f, n8, 8) || write_all(f, hdr, hlen);
    for (size_t i = 0; !bad && i < moe_safetensors_count(st); i++)
        bad = write_tensor(f, moe_safetensors_at(st, i), kind[i], N);
    if (bad) fprintf(stderr, "inflate-moe: write %s: %s\n", tmp, strerror(errno));
    bad = finish_file(f, tmp, out_dir, "model.safetensors", bad);
    *out_bytes = data_bytes;
    free(hdr);
    free(tmp);
    return bad;
}

/* same_dir: 1 if both paths name the same existing directory. */
static int same_dir(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int main(int argc, char **argv) {
    const char *in_dir = NULL, *out_dir = NULL;
    long long N = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--ffn") && i + 1 < argc) {
            char *end;
            errno = 0;
            N = strtoll(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || N <= 0 || N > (1LL << 30)) {
                fprintf(stderr, "inflate-moe: --ffn needs a positive integer, got '%s'\n", argv[i]);
                return 2;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "inflate-moe: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!in_dir) {
            in_dir = argv[i];
        } else if (!out_dir) {
            out_dir = argv[i];
        } else {
            fprintf(stderr, "inflate-moe: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!in_dir || !out_dir || N < 0) {
        usage(stderr);
        return 2;
    }

    int rc = 1;
    struct moe_safetensors *st = NULL;
    char *cfg_path = moe_path_join(in_dir, "config.json"), *cfg_text = NULL, *index_path = NULL;
    cJSON *cfg = NULL, *meta = NULL;
    enum pad_kind *kind = NULL;
    size_t cfg_len;
    if (!cfg_path || moe_read_file(cfg_path, INFLATE_MAX_CONFIG, &cfg_text, &cfg_len) != MOE_OK) goto done;
    if (!(cfg = cJSON_Parse(cfg_text)) || !cJSON_IsObject(cfg)) {
        fprintf(stderr, "inflate-moe: %s is not a JSON object\n", cfg_path);
        goto done;
    }
    /* the routed experts' width: Qwen-MoE and DeepSeek keep it apart from the dense MLP's */
    const char *f_key = cJSON_GetObjectItemCaseSensitive(cfg, "moe_intermediate_size") ? "moe_intermediate_size"
                                                                                         : "intermediate_size";
    long long F = config_int(cfg, f_key), H = config_int(cfg, "hidden_size");
    if (F <= 0 || H <= 0) {
        fprintf(stderr, "inflate-moe: %s needs positive integer %s and hidden_size\n", cfg_path, f_key);
        goto done;
    }
    if (N < F) {
        fprintf(stderr, "inflate-moe: --ffn %lld is smaller than the model's %s %lld; "
                        "this tool only widens experts\n", N, f_key, F);
        goto done;
    }
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "inflate-moe: cannot create %s: %s\n", out_dir, strerror(errno));
        goto done;
    }
    if (same_dir(in_dir, out_dir)) {
        fprintf(stderr, "inflate-moe: OUT_DIR is IN_DIR; write the inflated model elsewhere\n");
        goto done;
    }
    index_path = moe_path_join(out_dir, "model.safetensors.index.json");
    if (index_path && access(index_path, F_OK) == 0) {
        fprintf(stderr, "inflate-moe: %s exists and would shadow the new model.safetensors; remove it first\n",
                index_path);
        goto done;
    }
    if (moe_safetensors_open(in_dir, &st) != MOE_OK) goto done;
    size_t n = moe_safetensors_count(st);
    int n_experts = 0, copied;
    if (!(kind = calloc(n ? n : 1, sizeof *kind)) || plan(st, F, H, kind, &n_experts)) goto done;
    meta = read_metadata(moe_safetensors_file_path(st, 0));

    uint64_t in_bytes = 0, in_expert = 0, out_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const struct moe_st_tensor *t = moe_safetensors_at(st, i);
        in_bytes += t->nbytes;
        if (kind[i] != PAD_NONE) in_expert += t->nbytes;
    }
    if (write_model(st, kind, N, meta, out_dir, &out_bytes) || write_config(cfg, f_key, out_dir, N)) goto done;
    static const char *const side[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                       "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof side / sizeof side[0]; i++) {
        if (copy_side_file(in_dir, out_dir, side[i], &copied)) goto done;
        if (!copied && i == 0) fprintf(stderr, "inflate-moe: warning: %s has no tokenizer.json\n", in_dir);
    }
    const uint64_t out_expert = in_expert / (uint64_t)F * (uint64_t)N;
    printf("inflate-moe: %d experts widened from F = %lld to %lld (x%.2f); expert bytes %.2f MB -> %.2f MB, "
           "tensor data %.2f MB -> %.2f MB; wrote %s\n",
           n_experts, F, N, (double)N / (double)F, in_expert / 1e6, out_expert / 1e6, in_bytes / 1e6,
           out_bytes / 1e6, out_dir);
    rc = 0;
done:
    cJSON_Delete(cfg);
    cJSON_Delete(meta);
    free(cfg_text);
    free(cfg_path);
    free(index_path);
    free(kind);
    moe_safetensors_free(st);
    return rc;
}
