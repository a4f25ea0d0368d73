/* The prompt pass (lib/engine/prompt.h) against the token-by-token prompt, on
 * the oracle models and the oracle's ~120-token prompt (p3):
 *  - F32, F16 and Q8_0 weights: the same logits bit for bit (each value is
 *    decode's row dot);
 *  - Q4_0 weights: the prefill product's summation order (kernels/gemm.h),
 *    amplified through the layers where a value's last bit moves a Q8_0
 *    rounding of the next input: every logit within 2 % of the largest, the
 *    same greedy token with its logit within 5e-2 (the oracle's tolerance
 *    for Q4_0 against llama.cpp), the next 16 greedy tokens the same (the
 *    bound docs/prefill.md states);
 *  - any block size gives the same bits: the prompt in blocks of 7 tokens
 *    through prompt_pass_run equals engine_prefill's single block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/prompt.h"
#include "oracle.h"
#include "test.h"

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* greedy tokens after a prompt whose logits are l, 16 of them into out */
static void greedy(engine *e, const float *l, int n_prompt, int n_vocab, int *out) {
    for (int s = 0; s < 16; s++) {
        out[s] = argmax(l, n_vocab);
        l = engine_forward(e, out[s], n_prompt + s);
    }
}

/* a KV cache of its own for prompt_pass_run: n_layer x (K [n_ctx][kv_dim], V [kv_dim][n_ctx]) */
typedef struct {
    uint16_t *k, *v;
    int n_ctx, kv_dim;
} test_cache;

static kv_layer test_kv(void *ctx, int layer) {
    test_cache *c = ctx;
    const size_t per = (size_t)c->n_ctx * (size_t)c->kv_dim;
    return (kv_layer){c->k + (size_t)layer * per, c->v + (size_t)layer * per, c->n_ctx, c->kv_dim};
}

/* the prompt in blocks of `block` tokens; its KV cache into c, the last logits into logits */
static void run_blocks(const model *m, threadpool *pool, int block, const oracle_case *oc, test_cache *c,
                       float *logits) {
    char err[256];
    prompt_pass *p = prompt_pass_new(m, kernels_best(), pool, block, c->n_ctx, err, sizeof err);
    if (!p) {
        CHECK(0, "prompt_pass_new: %s", err);
        return;
    }
    for (int first = 0; first < oc->n_prompt; first += block) {
        const int count = oc->n_prompt - first < block ? oc->n_prompt - first : block;
        CHECK(prompt_pass_run(p, oc->prompt_tokens + first, count, first, test_kv, c, NULL, NULL) == 0,
              "prompt_pass_run failed");
        if (first + count == oc->n_prompt) prompt_pass_logits(p, count, logits);
    }
    prompt_pass_free(p);
}

static void check_blocks(const char *name, const model *m, const oracle_case *oc) {
    const int n_ctx = 256, kv_dim = m->n_head_kv * m->head_dim;
    const size_t cells = (size_t)m->n_layer * n_ctx * (size_t)kv_dim;
    test_cache a = {calloc(cells, 2), calloc(cells, 2), n_ctx, kv_dim}, b = {calloc(cells, 2), calloc(cells, 2), n_ctx, kv_dim};
    float *la = malloc(sizeof(float) * (size_t)m->n_vocab), *lb = malloc(sizeof(float) * (size_t)m->n_vocab);
    threadpool *pool = pool_new(2);
    run_blocks(m, pool, 7, oc, &a, la);
    run_blocks(m, pool, 200, oc, &b, lb);
    CHECK(memcmp(a.k, b.k, cells * 2) == 0 && memcmp(a.v, b.v, cells * 2) == 0,
          "%s: the KV cache of the prompt in blocks of 7 differs from one block", name);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)m->n_vocab) == 0,
          "%s: the logits of the prompt in blocks of 7 differ from one block", name);
    pool_free(pool);
    free(a.k), free(a.v), free(b.k), free(b.v), free(la), free(lb);
}

static void check_model(const char *name, const oracle_case *oc) {
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/oracle/%s.gguf", shared_dir(), name);
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        return;
    }
    const int nv = m.n_vocab, n = oc->n_prompt;
    engine *pass = engine_new(&m, 2, 512, err, sizeof err), *tokens = engine_new(&m, 2, 512, err, sizeof err);
    CHECK(pass && tokens, "%s: engine_new: %s", name, err);
    if (!pass || !tokens) return;
    engine_set_token_prompt(tokens, true);
    const int *prompt = (const int *)oc->prompt_tokens;
    float *lp = malloc(sizeof(float) * (size_t)nv), *lt = malloc(sizeof(float) * (size_t)nv);
    memcpy(lp, engine_prefill(pass, prompt, n), sizeof(float) * (size_t)nv);
    memcpy(lt, engine_prefill(tokens, prompt, n), sizeof(float) * (size_t)nv);
    const bool q4 = m.layers[0].wq.type == GGML_TYPE_Q4_0;
    if (!q4) {
        CHECK(memcmp(lp, lt, sizeof(float) * (size_t)nv) == 0, "%s: prompt pass logits differ from token by token",
              name);
    } else {
        float worst = 0, top = 0;
        for (int i = 0; i < nv; i++) {
            worst = fmaxf(worst, fabsf(lp[i] - lt[i]));
            top = fmaxf(top, fabsf(lt[i]));
        }
        const int best = argmax(lt, nv);
        const float top1 = fabsf(lp[best] - lt[best]);
        printf("%s: prompt pass vs token by token: largest logit difference %.3g (largest logit %.3g), top-1 %.3g\n",
               name, worst, top, top1);
        CHECK(worst <= 2e-2f * top, "%s: logits differ by %g, more than 2e-2 of %g", name, worst, top);
        CHECK(argmax(lp, nv) == best && top1 <= 5e-2f, "%s: top-1 token or its logit (by %g) differ", name, top1);
        CHECK(memcmp(lp, lt, sizeof(float) * (size_t)nv) != 0,
              "%s: the Q4_0 prompt pass gave token-by-token bits: is the prefill product in use?", name);
    }
    int gp[16], gt[16];
    greedy(pass, lp, n, nv, gp);
    greedy(tokens, lt, n, nv, gt);
    CHECK(memcmp(gp, gt, sizeof gp) == 0, "%s: 16 greedy tokens after the prompt pass differ", name);

    check_blocks(name, &m, oc);
    free(lp), free(lt);
    engine_free(pass), engine_free(tokens);
    model_free(&m);
}

int main(void) {
    const char *names[] = {"stories260K", "synth-f32", "synth-f16", "synth-q8_0", "synth-q4_0"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[512], err[256];
        snprintf(path, sizeof path, "%s/oracle/llama.cpp/%s.p3.json", shared_dir(), names[i]);
        oracle_case oc;
        if (oracle_load(&oc, path, err, sizeof err)) {
            CHECK(0, "%s: %s", path, err);
            continue;
        }
        check_model(names[i], &oc);
        oracle_free(&oc);
    }
    return test_summary();
}
