/* The reference engine against llama.cpp's outputs (../shared/oracle):
 * greedy tokens and logits within the oracle README's tolerances, on the
 * oracle's GGUF files and on our own conversion of stories260K. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "oracle.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "mkmodel_run.h"
#include "test.h"

typedef struct {
    const char *model;   /* file name in the oracle folder */
    int steps;           /* steps compared (teacher-forced with the oracle's tokens) */
    int top_n;           /* how many of the top-5 logits are compared */
    float tol;           /* on those logits */
    int agree;           /* the first `agree` greedy tokens must be the oracle's */
    int agreeing;        /* and at least this many of all `steps` */
} expectation;

/* The oracle README's tolerances. */
static const expectation expectations[] = {
    {"stories260K", 48, 5, 1e-3f, 48, 48}, {"synth-f32", 48, 5, 1e-3f, 48, 48}, {"synth-f16", 32, 1, 2e-2f, 32, 32},
    {"synth-q8_0", 32, 1, 2e-2f, 32, 32},  {"synth-q4_0", 16, 1, 5e-2f, 16, 16},
};

/* Where a kernel set does not meet the README, the bound it does meet (so a
 * regression still fails), each with its cause. prompt 0: every prompt. */
typedef struct {
    const char *model;
    int prompt;
    float tol;           /* on the README's top-n logits over its steps */
    int agree, agreeing; /* as in expectation */
} deviation;

/* avx512-exact with the engine's llama.cpp compatibility (engine.h) computes
 * as llama.cpp does: each generated token as it computes a token alone, and
 * the prompt as its batch (tinyBLAS order for the F32 matrix products and the
 * attention products, lib/kernels/tinyblas.h). stories260K, synth-f32, synth-q8_0 and
 * synth-q4_0 p1/p2 agree to the oracle's printed digits over every step
 * (|dlogit| <= 1.9e-6). What is left: */
static const deviation exact_deviations[] = {
    /* A bug in llama.cpp's AMX Q4_0 kernel (build 4748, ggml-cpu/amx/mmq.cpp),
     * which runs prompt batches of Q4_0 weights: for batch rows (tokens) in a
     * whole group of 32 (here tokens 0-95 of the 117-token prompt), on the first
     * block of K, output columns n with n % 32 >= 16 (weight rows) get the quants
     * of weight row n - 16 paired with row n's scale. So llama.cpp's own prompt
     * KV cache is wrong; pi2 computes it correctly and differs from the first
     * step on (8 of the 16 teacher-forced tokens still agree). Emulating the bug
     * made p3 agree to the printed digits (measured before it was removed). */
    {"synth-q4_0", 3, 1.8f, 0, 8},
};

/* The product: the default avx512 set, token by token. Its faster summation
 * order in the Q4_0/Q8_0 dots (several accumulators instead of one serial
 * chain) makes last-bit differences that the random synthetic models amplify
 * (steps are identical until a rounding flips and then drift). */
static const deviation fast_deviations[] = {
    /* pi2 computes a prompt token as a generated one, because a token must get
     * the same bits whether it comes alone or in a batch (docs/stack.md:
     * npu-worker prefill and the token-by-token fallback both equal pi2-ref);
     * and its dot_f32 fuses the n % 64 leftovers (FFN down: 172 = 128 + 44)
     * and its SiLU uses the vector exp for the n % 16 tail neurons, where ggml
     * multiplies then adds and calls libm's expf. Those are all the difference
     * (the exact run above agrees to the printed digits); this small real
     * model carries them into its logits: 1.9e-3, 4.6e-3, 7.6e-3 measured. */
    {"stories260K", 1, 2.5e-3f, 48, 48},
    {"stories260K", 2, 6e-3f, 48, 48},
    {"stories260K", 3, 9e-3f, 48, 48},
    {"synth-q8_0", 0, 1e-1f, 32, 32},    /* summation order: 5.2e-2 to 7.7e-2 measured */
    {"synth-q4_0", 3, 1.8f, 0, 8},       /* llama.cpp's AMX bug (above), then summation order */
};

/* The scalar reference, the set every CPU has (the only one on ARM64 today),
 * in pi2's order. Its dots sum in one serial chain (per element for F32/F16,
 * per block for Q8_0/Q4_0) where llama.cpp's SIMD code keeps 8 to 16 lanes;
 * the small real model and the random Q8_0 one carry that into their logits
 * (measured on x86-64 and under qemu-aarch64 alike: stories260K 8.5e-3,
 * 3.8e-3, 4.2e-3; synth-q8_0 4.1e-2 to 6.8e-2, p1's greedy tokens part after
 * 26 steps, 31 of 32 agree). */
static const deviation scalar_deviations[] = {
    {"stories260K", 1, 1.1e-2f, 48, 48},
    {"stories260K", 2, 5e-3f, 48, 48},
    {"stories260K", 3, 5.5e-3f, 48, 48},
    {"synth-q8_0", 0, 1e-1f, 32, 32},
    {"synth-q8_0", 1, 1e-1f, 26, 31},
    {"synth-q4_0", 3, 1.8f, 0, 7},       /* llama.cpp's AMX bug (above), then summation order */
};

/* The avx2 set (the fastest on a CPU without AVX-512), in its own order:
 * several accumulator lanes, Q4_0 blocks by pairs (kernels_avx2.h). Measured:
 * stories260K 2.9e-3, 9.5e-4, 3.9e-3; synth-q8_0 5.1e-2 to 7.7e-2, p3's
 * greedy tokens part after 2 steps at a near tie (30 of 32 agree). */
static const deviation avx2_deviations[] = {
    {"stories260K", 1, 1.1e-2f, 48, 48},
    {"stories260K", 2, 5e-3f, 48, 48},
    {"stories260K", 3, 5.5e-3f, 48, 48},
    {"synth-q8_0", 0, 1e-1f, 32, 32},
    {"synth-q8_0", 3, 1e-1f, 2, 30},
    {"synth-q4_0", 3, 1.8f, 0, 7},       /* llama.cpp's AMX bug (above), then summation order */
};

typedef struct {
    const char *kernels; /* kernels_by_name */
    bool llama;          /* engine_set_llama_compat */
    const deviation *deviations;
    size_t n_deviations;
} kernel_run;

static const kernel_run runs[] = {
    {"avx512-exact", true, exact_deviations, sizeof exact_deviations / sizeof *exact_deviations},
    {"avx512", false, fast_deviations, sizeof fast_deviations / sizeof *fast_deviations},
    {"scalar", false, scalar_deviations, sizeof scalar_deviations / sizeof *scalar_deviations},
    {"avx2", false, avx2_deviations, sizeof avx2_deviations / sizeof *avx2_deviations},
};

static expectation effective(const expectation *x, const kernel_run *run, int prompt) {
    expectation e = *x;
    for (size_t i = 0; i < run->n_deviations; i++) {
        const deviation *d = &run->deviations[i];
        if (strcmp(d->model, x->model) || (d->prompt && d->prompt != prompt)) continue;
        e.tol = d->tol;
        e.agree = d->agree;
        e.agreeing = d->agreeing;
    }
    return e;
}

/* Teacher-forced: feed the oracle's prompt and chosen tokens, compare each step's logits. */
static void check_case(const kernels *k, bool llama, const char *model_path, const char *case_path,
                       const expectation *x, int threads) {
    char err[512];
    oracle_case oc;
    if (oracle_load(&oc, case_path, err, sizeof err)) { CHECK(0, "%s", err); return; }
    model m;
    if (model_load(&m, model_path, err, sizeof err)) { CHECK(0, "%s", err); oracle_free(&oc); return; }
    engine *e = engine_new_with_kernels(&m, k, threads, 512, err, sizeof err); /* the oracle's context */
    CHECK(e != NULL, "%s", err);
    if (e && llama && engine_set_llama_compat(e, true, err, sizeof err)) {
        CHECK(0, "%s: %s", model_path, err);
        engine_free(e);
        e = NULL;
    }
    if (e) {
        float *logits = engine_prefill(e, oc.prompt_tokens, oc.n_prompt);
        const int steps = x->steps < oc.n_steps ? x->steps : oc.n_steps;
        int leading = -1, agreeing = 0; /* tokens equal to the oracle's before the first that is not; in all */
        float worst = 0;
        for (int s = 0; s < steps && logits; s++) {
            const oracle_step *st = &oc.steps[s];
            const int same = argmax(logits, m.n_vocab) == st->token;
            agreeing += same;
            if (!same && leading < 0) leading = s;
            for (int k = 0; k < x->top_n && k < st->n_top; k++) {
                float d = fabsf(logits[st->top_id[k]] - st->top_logit[k]);
                if (d > worst) worst = d;
            }
            logits = engine_forward(e, st->token, oc.n_prompt + s);
        }
        CHECK(logits != NULL, "%s: forward failed", case_path);
        if (leading < 0) leading = steps;
        const int want_leading = x->agree < steps ? x->agree : steps, want_agreeing = x->agreeing < steps ? x->agreeing : steps;
        CHECK(leading >= want_leading && agreeing >= want_agreeing,
              "%s on %s (%s, t=%d): the first %d greedy tokens agree, %d of %d in all (want %d, %d)", case_path,
              model_path, k->name, threads, leading, agreeing, steps, want_leading, want_agreeing);
        CHECK(worst <= x->tol, "%s on %s (%s, t=%d): logit differs by %g > %g", case_path, model_path, k->name,
              threads, worst, x->tol);
        printf("%-12s %-5s %-20s %-26s t=%d  tokens: first %2d of %2d agree, %2d in all  max |dlogit| %.2e (tol %.1e)\n",
               k->name, llama ? "llama" : "pi2", strrchr(case_path, '/') + 1, strrchr(model_path, '/') + 1, threads, leading, steps, agreeing,
               worst, x->tol);
        engine_free(e);
    }
    model_free(&m);
    oracle_free(&oc);
}

/* Our conversion's vocabulary tokenizes the oracle's prompt as llama.cpp did. */
static void check_prompt_tokens(const char *model_path, const char *case_path) {
    char err[512];
    oracle_case oc;
    if (oracle_load(&oc, case_path, err, sizeof err)) { CHECK(0, "%s", err); return; }
    gguf_file g;
    if (gguf_open(&g, model_path, err, sizeof err)) { CHECK(0, "%s", err); oracle_free(&oc); return; }
    tokenizer *t = tokenizer_from_gguf(&g, err, sizeof err);
    CHECK(t != NULL, "%s: %s", model_path, err);
    if (t) {
        int32_t ids[1024];
        const int n = tokenizer_encode(t, oc.prompt, 1, ids, 1024);
        CHECK(n == oc.n_prompt && memcmp(ids, oc.prompt_tokens, sizeof *ids * (size_t)n) == 0,
              "%s: %s tokenizes the prompt differently (%d tokens, llama.cpp %d)", case_path, model_path, n,
              oc.n_prompt);
        tokenizer_free(t);
    }
    gguf_close(&g);
    oracle_free(&oc);
}

static int convert_stories(char *out, size_t cap) {
    snprintf(out, cap, "/tmp/pi2-test-stories-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s %s/bin/convert-llama2c -i models/stories260K.bin -k models/tok512.bin -o %s 2>/dev/null",
             test_exec_wrap(), test_build_dir(), out);
    return system(cmd);
}

/* A model read into memory (model_load_resident, pi2-ref --load) computes
 * exactly what the mapped one does: same bytes, other pages. */
static void check_resident_matches_mapped(const char *model_path) {
    char err[512];
    model mapped, resident;
    if (model_load(&mapped, model_path, err, sizeof err)) { CHECK(0, "%s", err); return; }
    if (model_load_resident(&resident, model_path, err, sizeof err)) { CHECK(0, "%s", err); model_free(&mapped); return; }
    CHECK(resident.resident != NULL && resident.tok_embd.data != mapped.tok_embd.data, "resident model still points into the mapping");
    engine *a = engine_new(&mapped, 2, 64, err, sizeof err), *b = engine_new(&resident, 2, 64, err, sizeof err);
    int same = a && b;
    for (int pos = 0; pos < 8 && same; pos++) {
        float *la = engine_forward(a, 1 + pos * 7, pos), *lb = engine_forward(b, 1 + pos * 7, pos);
        same = la && lb && !memcmp(la, lb, sizeof(float) * (size_t)mapped.n_vocab);
    }
    CHECK(same, "%s: resident and mapped models give different logits", model_path);
    engine_free(a);
    engine_free(b);
    model_free(&resident);
    model_free(&mapped);
}

int main(void) {
    char path[512], model_path[512], ours[256];
    int converted = convert_stories(ours, sizeof ours) == 0;
    CHECK(converted, "convert-llama2c failed on models/stories260K.bin");
    snprintf(model_path, sizeof model_path, "%s/oracle/synth-q4_0.gguf", shared_dir());
    check_resident_matches_mapped(model_path);
    for (int p = 1; p <= 3 && converted; p++) {
        snprintf(path, sizeof path, "%s/oracle/llama.cpp/stories260K.p%d.json", shared_dir(), p);
        check_prompt_tokens(ours, path);
    }
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        const kernels *k = kernels_by_name(runs[r].kernels);
        if (!k) {
            SKIP("kernel set %s (this CPU lacks it)", runs[r].kernels);
            continue;
        }
        for (size_t i = 0; i < sizeof expectations / sizeof *expectations; i++) {
            const expectation *x = &expectations[i];
            snprintf(model_path, sizeof model_path, "%s/oracle/%s.gguf", shared_dir(), x->model);
            for (int p = 1; p <= 3; p++) {
                snprintf(path, sizeof path, "%s/oracle/llama.cpp/%s.p%d.json", shared_dir(), x->model, p);
                expectation now = effective(x, &runs[r], p);
                check_case(k, runs[r].llama, model_path, path, &now, p == 1 ? 1 : 2);
                if (converted && !strcmp(x->model, "stories260K")) check_case(k, runs[r].llama, ours, path, &now, 2);
            }
        }
    }
    if (converted) unlink(ours);
    return test_summary();
}
