/* predictor_agree (dense vs predictor-mode engines) on tiny mkmodel models:
 *   - PWRI (dense and predictor mode share the chunked FFN and the file's
 *     down_t): a predictor naming every neuron is dense bit for bit, so
 *     agreement must be exactly 1, the logit difference exactly 0 and every
 *     free-running continuation the full G tokens;
 *   - a predictor naming no neuron computes none and reads only its own
 *     weights (predictor_stage1_bytes + n_ff * predictor_row_bytes per layer);
 *   - the planted fc1/fc2 at the file's threshold: the counts equal those of
 *     an independent re-implementation here (same engines, same bits), all
 *     fractions within [0, 1], the prefix <= G, and far fewer neurons computed;
 *   - the token budget and G = 0 are honoured;
 *   - SiLU (F32, so down_t is exact): a lowrank predictor built here, every
 *     neuron named, differs from dense by rounding only; at its calibrated
 *     thresholds (the approximate mode) it computes fewer neurons. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "calib/predictor_build.h"
#include "calib/predictor_agree.h"
#include "mkmodel_run.h"
#include "test.h"
#include "engine/tokenizer.h"
#include "engine/sampler.h"

/* Short prompts (2-9 tokens in mkmodel's vocabulary) so that most teacher-forced
 * steps follow dense's generated tokens; the budget ends inside the last prompt. */
static const char *const prompts[] = {"Hello there.", "The cat sat.", "one two three", "x"};
#define N_PROMPTS 4
#define N_TOKENS 80
#define GEN 16
#define FREE_GEN 12
/* F32: summation order only (see tests/test_sparse_engine.c, LOGIT_TOL_ROUNDING) */
#define LOGIT_TOL_ROUNDING 1e-3

static char tmpdir[64];

static int mkmodel(const char *name, const char *flags, char *path, size_t cap) {
    return mkmodel_run(tmpdir, name, flags, path, cap);
}

static predictor_agree_opts opts(int n_tokens, int free_gen) {
    predictor_agree_opts o = {{prompts, N_PROMPTS, n_tokens, GEN, 2}, free_gen};
    return o;
}

static void set_all_thresholds(predictor *p, const model *m, float tau) {
    for (int l = 0; l < m->n_layer; l++) predictor_set_threshold(p, l, tau);
}

static void check_ranges(const char *label, const predictor_agreement *a, int free_gen) {
    CHECK(a->top1_same <= a->top1_in_top5 && a->top1_in_top5 <= a->steps, "%s: top1 %llu, top5 %llu, steps %llu",
          label, (unsigned long long)a->top1_same, (unsigned long long)a->top1_in_top5,
          (unsigned long long)a->steps);
    CHECK(a->rel_diff_max >= 0 && a->rel_diff_sum <= a->rel_diff_max * (double)a->steps + 1e-9,
          "%s: mean logit diff above its max", label);
    CHECK(a->prefix_sum <= a->free_possible && a->free_possible <= a->free_prompts * (uint64_t)free_gen,
          "%s: prefix %llu, possible %llu, prompts %llu x G %d", label, (unsigned long long)a->prefix_sum,
          (unsigned long long)a->free_possible, (unsigned long long)a->free_prompts, free_gen);
    CHECK(a->active <= a->computed && a->computed <= a->dense_computed, "%s: active %llu computed %llu dense %llu",
          label, (unsigned long long)a->active, (unsigned long long)a->computed,
          (unsigned long long)a->dense_computed);
}

/* The counts, re-derived with two engines stepped here. */
typedef struct {
    uint64_t steps, top1, top5, prefix, prompts;
} oracle_counts;

/* G greedy tokens after the prompt into out[0..G). */
static int generate(engine *e, const int32_t *prompt, int n, int G, int n_vocab, int32_t *out) {
    const float *logits = NULL;
    for (int pos = 0; pos < n; pos++) logits = engine_forward(e, prompt[pos], pos);
    for (int g = 0; g < G && logits; g++) {
        out[g] = argmax(logits, n_vocab);
        if (g + 1 < G) logits = engine_forward(e, out[g], n + g);
    }
    return logits ? 0 : -1;
}

static int oracle(const model *m, const predictor *p, const predictor_agree_opts *o, oracle_counts *c) {
    char err[256] = "prompt too long for the context";
    memset(c, 0, sizeof *c);
    tokenizer *tok = tokenizer_from_gguf(&m->gguf, err, sizeof err);
    engine *d = engine_new(m, 2, 0, err, sizeof err), *s = engine_new(m, 2, 0, err, sizeof err);
    int ok = tok && d && s && !engine_set_ffn_mode(s, FFN_PREDICTOR, p, err, sizeof err);
    int n_vocab = m->n_vocab;
    int32_t tokens[512], gd[FREE_GEN], gs[FREE_GEN];
    float *ld = malloc(sizeof(float) * (size_t)n_vocab), *ls = malloc(sizeof(float) * (size_t)n_vocab);
    ok = ok && ld && ls;
    for (int i = 0; ok && i < o->run.n_prompts; i++) {
        int n = tokenizer_encode(tok, o->run.prompts[i], tokenizer_adds_bos(tok), tokens, 512);
        ok = n > 0 && n + FREE_GEN <= engine_n_ctx(d);
        for (int pos = 0; ok && pos < n + o->run.gen_per_prompt && c->steps < (uint64_t)o->run.n_tokens; pos++) {
            int t = pos < n ? tokens[pos] : argmax(ld, n_vocab);
            memcpy(ld, engine_forward(d, t, pos), sizeof(float) * (size_t)n_vocab);
            memcpy(ls, engine_forward(s, t, pos), sizeof(float) * (size_t)n_vocab);
            int ts = argmax(ls, n_vocab), above = 0;
            for (int v = 0; v < n_vocab; v++) above += ld[v] > ld[ts];
            c->steps++;
            c->top1 += ts == argmax(ld, n_vocab);
            c->top5 += above < 5;
        }
        if (!ok || o->free_gen == 0) continue;
        ok = o->free_gen <= FREE_GEN && !generate(d, tokens, n, o->free_gen, n_vocab, gd) &&
             !generate(s, tokens, n, o->free_gen, n_vocab, gs);
        int prefix = 0;
        while (ok && prefix < o->free_gen && gd[prefix] == gs[prefix]) prefix++;
        c->prefix += (uint64_t)prefix;
        c->prompts++;
    }
    if (!ok) fprintf(stderr, "oracle: %s\n", err);
    free(ld);
    free(ls);
    engine_free(d);
    engine_free(s);
    tokenizer_free(tok);
    return ok ? 0 : -1;
}

static void check_pwri(const char *path) {
    model m;
    char err[256];
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "pwri: %s", err);
        return;
    }
    predictor *p = predictor_load(&m, NULL, err, sizeof err);
    CHECK(p != NULL, "pwri predictor: %s", err);
    if (!p) {
        model_free(&m);
        return;
    }
    const uint64_t cells = (uint64_t)m.n_layer * m.n_ff;
    predictor_agree_opts o = opts(N_TOKENS, FREE_GEN);
    predictor_agreement a;

    /* the file's threshold, against the re-implementation */
    int n = predictor_agree(&m, p, &o, &a, err, sizeof err);
    oracle_counts c;
    CHECK(n == N_TOKENS && (uint64_t)n == a.steps, "planted: %d steps (%s), want %d", n, n < 0 ? err : "", N_TOKENS);
    check_ranges("planted", &a, FREE_GEN);
    CHECK(oracle(&m, p, &o, &c) == 0, "oracle engines");
    CHECK(c.steps == a.steps && c.top1 == a.top1_same && c.top5 == a.top1_in_top5,
          "planted: teacher-forced steps/top1/top5 %llu/%llu/%llu, oracle %llu/%llu/%llu",
          (unsigned long long)a.steps, (unsigned long long)a.top1_same, (unsigned long long)a.top1_in_top5,
          (unsigned long long)c.steps, (unsigned long long)c.top1, (unsigned long long)c.top5);
    CHECK(c.prompts == a.free_prompts && c.prefix == a.prefix_sum && a.free_possible == a.free_prompts * FREE_GEN,
          "planted: free-running prompts/prefix/possible %llu/%llu/%llu, oracle %llu/%llu",
          (unsigned long long)a.free_prompts, (unsigned long long)a.prefix_sum, (unsigned long long)a.free_possible,
          (unsigned long long)c.prompts, (unsigned long long)c.prefix);
    CHECK(a.free_prompts == N_PROMPTS, "planted: %llu of %d prompts free-running", (unsigned long long)a.free_prompts,
          N_PROMPTS);
    CHECK(a.dense_computed == a.steps * cells, "dense computed %llu of %llu", (unsigned long long)a.dense_computed,
          (unsigned long long)(a.steps * cells));
    CHECK(a.computed < a.dense_computed / 3, "planted predictor computed %llu of %llu neurons",
          (unsigned long long)a.computed, (unsigned long long)a.dense_computed);
    CHECK(a.top1_same > 0 && a.rel_diff_max > 0, "planted: no agreement or no difference at all");
    printf("planted fc1/fc2: top1 %.3f, in top5 %.3f, diff max %.3g mean %.3g, prefix %.2f/%d, computed %.4f\n",
           (double)a.top1_same / a.steps, (double)a.top1_in_top5 / a.steps, a.rel_diff_max,
           a.rel_diff_sum / a.steps, (double)a.prefix_sum / a.free_prompts, FREE_GEN,
           (double)a.computed / (a.steps * cells));

    /* every neuron named: dense bit for bit */
    set_all_thresholds(p, &m, -1e30f);
    n = predictor_agree(&m, p, &o, &a, err, sizeof err);
    CHECK(n == N_TOKENS, "all: %d steps", n);
    CHECK(a.top1_same == a.steps && a.top1_in_top5 == a.steps, "all neurons: top1 %llu, top5 %llu of %llu",
          (unsigned long long)a.top1_same, (unsigned long long)a.top1_in_top5, (unsigned long long)a.steps);
    CHECK(a.rel_diff_max == 0 && a.rel_diff_sum == 0, "all neurons: logit diff %g, not 0", a.rel_diff_max);
    CHECK(a.prefix_sum == a.free_possible && a.free_possible == a.free_prompts * FREE_GEN,
          "all neurons: prefix %llu of %llu", (unsigned long long)a.prefix_sum, (unsigned long long)a.free_possible);
    CHECK(a.computed == a.steps * cells, "all neurons: computed %llu of %llu", (unsigned long long)a.computed,
          (unsigned long long)(a.steps * cells));

    /* no neuron named: only the predictor's own weights are read */
    set_all_thresholds(p, &m, 1e30f);
    uint64_t pred_bytes = 0;
    for (int l = 0; l < m.n_layer; l++)
        pred_bytes += predictor_stage1_bytes(p, l) + (uint64_t)m.n_ff * predictor_row_bytes(p, l);
    n = predictor_agree(&m, p, &o, &a, err, sizeof err);
    CHECK(n == N_TOKENS, "none: %d steps", n);
    CHECK(a.computed == 0 && a.active == 0, "no neuron named: computed %llu, active %llu",
          (unsigned long long)a.computed, (unsigned long long)a.active);
    CHECK(a.bytes == a.steps * pred_bytes, "no neuron named: %llu bytes, predictor alone %llu",
          (unsigned long long)a.bytes, (unsigned long long)(a.steps * pred_bytes));
    check_ranges("none", &a, FREE_GEN);
    CHECK(oracle(&m, p, &o, &c) == 0 && c.top1 == a.top1_same && c.top5 == a.top1_in_top5 && c.prefix == a.prefix_sum,
          "none: top1/top5/prefix %llu/%llu/%llu, oracle %llu/%llu/%llu", (unsigned long long)a.top1_same,
          (unsigned long long)a.top1_in_top5, (unsigned long long)a.prefix_sum, (unsigned long long)c.top1,
          (unsigned long long)c.top5, (unsigned long long)c.prefix);
    printf("no neuron: top1 %.3f, in top5 %.3f, prefix %.2f/%d\n", (double)a.top1_same / a.steps,
           (double)a.top1_in_top5 / a.steps, (double)a.prefix_sum / a.free_prompts, FREE_GEN);

    /* budget and G = 0 */
    o = opts(7, 0);
    n = predictor_agree(&m, p, &o, &a, err, sizeof err);
    CHECK(n == 7 && a.steps == 7 && a.free_prompts == 0 && a.free_possible == 0 && a.prefix_sum == 0,
          "budget 7, G 0: %d steps, %llu free prompts", n, (unsigned long long)a.free_prompts);
    predictor_free(p);
    model_free(&m);
}

static void check_silu(const char *path) {
    model m;
    char err[256];
    if (model_load(&m, path, err, sizeof err)) {
        CHECK(0, "silu: %s", err);
        return;
    }
    char side[128];
    snprintf(side, sizeof side, "%s/silu_pred.gguf", tmpdir);
    predictor_build_opts b = {side, 32, 0.99, 0.3, GGML_TYPE_F32, 2,
                              {predictor_calib_prompts, predictor_n_calib_prompts, 64, 8, 2}};
    int built = predictor_build(&m, &b, err, sizeof err);
    CHECK(built == 0, "silu build: %s", err);
    predictor *p = built == 0 ? predictor_load(&m, side, err, sizeof err) : NULL;
    CHECK(p != NULL, "silu load: %s", err);
    if (p) {
        predictor_agree_opts o = opts(N_TOKENS, FREE_GEN);
        predictor_agreement a;
        int n = predictor_agree(&m, p, &o, &a, err, sizeof err);
        CHECK(n == N_TOKENS, "silu calibrated: %d steps (%s)", n, n < 0 ? err : "");
        check_ranges("silu calibrated", &a, FREE_GEN);
        CHECK(a.computed < a.dense_computed, "silu approximate mode computed all %llu neurons",
              (unsigned long long)a.computed);
        printf("silu approximate (keep 0.3, rank 32): top1 %.3f, diff max %.3g, prefix %.2f/%d, computed %.4f\n",
               (double)a.top1_same / a.steps, a.rel_diff_max, (double)a.prefix_sum / a.free_prompts, FREE_GEN,
               (double)a.computed / a.dense_computed);
        set_all_thresholds(p, &m, -1e30f);
        n = predictor_agree(&m, p, &o, &a, err, sizeof err);
        CHECK(n == N_TOKENS && a.computed == a.dense_computed, "silu all neurons: computed %llu of %llu",
              (unsigned long long)a.computed, (unsigned long long)a.dense_computed);
        CHECK(a.rel_diff_max <= LOGIT_TOL_ROUNDING, "silu all neurons (F32): logit diff %.3g > %.3g", a.rel_diff_max,
              LOGIT_TOL_ROUNDING);
        predictor_free(p);
    }
    unlink(side);
    model_free(&m);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pi2_predictor_agree_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[512];
    int rc = mkmodel("pwri.gguf", "--preset tiny --act relu --type q8_0 --pwri", path, sizeof path);
    CHECK(rc == 0, "mkmodel --pwri failed (is %s/bin/mkmodel built?)", test_build_dir());
    if (rc == 0) check_pwri(path);
    unlink(path);
    rc = mkmodel("silu.gguf", "--preset tiny --act silu --type f32", path, sizeof path);
    CHECK(rc == 0, "mkmodel --act silu failed");
    if (rc == 0) check_silu(path);
    unlink(path);
    rmdir(tmpdir);
    return test_summary();
}
