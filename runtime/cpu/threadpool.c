/* threadpool.c - persistent workers woken per loop by a generation counter. */
#include "moe-threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct moe_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation; /* bumped per loop */
    int pending;         /* workers still running the current loop */
    int quit;
    /* current loop */
    moe_range_fn fn;
    void *ctx;
    int64_t n, chunk;
};

struct worker_arg {
    struct moe_pool *p;
    int tid;
};

/* run_share: thread tid's contiguous part of the current loop. */
static void run_share(struct moe_pool *p, int tid) {
    int64_t b = (int64_t)tid * p->chunk, e = b + p->chunk;
    if (e > p->n) e = p->n;
    if (b < e) p->fn(p->ctx, b, e, tid);
}

static void *worker_main(void *arg) {
    struct worker_arg *wa = arg;
    struct moe_pool *p = wa->p;
    int tid = wa->tid;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_share(p, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

enum moe_status moe_pool_create(int n_threads, struct moe_pool **out) {
    *out = NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    struct moe_pool *p = calloc(1, sizeof *p);
    if (!p) return MOE_ERR_NOMEM;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        moe_pool_free(p);
        return MOE_ERR_NOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, (wa->p = p, wa->tid = i, wa))) {
            free(wa);
            MOE_LOGE("cannot start thread %d", i);
            p->n_threads = i; /* join only those started */
            moe_pool_free(p);
            return MOE_ERR_NOMEM;
        }
    }
    *out = p;
    return MOE_OK;
}

void moe_pool_free(struct moe_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; p->threads && i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int moe_pool_n_threads(const struct moe_pool *p) { return p->n_threads; }

void moe_pool_for(struct moe_pool *p, int64_t n, int64_t min_chunk, moe_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    int64_t workers = (n + min_chunk - 1) / min_chunk;
    if (workers > p->n_threads) workers = p->n_threads;
    if (workers <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = (n + workers - 1) / workers;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
