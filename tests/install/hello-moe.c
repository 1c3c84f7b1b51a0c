/*
 * hello-moe.c - a program outside the source tree, built against an installed
 * copy of the libraries the way a user would build one:
 *
 *   cc hello-moe.c $(pkg-config --cflags --libs --static moe) -o hello-moe
 *
 * It loads a checkpoint directory with moe_model_load and prints the model's
 * layer and expert counts, runs three tokens through a session on the
 * backend the registry gives for "cpu" (moe-session.h, moe-backend.h) and
 * prints its name and whether the logits are finite, then opens a bundle with moe_bundle_open (when a
 * second argument is given) and prints its expert layout. tests/install/
 * test-install.sh builds and runs it against `cmake --install` of the build
 * tree and checks what it prints.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <moe-backend.h>
#include <moe-bundle.h>
#include <moe-model.h>
#include <moe-session.h>
#include <moe-status.h>

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: hello-moe CHECKPOINT_DIR [BUNDLE]\n");
        return 2;
    }
    struct moe_model_params mp = moe_model_default_params();
    struct moe_model *m = NULL;
    enum moe_status st = moe_model_load(argv[1], &mp, &m);
    if (st != MOE_OK) {
        fprintf(stderr, "hello-moe: %s: %s\n", argv[1], moe_status_str(st));
        return 1;
    }
    printf("layers %d experts %d\n", m->cfg.n_layer, m->cfg.n_expert);
    struct moe_session_params sp = moe_session_default_params();
    sp.device = "cpu", sp.n_ctx = 16, sp.n_threads = 1;
    struct moe_session *s = NULL;
    float *logits = malloc(sizeof(float) * (size_t)m->cfg.n_vocab);
    const int32_t ids[3] = {1, 2, 3};
    st = logits ? moe_session_create(m, &sp, &s) : MOE_ERR_NOMEM;
    if (st == MOE_OK) st = moe_session_forward(s, ids, 3, logits, 0);
    int finite = st == MOE_OK;
    for (int i = 0; finite && i < m->cfg.n_vocab; i++) finite = isfinite(logits[i]);
    printf("backend %s, logits %s\n", moe_backend_name(s ? moe_session_backend(s) : NULL),
           finite ? "finite" : moe_status_str(st));
    moe_session_free(s);
    free(logits);
    moe_model_free(m);
    if (!finite) return 1;
    if (argc == 3) {
        struct moe_bundle *b = NULL;
        st = moe_bundle_open(argv[2], &b);
        printf("bundle %s\n", moe_status_str(st));
        if (st != MOE_OK) return 1;
        uint32_t nl, ne, np;
        moe_bundle_expert_layout(b, &nl, &ne, &np);
        printf("bundle layers %u experts %u precisions %u\n", nl, ne, np);
        moe_bundle_free(b);
    }
    return 0;
}
