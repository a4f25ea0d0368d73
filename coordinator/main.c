/* coordinator: sessions, tokenizer, sampling and the layer-by-layer schedule
 * of a pi2 stack (docs/stack.md). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "stack/exit_codes.h"
#include "stack/proc_stop.h"
#include "util/cli.h"
#include "util/log.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: coordinator -m MODEL.gguf [-r RUNID] [--no-npu] [options]\n"
            "  -m, --model FILE        the model the stack runs (the same path cachemgr got)\n"
            "  -r, --run RUNID         stack to join (default: $PI2_RUN, else \"default\")\n"
            "      --no-npu            prefill with decode tasks even if an npu-worker is up\n"
            "      --task-timeout MS   re-send a decode step that finishes no layer for MS (default 5000)\n"
            "      --prefill-stall MS  re-send a prefill whose npu-worker finishes no layer for MS, however\n"
            "                          long the whole prompt takes (default 60000)\n"
            "      --worker-wait MS    how long a generation waits for lost cpu-workers (default 30000)\n"
            "      --npu-wait MS       ... for a lost npu-worker before prefilling without it (default 5000)\n"
            "      --startup-wait MS   for cachemgr's segments and weights (default 300000)\n"
            "      --split SPLIT       how a decode step is split between the cpu-workers: auto (default:\n"
            "                          moved after each token so that they take the same time), even,\n"
            "                          or one weight per worker, W0,W1,... (fixed)\n"
            "  -h, --help              this help\n"
            "Binds ROUTER endpoints \"coordinator\" (workers) and \"client\" (pi2 run) in the run directory.\n"
            "Environment: PI2_LOG=debug|info|warn|error, PI2_RUN\n");
}

static int parse_args(int argc, char **argv, coord_options *o) {
    enum { OPT_NO_NPU = 256, OPT_TASK_TIMEOUT, OPT_WORKER_WAIT, OPT_NPU_WAIT, OPT_STARTUP_WAIT, OPT_PREFILL_STALL, OPT_SPLIT };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'}, {"run", required_argument, 0, 'r'},
        {"no-npu", no_argument, 0, OPT_NO_NPU}, {"task-timeout", required_argument, 0, OPT_TASK_TIMEOUT},
        {"worker-wait", required_argument, 0, OPT_WORKER_WAIT}, {"npu-wait", required_argument, 0, OPT_NPU_WAIT},
        {"startup-wait", required_argument, 0, OPT_STARTUP_WAIT}, {"prefill-stall", required_argument, 0, OPT_PREFILL_STALL},
        {"split", required_argument, 0, OPT_SPLIT}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (coord_options){.runid = cli_default_runid(), .task_timeout_ms = 5000, .prefill_stall_ms = 60000,
                         .worker_wait_ms = 30000, .npu_wait_ms = 5000, .startup_wait_ms = 300000, .split = "auto"};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:r:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'm': o->model_path = optarg; break;
        case 'r': o->runid = optarg; break;
        case OPT_NO_NPU: o->no_npu = true; break;
        case OPT_TASK_TIMEOUT: if (cli_parse_int(optarg, "--task-timeout", 1, 3600000, &o->task_timeout_ms)) return -1; break;
        case OPT_PREFILL_STALL: if (cli_parse_int(optarg, "--prefill-stall", 1, 3600000, &o->prefill_stall_ms)) return -1; break;
        case OPT_WORKER_WAIT: if (cli_parse_int(optarg, "--worker-wait", 1, 3600000, &o->worker_wait_ms)) return -1; break;
        case OPT_NPU_WAIT: if (cli_parse_int(optarg, "--npu-wait", 1, 3600000, &o->npu_wait_ms)) return -1; break;
        case OPT_STARTUP_WAIT: if (cli_parse_int(optarg, "--startup-wait", 1, 3600000, &o->startup_wait_ms)) return -1; break;
        case OPT_SPLIT: o->split = optarg; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (!o->model_path) { log_error("no model given (-m FILE)"); usage(stderr); return -1; }
    return 0;
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    static coord c;
    if (parse_args(argc, argv, &c.opt)) return PI2_EXIT_USAGE;
    /* cachemgr records the canonical path in the control block */
    static char model_real[PATH_MAX];
    if (!realpath(c.opt.model_path, model_real)) {
        log_error("%s: %s", c.opt.model_path, strerror(errno));
        return 1;
    }
    c.opt.model_path = model_real;
    proc_stop_on_signals();
    c.stop = &proc_stop;
    int rc = 1;
    if (coord_attach(&c) || coord_open_bus(&c)) goto out;
    workers_init(&c);
    coord_new_epoch(&c); /* whatever an earlier coordinator left in flight is void */
    log_info("%s: %d layers, dim %d, vocab %d; ctx %d, %d cpu-worker(s), prefill %s; run '%s'", c.opt.model_path,
             c.sv.m.n_layer, c.sv.m.n_embd, c.sv.m.n_vocab, c.params.n_ctx, c.params.n_cpu_workers,
             c.opt.no_npu ? "by decode tasks" : "on the npu-worker when it is up", c.opt.runid);
    while (!proc_stop) {
        queue_next(&c); /* the next waiting client, once the slot is free */
        if (c.req.pending) generate_serve(&c);
        else coord_pump(&c, 100);
    }
    if (c.req.pending)
        client_send_error(&c, PI2__ERROR_CODE__SHUTTING_DOWN, "the stack is shutting down");
    queue_close(&c);
    gen_request_clear(&c.req);
    log_info("stopping");
    rc = 0;
out:
    if (proc_stop) rc = 0; /* asked to stop while starting: not an error */
    coord_close_bus(&c);
    coord_detach(&c);
    return rc;
}
