/* pi2-reorder: write a copy of a ReLU model with each layer's FFN neurons
 * renumbered by descending firing frequency on calibration prompts, so the hot
 * neurons are contiguous (lib/calib/reorder.h, docs/sparse.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/cli.h"
#include "util/clock.h"
#include "util/log.h"
#include "engine/model.h"
#include "calib/predictor_build.h"
#include "calib/reorder.h"

typedef struct {
    const char *in, *out;
    int n_tokens, gen, threads;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-reorder -m IN -o OUT [options]\n"
            "Runs calibration prompts through the reference engine, counts how often each FFN neuron\n"
            "fires, and writes a copy of IN (GGUF or PWRI, ReLU FFN) whose neurons are ordered by\n"
            "descending firing frequency in every layer. The model computes the same function (logits\n"
            "change by rounding only: the FFN sums in another order). PWRI and F32/F16 files get the\n"
            "full order; a quantized ffn_down keeps its 32-neuron blocks whole (exact), ordered by their\n"
            "summed firing. The order and counts are stored as pi2.reorder.* metadata.\n"
            "  -m, --model PATH   input model\n"
            "  -o, --output PATH  output model (written to PATH.tmp, then renamed)\n"
            "  -n, --tokens N     calibration tokens (default 512)\n"
            "      --gen N        greedy tokens generated after each prompt (default 32)\n"
            "  -t, --threads N    engine threads (default 2)\n"
            "  -h, --help         this text\n");
}

static int parse_args(options *o, int argc, char **argv) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"output", required_argument, 0, 'o'},
        {"tokens", required_argument, 0, 'n'}, {"gen", required_argument, 0, 1},
        {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:o:n:t:h", longs, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': o->in = optarg; break;
        case 'o': o->out = optarg; break;
        case 'n': bad = cli_parse_int(optarg, "--tokens", 1, 1 << 24, &o->n_tokens); break;
        case 1: bad = cli_parse_int(optarg, "--gen", 0, 1 << 16, &o->gen); break;
        case 't': bad = cli_parse_int(optarg, "--threads", 1, 256, &o->threads); break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) return -1;
    }
    if (optind != argc) return log_error("unexpected argument '%s'", argv[optind]), -1;
    if (!o->in || !o->out) return log_error("need -m IN and -o OUT (see -h)"), -1;
    return 0;
}

static int by_count_desc(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* Share of a layer's firings on its first fifth of neurons: in the chosen
 * order, and in the best order (hottest first). */
static void log_layer(int l, const uint32_t *counts, const int32_t *perm, int n_ff, uint32_t *sorted) {
    int head = n_ff / 5;
    uint64_t total = 0, ours = 0, best = 0;
    memcpy(sorted, counts, sizeof *sorted * (size_t)n_ff);
    qsort(sorted, (size_t)n_ff, sizeof *sorted, by_count_desc);
    for (int j = 0; j < n_ff; j++) {
        total += counts[j];
        if (j < head) ours += counts[perm[j]], best += sorted[j];
    }
    if (total)
        log_info("layer %2d: first 20%% of neurons take %.1f%% of firings (hottest-first: %.1f%%)", l,
                 100.0 * (double)ours / (double)total, 100.0 * (double)best / (double)total);
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o = {.n_tokens = 512, .gen = 32, .threads = 2};
    if (parse_args(&o, argc, argv)) return 2;
    char err[512];
    model m;
    if (model_load(&m, o.in, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    size_t cells = (size_t)m.n_layer * (size_t)m.n_ff;
    uint32_t *counts = malloc(sizeof *counts * cells), *sorted = malloc(sizeof *sorted * (size_t)m.n_ff);
    int32_t *perm = malloc(sizeof *perm * cells);
    int rc = 1;
    if (!counts || !sorted || !perm) {
        log_error("out of memory");
        goto out;
    }
    predictor_run_opts run = {predictor_calib_prompts, predictor_n_calib_prompts, o.n_tokens, o.gen, o.threads};
    double t0 = clock_seconds();
    int tokens = reorder_count_firing(&m, &run, counts, err, sizeof err);
    if (tokens <= 0) {
        log_error("%s: %s", o.in, tokens < 0 ? err : "no calibration token could be run");
        goto out;
    }
    log_info("counted firing on %d calibration tokens (%.1f s)", tokens, clock_seconds() - t0);
    int granularity = reorder_granularity(&m);
    if (granularity > 1) log_info("quantized ffn_down: neurons move in whole blocks of %d", granularity);
    for (int l = 0; l < m.n_layer; l++) {
        const uint32_t *c = counts + (size_t)l * m.n_ff;
        if (reorder_layer_perm(c, m.n_ff, granularity, perm + (size_t)l * m.n_ff)) {
            log_error("layer %d: cannot order %d neurons in blocks of %d", l, m.n_ff, granularity);
            goto out;
        }
        log_layer(l, c, perm + (size_t)l * m.n_ff, m.n_ff, sorted);
    }
    reorder_plan plan = {perm, counts, tokens, granularity};
    t0 = clock_seconds();
    if (reorder_write(&m, &plan, o.out, err, sizeof err)) {
        log_error("%s", err);
        goto out;
    }
    log_info("wrote %s (%.1f s)", o.out, clock_seconds() - t0);
    rc = 0;
out:
    free(counts);
    free(sorted);
    free(perm);
    model_free(&m);
    return rc;
}
