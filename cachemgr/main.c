/* cachemgr: creates (or re-attaches) the run's segments, loads the weights
 * through the io-worker, sets weights_ready, then stays up beating its row.
 * Its segments outlive it: `pi2 down` (pi2-ctl cleanup) removes them. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cachemgr.h"
#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/log.h"
#include "engine/predictor.h"
#include "stack/rundir.h"

#define BEAT_MS 100

static void usage(FILE *f) {
    fprintf(f,
            "usage: cachemgr -m MODEL.gguf [-r RUNID] [-c N_CTX] [--cpu-workers N] [--max-prefill N] [--ffn MODE]\n"
            "                [--predictor FILE] [--plan DIR] [--small-pages] [--check]\n"
            "Creates the run's shared-memory segments and loads the weights through the io-worker.\n"
            "  -m, --model FILE        the model the stack runs\n"
            "  -r, --run RUNID         run id (default: $PI2_RUN, else \"default\")\n"
            "  -c, --ctx-size N        KV cache positions (default: min(model context, 2048))\n"
            "      --cpu-workers N     decode workers (default 1, at most %d)\n"
            "      --max-prefill N     most prompt tokens per prefill request (default: the plan's under --plan,\n"
            "                          else %d; under a plan at most the plan's, whose memory counts them)\n"
            "      --io-timeout-ms N   re-send a read batch unanswered this long (default 5000)\n"
            "      --ffn MODE          FFN of a generation that does not choose one (docs/sparse.md):\n"
            "                          auto (default: ReLU models sparse, with the predictor if there is one,\n"
            "                          else gate-first; other models dense), dense, gate-first, predictor\n"
            "      --predictor FILE    predictor side file (pi2-predictor build); without it, predictor mode\n"
            "                          uses a PWRI model's own fc1/fc2\n"
            "      --plan DIR          run under the memory budget of pi2 plan's DIR (or its plan.pb): only the\n"
            "                          preloaded tensors and the hot bundles in memory, the rest read from the\n"
            "                          bundle file as needed (docs/offload.md); its ctx and FFN mode are the stack's\n"
            "      --small-pages       leave new segments on 4 KiB pages: start-up skips moving them into\n"
            "                          2 MiB pages (seconds for a 7B model), decode reads scattered rows slower\n"
            "      --check             only check: the model opens as the stack opens it, its tokenizer and\n"
            "                          FFN mode are usable, and the segments fit in the memory this process\n"
            "                          may use (cgroup limit or MemAvailable); prints NEED LIMIT SOURCE\n"
            "  -h, --help              this help\n"
            "On a restart the existing segments of the run are kept (with their parameters).\n"
            "Environment: PI2_LOG=debug|info|warn|error\n",
            STACK_MAX_CPU_WORKERS, STACK_DEFAULT_MAX_PREFILL);
}

typedef struct {
    const char *model, *runid, *predictor, *plan;
    int n_ctx, cpu_workers, max_prefill, io_timeout_ms;
    bool small_pages, check;
    ffn_mode ffn;
    bool ffn_auto; /* resolved for the model (resolve_ffn) */
} options;

static int parse_args(int argc, char **argv, options *o) {
    enum { OPT_CPU = 256, OPT_PREFILL, OPT_TIMEOUT, OPT_FFN, OPT_PREDICTOR, OPT_PLAN, OPT_SMALL_PAGES, OPT_CHECK };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},         {"run", required_argument, 0, 'r'},
        {"ctx-size", required_argument, 0, 'c'},      {"cpu-workers", required_argument, 0, OPT_CPU},
        {"max-prefill", required_argument, 0, OPT_PREFILL}, {"io-timeout-ms", required_argument, 0, OPT_TIMEOUT},
        {"ffn", required_argument, 0, OPT_FFN},       {"predictor", required_argument, 0, OPT_PREDICTOR},
        {"plan", required_argument, 0, OPT_PLAN},
        {"small-pages", no_argument, 0, OPT_SMALL_PAGES}, {"check", no_argument, 0, OPT_CHECK},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (options){.runid = cli_default_runid(), .cpu_workers = 1, .max_prefill = 0, .io_timeout_ms = 5000,
                   .ffn_auto = true};
    int c;
    while ((c = getopt_long(argc, argv, "m:r:c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'r': o->runid = optarg; break;
        case 'c': if (cli_parse_int(optarg, "-c", 1, 1 << 20, &o->n_ctx)) return -1; break;
        case OPT_CPU: if (cli_parse_int(optarg, "--cpu-workers", 1, STACK_MAX_CPU_WORKERS, &o->cpu_workers)) return -1; break;
        case OPT_PREFILL: if (cli_parse_int(optarg, "--max-prefill", 1, 1 << 20, &o->max_prefill)) return -1; break;
        case OPT_TIMEOUT: if (cli_parse_int(optarg, "--io-timeout-ms", 10, 3600 * 1000, &o->io_timeout_ms)) return -1; break;
        case OPT_FFN: if (ffn_mode_parse_flag(optarg, "--ffn", &o->ffn, &o->ffn_auto)) return -1; break;
        case OPT_PREDICTOR: o->predictor = optarg; break;
        case OPT_PLAN: o->plan = optarg; break;
        case OPT_SMALL_PAGES: o->small_pages = true; break;
        case OPT_CHECK: o->check = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (!o->model) { log_error("no model given (-m FILE)"); usage(stderr); return -1; }
    return 0;
}

/* The stack's FFN mode: "auto" resolved for this model; a mode the model
 * cannot run, or a predictor that does not load for it, is refused here, so
 * the workers never meet one. */
static int resolve_ffn(const options *o, cachemgr *c, int32_t *mode) {
    const model *m = &c->m;
    bool has_fc = m->layers[0].fc1.data != NULL;
    ffn_mode want = o->ffn;
    if (o->ffn_auto)
        want = o->predictor || (has_fc && m->act != FFN_SILU) ? FFN_PREDICTOR
               : m->act != FFN_SILU                         ? FFN_GATE_FIRST
                                                            : FFN_DENSE;
    const char *why = ffn_mode_refusal(m, want, true); /* checked below, or by the planner */
    if (why) {
        log_error("--ffn %s on %s: %s", ffn_mode_name(want), c->model_path, why);
        return -1;
    }
    if (o->predictor && !realpath(o->predictor, c->predictor_path)) {
        log_error("predictor %s: %s", o->predictor, strerror(errno));
        return -1;
    }
    /* Loading checks the predictor whole, into a private Q8_0 copy. Under a plan the planner has run
     * this predictor on this model (the plan names the model's fingerprint), and a cachemgr restarted
     * inside a full memory cap would thrash for that copy; the cpu-workers load it either way. */
    if (want == FFN_PREDICTOR && !c->budgeted) {
        char err[512];
        predictor *p = predictor_load(m, o->predictor ? c->predictor_path : NULL, err, sizeof err);
        if (!p) { log_error("%s", err); return -1; }
        predictor_free(p);
    }
    *mode = (int32_t)want;
    char desc[sizeof c->predictor_path + 64];
    ffn_mode_describe(desc, sizeof desc, want, o->predictor ? c->predictor_path : NULL, sizeof c->predictor_path);
    log_info("FFN mode of the stack: %s", desc);
    return 0;
}

/* --plan: the plan's layout; its context and FFN mode become the stack's
 * (a command line that asks for others is refused, not overridden). */
static int open_plan(options *o, cachemgr *c) {
    char plan[PATH_MAX], err[1024];
    if (!realpath(o->plan, plan)) {
        log_error("plan %s: %s", o->plan, strerror(errno));
        return -1;
    }
    if (offload_open(&c->off, &c->m, c->model_path, plan, false, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    c->budgeted = true;
    const Pi2__Plan *p = c->off.plan;
    if (o->n_ctx && o->n_ctx != (int)p->ctx) {
        log_error("-c %d: the plan %s was made for a context of %u (make another with pi2 plan --ctx)", o->n_ctx,
                  c->off.plan_path, p->ctx);
        return -1;
    }
    o->n_ctx = (int)p->ctx;
    if (!o->ffn_auto && o->ffn != c->off.mode) {
        log_error("--ffn %s: the plan %s is for %s mode", ffn_mode_name(o->ffn), c->off.plan_path,
                  ffn_mode_name(c->off.mode));
        return -1;
    }
    o->ffn_auto = false;
    o->ffn = c->off.mode;
    if (p->max_prefill && o->max_prefill > (int)p->max_prefill) {
        log_error("--max-prefill %d: the plan %s counts prompt buffers for %u tokens a step in its budget (make "
                  "another with this stack config: pi2 plan -c)", o->max_prefill, c->off.plan_path, p->max_prefill);
        return -1;
    }
    if (!o->max_prefill) o->max_prefill = (int)p->max_prefill;
    if (c->off.side_predictor && !o->predictor) o->predictor = p->predictor;
    log_info("plan %s: budget %.1f MiB (preload %.1f, hot %.1f, cold %u slots = %.1f MiB); bundles from %s",
             c->off.plan_path, p->budget_bytes / 1048576.0, c->off.preload_bytes / 1048576.0,
             c->off.hot_bytes / 1048576.0, c->off.cold_slots, c->off.cold_bytes / 1048576.0, c->off.bundle_path);
    return 0;
}

/* Beats until SIGTERM; returns the exit status. */
static int stay_up(cachemgr *c) {
    while (!proc_stop) {
        if (shm_is_stale(c->seg[SEG_CTL])) {
            log_info("the run's segments were removed (pi2 down); exiting");
            return 0;
        }
        cm_beat(c, PROC_READY);
        nanosleep(&(struct timespec){.tv_nsec = BEAT_MS * 1000 * 1000}, NULL);
    }
    log_info("stopping; the segments stay for the next cachemgr");
    return 0;
}

static int start(cachemgr *c) {
    char dir[RUNDIR_PATH_MAX];
    if (rundir_path(dir, sizeof dir, c->runid) || rundir_create(dir)) {
        log_error("run directory of '%s': %s", c->runid, rundir_last_error());
        return 1;
    }
    if (cm_open_segments(c)) return 1;
    c->row = ctl_proc_claim(c->ctl, "cachemgr", (int32_t)getpid());
    if (!c->row) log_warn("the process table is full; not beating");
    uint64_t ready = atomic_load(&c->ctl->weights_ready);
    if (ready) {
        log_info("weights already loaded (generation %llu); keeping them", (unsigned long long)ready);
    } else {
        int rc = cm_load_weights(c);
        if (rc < 0) return 1;
        if (rc > 0) return 0; /* stopped by a signal while loading */
    }
    return stay_up(c);
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(argc, argv, &o)) return PI2_EXIT_USAGE;
    proc_stop_on_signals();

    cachemgr c = {.runid = o.runid, .io_timeout_ms = o.io_timeout_ms, .small_pages = o.small_pages};
    if (!realpath(o.model, c.model_path)) {
        log_error("model %s: %s", o.model, strerror(errno));
        return 1;
    }
    char err[512];
    if (model_load(&c.m, c.model_path, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    if (o.plan && open_plan(&o, &c)) {
        model_free(&c.m);
        return PI2_EXIT_CONFIG;
    }
    int n_ctx = o.n_ctx ? o.n_ctx : (c.m.n_ctx_train > 0 && c.m.n_ctx_train < 2048 ? c.m.n_ctx_train : 2048);
    if (!o.max_prefill) o.max_prefill = STACK_DEFAULT_MAX_PREFILL;
    c.params = (stack_params){.n_ctx = n_ctx, .n_cpu_workers = o.cpu_workers, .max_prefill = o.max_prefill};
    int status = resolve_ffn(&o, &c, &c.params.ffn_mode) ? PI2_EXIT_CONFIG : o.check ? cm_preflight(&c) : start(&c);
    cm_beat(&c, PROC_DEAD);
    cm_close_segments(&c);
    offload_close(&c.off);
    model_free(&c.m);
    return status;
}
