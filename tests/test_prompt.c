/* The prompt pass (lib/engine/prompt.h) against the token-by-token prompt, on
 * the oracle models and the oracle's ~120-token prompt (p3):
 *  - Q8_0 weights: the same logits bit for bit (each value is decode's row dot);
 *  - F32 and F16 weights: the float product's tinyBLAS order (kernels/gemm.h)
 *    against decode's dots: every logit within 1e-3 of the largest, the
 *    greedy token's logit within the oracle's tolerance, 16 greedy tokens alike;
 *  - Q4_0 weights: the prefill product's summation order (kernels/gemm.h),
 *    amplified through the layers where a value's last bit moves a Q8_0
 *    rounding of the next input: every logit within 2 % of the largest, the
 *    same greedy token with its logit within 5e-2 (the oracle's tolerance
 *    for Q4_0 against llama.cpp), the next 16 greedy tokens the same (the
 *    bound docs/prefill.md states);
 *  - any block size gives the same bits: the prompt in blocks of 7 tokens
 *    through prompt_pass_run equals one block and engine_prefill;
 *  - so do the FFN weights in pieces of neurons (prompt_ffn_source, as a
 *    budgeted stack streams them): one step, three steps, and the whole layer;
 *  - PowerInfer files (ffn_down_t only, summed by the sparse axpy) close to
 *    their token-by-token prompt and to their GGUF twin's pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/prompt.h"
#include "engine/sampler.h" /* argmax */
#include "mkmodel_run.h"
#include "oracle.h"
#include "rng.h"
#include "test.h"

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

/* a prompt_ffn_source over the model's own weights, `piece` neurons at a time */
typedef struct {
    const model *m;
    long piece;
    long asked; /* pieces handed out */
} piece_source;

static int model_piece(void *ctx, int l, long n0, layer_weights *out, long *n1) {
    piece_source *ps = ctx;
    *out = ps->m->layers[l];
    *n1 = n0 + ps->piece < ps->m->n_ff ? n0 + ps->piece : ps->m->n_ff;
    layer_weights_neurons(out, n0, *n1);
    ps->asked++;
    return 0;
}

/* the prompt in blocks of `block` tokens, the FFN in pieces of `piece` neurons (0: from the model); its KV cache
 * into c, the last logits into logits */
static void run_blocks(const model *m, threadpool *pool, int block, long piece, const int32_t *tokens, int n_prompt,
                       test_cache *c, float *logits) {
    char err[256];
    prompt_pass *p = prompt_pass_new(m, kernels_best(), pool, block, c->n_ctx, err, sizeof err);
    if (!p) {
        CHECK(0, "prompt_pass_new: %s", err);
        return;
    }
    piece_source ps = {m, piece, 0};
    const prompt_ffn_source src = {model_piece, &ps};
    for (int first = 0; first < n_prompt; first += block) {
        const int count = n_prompt - first < block ? n_prompt - first : block;
        CHECK(prompt_pass_run(p, tokens + first, count, first, test_kv, c, NULL, NULL, piece ? &src : NULL) == 0,
              "prompt_pass_run failed");
        if (first + count == n_prompt) prompt_pass_logits(p, count, logits);
    }
    const long blocks = (n_prompt + block - 1) / block;
    if (piece)
        CHECK(ps.asked == blocks * m->n_layer * ((m->n_ff + piece - 1) / piece), "%ld pieces asked for, pieces of %ld",
              ps.asked, piece);
    prompt_pass_free(p);
}

/* the FFN in pieces of one step, three steps and a layer of neurons gives the bits of the whole model */
static void check_pieces(const char *name, const model *m, const int32_t *tokens, int n_prompt, const test_cache *whole,
                         const float *whole_logits) {
    const int n_ctx = whole->n_ctx, kv_dim = whole->kv_dim;
    const size_t cells = (size_t)m->n_layer * n_ctx * (size_t)kv_dim;
    const long step = prompt_pass_neuron_step(m), pieces[] = {step, 3 * step, m->n_ff};
    threadpool *pool = pool_new(2);
    for (int i = 0; i < 3; i++) {
        if (i < 2 && step == m->n_ff) continue;
        test_cache c = {calloc(cells, 2), calloc(cells, 2), n_ctx, kv_dim};
        float *logits = malloc(sizeof(float) * (size_t)m->n_vocab);
        run_blocks(m, pool, 200, pieces[i], tokens, n_prompt, &c, logits);
        CHECK(memcmp(c.k, whole->k, cells * 2) == 0 && memcmp(c.v, whole->v, cells * 2) == 0 &&
                  memcmp(logits, whole_logits, sizeof(float) * (size_t)m->n_vocab) == 0,
              "%s: the FFN in pieces of %ld neurons (step %ld of %d) gives other bits", name, pieces[i], step, m->n_ff);
        free(c.k), free(c.v), free(logits);
    }
    pool_free(pool);
}

/* blocks of 7 and one block give the same KV cache and logits; so does
 * engine_prefill (`expect`, NULL: not compared), which must run the pass */
static void check_blocks(const char *name, const model *m, const int32_t *tokens, int n_prompt, const float *expect) {
    const int n_ctx = 256, kv_dim = m->n_head_kv * m->head_dim;
    const size_t cells = (size_t)m->n_layer * n_ctx * (size_t)kv_dim;
    test_cache a = {calloc(cells, 2), calloc(cells, 2), n_ctx, kv_dim}, b = {calloc(cells, 2), calloc(cells, 2), n_ctx, kv_dim};
    float *la = malloc(sizeof(float) * (size_t)m->n_vocab), *lb = malloc(sizeof(float) * (size_t)m->n_vocab);
    threadpool *pool = pool_new(2);
    run_blocks(m, pool, 7, 0, tokens, n_prompt, &a, la);
    run_blocks(m, pool, 200, 0, tokens, n_prompt, &b, lb);
    CHECK(memcmp(a.k, b.k, cells * 2) == 0 && memcmp(a.v, b.v, cells * 2) == 0,
          "%s: the KV cache of the prompt in blocks of 7 differs from one block", name);
    CHECK(memcmp(la, lb, sizeof(float) * (size_t)m->n_vocab) == 0,
          "%s: the logits of the prompt in blocks of 7 differ from one block", name);
    if (expect)
        CHECK(memcmp(expect, lb, sizeof(float) * (size_t)m->n_vocab) == 0,
              "%s: engine_prefill's logits are not the prompt pass's", name);
    pool_free(pool);
    check_pieces(name, m, tokens, n_prompt, &b, lb);
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
    /* Q8_0 weights take decode's dots in the prompt too: the same bits. Q4_0
     * and float weights take the prefill products, whose summation order is
     * their own (docs/prefill.md): a last-bit difference, which Q4_0 models
     * amplify through the next layer's Q8_0 rounding. */
    const uint32_t type = m.layers[0].wq.type;
    if (type == GGML_TYPE_Q8_0) {
        CHECK(memcmp(lp, lt, sizeof(float) * (size_t)nv) == 0, "%s: prompt pass logits differ from token by token",
              name);
    } else {
        /* measured: F32 3.1e-4 of the largest logit (stories260K), F16 5.2e-4, Q4_0 1.2e-2; top-1
         * 2.2e-3, 8.9e-4, 1.9e-2. The top-1 bounds are the oracle's tolerances against llama.cpp. */
        const bool q4 = type == GGML_TYPE_Q4_0;
        const float tol = q4 ? 2e-2f : 1e-3f, top1_tol = q4 ? 5e-2f : type == GGML_TYPE_F16 ? 2e-2f : 5e-3f;
        float worst = 0, top = 0;
        for (int i = 0; i < nv; i++) {
            worst = fmaxf(worst, fabsf(lp[i] - lt[i]));
            top = fmaxf(top, fabsf(lt[i]));
        }
        const int best = argmax(lt, nv);
        const float top1 = fabsf(lp[best] - lt[best]);
        printf("%s: prompt pass vs token by token: largest logit difference %.3g (largest logit %.3g), top-1 %.3g\n",
               name, worst, top, top1);
        CHECK(worst <= tol * top, "%s: logits differ by %g, more than %g of %g", name, worst, tol, top);
        CHECK(argmax(lp, nv) == best && top1 <= top1_tol, "%s: top-1 token or its logit (by %g) differ", name, top1);
        CHECK(memcmp(lp, lt, sizeof(float) * (size_t)nv) != 0,
              "%s: the prompt pass gave token-by-token bits: is the prefill product in use?", name);
    }
    int gp[16], gt[16];
    greedy(pass, lp, n, nv, gp);
    greedy(tokens, lt, n, nv, gt);
    CHECK(memcmp(gp, gt, sizeof gp) == 0, "%s: 16 greedy tokens after the prompt pass differ", name);

    check_blocks(name, &m, oc->prompt_tokens, oc->n_prompt, lp);
    free(lp), free(lt);
    engine_free(pass), engine_free(tokens);
    model_free(&m);
}

/* Heads of 64 (the oracle models' are 32 and 8): the tiled K . q the prompt
 * pass runs a few tokens at a time (kernels' dot_f16_rows_tile) against decode's
 * one dot a pair, with grouped heads, runs of tokens across blocks of 7 and a
 * last run shorter than the others: Q8_0 weights, the same bits. */
static void check_wide_heads(const char *dir) {
    char path[512], err[256];
    if (mkmodel_run(dir, "heads64-q8_0.gguf", "--preset tiny --dim 256 --heads 4 --kv-heads 2 --ff 512 --type q8_0 "
                    "--seed 9", path, sizeof path)) {
        CHECK(0, "mkmodel heads64-q8_0.gguf failed");
        return;
    }
    model m;
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        return;
    }
    CHECK(m.head_dim == 64 && m.n_head_kv < m.n_head, "%s: heads of 64, grouped (got %d, %d of %d)", path, m.head_dim,
          m.n_head_kv, m.n_head);
    enum { N = 45 };
    int32_t tokens[N];
    rng_seed(13);
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)(rng_u32() % (uint32_t)m.n_vocab);
    engine *pass = engine_new(&m, 2, 256, err, sizeof err), *by_token = engine_new(&m, 2, 256, err, sizeof err);
    CHECK(pass && by_token, "%s: engine_new: %s", path, err);
    if (pass && by_token) {
        engine_set_token_prompt(by_token, true);
        const size_t bytes = sizeof(float) * (size_t)m.n_vocab;
        float *lp = malloc(bytes);
        memcpy(lp, engine_prefill(pass, (const int *)tokens, N), bytes);
        CHECK(memcmp(lp, engine_prefill(by_token, (const int *)tokens, N), bytes) == 0,
              "heads of 64: prompt pass logits differ from token by token");
        check_blocks("heads of 64", &m, tokens, N, lp);
        free(lp);
    }
    engine_free(pass), engine_free(by_token);
    model_free(&m);
}

/* largest |a - b| over the largest |b| */
static float logit_gap(const float *a, const float *b, int n) {
    float worst = 0, top = 0;
    for (int i = 0; i < n; i++) worst = fmaxf(worst, fabsf(a[i] - b[i])), top = fmaxf(top, fabsf(b[i]));
    return top > 0 ? worst / top : worst;
}

/* A PowerInfer file (ffn_down_t only) through the prompt pass: against its
 * own token-by-token prompt (decode's chunked sparse FFN) and against the
 * GGUF twin mkmodel writes from the same seed (same weights, ffn_down: the
 * dense product). Wide FFN, narrow rows: several down_t chunks per layer. */
static void check_pwri(const char *dir, const char *type, float tol, float twin_tol) {
    char flags[256], gguf_path[512], pwri_path[512], err[256];
    snprintf(flags, sizeof flags, "--preset tiny --dim 64 --heads 2 --kv-heads 2 --ff 16384 --act relu --type %s --seed 5",
             type);
    char pflags[300];
    snprintf(pflags, sizeof pflags, "%s --pwri", flags);
    char gname[64], pname[64];
    snprintf(gname, sizeof gname, "wide-%s.gguf", type);
    snprintf(pname, sizeof pname, "wide-%s-pwri.gguf", type);
    if (mkmodel_run(dir, gname, flags, gguf_path, sizeof gguf_path) ||
        mkmodel_run(dir, pname, pflags, pwri_path, sizeof pwri_path)) {
        CHECK(0, "mkmodel %s failed", pflags);
        return;
    }
    model g, pw;
    if (model_load(&g, gguf_path, err, sizeof err)) {
        CHECK(0, "%s: %s", gguf_path, err);
        return;
    }
    if (model_load(&pw, pwri_path, err, sizeof err)) {
        CHECK(0, "%s: %s", pwri_path, err);
        model_free(&g);
        return;
    }
    CHECK(!pw.layers[0].down.data && pw.layers[0].down_t.data && prompt_pass_takes(&pw),
          "%s: a down_t-only model the prompt pass takes", pname);
    enum { N = 90 };
    int tokens[N];
    rng_seed(11);
    tokens[0] = 1;
    for (int t = 1; t < N; t++) tokens[t] = 2 + (int)(rng_u32() % (uint32_t)(pw.n_vocab - 2));
    const int nv = pw.n_vocab;
    engine *pass = engine_new(&pw, 2, 256, err, sizeof err), *by_token = engine_new(&pw, 2, 256, err, sizeof err),
           *twin = engine_new(&g, 2, 256, err, sizeof err);
    CHECK(pass && by_token && twin, "%s: engine_new: %s", pname, err);
    if (pass && by_token && twin) {
        engine_set_token_prompt(by_token, true);
        float *lp = malloc(sizeof(float) * (size_t)nv), *lt = malloc(sizeof(float) * (size_t)nv),
              *lg = malloc(sizeof(float) * (size_t)nv);
        memcpy(lp, engine_prefill(pass, tokens, N), sizeof(float) * (size_t)nv);
        memcpy(lt, engine_prefill(by_token, tokens, N), sizeof(float) * (size_t)nv);
        memcpy(lg, engine_prefill(twin, tokens, N), sizeof(float) * (size_t)nv);
        const float by_tok = logit_gap(lp, lt, nv), by_twin = logit_gap(lp, lg, nv);
        printf("%s: prompt pass vs token by token %.3g, vs the GGUF twin's pass %.3g (of the largest logit)\n", pname,
               by_tok, by_twin);
        CHECK(by_tok <= tol && argmax(lp, nv) == argmax(lt, nv), "%s: %g from token by token (limit %g)", pname, by_tok,
              tol);
        CHECK(by_twin <= twin_tol && argmax(lp, nv) == argmax(lg, nv), "%s: %g from the GGUF twin (limit %g)", pname,
              by_twin, twin_tol);
        int32_t t32[N];
        for (int t = 0; t < N; t++) t32[t] = tokens[t];
        check_blocks(pname, &pw, t32, N, lp);
        free(lp), free(lt), free(lg);
    }
    engine_free(pass), engine_free(by_token), engine_free(twin);
    model_free(&g), model_free(&pw);
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
    char dir[] = "/tmp/pi2-test-prompt-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return test_summary();
    }
    /* F32: summation order only (1e-3, test_sparse_engine's rounding bound).
     * Q4_0: against token by token, hb's quantization as the axpy does it in
     * other groups (2e-2, measured 5e-3); against the twin, whose ffn_down
     * is quantized along the other axis (other weights) and whose hb goes
     * through Q8_0: 6e-2 (measured 3.4e-2) */
    check_wide_heads(dir);
    check_pwri(dir, "f32", 1e-3f, 1e-3f);
    check_pwri(dir, "q4_0", 2e-2f, 6e-2f);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}
