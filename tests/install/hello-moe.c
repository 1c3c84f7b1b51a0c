/*
 * hello-moe.c - a program outside the source tree, built against an installed
 * copy of the libraries the way a user would build one:
 *
 *   cc hello-moe.c $(pkg-config --cflags --libs --static moe) -o hello-moe
 *
 * It loads a checkpoint directory with moe_model_load and prints the model's
 * layer and expert counts, then opens a bundle with moe_bundle_open (when a
 * second argument is given) and prints its expert layout. tests/install/
 * test-install.sh builds and runs it against `cmake --install` of the build
 * tree and checks what it prints.
 */
#include <stdio.h>

#include <moe-bundle.h>
#include <moe-model.h>
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
    moe_model_free(m);
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
