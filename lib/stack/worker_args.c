#include "stack/worker_args.h"

#include <getopt.h>
#include <stdlib.h>

#include "util/cli.h"
#include "util/log.h"
#include "stack/stack_attach.h"

int worker_args_parse(int argc, char **argv, worker_args *a, int default_threads, int max_index,
                      void (*usage)(FILE *f)) {
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'}, {"run", required_argument, 0, 'r'},
                                             {"index", required_argument, 0, 'i'}, {"threads", required_argument, 0, 't'},
                                             {"no-realtime", no_argument, 0, 'R'}, {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    *a = (worker_args){.runid = cli_default_runid(), .index = -1, .n_threads = default_threads,
                       .realtime_io = max_index >= 0};
    const char *shortopts = max_index >= 0 ? "m:r:i:t:h" : "m:r:t:h";
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (c) {
        case 'm': a->model_path = optarg; break;
        case 'r': a->runid = optarg; break;
        case 'i':
            if (max_index < 0) { log_error("this worker takes no -i"); usage(stderr); return -1; }
            if (cli_parse_int(optarg, "-i", 0, max_index, &a->index)) return -1;
            break;
        case 't': if (cli_parse_int(optarg, "-t", 1, 256, &a->n_threads)) return -1; break;
        case 'R':
            if (max_index < 0) { log_error("this worker takes no --no-realtime"); usage(stderr); return -1; }
            a->realtime_io = false;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (!a->model_path) { log_error("no model given (-m FILE)"); usage(stderr); return -1; }
    if (max_index >= 0 && a->index < 0) { log_error("no worker index given (-i INDEX)"); usage(stderr); return -1; }
    const char *delay = getenv("PI2_TASK_DELAY_US");
    if (delay && *delay && cli_parse_long(delay, "PI2_TASK_DELAY_US", 0, 60000000, &a->task_delay_us)) return -1;
    return 0;
}

void worker_args_help(FILE *f, int default_threads, const char *unit) {
    fprintf(f,
            "  -m, --model FILE     the GGUF model the stack runs (as given to cachemgr)\n"
            "  -r, --run ID         run id (default $PI2_RUN or \"default\")\n"
            "  -t, --threads N      compute threads (default %d)\n"
            "  -h, --help           this help\n"
            "Waits up to %d s for cachemgr's segments and weights.\n"
            "Environment: PI2_LOG=debug|info|warn|error, PI2_TASK_DELAY_US=N (sleep N us per %s)\n",
            default_threads, STACK_WAIT_MS / 1000, unit);
}
