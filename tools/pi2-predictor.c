/* pi2-predictor: build, evaluate and inspect activation predictors.
 *   build: a lowrank predictor side file from a model's gate matrices
 *   eval:  recall / precision of a predictor (side file or PWRI fc1/fc2) against the true firing,
 *          and a predictor-mode engine's greedy-token agreement with the dense engine
 *   info:  a side file's metadata and per-layer thresholds */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/cli.h"
#include "util/clock.h"
#include "util/log.h"
#include "engine/model.h"
#include "calib/predictor_build.h"
#include "calib/prompts_file.h"
#include "calib/predictor_agree.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-predictor build -m MODEL -o PRED.gguf [options]\n"
            "       pi2-predictor eval -m MODEL [-P PRED.gguf] [options]\n"
            "       pi2-predictor info PRED.gguf\n"
            "build: factor every layer's gate matrix (randomized SVD) and calibrate per-layer\n"
            "       thresholds on sample prompts to a target recall of the true firing set.\n"
            "eval:  run prompts through the reference engine; per layer: recall, precision,\n"
            "       predicted vs true active fraction. Without -P: the model's PowerInfer fc1/fc2.\n"
            "       Then dense and predictor-mode engines side by side: neurons computed and FFN\n"
            "       bytes per token, greedy-token agreement fed dense's tokens (teacher-forced),\n"
            "       and the common prefix of their own greedy continuations (free-running).\n"
            "  -m, --model FILE     GGUF model\n"
            "  -o, --output FILE    side file to write (build)\n"
            "  -P, --predictor FILE side file to evaluate (eval)\n"
            "  -r, --rank R         factorization rank (default: min(128, min(n_embd, n_ff)/2))\n"
            "      --recall F       target recall on the calibration tokens (default 0.99)\n"
            "      --silu-keep F    SiLU models: fraction of neurons with the largest silu(gate)\n"
            "                       counted as firing (default 0.2)\n"
            "      --type T         predictor weights: f16 (default), f32 or q8_0\n"
            "      --power-iters N  subspace iterations of the randomized SVD (default 2)\n"
            "      --prompts FILE   one prompt per line (default: built-in prompts; build and eval\n"
            "                       use disjoint sets)\n"
            "  -n, --tokens N       tokens to run (default 256)\n"
            "      --gen N          greedy tokens generated after each prompt (default 16)\n"
            "      --free-gen N     eval: free-running greedy tokens per prompt (default 32; 0: skip)\n"
            "  -t, --threads N      threads (default 2)\n"
            "  -h, --help           this help\n");
}

typedef struct {
    const char *model_path, *out_path, *pred_path, *prompts_path;
    int rank, power_iters, n_tokens, gen, free_gen, threads;
    double recall, silu_keep;
    int type;
} options;

static int parse_args(int argc, char **argv, options *o) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"output", required_argument, 0, 'o'},
        {"predictor", required_argument, 0, 'P'}, {"rank", required_argument, 0, 'r'},
        {"recall", required_argument, 0, 1}, {"silu-keep", required_argument, 0, 2},
        {"type", required_argument, 0, 3}, {"power-iters", required_argument, 0, 4},
        {"prompts", required_argument, 0, 5}, {"tokens", required_argument, 0, 'n'},
        {"gen", required_argument, 0, 6}, {"free-gen", required_argument, 0, 7},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:o:P:r:n:t:h", longs, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'o': o->out_path = optarg; break;
        case 'P': o->pred_path = optarg; break;
        case 'r': bad = cli_parse_int(optarg, "--rank", 1, 1 << 16, &o->rank); break;
        case 1: bad = cli_parse_double(optarg, "--recall", 1e-3, 1, &o->recall); break;
        case 2: bad = cli_parse_double(optarg, "--silu-keep", 1e-3, 0.999, &o->silu_keep); break;
        case 3:
            o->type = ggml_type_from_name(optarg);
            if (o->type != GGML_TYPE_F32 && o->type != GGML_TYPE_F16 && o->type != GGML_TYPE_Q8_0) {
                log_error("--type: '%s' is not f16, f32 or q8_0", optarg);
                bad = 1;
            }
            break;
        case 4: bad = cli_parse_int(optarg, "--power-iters", 0, 20, &o->power_iters); break;
        case 5: o->prompts_path = optarg; break;
        case 'n': bad = cli_parse_int(optarg, "--tokens", 1, 1 << 24, &o->n_tokens); break;
        case 6: bad = cli_parse_int(optarg, "--gen", 0, 1 << 16, &o->gen); break;
        case 7: bad = cli_parse_int(optarg, "--free-gen", 0, 1 << 16, &o->free_gen); break;
        case 't': bad = cli_parse_int(optarg, "--threads", 1, 256, &o->threads); break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) return -1;
    }
    if (optind != argc) {
        log_error("unexpected argument '%s'", argv[optind]);
        return -1;
    }
    return 0;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

/* Per-layer recall / precision; returns the all-layer totals. */
static predictor_layer_stats print_table(const model *m, const predictor_layer_stats *s) {
    printf("%-6s %8s %9s %9s %9s %9s\n", "layer", "recall", "precision", "predicted", "true", "act_mass");
    predictor_layer_stats all = {0};
    for (int l = 0; l < m->n_layer; l++) {
        const predictor_layer_stats *x = &s[l];
        double cells = (double)x->tokens * m->n_ff;
        printf("%-6d %8.4f %9.4f %9.4f %9.4f %9.4f\n", l, ratio(x->hits, x->true_active), ratio(x->hits, x->predicted),
               ratio(x->predicted, cells), ratio(x->true_active, cells), ratio(x->mass_kept, x->mass_total));
        all.tokens += x->tokens;
        all.true_active += x->true_active;
        all.predicted += x->predicted;
        all.hits += x->hits;
        all.mass_total += x->mass_total;
        all.mass_kept += x->mass_kept;
    }
    double cells = (double)all.tokens * m->n_ff;
    printf("%-6s %8.4f %9.4f %9.4f %9.4f %9.4f\n", "all", ratio(all.hits, all.true_active), ratio(all.hits, all.predicted),
           ratio(all.predicted, cells), ratio(all.true_active, cells), ratio(all.mass_kept, all.mass_total));
    return all;
}

static void print_agreement(const model *m, const predictor_agreement *a, int free_gen) {
    double cells = (double)a->steps * m->n_layer * m->n_ff, mib = 1048576.0 * (double)a->steps;
    printf("\nagreement with dense: teacher-forced %llu tokens (both fed the same tokens); free-running %d greedy "
           "tokens after each of %llu prompts\n",
           (unsigned long long)a->steps, free_gen, (unsigned long long)a->free_prompts);
    printf("%-10s %9s %9s %10s %8s %8s %10s %10s %12s\n", "engine", "computed", "active", "ffn_MiB/tok", "top1",
           "in_top5", "diff_max", "diff_mean", "free_prefix");
    printf("%-10s %9.4f %9s %10.3f %8s %8s %10s %10s %12s\n", "dense", ratio(a->dense_computed, cells), "-",
           ratio(a->dense_bytes, mib), "-", "-", "-", "-", "-");
    char prefix[48];
    snprintf(prefix, sizeof prefix, "%.2f/%.2f", ratio(a->prefix_sum, a->free_prompts),
             ratio(a->free_possible, a->free_prompts));
    printf("%-10s %9.4f %9.4f %10.3f %8.4f %8.4f %10.4g %10.4g %12s\n", "predictor", ratio(a->computed, cells),
           ratio(a->active, cells), ratio(a->bytes, mib), ratio(a->top1_same, a->steps),
           ratio(a->top1_in_top5, a->steps), a->rel_diff_max, ratio(a->rel_diff_sum, a->steps), prefix);
    printf("(computed / active: fraction of all layers' neurons per token; diff: max |logit diff| / max |dense "
           "logit| per token; free_prefix: mean common prefix / mean tokens possible)\n");
}

static void print_summary(const model *m, const predictor *p, const predictor_layer_stats *all, int tokens,
                          const predictor_agreement *a, int free_gen) {
    double cells = (double)all->tokens * m->n_ff, steps_cells = (double)a->steps * m->n_layer * m->n_ff,
           mib = 1048576.0 * (double)a->steps;
    printf("summary: kind=%s rank=%d act=%s tokens=%d recall=%.4f precision=%.4f predicted=%.4f true=%.4f "
           "act_mass=%.4f predictor_mib_per_token=%.2f agree_tokens=%llu top1_agree=%.4f top1_in_top5=%.4f "
           "logit_diff_max=%.4g logit_diff_mean=%.4g free_gen=%d free_prompts=%llu free_prefix_mean=%.2f "
           "free_prefix_frac=%.4f computed=%.4f active=%.4f ffn_mib_per_token=%.3f dense_ffn_mib_per_token=%.3f\n",
           predictor_get_kind(p) == PREDICTOR_POWERINFER ? "powerinfer" : "lowrank", predictor_max_rank(p),
           ffn_act_name(m->act), tokens, ratio(all->hits, all->true_active), ratio(all->hits, all->predicted),
           ratio(all->predicted, cells), ratio(all->true_active, cells), ratio(all->mass_kept, all->mass_total),
           (double)predictor_bytes_per_token(p) / 1048576.0, (unsigned long long)a->steps,
           ratio(a->top1_same, a->steps), ratio(a->top1_in_top5, a->steps), a->rel_diff_max,
           ratio(a->rel_diff_sum, a->steps), free_gen,
           (unsigned long long)a->free_prompts, ratio(a->prefix_sum, a->free_prompts),
           ratio(a->prefix_sum, a->free_possible), ratio(a->computed, steps_cells), ratio(a->active, steps_cells),
           ratio(a->bytes, mib), ratio(a->dense_bytes, mib));
}

static int cmd_build_or_eval(bool build, const options *o) {
    if (!o->model_path || (build && !o->out_path)) {
        log_error(build ? "build needs -m MODEL and -o PRED.gguf" : "eval needs -m MODEL");
        return 1;
    }
    char err[512];
    model m;
    if (model_load(&m, o->model_path, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    char **file_prompts = NULL;
    int n_file = 0, rc = 1;
    predictor_run_opts run = {build ? predictor_calib_prompts : predictor_eval_prompts,
                              build ? predictor_n_calib_prompts : predictor_n_eval_prompts, o->n_tokens, o->gen,
                              o->threads};
    if (o->prompts_path) {
        n_file = calib_read_prompts(o->prompts_path, &file_prompts, err, sizeof err);
        if (n_file <= 0) {
            if (n_file < 0) log_error("%s", err);
            else log_error("%s has no prompts", o->prompts_path);
            n_file = 0;
            goto done;
        }
        run.prompts = (const char *const *)file_prompts;
        run.n_prompts = n_file;
    }
    double t0 = clock_seconds();
    if (build) {
        predictor_build_opts b = {o->out_path, o->rank, o->recall, o->silu_keep, (uint32_t)o->type, o->power_iters, run};
        if (predictor_build(&m, &b, err, sizeof err)) {
            log_error("%s", err);
            goto done;
        }
        log_info("built %s in %.1f s", o->out_path, clock_seconds() - t0);
        rc = 0;
        goto done;
    }
    predictor *p = predictor_load(&m, o->pred_path, err, sizeof err);
    if (!p) {
        log_error("%s", err);
        goto done;
    }
    predictor_layer_stats *stats = calloc((size_t)m.n_layer, sizeof *stats);
    int tokens = stats ? predictor_eval(&m, p, &run, stats, err, sizeof err) : -1;
    if (tokens < 0) {
        log_error("%s", stats ? err : "out of memory");
    } else {
        predictor_layer_stats all = print_table(&m, stats);
        log_info("evaluated %d tokens in %.1f s", tokens, clock_seconds() - t0);
        t0 = clock_seconds();
        predictor_agree_opts ao = {run, o->free_gen};
        predictor_agreement a;
        if (predictor_agree(&m, p, &ao, &a, err, sizeof err) < 0) {
            log_error("%s", err);
        } else {
            print_agreement(&m, &a, o->free_gen);
            print_summary(&m, p, &all, tokens, &a, o->free_gen);
            log_info("compared with dense in %.1f s", clock_seconds() - t0);
            rc = 0;
        }
    }
    free(stats);
    predictor_free(p);
done:
    calib_free_prompts(file_prompts, n_file > 0 ? n_file : 0);
    model_free(&m);
    return rc;
}

static int cmd_info(const char *path) {
    gguf_file g;
    char err[512];
    if (gguf_open(&g, path, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    gguf_str kind, input, act;
    uint64_t rank = 0, n_layer = 0, n_embd = 0, n_ff = 0, size = 0, fp = 0, calib = 0, n_thr = 0, n_cut = 0;
    double recall = 0;
    const void *thr = NULL, *cut = NULL;
    if (!gguf_get_str(&g, PRED_KEY_KIND, &kind) || !gguf_get_str(&g, PRED_KEY_INPUT, &input) ||
        !gguf_get_uint(&g, PRED_KEY_RANK, &rank) || !gguf_get_uint(&g, PRED_KEY_N_LAYER, &n_layer) ||
        !gguf_get_uint(&g, PRED_KEY_N_EMBD, &n_embd) || !gguf_get_uint(&g, PRED_KEY_N_FF, &n_ff) ||
        !gguf_get_arr(&g, PRED_KEY_THRESHOLDS, GGUF_FLOAT32, &n_thr, &thr) ||
        !gguf_get_arr(&g, PRED_KEY_GATE_CUT, GGUF_FLOAT32, &n_cut, &cut) || n_thr != n_layer || n_cut != n_layer) {
        log_error("%s: not a pi2 predictor side file (missing or malformed pi2.predictor.* metadata)", path);
        gguf_close(&g);
        return 1;
    }
    gguf_get_float(&g, PRED_KEY_RECALL, &recall);
    gguf_get_uint(&g, PRED_KEY_MODEL_SIZE, &size);
    gguf_get_uint(&g, PRED_KEY_FINGERPRINT, &fp);
    gguf_get_uint(&g, PRED_KEY_CALIB_TOKENS, &calib);
    bool has_act = gguf_get_str(&g, PRED_KEY_ACT, &act);
    uint64_t bytes = 0;
    uint32_t type = g.n_tensors ? g.tensors[0].type : 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) bytes += g.tensors[i].nbytes;
    printf("kind          %.*s\n", (int)kind.len, kind.ptr);
    printf("input         %.*s\n", (int)input.len, input.ptr);
    printf("activation    %.*s\n", has_act ? (int)act.len : 1, has_act ? act.ptr : "?");
    printf("rank          %llu\n", (unsigned long long)rank);
    printf("target recall %.4f\n", recall);
    printf("calibration   %llu tokens\n", (unsigned long long)calib);
    printf("model         %llu layers, n_embd %llu, n_ff %llu, file size %llu, fingerprint %016llx\n",
           (unsigned long long)n_layer, (unsigned long long)n_embd, (unsigned long long)n_ff, (unsigned long long)size,
           (unsigned long long)fp);
    printf("weights       %llu tensors, %s, %.2f MiB (read per token)\n", (unsigned long long)g.n_tensors,
           ggml_type_name(type), (double)bytes / 1048576.0);
    printf("%-6s %12s %10s\n", "layer", "threshold", "gate_cut");
    for (uint64_t l = 0; l < n_layer; l++) {
        float t, c; /* metadata arrays are not aligned */
        memcpy(&t, (const char *)thr + sizeof t * l, sizeof t);
        memcpy(&c, (const char *)cut + sizeof c * l, sizeof c);
        printf("%-6llu %12.5g %10.4g\n", (unsigned long long)l, t, c);
    }
    gguf_close(&g);
    return 0;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) {
        if (argc != 3) {
            log_error("usage: pi2-predictor info PRED.gguf");
            return 1;
        }
        return cmd_info(argv[2]);
    }
    if (strcmp(cmd, "build") && strcmp(cmd, "eval")) {
        log_error("unknown command '%s' (build, eval or info)", cmd);
        usage(stderr);
        return 1;
    }
    options o = {.rank = 0, .power_iters = 2, .n_tokens = 256, .gen = 16, .free_gen = 32, .threads = 2, .recall = 0.99,
                 .silu_keep = 0.2, .type = GGML_TYPE_F16};
    if (parse_args(argc - 1, argv + 1, &o)) return 1;
    if (!strcmp(cmd, "eval") && o.out_path) log_warn("-o is ignored by eval");
    return cmd_build_or_eval(!strcmp(cmd, "build"), &o);
}
