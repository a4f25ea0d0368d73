/* planner: pi2's offline step (docs/planner.md). `pi2 plan` measures the
 * machine (cached) and the model's firing on calibration prompts, chooses how
 * neurons are bundled and what the memory budget keeps resident, predicts the
 * decode speed, and writes the bundle file and the plan; `pi2 plan show`
 * prints a plan. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "calib/model_profile.h"
#include "plan/plan_file.h"
#include "plan_build.h"
#include "plan_report.h"
#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/log.h"
#include "util/mem_limit.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2 plan -m MODEL (--mem-budget SIZE | --target-speed TOK_S) -o DIR [options]\n"
            "       pi2 plan show PLAN\n"
            "Plans how MODEL runs in a memory budget on this machine: measures the machine (once, cached),\n"
            "profiles which FFN neurons fire on calibration prompts, bundles the neurons for storage\n"
            "reads, pins the most needed bundles in memory and predicts the decode speed. Writes to DIR:\n"
            "plan.pb (the plan), bundles.gguf (the bundle file), model-profile.gguf, curve.svg.\n"
            "  -m, --model PATH        the model (GGUF or PWRI, ReLU FFN)\n"
            "  -o, --output DIR        where the plan goes (created)\n"
            "      --mem-budget SIZE   memory for the whole stack: 2G, 1536M, or 50%% (of what this\n"
            "                          process may use: its memory cgroup's limit, else MemAvailable)\n"
            "      --target-speed X    the smallest budget predicted to decode X tok/s (with --mem-budget:\n"
            "                          refused if that is more than the budget)\n"
            "  -c, --config FILE       the stack config the plan is for (default: configs/default.conf's)\n"
            "  -f, --prompts FILE      more calibration prompts, one per line, after the built-in ones\n"
            "  -n, --tokens N          calibration tokens (default 1024), at most what the prompts give\n"
            "                          (the built-in ones about a thousand; -f for more)\n"
            "      --ctx N             context the KV cache is sized for (default 1024, as pi2 up)\n"
            "      --mode MODE         predictor or gate-first (default: predictor if MODEL has one or\n"
            "                          --predictor is given)\n"
            "      --predictor FILE    a pi2-predictor side file for predictor mode (a GGUF model's)\n"
            "      --order ORDER       which neurons of a layer are pinned first: profile (the calibration's\n"
            "                          hottest) or file (the model's own order, for a file pi2-reorder made\n"
            "                          hottest-first: a prompt then copies the pinned rows instead of reading\n"
            "                          them); default file for such a file, else profile\n"
            "      --reprofile         measure the machine again instead of using the cached profile\n"
            "      --hw-point-seconds S  time per measured point of the hardware profile (default 0.2;\n"
            "                          the whole profile takes about 65 times that)\n"
            "  -t, --threads N         engine threads for the model profile (default 2)\n"
            "  -h, --help              this text\n");
}

/* "2G", "1536M", "64K", "3000000" (bytes), "50%" of the memory this process may use */
static int parse_budget(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    double scale = 1;
    if (end == s || errno || !(v > 0)) goto bad;
    if (strcmp(end, "%") == 0) {
        mem_limit lim;
        if (v > 100 || mem_limit_read("", &lim)) goto bad;
        *out = (uint64_t)(v / 100 * (double)lim.bytes);
        log_info("--mem-budget %s: %.0f MiB of %.0f MiB (%s)", s, *out / 1048576.0, lim.bytes / 1048576.0, lim.source);
        return 0;
    }
    switch (*end) {
    case 'K': case 'k': scale = 1024.0, end++; break;
    case 'M': case 'm': scale = 1048576.0, end++; break;
    case 'G': case 'g': scale = 1073741824.0, end++; break;
    case '\0': break;
    default: goto bad;
    }
    if (strcmp(end, "") && strcmp(end, "i") && strcmp(end, "iB") && strcmp(end, "B")) goto bad;
    if (v * scale > 1e18) goto bad;
    *out = (uint64_t)(v * scale);
    return 0;
bad:
    log_error("--mem-budget '%s': not a size (2G, 1536M, 50%%)", s);
    return -1;
}

static int parse_args(plan_options *o, int argc, char **argv) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},    {"output", required_argument, 0, 'o'},
        {"mem-budget", required_argument, 0, 1}, {"target-speed", required_argument, 0, 2},
        {"config", required_argument, 0, 'c'},   {"prompts", required_argument, 0, 'f'},
        {"tokens", required_argument, 0, 'n'},   {"ctx", required_argument, 0, 3},
        {"mode", required_argument, 0, 4},       {"reprofile", no_argument, 0, 5},
        {"threads", required_argument, 0, 't'},  {"help", no_argument, 0, 'h'},
        {"hw-point-seconds", required_argument, 0, 6}, {"predictor", required_argument, 0, 7},
        {"order", required_argument, 0, 8},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:o:c:f:n:t:h", longs, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'o': o->out_dir = optarg; break;
        case 'c': o->conf_path = optarg; break;
        case 'f': o->prompts_path = optarg; break;
        case 'n':
            bad = cli_parse_int(optarg, "--tokens", 16, 1 << 20, &o->tokens);
            o->tokens_given = true;
            break;
        case 't': bad = cli_parse_int(optarg, "--threads", 1, 1024, &o->threads); break;
        case 1: bad = parse_budget(optarg, &o->budget); break;
        case 2: bad = cli_parse_double(optarg, "--target-speed", 1e-6, 1e6, &o->target); break;
        case 3: bad = cli_parse_int(optarg, "--ctx", 1, 1 << 24, &o->ctx); break;
        case 4:
            if (strcmp(optarg, "predictor") == 0) o->mode = FFN_PREDICTOR;
            else if (strcmp(optarg, "gate-first") == 0) o->mode = FFN_GATE_FIRST;
            else log_error("--mode '%s': predictor or gate-first", optarg), bad = 1;
            o->mode_given = true;
            break;
        case 5: o->reprofile = true; break;
        case 6: bad = cli_parse_double(optarg, "--hw-point-seconds", 0.001, 60, &o->hw_point_seconds); break;
        case 7: o->predictor_path = optarg; break;
        case 8:
            if (strcmp(optarg, "profile") == 0) o->order = ORDER_PROFILE;
            else if (strcmp(optarg, "file") == 0) o->order = ORDER_FILE;
            else log_error("--order '%s': profile or file", optarg), bad = 1;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) return -1;
    }
    if (optind < argc) {
        log_error("unexpected argument '%s' (see -h)", argv[optind]);
        return -1;
    }
    if (!o->model_path || !o->out_dir || (!o->budget && !o->target)) {
        log_error("-m MODEL, -o DIR and --mem-budget or --target-speed are required (see -h)");
        return -1;
    }
    return 0;
}

static int show(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0) {
        usage(argc == 3 ? stdout : stderr);
        return argc == 3 ? 0 : 2;
    }
    char err[512];
    Pi2__Plan *p = plan_load(argv[2], NULL, NULL, err, sizeof err);
    if (!p) {
        log_error("%s", err);
        return 1;
    }
    plan_print(stdout, p);
    printf("\npredicted speed by memory budget:\n");
    plan_print_curve(stdout, p);
    plan_free(p);
    return 0;
}

int main(int argc, char **argv) {
    log_init("planner");
    if (argc >= 2 && strcmp(argv[1], "show") == 0) return show(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "plan") == 0) argc--, argv++;
    plan_options o = {.tokens = 1024, .ctx = 1024, .threads = 2};
    if (parse_args(&o, argc, argv)) return PI2_EXIT_USAGE;
    return plan_run(&o) ? 1 : 0;
}
