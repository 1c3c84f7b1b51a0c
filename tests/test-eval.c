/*
 * test-eval.c - `moe-prep eval` end to end on the fixture models:
 *   - a model against itself gives KL 0, the same top token everywhere and
 *     identical perplexities; two different models give KL > 0;
 *   - the perplexity equals one computed here, independently, from logits of
 *     moe_session_forward (whole chunks in one call; BOS from config.json first
 *     in the stream and over each chunk's first token; NLL of positions
 *     ctx/2 .. ctx-2), with and without a BOS, with --max-chunks;
 *   - a reference with another vocabulary size, a dataset shorter than 2 x ctx,
 *     --ctx beyond the model's positions and a missing dataset exit 1 with a
 *     message saying so; usage errors exit 2; --help exits 0.
 * argv[1] is the moe-prep binary.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe-model.h"
#include "moe-session.h"
#include "moe-mmap.h"
#include "moe-test.h"
#include "moe-tokenizer.h"

#define CTX 32

static const char *moe_prep;
static char text_path[64], short_path[64], tiny_dir[64];
static char out[1 << 16];

/* run: execute a shell command, capture its output (stdout, plus stderr if the
 * command redirects it) into out; returns the exit code. */
static int run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* eval_json: run eval with --json and parse stdout; NULL (and a failed check) on error. */
static cJSON *eval_json(const char *model, const char *ref, const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval %s/models/%s%s%s --dataset %s --ctx %d -t 2 --json %s 2>/dev/null",
             moe_prep, MOE_FIXTURES, model, ref ? " --ref " MOE_FIXTURES "/models/" : "", ref ? ref : "",
             text_path, CTX, extra ? extra : "");
    int rc = run(cmd);
    CHECK(rc == 0, "%s: exit %d", cmd, rc);
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "%s: output is not JSON: %s", cmd, out);
    return j;
}

static double num(const cJSON *j, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItem(j, a);
    if (b) x = cJSON_GetObjectItem(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* write_text: a few KB of English-like words from a fixed generator. */
static void write_text(const char *path, int n_sentences) {
    static const char *const words[] = {"the", "river", "ran", "past", "old", "mill", "and", "a",
                                        "child", "watched", "boats", "drift", "slowly", "toward",
                                        "town", "where", "bells", "rang", "every", "evening", "of",
                                        "summer", "while", "birds", "sang", "in", "tall", "trees"};
    FILE *f = fopen(path, "w");
    unsigned x = 12345;
    for (int s = 0; s < n_sentences; s++) {
        int n = 5 + s % 9;
        for (int w = 0; w < n; w++) {
            x = x * 1103515245u + 12345u;
            fprintf(f, "%s%s", w ? " " : (s ? " " : ""), words[(x >> 16) % (sizeof words / sizeof *words)]);
        }
        fputc('.', f);
    }
    fputc('\n', f);
    fclose(f);
}

/* write_tiny_model: a one-layer Mixtral checkpoint with `vocab` tokens and no
 * tokenizer: F32 tensors, zero except the 1-D ones (norms = 1). */
static void write_tiny_model(const char *dir, int vocab) {
    static const struct {
        const char *name;
        int r, c;
    } t[] = {{"model.embed_tokens.weight", -1, 8}, {"lm_head.weight", -1, 8}, {"model.norm.weight", 8, 0},
             {"model.layers.0.input_layernorm.weight", 8, 0},
             {"model.layers.0.post_attention_layernorm.weight", 8, 0},
             {"model.layers.0.self_attn.q_proj.weight", 8, 8}, {"model.layers.0.self_attn.k_proj.weight", 4, 8},
             {"model.layers.0.self_attn.v_proj.weight", 4, 8}, {"model.layers.0.self_attn.o_proj.weight", 8, 8},
             {"model.layers.0.block_sparse_moe.gate.weight", 2, 8},
             {"model.layers.0.block_sparse_moe.experts.0.w1.weight", 4, 8},
             {"model.layers.0.block_sparse_moe.experts.0.w2.weight", 8, 4},
             {"model.layers.0.block_sparse_moe.experts.0.w3.weight", 4, 8},
             {"model.layers.0.block_sparse_moe.experts.1.w1.weight", 4, 8},
             {"model.layers.0.block_sparse_moe.experts.1.w2.weight", 8, 4},
             {"model.layers.0.block_sparse_moe.experts.1.w3.weight", 4, 8}};
    const int n_t = (int)(sizeof t / sizeof *t);
    char path[256], header[8192] = "{";
    size_t off = 0, n_el[32];
    for (int i = 0; i < n_t; i++) {
        int r = t[i].r < 0 ? vocab : t[i].r;
        n_el[i] = (size_t)r * (t[i].c ? t[i].c : 1);
        char shape[32];
        snprintf(shape, sizeof shape, t[i].c ? "[%d, %d]" : "[%d]", r, t[i].c);
        snprintf(header + strlen(header), sizeof header - strlen(header),
                 "%s\"%s\": {\"dtype\": \"F32\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}", i ? ", " : "",
                 t[i].name, shape, off, off + 4 * n_el[i]);
        off += 4 * n_el[i];
    }
    strcat(header, "}");
    while (strlen(header) % 8) strcat(header, " ");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    unsigned long long hl = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)(hl >> (8 * i)) & 0xff, f);
    fwrite(header, 1, hl, f);
    for (int i = 0; i < n_t; i++) {
        float v = t[i].c ? 0.0f : 1.0f;
        for (size_t k = 0; k < n_el[i]; k++) fwrite(&v, 4, 1, f);
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", "
               "\"vocab_size\": %d, \"hidden_size\": 8, \"intermediate_size\": 4, "
               "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
               "\"num_local_experts\": 2, \"num_experts_per_tok\": 1, \"max_position_embeddings\": 256, "
               "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
            vocab);
    fclose(f);
}

/* expected_nll: mean NLL and its standard error over the scored halves of the
 * first n_chunks chunks, computed here from moe_session_forward's logits. */
static int expected_nll(const char *name, int n_chunks, double *mean, double *err, int *n_scored, int *bos) {
    char dir[512], *text = NULL;
    snprintf(dir, sizeof dir, "%s/models/%s", MOE_FIXTURES, name);
    struct moe_model *m = NULL;
    struct moe_session *s = NULL;
    if (moe_model_load_hf(dir, &m) != MOE_OK) return 0;
    FILE *f = fopen(text_path, "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)len);
    CHECK(fread(text, 1, (size_t)len, f) == (size_t)len, "read %s", text_path);
    fclose(f);
    int32_t *ids = NULL, *text_ids = NULL;
    size_t n_ids = 0, n_text = 0;
    moe_tokenizer_encode(m->tok, text, (size_t)len, 0, &text_ids, &n_text);
    ids = malloc(sizeof(int32_t) * (n_text + 1));
    if (m->cfg.bos_id >= 0) ids[n_ids++] = m->cfg.bos_id; /* the stream starts with BOS */
    memcpy(ids + n_ids, text_ids, sizeof(int32_t) * n_text);
    n_ids += n_text;
    free(text_ids);
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = CTX;
    sp.n_threads = 1;
    moe_session_create(m, &sp, &s);
    const int V = m->cfg.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V * CTX);
    double nll[4096];
    int n = 0;
    if (n_chunks <= 0 || n_chunks > (int)(n_ids / CTX)) n_chunks = (int)(n_ids / CTX);
    for (int c = 0; c < n_chunks; c++) {
        int32_t chunk[CTX];
        memcpy(chunk, ids + (size_t)c * CTX, sizeof chunk);
        if (m->cfg.bos_id >= 0) chunk[0] = m->cfg.bos_id;
        moe_session_reset(s);
        CHECK(moe_session_forward(s, chunk, CTX, logits, 1) == MOE_OK, "%s: forward", name);
        for (int i = CTX / 2; i < CTX - 1 && n < 4096; i++) {
            const float *l = logits + (size_t)i * V;
            double mx = l[0], sum = 0;
            for (int k = 1; k < V; k++) mx = l[k] > mx ? l[k] : mx;
            for (int k = 0; k < V; k++) sum += exp(l[k] - mx);
            nll[n++] = mx + log(sum) - l[chunk[i + 1]];
        }
    }
    double mu = 0, var = 0;
    for (int i = 0; i < n; i++) mu += nll[i];
    mu /= n;
    for (int i = 0; i < n; i++) var += (nll[i] - mu) * (nll[i] - mu);
    *mean = mu;
    *err = sqrt(var / n / (n - 1));
    *n_scored = n;
    *bos = m->cfg.bos_id;
    free(logits);
    free(ids);
    free(text);
    moe_session_free(s);
    moe_model_free(m);
    return 1;
}

/* check_ppl: eval's PPL of `name` equals the independent computation. */
static void check_ppl(const char *name, int max_chunks) {
    double mean, err;
    int n, bos;
    if (!expected_nll(name, max_chunks, &mean, &err, &n, &bos)) {
        CHECK(0, "%s: cannot compute the expected NLL", name);
        return;
    }
    char extra[64] = "";
    if (max_chunks) snprintf(extra, sizeof extra, "--max-chunks %d", max_chunks);
    cJSON *j = eval_json(name, NULL, extra);
    if (!j) return;
    double ppl = num(j, "ppl", "value"), ppl_err = num(j, "ppl", "stderr");
    const cJSON *jb = cJSON_GetObjectItem(j, "bos");
    CHECK(bos >= 0 ? cJSON_IsNumber(jb) && jb->valueint == bos : cJSON_IsNull(jb), "%s: BOS, expected %d", name,
          bos);
    CHECK(num(j, "tokens_scored", NULL) == n, "%s: %g tokens scored, expected %d", name,
          num(j, "tokens_scored", NULL), n);
    CHECK(fabs(num(j, "nll", "mean") - mean) <= 1e-9 * mean, "%s: mean NLL %.12f, expected %.12f", name,
          num(j, "nll", "mean"), mean);
    CHECK(fabs(ppl - exp(mean)) <= 1e-9 * exp(mean), "%s: PPL %.9f, expected %.9f", name, ppl, exp(mean));
    CHECK(fabs(ppl_err - exp(mean) * err) <= 1e-6 * exp(mean) * err, "%s: PPL error %.9f, expected %.9f",
          name, ppl_err, exp(mean) * err);
    cJSON_Delete(j);
}

/* count_route: the test's own router observer (token-slots per layer x expert). */
static int64_t g_load[64][64];
static void count_route(const struct moe_route_event *ev, void *user) {
    for (int i = 0; i < ev->n_tokens * ev->k; i++) g_load[ev->layer][ev->experts[i]]++;
}

/* check_extras: --unigram and --routing agree with an independent count: the
 * unigram perplexity from the stream's own token counts (add-one), and the
 * expert load from a router observer over the same tokens eval feeds (the
 * first ctx-1 tokens of each chunk). */
static void check_extras(const char *name) {
    char dir[512], *text = NULL;
    size_t len = 0;
    snprintf(dir, sizeof dir, "%s/models/%s", MOE_FIXTURES, name);
    struct moe_model *m = NULL;
    if (moe_model_load_hf(dir, &m) != MOE_OK || moe_read_file(text_path, 1 << 24, &text, &len) != MOE_OK) {
        CHECK(0, "%s: setup", name);
        return;
    }
    int32_t *ids = NULL;
    size_t n_text = 0;
    moe_tokenizer_encode(m->tok, text, len, 0, &ids, &n_text);
    CHECK(m->cfg.bos_id < 0, "%s: check_extras expects a model without BOS", name);
    const int V = m->cfg.n_vocab, n_chunks = (int)(n_text / CTX);
    int64_t *count = calloc((size_t)V, sizeof *count);
    for (size_t i = 0; i < n_text; i++) count[ids[i]]++;
    double nll = 0;
    int n = 0;
    memset(g_load, 0, sizeof g_load);
    struct moe_session_params sp = moe_session_default_params();
    sp.n_ctx = CTX;
    sp.n_threads = 1;
    sp.on_route = count_route;
    struct moe_session *s = NULL;
    moe_session_create(m, &sp, &s);
    for (int c = 0; c < n_chunks; c++) {
        const int32_t *chunk = ids + (size_t)c * CTX;
        for (int i = CTX / 2; i < CTX - 1; i++, n++) nll -= log((count[chunk[i + 1]] + 1.0) / ((double)n_text + V));
        moe_session_reset(s);
        CHECK(moe_session_forward(s, chunk, CTX - 1, NULL, 0) == MOE_OK, "%s: forward", name);
    }
    cJSON *j = eval_json(name, NULL, "--unigram --routing");
    if (j) {
        double want = exp(nll / n), got = num(j, "unigram_ppl", NULL);
        CHECK(fabs(got - want) <= 1e-9 * want, "%s: unigram PPL %.9f, expected %.9f", name, got, want);
        CHECK(fabs(num(j, "ppl_over_unigram", NULL) - num(j, "ppl", "value") / want) <= 1e-9 * got,
              "%s: PPL / unigram ratio", name);
        const cJSON *r = cJSON_GetObjectItem(j, "routing"), *layer;
        int n_layers = 0;
        cJSON_ArrayForEach(layer, r) {
            int l = (int)num(layer, "layer", NULL), top = (int)num(layer, "top_expert", NULL), e = 0;
            const cJSON *v;
            int64_t best = -1, total = 0;
            cJSON_ArrayForEach(v, cJSON_GetObjectItem(layer, "load")) {
                CHECK((int64_t)v->valuedouble == g_load[l][e], "%s: layer %d expert %d load %g, expected %lld", name,
                      l, e, v->valuedouble, (long long)g_load[l][e]);
                if (g_load[l][e] > best) best = g_load[l][e];
                total += g_load[l][e];
                e++;
            }
            CHECK(e == m->cfg.n_expert && g_load[l][top] == best, "%s: layer %d top expert", name, l);
            CHECK(total == (int64_t)n_chunks * (CTX - 1) * m->cfg.n_expert_used, "%s: layer %d token-slots", name, l);
            double h = num(layer, "load_entropy_ratio", NULL);
            CHECK(h > 0 && h <= 1, "%s: layer %d entropy ratio %g", name, l, h);
            n_layers++;
        }
        int n_moe = 0;
        for (int l = 0; l < m->cfg.n_layer; l++) n_moe += m->cfg.layer_moe[l];
        CHECK(n_layers == n_moe, "%s: %d routing rows for %d MoE layers", name, n_layers, n_moe);
        cJSON_Delete(j);
    }
    moe_session_free(s);
    free(count);
    free(ids);
    free(text);
    moe_model_free(m);
}

/* check_self: a model against itself. */
static void check_self(const char *name) {
    cJSON *j = eval_json(name, name, NULL);
    if (!j) return;
    double chunks = num(j, "chunks", NULL);
    CHECK(chunks >= 2 && num(j, "tokens_scored", NULL) == chunks * (CTX - 1 - CTX / 2),
          "%s: %g chunks, %g scored", name, chunks, num(j, "tokens_scored", NULL));
    CHECK(num(j, "kld", "mean") == 0 && fabs(num(j, "kld", "max")) < 1e-9 && fabs(num(j, "kld", "min")) < 1e-9,
          "%s vs itself: KL mean %g, max %g, min %g", name, num(j, "kld", "mean"), num(j, "kld", "max"),
          num(j, "kld", "min"));
    CHECK(num(j, "same_top", "value") == 1, "%s vs itself: same top %g", name, num(j, "same_top", "value"));
    CHECK(num(j, "ppl", "value") == num(j, "ref_ppl", "value"), "%s vs itself: PPL %.9g vs %.9g", name,
          num(j, "ppl", "value"), num(j, "ref_ppl", "value"));
    CHECK(num(j, "ppl_ratio", "value") == 1 && num(j, "ppl_diff", "value") == 0 &&
          num(j, "ppl_diff", "stderr") == 0 && num(j, "delta_p", "max") == 0,
          "%s vs itself: ratio %g, diff %g ± %g, max dp %g", name, num(j, "ppl_ratio", "value"),
          num(j, "ppl_diff", "value"), num(j, "ppl_diff", "stderr"), num(j, "delta_p", "max"));
    cJSON_Delete(j);
}

/* check_pair: two different models: KL > 0 everywhere sensible, and the ref's
 * PPL equals the ref's own PPL run alone. */
static void check_pair(const char *model, const char *ref) {
    cJSON *j = eval_json(model, ref, NULL), *r = eval_json(ref, NULL, NULL);
    if (j && r) {
        CHECK(num(j, "kld", "mean") > 1e-6 && num(j, "kld", "min") >= 0 &&
                  num(j, "kld", "median") <= num(j, "kld", "p99") && num(j, "kld", "p99") <= num(j, "kld", "max"),
              "%s vs %s: KL mean %g, min %g, median %g, p99 %g, max %g", model, ref, num(j, "kld", "mean"),
              num(j, "kld", "min"), num(j, "kld", "median"), num(j, "kld", "p99"), num(j, "kld", "max"));
        CHECK(num(j, "ref_ppl", "value") == num(r, "ppl", "value"), "%s: PPL as ref %.9g, alone %.9g", ref,
              num(j, "ref_ppl", "value"), num(r, "ppl", "value"));
        CHECK(fabs(num(j, "ppl_ratio", "value") - num(j, "ppl", "value") / num(j, "ref_ppl", "value")) < 1e-9 *
                  num(j, "ppl_ratio", "value"), "%s vs %s: PPL ratio", model, ref);
    }
    cJSON_Delete(j);
    cJSON_Delete(r);
}

/* check_fails: cmd exits `code` and its output mentions `needle`. */
static void check_fails(const char *args, int code, const char *needle) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s eval %s 2>&1", moe_prep, args);
    int rc = run(cmd);
    CHECK(rc == code, "%s: exit %d, expected %d; output:\n%s", cmd, rc, code, out);
    CHECK(!needle || strstr(out, needle), "%s: output lacks \"%s\":\n%s", cmd, needle, out);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test-eval MOE_PREP_BINARY\n");
        return 2;
    }
    moe_prep = argv[1];
    moe_log_set_level(MOE_LOG_WARN);
    strcpy(text_path, "/tmp/moe-test-eval-XXXXXX");
    strcpy(short_path, "/tmp/moe-test-eval-short-XXXXXX");
    strcpy(tiny_dir, "/tmp/moe-test-eval-tiny-XXXXXX");
    close(mkstemp(text_path));
    close(mkstemp(short_path));
    if (!mkdtemp(tiny_dir)) return 1;
    write_text(text_path, 60); /* ~3 KB: about 40 chunks of 32 tokens */
    write_text(short_path, 3);
    write_tiny_model(tiny_dir, 512);

    check_self("qwen2_moe-f32");
    check_self("mixtral-f32");
    check_self("deepseek_v3-f32");
    check_self("gpt_oss-f32");
    check_pair("mixtral-bf16", "mixtral-f32");
    check_ppl("mixtral-f32", 0);   /* BOS 1 replaces each chunk's first token */
    check_ppl("qwen2_moe-f32", 0); /* no BOS */
    check_ppl("phimoe-f32", 3);    /* --max-chunks */
    check_ppl("deepseek_v2-f32", 0);
    check_extras("qwen2_moe-f32"); /* --unigram, --routing (one dense layer) */

    char args[1024];
    const char *mix = MOE_FIXTURES "/models/mixtral-f32";
    snprintf(args, sizeof args, "%s --ref %s --dataset %s --ctx %d", mix, tiny_dir, text_path, CTX);
    check_fails(args, 1, "vocabulary sizes differ");
    snprintf(args, sizeof args, "%s --ref %s/models/qwen2_moe-f32 --dataset %s --ctx %d", mix, MOE_FIXTURES,
             text_path, CTX);
    check_fails(args, 1, "tokenizers");
    snprintf(args, sizeof args, "%s --dataset %s --ctx %d", mix, short_path, CTX);
    check_fails(args, 1, "needs at least 64");
    snprintf(args, sizeof args, "%s --dataset %s --ctx 512", mix, text_path);
    check_fails(args, 1, "max_position_embeddings 256");
    snprintf(args, sizeof args, "%s --dataset %s.missing --ctx %d", mix, text_path, CTX);
    check_fails(args, 1, "cannot read the dataset");
    snprintf(args, sizeof args, "%s/models/no-such-model --dataset %s --ctx %d", MOE_FIXTURES, text_path, CTX);
    check_fails(args, 1, "cannot load the model");
    snprintf(args, sizeof args, "%s --dataset %s --ctx %d -t 2", mix, text_path, CTX);
    check_fails(args, 0, "PPL = ");
    check_fails(mix, 2, "--dataset");
    snprintf(args, sizeof args, "%s --dataset %s --ctx 2", mix, text_path);
    check_fails(args, 2, "--ctx");
    check_fails("--frobnicate", 2, "unknown or ambiguous option");
    check_fails("--help", 0, "example");

    remove(text_path);
    remove(short_path);
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", tiny_dir);
    remove(path);
    rmdir(tiny_dir);
    if (!fails) printf("test-eval: all checks passed\n");
    return fails != 0;
}
