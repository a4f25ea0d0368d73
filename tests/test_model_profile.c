/* The planner's model profile (lib/calib/model_profile.h) on mkmodel's tiny models:
 *  - deterministic: two runs, and threads 1 and 2 (both modes), give the same bits;
 *  - gate-first counts equal reorder_count_firing's (its own observer);
 *  - cofired(i, i) is the count, cofired is symmetric and equals a brute-force
 *    count over the bitsets; progress is called once per token;
 *  - the counts recover mkmodel's planted firing probabilities (rebuilt through
 *    synth_model): Spearman correlation and the top-20 % overlap per layer;
 *  - predictor mode on a PWRI model names what the engine's chunked predictor
 *    path (predictor_prepare, predictor_rows by chunk, logit >= threshold)
 *    names; gate-first on a SiLU model, predictor mode without a predictor
 *    and other bad options are refused;
 *  - save / load round trip; load refuses a truncated file, a count that is not
 *    its bitset's popcount, a bit past n_tokens, another general.type or
 *    version, a missing key, tensors of another shape, and a profile of
 *    another model, each error naming the file;
 *  - rank_correlation on hand-checked cases (identical, reversed, ties);
 *  - a model whose weight is relabelled I32 (a type the GGUF reader now takes) is refused. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/model_profile.h"
#include "calib/reorder.h"
#include "engine/ffn_chunks.h"
#include "engine/predictor.h"
#include "gguf/gguf.h"
#include "mkmodel_run.h"
#include "synth/synth_model.h"
#include "test.h"
#include "util/clock.h"

static char dir[] = "/tmp/pi2-test-model-profile-XXXXXX";
static char err[1024];

/* mkmodel flags of the planted model, and the synth_params they give */
#define HOT_FLAGS "--preset tiny --act relu --hot 0.2:0.8 --fire 0.1 --seed 7"
static const synth_params hot_params = {.n_embd = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512,
                                        .n_vocab = 512, .relu = true, .seed = 7, .fire = 0.1, .hot_frac = 0.2,
                                        .hot_share = 0.8};

static bool load(const char *name, const char *flags, model *m, char *path, size_t cap) {
    if (mkmodel_run(dir, name, flags, path, cap) != 0) {
        CHECK(0, "mkmodel %s", flags);
        return false;
    }
    const bool ok = model_load(m, path, err, sizeof err) == 0;
    CHECK(ok, "loading %s: %s", path, err);
    return ok;
}

static model_profile_opts opts(ffn_mode mode, int n_tokens, int threads, const char *model_name) {
    return (model_profile_opts){.prompts = model_profile_builtin_prompts, .n_prompts = model_profile_n_builtin,
                                .n_tokens = n_tokens, .gen_per_prompt = 32, .mode = mode, .threads = threads,
                                .model_name = model_name};
}

static bool profiles_equal(const model_profile *a, const model_profile *b) {
    const size_t rows = (size_t)a->n_layer * (size_t)a->n_ff;
    return a->n_layer == b->n_layer && a->n_ff == b->n_ff && a->n_tokens == b->n_tokens && a->mode == b->mode &&
           a->words == b->words && a->source_size == b->source_size &&
           a->source_fingerprint == b->source_fingerprint && a->run_hash == b->run_hash &&
           !memcmp(a->counts, b->counts, sizeof *a->counts * rows) &&
           !memcmp(a->fired, b->fired, sizeof *a->fired * rows * (size_t)a->words) &&
           !a->guess_missed == !b->guess_missed &&
           (!a->guess_missed || !memcmp(a->guess_missed, b->guess_missed, sizeof *a->guess_missed * rows));
}

static bool bit(const model_profile *p, int l, int i, int t) {
    return p->fired[((size_t)l * (size_t)p->n_ff + (size_t)i) * (size_t)p->words + (size_t)t / 64] >> (t % 64) & 1;
}

typedef struct {
    int calls, last_done, last_total, out_of_order;
} progress_log;

static void on_progress(void *ctx, int done, int total) {
    progress_log *g = ctx;
    g->out_of_order += done != g->last_done + 1;
    g->calls++, g->last_done = done, g->last_total = total;
}

static void test_gate_first(const model *m, const char *path) {
    model_profile a, b, c;
    progress_log g = {0};
    model_profile_opts o = opts(FFN_GATE_FIRST, 300, 1, path);
    o.progress = on_progress, o.progress_ctx = &g;
    CHECK(model_profile_run(&a, m, &o, err, sizeof err) == 0, "%s", err);
    CHECK(a.n_tokens == 300 && a.words == 5 && a.n_layer == m->n_layer && a.n_ff == m->n_ff, "%d tokens, %d words",
          a.n_tokens, a.words);
    CHECK(g.calls == 300 && g.last_done == 300 && g.last_total == 300 && !g.out_of_order,
          "progress: %d calls, last %d of %d, %d out of order", g.calls, g.last_done, g.last_total, g.out_of_order);
    CHECK(a.source_size == (uint64_t)m->gguf.size && a.source_fingerprint == model_fingerprint(m) &&
              a.run_hash == model_profile_run_hash(&o),
          "source and prompts identity");
    o.progress = NULL;
    CHECK(model_profile_run(&b, m, &o, err, sizeof err) == 0 && profiles_equal(&a, &b), "two runs differ");
    o.threads = 2;
    CHECK(model_profile_run(&c, m, &o, err, sizeof err) == 0 && profiles_equal(&a, &c), "threads 1 and 2 differ");
    model_profile_opts fewer = o;
    fewer.n_prompts = o.n_prompts - 1;
    model_profile d;
    CHECK(model_profile_run(&d, m, &fewer, err, sizeof err) == 0 && d.run_hash != a.run_hash,
          "the run hash names the prompt set");
    model_profile_free(&d);
    model_profile_opts asked = o;
    asked.n_tokens = o.n_tokens + 1;
    CHECK(model_profile_run_hash(&asked) != a.run_hash, "the run hash names the tokens asked for");
    asked = o, asked.gen_per_prompt = o.gen_per_prompt + 1;
    CHECK(model_profile_run_hash(&asked) != a.run_hash, "the run hash names the greedy tokens per prompt");

    /* reorder's firing counts: the same prompts through its own observer */
    uint32_t *counts = malloc(sizeof *counts * (size_t)m->n_layer * (size_t)m->n_ff);
    predictor_run_opts ro = {o.prompts, o.n_prompts, o.n_tokens, o.gen_per_prompt, 1};
    CHECK(reorder_count_firing(m, &ro, counts, err, sizeof err) == 300, "reorder_count_firing: %s", err);
    CHECK(!memcmp(counts, a.counts, sizeof *counts * (size_t)m->n_layer * (size_t)m->n_ff), "counts differ from reorder's");
    uint64_t fired = 0;
    for (size_t k = 0; k < (size_t)m->n_layer * (size_t)m->n_ff; k++) fired += a.counts[k];
    printf("gate-first, %d tokens: %.1f%% of the neurons fire per token\n", a.n_tokens,
           100.0 * (double)fired / ((double)a.n_tokens * m->n_layer * m->n_ff));
    free(counts);

    int bad_diag = 0, bad_sym = 0, bad_brute = 0;
    for (int l = 0; l < a.n_layer; l++)
        for (int i = 0; i < a.n_ff; i++) {
            bad_diag += model_profile_cofired(&a, l, i, i) != a.counts[(size_t)l * (size_t)a.n_ff + (size_t)i];
            for (int j = i % 7; j < a.n_ff; j += 7) {
                uint32_t both = 0;
                for (int t = 0; t < a.n_tokens; t++) both += bit(&a, l, i, t) && bit(&a, l, j, t);
                bad_brute += model_profile_cofired(&a, l, i, j) != both;
                bad_sym += model_profile_cofired(&a, l, i, j) != model_profile_cofired(&a, l, j, i);
            }
        }
    CHECK(!bad_diag && !bad_sym && !bad_brute, "cofired: %d diagonal, %d asymmetric, %d wrong pairs", bad_diag,
          bad_sym, bad_brute);
    model_profile_free(&a), model_profile_free(&b), model_profile_free(&c);
}

/* The share of the top k by planted probability that are among the top k by count. */
static double top_overlap(const double *planted, const double *measured, int n, int k) {
    int both = 0;
    for (int i = 0; i < n; i++) {
        int above_p = 0, above_m = 0; /* neurons ranked before i: higher value, or equal and a lower index */
        for (int j = 0; j < n; j++) {
            above_p += planted[j] > planted[i] || (planted[j] == planted[i] && j < i);
            above_m += measured[j] > measured[i] || (measured[j] == measured[i] && j < i);
        }
        both += above_p < k && above_m < k;
    }
    return (double)both / k;
}

static void test_planted(const model *m, const char *path) {
    synth_model *sm = synth_model_new(&hot_params, err, sizeof err);
    CHECK(sm, "synth_model_new: %s", err);
    if (!sm) return;
    /* short greedy continuations: long ones loop on a synthetic model and skew its counts (seed 2 with 32
     * per prompt: top-20 % overlap 0.71; with 8, over seeds 1-4 and 7: Spearman 0.85-0.89, overlap 0.83-0.89) */
    model_profile p;
    model_profile_opts o = opts(FFN_GATE_FIRST, 512, 2, path);
    o.gen_per_prompt = 8;
    CHECK(model_profile_run(&p, m, &o, err, sizeof err) == 0 && p.n_tokens == 512, "%s", err);
    double *planted = malloc(sizeof(double) * (size_t)m->n_ff), *measured = malloc(sizeof(double) * (size_t)m->n_ff);
    for (int l = 0; l < m->n_layer; l++) {
        for (int i = 0; i < m->n_ff; i++) {
            planted[i] = synth_target_p(sm, l, i);
            measured[i] = p.counts[(size_t)l * (size_t)m->n_ff + (size_t)i];
        }
        const double rho = rank_correlation(planted, measured, m->n_ff);
        const double overlap = top_overlap(planted, measured, m->n_ff, m->n_ff / 5);
        printf("planted hot set, layer %d: Spearman %.3f, top-20%% overlap %.1f%%\n", l, rho, 100 * overlap);
        /* measured here 0.877 and 0.876, 87.3 % and 87.3 %; the counts are exact (== reorder's), the gap is
         * between mkmodel's targets and the firing these tokens realize */
        CHECK(rho >= 0.8, "layer %d: Spearman %.3f", l, rho);
        CHECK(overlap >= 0.8, "layer %d: top-20%% overlap %.3f", l, overlap);
    }
    free(planted), free(measured);
    model_profile_free(&p);
    synth_model_free(sm);
}

/* ---- predictor mode: the engine's chunked path, observed ---- */

typedef struct {
    const model *m;
    const predictor *pred;
    model_profile *want; /* filled here: bit t of the neurons the chunks select, and the guess's misses */
    float *hidden, *logits, *guess;
    act_vec conv;
    int token;
} engine_path;

/* logits[0..n_ff) as the cpu-workers' chunks compute them from x (predictor_prepare, then predictor_rows) */
static void chunk_logits(engine_path *e, int layer, const float *x, const float *ffn_in, float *logits) {
    predictor_prepare(e->pred, layer, x, ffn_in, e->hidden, &e->conv);
    for (int c = 0; c < ffn_chunk_count(e->m); c++) {
        long n0, n1;
        ffn_chunk_range(e->m, c, &n0, &n1);
        predictor_rows(e->pred, layer, &e->conv, n0, n1, logits + n0);
    }
}

static void engine_path_observer(void *ctx, const ffn_observation *o) {
    engine_path *e = ctx;
    const int layer = o->layer;
    if (layer == 0) e->token++;
    const float tau = predictor_threshold(e->pred, layer);
    chunk_logits(e, layer, o->residual, o->ffn_in, e->logits);
    /* the guess (cpu-worker/decode.c, step_prefetch): this model's predictor reads the residual, so the
     * layer's input as it is */
    chunk_logits(e, layer, o->layer_in, NULL, e->guess);
    for (long i = 0; i < e->m->n_ff; i++)
        if (e->logits[i] >= tau) {
            const size_t row = (size_t)layer * (size_t)e->m->n_ff + (size_t)i;
            e->want->fired[row * (size_t)e->want->words + (size_t)e->token / 64] |= 1ull << (e->token % 64);
            e->want->guess_missed[row] += e->guess[i] < tau;
        }
}

static void test_predictor_mode(const model *m, const char *path) {
    model_profile p, gf;
    model_profile_opts o = opts(FFN_PREDICTOR, 256, 2, path);
    CHECK(model_profile_run(&p, m, &o, err, sizeof err) == 0 && p.mode == FFN_PREDICTOR && p.n_tokens == 256, "%s",
          err);
    model_profile one;
    model_profile_opts o1 = opts(FFN_PREDICTOR, 256, 1, path);
    CHECK(model_profile_run(&one, m, &o1, err, sizeof err) == 0 && profiles_equal(&p, &one),
          "predictor mode: threads 1 and 2 differ");
    model_profile_free(&one);
    predictor *pred = predictor_load(m, NULL, err, sizeof err);
    CHECK(pred, "predictor_load: %s", err);
    if (!pred || !p.fired) goto out;
    const int rank = predictor_max_rank(pred), wide = rank > m->n_embd ? rank : m->n_embd;
    model_profile want = {.n_ff = m->n_ff, .words = p.words};
    const size_t rows = (size_t)m->n_layer * (size_t)m->n_ff;
    want.fired = calloc(rows * (size_t)p.words, sizeof *want.fired);
    want.guess_missed = calloc(rows, sizeof *want.guess_missed);
    CHECK(predictor_get_input(pred) == PREDICTOR_INPUT_RESIDUAL, "the test model's predictor reads the residual");
    engine_path e = {m, pred, &want, malloc(sizeof(float) * (size_t)rank), malloc(sizeof(float) * (size_t)m->n_ff),
                     malloc(sizeof(float) * (size_t)m->n_ff),
                     {.f16 = calloc((size_t)wide, sizeof(uint16_t)), .q8 = calloc((size_t)wide / QK8_0 + 1,
                                                                                  sizeof(block_q8_0))},
                     -1};
    predictor_run_opts ro = {o.prompts, o.n_prompts, o.n_tokens, o.gen_per_prompt, 1};
    CHECK(predictor_run_prompts(m, &ro, engine_path_observer, &e, err, sizeof err) == 256, "%s", err);
    CHECK(!memcmp(want.fired, p.fired, sizeof *p.fired * (size_t)m->n_layer * (size_t)m->n_ff * (size_t)p.words),
          "predictor mode's fired sets differ from the engine's chunked selection");
    CHECK(p.guess_missed && !memcmp(want.guess_missed, p.guess_missed, sizeof *p.guess_missed * rows),
          "the guess's misses differ from the chunked guess on each layer's input");
    uint64_t fired = 0, missed = 0;
    for (size_t r = 0; r < rows; r++) fired += p.counts[r], missed += p.guess_missed ? p.guess_missed[r] : 0;
    /* attention moves the residual a little: the guess misses a few of the neurons, not none, not most */
    CHECK(missed > 0 && missed < fired / 4, "the guess from the layer's input missed %llu of %llu firings",
          (unsigned long long)missed, (unsigned long long)fired);
    printf("the guess from each layer's input missed %.2f %% of the %llu selected neurons\n",
           100.0 * (double)missed / (double)(fired ? fired : 1), (unsigned long long)fired);
    free(want.fired), free(want.guess_missed), free(e.hidden), free(e.logits), free(e.guess), free(e.conv.f16),
        free(e.conv.q8);

    /* how the predicted sets compare with the true firing, for the record */
    o.mode = FFN_GATE_FIRST;
    CHECK(model_profile_run(&gf, m, &o, err, sizeof err) == 0, "%s", err);
    uint64_t predicted = 0, truth = 0, hits = 0;
    for (size_t w = 0; w < (size_t)m->n_layer * (size_t)m->n_ff * (size_t)p.words; w++) {
        predicted += (uint64_t)__builtin_popcountll(p.fired[w]);
        truth += (uint64_t)__builtin_popcountll(gf.fired[w]);
        hits += (uint64_t)__builtin_popcountll(p.fired[w] & gf.fired[w]);
    }
    printf("predictor mode on %d tokens: recall %.3f, precision %.3f of gate > 0\n", p.n_tokens,
           (double)hits / (double)truth, (double)hits / (double)predicted);
    model_profile_free(&gf);
out:
    predictor_free(pred);
    model_profile_free(&p);
}

static void expect_refusal(const char *what, const model *m, const model_profile_opts *o, const char *needle1,
                           const char *needle2) {
    model_profile p;
    err[0] = 0;
    const int rc = model_profile_run(&p, m, o, err, sizeof err);
    CHECK(rc == -1 && strstr(err, needle1) && strstr(err, needle2), "%s: rc %d, '%s'", what, rc, err);
    CHECK(!p.fired && !p.counts, "%s: the refused profile holds nothing", what);
    printf("refused (%s): %s\n", what, err);
}

static void test_refusals(const model *relu, const char *relu_path, const model *silu, const char *silu_path) {
    model_profile_opts o = opts(FFN_GATE_FIRST, 64, 1, silu_path);
    expect_refusal("gate-first on silu", silu, &o, silu_path, "silu");
    o = opts(FFN_PREDICTOR, 64, 1, relu_path);
    expect_refusal("predictor mode without a predictor", relu, &o, relu_path, "needs a predictor");
    o = opts(FFN_DENSE, 64, 1, relu_path);
    expect_refusal("dense mode", relu, &o, relu_path, "dense");
    o = opts(FFN_GATE_FIRST, 0, 1, relu_path);
    expect_refusal("no tokens", relu, &o, relu_path, "tokens");
}

/* ---- the file ---- */

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *buf = malloc(*n);
    if (buf && fread(buf, 1, *n, f) != *n) free(buf), buf = NULL;
    fclose(f);
    return buf;
}

static void write_all(const char *path, const unsigned char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n, "writing %s", path);
    if (f) fclose(f);
}

/* Offset of the first occurrence of needle[0..len) in buf, or -1. */
static long find_bytes(const unsigned char *buf, size_t n, const void *needle, size_t len) {
    for (size_t i = 0; i + len <= n; i++)
        if (!memcmp(buf + i, needle, len)) return (long)i;
    return -1;
}

/* File offset of tensor `name`'s data. */
static long tensor_offset(const char *path, const char *name) {
    gguf_file g;
    if (gguf_open(&g, path, err, sizeof err)) return -1;
    const gguf_tensor *t = gguf_find_tensor(&g, name);
    const long at = t ? (long)((const unsigned char *)t->data - g.base) : -1;
    gguf_close(&g);
    return at;
}

static void expect_load_error(const char *what, const char *path, const model *m, const char *model_path,
                              const char *needle) {
    model_profile p;
    err[0] = 0;
    const int rc = model_profile_load(&p, path, m, model_path, err, sizeof err);
    CHECK(rc == -1 && strstr(err, path) && strstr(err, needle), "%s: rc %d, '%s'", what, rc, err);
    CHECK(!p.fired && !p.counts, "%s: the refused profile holds nothing", what);
    printf("refused (%s): %s\n", what, err);
}

/* A copy of the profile file with one change: at `at`, the bytes of `with`. */
static void corrupt(const unsigned char *buf, size_t n, const char *path, long at, const void *with, size_t len) {
    unsigned char *copy = malloc(n);
    memcpy(copy, buf, n);
    CHECK(at >= 0 && (size_t)at + len <= n, "%s: offset %ld", path, at);
    if (at >= 0 && (size_t)at + len <= n) memcpy(copy + at, with, len);
    write_all(path, copy, n);
    free(copy);
}

/* A predictor-mode profile keeps the guess's misses through its file, and a count of them above the
 * neuron's firings is refused. */
/* A profile of `tokens` tokens in `mode` into p, saved as dir/name (path), read back with the model and
 * compared. */
static void profile_round_trip(const model *m, const char *model_path, ffn_mode mode, int tokens, const char *name,
                               model_profile *p, char *path, size_t path_len) {
    model_profile q;
    model_profile_opts o = opts(mode, tokens, 1, model_path);
    CHECK(model_profile_run(p, m, &o, err, sizeof err) == 0, "%s", err);
    snprintf(path, path_len, "%s/%s", dir, name);
    CHECK(model_profile_save(p, m, model_path, path, err, sizeof err) == 0, "save: %s", err);
    CHECK(model_profile_load(&q, path, m, model_path, err, sizeof err) == 0 && profiles_equal(p, &q),
          "%s round trip with the model: %s", ffn_mode_name(mode), err);
    model_profile_free(&q);
}

static void test_predictor_file(const model *m, const char *model_path) {
    model_profile p;
    char path[512], bad[600];
    profile_round_trip(m, model_path, FFN_PREDICTOR, 128, "pwri.profile", &p, path, sizeof path);
    CHECK(p.guess_missed, "a predictor-mode profile counts the guess's misses");
    size_t n;
    unsigned char *buf = read_all(path, &n);
    CHECK(buf, "reading %s", path);
    if (buf && p.counts) {
        snprintf(bad, sizeof bad, "%s/guess.profile", dir);
        const uint32_t more = p.counts[(size_t)p.n_ff + 7] + 1; /* layer 1, neuron 7 */
        corrupt(buf, n, bad, tensor_offset(path, "blk.1.guess_missed") + 7 * 4, &more, sizeof more);
        expect_load_error("more guess misses than firings", bad, m, model_path, "layer 1 neuron 7: the guess missed");
    }
    free(buf);
    model_profile_free(&p);
}

static void test_file(const model *m, const char *model_path, const model *other, const char *other_path) {
    model_profile p, q;
    char path[512], bad[600];
    /* 200 tokens: a partial last word */
    profile_round_trip(m, model_path, FFN_GATE_FIRST, 200, "relu.profile", &p, path, sizeof path);
    CHECK(model_profile_load(&q, path, NULL, NULL, err, sizeof err) == 0 && profiles_equal(&p, &q),
          "round trip without: %s", err);
    model_profile_free(&q);
    snprintf(bad, sizeof bad, "%s/other.profile", dir);
    CHECK(model_profile_save(&p, other, other_path, bad, err, sizeof err) == -1 && strstr(err, other_path),
          "saving under another model: '%s'", err);

    size_t n;
    unsigned char *buf = read_all(path, &n);
    CHECK(buf, "reading %s", path);
    if (!buf) goto out;
    snprintf(bad, sizeof bad, "%s/truncated.profile", dir);
    write_all(bad, buf, n - 100);
    expect_load_error("truncated", bad, m, model_path, "past the end");

    /* count of layer 1's neuron 3, one bit flipped: no longer its bitset's popcount */
    snprintf(bad, sizeof bad, "%s/count.profile", dir);
    const long counts_at = tensor_offset(path, "blk.1.counts") + 3 * 4;
    const unsigned char flipped = (unsigned char)(buf[counts_at] ^ 0x10);
    corrupt(buf, n, bad, counts_at, &flipped, 1);
    expect_load_error("a flipped count", bad, m, model_path, "layer 1 neuron 3: count");

    /* a bit for token 255 of layer 0's neuron 5: past n_tokens = 200 */
    snprintf(bad, sizeof bad, "%s/tail.profile", dir);
    const long word_at = tensor_offset(path, "blk.0.fired") + (5 * p.words + p.words - 1) * 8 + 7;
    const unsigned char high = (unsigned char)(buf[word_at] | 0x80);
    corrupt(buf, n, bad, word_at, &high, 1);
    expect_load_error("a bit past n_tokens", bad, m, model_path, "past n_tokens");

    snprintf(bad, sizeof bad, "%s/type.profile", dir);
    const char type_value[] = "\x0b\0\0\0\0\0\0\0pi2.profile";
    corrupt(buf, n, bad, find_bytes(buf, n, type_value, sizeof type_value - 1) + 8, "pi2.bundle!", 11);
    expect_load_error("another general.type", bad, m, model_path, "not a pi2 model profile");

    snprintf(bad, sizeof bad, "%s/version.profile", dir);
    const char version_key[] = "pi2.profile.version";
    const uint32_t version = MODEL_PROFILE_VERSION + 1;
    corrupt(buf, n, bad, find_bytes(buf, n, version_key, sizeof version_key - 1) + (long)sizeof version_key - 1 + 4,
            &version, sizeof version);
    expect_load_error("another version", bad, m, model_path, "version");

    /* n_tokens 300: 5 words a bitset, the tensors hold 4 */
    snprintf(bad, sizeof bad, "%s/tokens.profile", dir);
    const char tokens_key[] = "pi2.profile.n_tokens";
    const uint32_t tokens = 300;
    corrupt(buf, n, bad, find_bytes(buf, n, tokens_key, sizeof tokens_key - 1) + (long)sizeof tokens_key - 1 + 4,
            &tokens, sizeof tokens);
    expect_load_error("a shape that is not n_tokens'", bad, m, model_path, "tensor 'blk.0.fired' must be i8 of shape");

    snprintf(bad, sizeof bad, "%s/key.profile", dir);
    const char n_ff_key[] = "pi2.profile.n_ff";
    corrupt(buf, n, bad, find_bytes(buf, n, n_ff_key, sizeof n_ff_key - 1) + (long)sizeof n_ff_key - 2, "X", 1);
    expect_load_error("a missing key", bad, m, model_path, "'pi2.profile.n_ff' is missing");

    model_profile_free(&q);
    err[0] = 0;
    CHECK(model_profile_load(&q, path, other, other_path, err, sizeof err) == -1 && strstr(err, path) &&
              strstr(err, other_path) && strstr(err, "another model file") && strstr(err, "relu.gguf"),
          "another model: '%s'", err);
    printf("refused (another model): %s\n", err);
    free(buf);
out:
    model_profile_free(&p);
}

/* GGML_TYPE_I32 is a type the reader takes, never a weight: a model whose
 * (F32) ffn_gate or attn_norm is relabelled I32, the same byte size, is refused. */
static void test_i32_is_not_a_weight(const char *f32_path) {
    size_t n;
    unsigned char *buf = read_all(f32_path, &n);
    CHECK(buf, "reading %s", f32_path);
    if (!buf) return;
    static const struct {
        const char *name;
        int n_dims;
    } tensors[] = {{"blk.0.ffn_gate.weight", 2}, {"blk.0.attn_norm.weight", 1}};
    for (size_t k = 0; k < sizeof tensors / sizeof tensors[0]; k++) {
        char bad[600];
        snprintf(bad, sizeof bad, "%s/i32-%zu.gguf", dir, k);
        const uint32_t i32 = GGML_TYPE_I32;
        const long name_at = find_bytes(buf, n, tensors[k].name, strlen(tensors[k].name));
        corrupt(buf, n, bad, name_at + (long)strlen(tensors[k].name) + 4 + 8 * tensors[k].n_dims, &i32, sizeof i32);
        model m;
        err[0] = 0;
        CHECK(model_load(&m, bad, err, sizeof err) == -1 && strstr(err, tensors[k].name) &&
                  strstr(err, "not a weight type"),
              "%s as i32: '%s'", tensors[k].name, err);
        printf("refused (an i32 weight): %s\n", err);
    }
    free(buf);
}

static void test_rank_correlation(void) {
    const double a[] = {1, 2, 3, 4, 5}, up[] = {10, 20, 30, 40, 50}, down[] = {5, 4, 3, 2, 1};
    CHECK(fabs(rank_correlation(a, up, 5) - 1) < 1e-12, "identical order");
    CHECK(fabs(rank_correlation(a, down, 5) + 1) < 1e-12, "reversed order");
    /* ties: ranks 1, 2.5, 2.5, 4 against 1..4: 4.5 / sqrt(4.5 * 5) */
    const double tied[] = {1, 2, 2, 3}, four[] = {1, 2, 3, 4};
    CHECK(fabs(rank_correlation(tied, four, 4) - 3 / sqrt(10)) < 1e-12, "tie in a: %.15f",
          rank_correlation(tied, four, 4));
    /* ranks 1, 2, 3.5, 5, 3.5 against 1..5: 8 / sqrt(10 * 9.5) */
    const double b[] = {5, 6, 7, 8, 7};
    CHECK(fabs(rank_correlation(a, b, 5) - 8 / sqrt(95)) < 1e-12, "tie in b: %.15f", rank_correlation(a, b, 5));
    const double flat[] = {3, 3, 3, 3, 3};
    CHECK(rank_correlation(a, flat, 5) == 0 && rank_correlation(a, a, 1) == 0, "constant side or one value: 0");
}

static void time_1024(const model *m, const char *path) {
    model_profile p;
    model_profile_opts o = opts(FFN_GATE_FIRST, 1024, 2, path);
    o.gen_per_prompt = 64;
    const double t0 = clock_seconds();
    CHECK(model_profile_run(&p, m, &o, err, sizeof err) == 0 && p.n_tokens == 1024, "%d tokens: %s", p.n_tokens, err);
    printf("profiled %d tokens of a tiny model (%d layers x %d neurons) in %.2f s with 2 threads\n", p.n_tokens,
           m->n_layer, m->n_ff, clock_seconds() - t0);
    model_profile_free(&p);
}

int main(void) {
    test_rank_correlation();
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return test_summary();
    }
    char relu_path[512], other_path[512], hot_path[512], pwri_path[512], silu_path[512];
    model relu, other, hot, pwri, silu;
    if (load("relu.gguf", "--preset tiny --act relu --seed 3", &relu, relu_path, sizeof relu_path) &&
        load("other.gguf", "--preset tiny --act relu --seed 4", &other, other_path, sizeof other_path) &&
        load("hot.gguf", HOT_FLAGS, &hot, hot_path, sizeof hot_path) &&
        load("pwri.gguf", "--preset tiny --act relu --pwri --seed 5", &pwri, pwri_path, sizeof pwri_path) &&
        load("silu.gguf", "--preset tiny --act silu --seed 3", &silu, silu_path, sizeof silu_path)) {
        test_gate_first(&relu, relu_path);
        test_planted(&hot, hot_path);
        test_predictor_mode(&pwri, pwri_path);
        test_predictor_file(&pwri, pwri_path);
        test_refusals(&relu, relu_path, &silu, silu_path);
        test_file(&relu, relu_path, &other, other_path);
        time_1024(&relu, relu_path);
        char f32_path[512];
        if (mkmodel_run(dir, "f32.gguf", "--preset tiny --act relu --type f32", f32_path, sizeof f32_path) == 0)
            test_i32_is_not_a_weight(f32_path);
        else
            CHECK(0, "mkmodel --type f32");
        model_free(&relu), model_free(&other), model_free(&hot), model_free(&pwri), model_free(&silu);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
    return test_summary();
}
