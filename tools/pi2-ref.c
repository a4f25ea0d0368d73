/* pi2-ref: the single-process reference engine. Streams generated text to
 * stdout; timings to stderr. Every later part of pi2 is checked against it. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/cli.h"
#include "util/clock.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "util/log.h"
#include "engine/model.h"
#include "engine/predictor.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

typedef struct {
    const char *model_path, *prompt;
    int n_predict, n_threads, n_ctx, top_k;
    float temp, top_p;
    uint64_t seed;
    int ignore_eos, load;
    ffn_mode ffn;
    const char *predictor_path;
    int llama_compat, token_prompt;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-ref -m MODEL.gguf [-p PROMPT] [-n N] [-t THREADS] [options]\n"
            "  -m, --model FILE     GGUF model (llama or bamboo architecture; GGUF or PWRI magic)\n"
            "  -p, --prompt TEXT    prompt (default: empty, generation starts from BOS)\n"
            "  -n, --n-predict N    tokens to generate (default 64)\n"
            "  -t, --threads N      threads (default 2)\n"
            "  -c, --ctx-size N     context length (default: the model's)\n"
            "      --temp T         temperature; 0 = greedy (default 0.8)\n"
            "      --top-k K        keep the K most likely tokens; 0 = all (default 40)\n"
            "      --top-p P        nucleus sampling threshold (default 0.95)\n"
            "  -s, --seed N         sampling seed (default: from the clock)\n"
            "      --ignore-eos     keep generating after end-of-sequence\n"
            "      --load           read the model into memory on 2 MiB pages instead of mapping it\n"
            "                       (needs RAM for the whole file; fewer TLB misses, faster decode)\n"
            "      --ffn MODE       how the FFN is computed (docs/sparse.md):\n"
            "                         dense       every neuron (default)\n"
            "                         gate-first  ReLU models: every gate row, then up and down only for\n"
            "                                     the neurons that fire (exact)\n"
            "                         predictor   only the neurons a predictor names: PowerInfer's fc1/fc2\n"
            "                                     from a PWRI file, or --predictor FILE (approximate)\n"
            "      --predictor FILE a predictor side file from pi2-predictor build (no --ffn: predictor)\n"
            "                       (the prompt always runs dense, as the stack's prefill; generated tokens\n"
            "                       in MODE)\n"
            "      --llama-compat   reproduce llama.cpp's CPU outputs to their last digits (SiLU models,\n"
            "                       dense FFN, AVX-512): its summation orders, and the prompt as one\n"
            "                       batch as llama.cpp runs it (slower; a check, not the product's path)\n"
            "      --token-prompt   run the prompt token by token, as the stack does without an npu-worker\n"
            "                       (default: the npu-worker's prompt pass, docs/prefill.md)\n"
            "  -h, --help           this help\n"
            "Environment: PI2_LOG=debug|info|warn|error, PI2_KERNELS=scalar|avx2|avx512|avx512-exact|amx\n");
}

static int parse_args(int argc, char **argv, options *o) {
    enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_IGNORE_EOS, OPT_LOAD, OPT_FFN, OPT_PREDICTOR, OPT_LLAMA, OPT_TOKEN_PROMPT };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        {"ctx-size", required_argument, 0, 'c'}, {"seed", required_argument, 0, 's'},
        {"temp", required_argument, 0, OPT_TEMP}, {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP}, {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"load", no_argument, 0, OPT_LOAD}, {"ffn", required_argument, 0, OPT_FFN},
        {"predictor", required_argument, 0, OPT_PREDICTOR}, {"llama-compat", no_argument, 0, OPT_LLAMA},
        {"token-prompt", no_argument, 0, OPT_TOKEN_PROMPT}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (options){.prompt = "", .n_predict = 64, .n_threads = 2, .top_k = 40, .temp = 0.8f, .top_p = 0.95f,
                   .seed = (uint64_t)time(NULL)};
    long v;
    int c, ffn_given = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:s:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': if (cli_parse_int(optarg, "-n", 0, 1 << 24, &o->n_predict)) return -1; break;
        case 't': if (cli_parse_int(optarg, "-t", 1, 256, &o->n_threads)) return -1; break;
        case 'c': if (cli_parse_int(optarg, "-c", 1, 1 << 22, &o->n_ctx)) return -1; break;
        case 's': if (cli_parse_long(optarg, "--seed", 0, __LONG_MAX__, &v)) return -1; o->seed = (uint64_t)v; break;
        case OPT_TEMP: if (cli_parse_float(optarg, "--temp", &o->temp)) return -1; break;
        case OPT_TOPK: if (cli_parse_int(optarg, "--top-k", 0, 1 << 24, &o->top_k)) return -1; break;
        case OPT_TOPP: if (cli_parse_float(optarg, "--top-p", &o->top_p)) return -1; break;
        case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
        case OPT_LOAD: o->load = 1; break;
        case OPT_FFN: if (ffn_mode_parse_flag(optarg, "--ffn", &o->ffn, NULL)) return -1; ffn_given = 1; break;
        case OPT_PREDICTOR: o->predictor_path = optarg; break;
        case OPT_LLAMA: o->llama_compat = 1; break;
        case OPT_TOKEN_PROMPT: o->token_prompt = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (o->predictor_path && !ffn_given) o->ffn = FFN_PREDICTOR;
    if (!o->model_path) { log_error("no model given (-m FILE)"); usage(stderr); return -1; }
    return 0;
}

static void emit(const tokenizer *tok, int token) {
    char piece[256];
    size_t n = tokenizer_piece(tok, token, piece, sizeof piece);
    fwrite(piece, 1, n, stdout);
    fflush(stdout);
}

static int generate(const options *o, const model *m, const tokenizer *tok, engine *e, const predictor *pred) {
    int n_ctx = engine_n_ctx(e);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n_ctx);
    if (!tokens) { log_error("out of memory"); return -1; }
    int n_prompt = tokenizer_encode(tok, o->prompt, tokenizer_adds_bos(tok), tokens, n_ctx);
    if (n_prompt < 0) {
        log_error("the prompt needs more than the context's %d tokens", n_ctx);
        free(tokens);
        return -1;
    }
    fputs(o->prompt, stdout);
    sampler smp;
    sampler_init(&smp, o->temp, o->top_k, o->top_p, o->seed);
    double t0 = clock_seconds(), t_prompt = 0;
    float *logits = NULL;
    char err[256];
    /* the prompt with a dense FFN, as the stack's prefill; generated tokens in the chosen mode */
    engine_set_ffn_mode(e, FFN_DENSE, NULL, err, sizeof err);
    logits = engine_prefill(e, tokens, n_prompt);
    t_prompt = clock_seconds() - t0;
    if (engine_set_ffn_mode(e, o->ffn, pred, err, sizeof err)) {
        log_error("%s", err);
        free(tokens);
        return -1;
    }
    int n_gen = 0, pos = n_prompt;
    double ffn_active = 0, ffn_bytes = 0; /* summed over decode steps */
    double t1 = clock_seconds();
    while (n_gen < o->n_predict) {
        int next = sampler_sample(&smp, logits, m->n_vocab);
        if (next == tokenizer_eos(tok) && !o->ignore_eos) break;
        emit(tok, next);
        n_gen++;
        if (pos >= n_ctx) { log_warn("context of %d tokens is full", n_ctx); break; }
        logits = engine_forward(e, next, pos++);
        engine_ffn_stats_t st;
        engine_ffn_stats(e, &st);
        ffn_active += (double)st.active;
        ffn_bytes += (double)st.bytes;
    }
    double t_gen = clock_seconds() - t1;
    fputc('\n', stdout);
    double gen_rate = n_gen / (t_gen > 0 ? t_gen : 1e-9), bytes = (double)model_bytes_per_token(m);
    log_info("prompt: %d tokens in %.3f s (%.2f tok/s); generated: %d tokens in %.3f s (%.2f tok/s)", n_prompt,
             t_prompt, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9), n_gen, t_gen, gen_rate);
    if (o->ffn != FFN_DENSE && n_gen > 0) {
        const double per_token = ffn_bytes / n_gen, dense_ffn = (double)model_ffn_bytes_per_token(m);
        bytes += per_token - dense_ffn;
        log_info("%s FFN: active fraction %.4f, %.2f MB of FFN weights touched per token (dense %.2f MB)",
                 ffn_mode_name(o->ffn), ffn_active / n_gen / ((double)m->n_layer * m->n_ff), per_token / 1e6,
                 dense_ffn / 1e6);
    }
    log_info("decode streams %.1f MB of weights per token: %.2f GB/s", bytes / 1e6, gen_rate * bytes / 1e9);
    sampler_free(&smp);
    free(tokens);
    return 0;
}

/* Loads the predictor (if the mode needs one) and sets the engine up; 0, or -1 after logging why. */
static int setup_engine(const options *o, const model *m, engine *e, predictor **pred) {
    char err[512];
    engine_set_token_prompt(e, o->token_prompt);
    if (o->llama_compat && engine_set_llama_compat(e, true, err, sizeof err)) {
        log_error("--llama-compat: %s", err);
        return -1;
    }
    if (o->ffn == FFN_PREDICTOR && !(*pred = predictor_load(m, o->predictor_path, err, sizeof err))) {
        log_error("%s", err);
        return -1;
    }
    if (engine_set_ffn_mode(e, o->ffn, *pred, err, sizeof err)) {
        log_error("%s: %s", o->model_path, err);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(argc, argv, &o)) return 2;
    char err[512];
    model m;
    double t_load = clock_seconds();
    int load_failed = o.load ? model_load_resident(&m, o.model_path, err, sizeof err)
                             : model_load(&m, o.model_path, err, sizeof err);
    if (load_failed) { log_error("%s", err); return 1; }
    if (o.load) log_info("read %s into memory in %.2f s", o.model_path, clock_seconds() - t_load);
    int rc = 1;
    engine *e = NULL;
    predictor *pred = NULL;
    tokenizer *tok = tokenizer_from_gguf(&m.gguf, err, sizeof err);
    if (!tok) { log_error("%s: %s", o.model_path, err); goto out; }
    if (tokenizer_n_vocab(tok) != m.n_vocab) log_warn("tokenizer has %d tokens, the model %d", tokenizer_n_vocab(tok), m.n_vocab);
    const kernels *k = o.llama_compat ? kernels_by_name("avx512-exact") : kernels_best();
    if (!k) { log_error("--llama-compat needs AVX-512 (the avx512-exact kernels)"); goto out; }
    if (!(e = engine_new_with_kernels(&m, k, o.n_threads, o.n_ctx, err, sizeof err))) { log_error("%s", err); goto out; }
    if (setup_engine(&o, &m, e, &pred)) goto out;
    log_info("%s: %s, %d layers, dim %d, ffn %d (%s, %s), vocab %d, ctx %d, %d threads", o.model_path, m.arch,
             m.n_layer, m.n_embd, m.n_ff, ffn_act_name(m.act), ffn_mode_name(o.ffn),
             m.n_vocab, engine_n_ctx(e), o.n_threads);
    rc = generate(&o, &m, tok, e, pred) ? 1 : 0;
out:
    engine_free(e);
    predictor_free(pred);
    tokenizer_free(tok);
    model_free(&m);
    return rc;
}
