/* pi2-client (`pi2 run`): asks a running stack's coordinator for one
 * generation and streams it to stdout exactly as pi2-ref prints it (the
 * prompt, the pieces, a newline); timings go to stderr. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stack/bus.h"
#include "stack/exit_codes.h"
#include "util/cli.h"
#include "util/clock.h"
#include "engine/ffn_chunks.h"
#include "util/log.h"
#include "stack/msg.h"
#include "stack/rundir.h"
#include "stack/shm.h"
#include "stack/stack.h"

#define POLL_SLICE_MS 250
#define COORDINATOR_DEAD_MS 2000 /* its ctl row unbeaten this long: it is gone */
#define PROGRESS_AFTER_MS 1000  /* a prompt that takes longer shows its progress */
#define PROGRESS_LINE_MS 2000   /* ... as a log line this often when stderr is not a terminal */

typedef struct {
    const char *runid, *prompt;
    int n_predict, top_k, timeout_s, wait_s;
    float temp, top_p;
    uint64_t seed;
    int ignore_eos;
    ffn_mode ffn;
    bool ffn_given; /* else the stack's mode */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-client [-r RUNID] [-p PROMPT] [-n N] [options]\n"
            "  -r, --run RUNID      stack to ask (default: $PI2_RUN, else \"default\")\n"
            "  -p, --prompt TEXT    prompt (default: empty, generation starts from BOS)\n"
            "  -n, --n-predict N    tokens to generate (default 64)\n"
            "      --temp T         temperature; 0 = greedy (default 0.8)\n"
            "      --top-k K        keep the K most likely tokens; 0 = all (default 40)\n"
            "      --top-p P        nucleus sampling threshold (default 0.95)\n"
            "  -s, --seed N         sampling seed (default: from the clock)\n"
            "      --ignore-eos     keep generating after end-of-sequence\n"
            "      --ffn MODE       dense, gate-first or predictor (default: the stack's, pi2 up --ffn)\n"
            "      --timeout S      give up when the stack sends nothing for S seconds (default 30)\n"
            "      --wait S         while another generation runs, wait up to S seconds for our turn\n"
            "                       (default 300; 0: be refused at once)\n"
            "  -h, --help           this help\n"
            "Environment: PI2_LOG=debug|info|warn|error, PI2_RUN\n");
}

static int parse_args(int argc, char **argv, options *o) {
    enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_IGNORE_EOS, OPT_TIMEOUT, OPT_FFN, OPT_WAIT };
    static const struct option longopts[] = {
        {"run", required_argument, 0, 'r'}, {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"seed", required_argument, 0, 's'},
        {"temp", required_argument, 0, OPT_TEMP}, {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP}, {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"timeout", required_argument, 0, OPT_TIMEOUT}, {"ffn", required_argument, 0, OPT_FFN},
        {"wait", required_argument, 0, OPT_WAIT}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *o = (options){.runid = cli_default_runid(), .prompt = "", .n_predict = 64, .top_k = 40,
                   .timeout_s = 30, .wait_s = 300, .temp = 0.8f, .top_p = 0.95f, .seed = (uint64_t)time(NULL)};
    long v;
    int c;
    while ((c = getopt_long(argc, argv, "r:p:n:s:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'r': o->runid = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': if (cli_parse_int(optarg, "-n", 0, MSG_MAX_PREDICT, &o->n_predict)) return -1; break;
        case 's': if (cli_parse_long(optarg, "--seed", 0, __LONG_MAX__, &v)) return -1; o->seed = (uint64_t)v; break;
        case OPT_TEMP: if (cli_parse_float(optarg, "--temp", &o->temp)) return -1; break;
        case OPT_TOPK: if (cli_parse_int(optarg, "--top-k", 0, 1 << 24, &o->top_k)) return -1; break;
        case OPT_TOPP: if (cli_parse_float(optarg, "--top-p", &o->top_p)) return -1; break;
        case OPT_IGNORE_EOS: o->ignore_eos = 1; break;
        case OPT_FFN: if (ffn_mode_parse_flag(optarg, "--ffn", &o->ffn, NULL)) return -1; o->ffn_given = true; break;
        case OPT_TIMEOUT: if (cli_parse_int(optarg, "--timeout", 1, 86400, &o->timeout_s)) return -1; break;
        case OPT_WAIT: if (cli_parse_int(optarg, "--wait", 0, (int)(MSG_MAX_WAIT_MS / 1000), &o->wait_s)) return -1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) { log_error("unexpected argument '%s'", argv[optind]); return -1; }
    if (strlen(o->prompt) > MSG_MAX_PROMPT) {
        log_error("the prompt has %zu bytes, more than %u", strlen(o->prompt), MSG_MAX_PROMPT);
        return -1;
    }
    return 0;
}

/* The coordinator's client endpoint, if the stack's run directory and socket exist.
 * (A ZeroMQ connect to nothing would succeed and then wait in silence.) */
static int find_endpoint(const options *o, char *ep, size_t len) {
    char dir[RUNDIR_PATH_MAX];
    struct stat st;
    if (rundir_path(dir, sizeof dir, o->runid)) {
        log_error("run id '%s': %s", o->runid, rundir_last_error());
        return -1;
    }
    if (stat(dir, &st) || bus_endpoint_ipc(ep, len, dir, "client", 0) || stat(ep + strlen("ipc://"), &st)) {
        log_error("no pi2 stack '%s' is up (pi2 up -m MODEL)", o->runid);
        return -1;
    }
    if (rundir_check(dir)) {
        log_error("run directory %s: %s", dir, rundir_last_error());
        return -1;
    }
    return 0;
}

static int send_request(bus_socket *s, const options *o) {
    Pi2__SamplingParams sp = PI2__SAMPLING_PARAMS__INIT;
    sp.temperature = o->temp, sp.top_k = o->top_k, sp.top_p = o->top_p, sp.seed = o->seed;
    Pi2__GenerateRequest g = PI2__GENERATE_REQUEST__INIT;
    g.prompt.data = (uint8_t *)o->prompt, g.prompt.len = strlen(o->prompt);
    g.n_predict = (uint32_t)o->n_predict, g.sampling = &sp, g.ignore_eos = o->ignore_eos;
    g.ffn_mode = o->ffn_given ? ffn_mode_to_wire(o->ffn) : PI2__FFN_MODE__FFN_MODE_UNSPECIFIED;
    g.max_wait_ms = (uint32_t)o->wait_s * 1000;
    Pi2__Envelope env;
    msg_envelope_init(&env, 1, 0);
    env.body_case = PI2__ENVELOPE__BODY_GENERATE_REQUEST;
    env.generate_request = &g;
    size_t len;
    uint8_t *buf = msg_pack_alloc(&env, &len);
    int rc = buf ? bus_send(s, PI2_BUS_MSG, buf, len) : BUS_ERR;
    free(buf);
    if (rc != BUS_OK) log_error("sending the request: %s", bus_status_str(rc));
    return rc == BUS_OK ? 0 : -1;
}

/* Limits for what a coordinator sends us; we do not load the model, so token ids and
 * positions are only bounded by their types (they are printed, never used as indices). */
static const msg_limits CLIENT_LIMITS = {
    .n_layer = 1, .n_ff = 1, .n_head = 1, .n_ctx = UINT32_MAX, .n_vocab = UINT32_MAX,
    .act_segment_size = 1, .weight_segment_size = 1, .kv_segment_size = 1, .model_file_size = 1, .slot_size = 1,
};

/* Under a memory budget, after at least one decode step: the generation's
 * neuron cache, "; neuron cache: 82.4% hits, 2.571 MB read per token". */
static void offload_text(const Pi2__OffloadStats *o, char *buf, size_t len) {
    buf[0] = 0;
    if (!o || !o->tokens) return;
    const offload_tally t = msg_offload_tally(o);
    const offload_rates r = offload_tally_rates(&t);
    snprintf(buf, len, "; neuron cache: %.1f%% hits, %.3f MB read per token", 100 * (r.hot + r.cold),
             r.bytes_per_token / 1e6);
}

/* ttft_ms: from sending the request to the first piece, as this client saw it (< 0: none came). */
static void log_timings(const Pi2__GenerateDone *d, double ttft_ms) {
    double ps = d->prompt_ms / 1e3, ds = d->decode_ms / 1e3;
    char ttft[48] = "", cache[96];
    if (ttft_ms >= 0) snprintf(ttft, sizeof ttft, "; time to first token %.3f s", ttft_ms / 1e3);
    offload_text(d->offload, cache, sizeof cache);
    log_info("prompt: %u tokens in %.3f s (%.2f tok/s); generated: %u tokens in %.3f s (%.2f tok/s)%s%s",
             d->n_prompt, ps, d->n_prompt / (ps > 0 ? ps : 1e-9), d->n_generated, ds,
             d->n_generated / (ds > 0 ? ds : 1e-9), ttft, cache);
    if (d->status == PI2__GENERATE_STATUS__GEN_CONTEXT_FULL) log_warn("the stack's context is full");
}

/* The coordinator's row in the stack's control block, to notice its death long before
 * --timeout; NULL (and *seg NULL) if the block cannot be read, then only the timeout tells. */
static const proc_row *coordinator_row(const char *runid, shm_segment **seg) {
    char name[SHM_NAME_MAX];
    *seg = NULL;
    if (shm_make_name(name, sizeof name, runid, STACK_SEG_CTL) ||
        !(*seg = shm_attach(name, SHM_KIND_CONTROL, SHM_ATTACH_READONLY)))
        return NULL;
    uint64_t size = 0;
    const stack_ctl *c = shm_region_ptr(*seg, "ctl", &size);
    if (c && size >= sizeof *c && __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) == STACK_CTL_MAGIC)
        for (int i = 0; i < STACK_MAX_PROCS; i++)
            if (!strncmp(c->procs[i].name, "coordinator", sizeof c->procs[i].name)) return &c->procs[i];
    shm_detach(*seg);
    *seg = NULL;
    return NULL;
}

static bool coordinator_gone(const proc_row *r) {
    return r && (atomic_load(&r->state) == PROC_DEAD || clock_ms() - atomic_load(&r->heartbeat_ms) > COORDINATOR_DEAD_MS);
}

/* Prompt progress on stderr once the prompt has run for a second (as
 * llama.cpp users are used to): one line rewritten in place on a terminal, a
 * log line every 2 s otherwise. */
typedef struct {
    bool tty, shown;
    int64_t last_line_ms;
} progress_view;

static void progress_show(progress_view *v, const Pi2__PromptProgress *p) {
    if (p->elapsed_ms < PROGRESS_AFTER_MS) return;
    double s = p->elapsed_ms / 1e3, pct = p->n_prompt ? 100.0 * p->n_done / p->n_prompt : 0;
    if (v->tty) {
        fprintf(stderr, "\rprompt: %u/%u tokens (%.0f %%), %.1f tok/s, %.1f s ", p->n_done, p->n_prompt, pct,
                p->n_done / s, s);
        v->shown = true;
    } else if (clock_ms() - v->last_line_ms >= PROGRESS_LINE_MS) {
        log_info("prompt: %u/%u tokens (%.0f %%), %.1f tok/s, %.1f s", p->n_done, p->n_prompt, pct, p->n_done / s, s);
        v->last_line_ms = clock_ms();
    }
}

static void progress_end(progress_view *v) {
    if (v->shown) fputc('\n', stderr);
    v->shown = false;
}

/* Streams the answer; returns the exit status. sent_ms: when the request went out. */
static int receive(bus_socket *s, const options *o, const proc_row *coordinator, int64_t sent_ms) {
    uint32_t next_index = 0;
    bool started = false;
    int64_t last_heard = clock_ms();
    double ttft_ms = -1;
    progress_view pv = {.tty = isatty(STDERR_FILENO)};
    uint32_t ahead = 0;
    for (;;) {
        struct bus_msg bm;
        int rc = bus_recv(s, &bm, POLL_SLICE_MS);
        if (rc == BUS_TIMEOUT) {
            bool gone = coordinator_gone(coordinator);
            if (!gone && clock_ms() - last_heard < (int64_t)o->timeout_s * 1000) continue;
            progress_end(&pv);
            if (started) fputc('\n', stdout);
            fflush(stdout);
            if (gone) log_error("the coordinator of stack '%s' stopped (see pi2 status and its log)", o->runid);
            else log_error("the stack sent nothing for %d s (is the coordinator up? see pi2 status)", o->timeout_s);
            return 1;
        }
        last_heard = clock_ms();
        if (rc == BUS_EINTR) return 1;
        if (rc != BUS_OK) {
            log_warn("dropped a frame: %s", bus_status_str(rc));
            continue;
        }
        char err[256];
        Pi2__Envelope *env = bm.type == PI2_BUS_MSG ? msg_unpack(bm.data, bm.len, err, sizeof err) : NULL;
        if (bm.type != PI2_BUS_MSG) snprintf(err, sizeof err, "frame type %u", bm.type);
        if (env && msg_validate(env, &CLIENT_LIMITS, err, sizeof err)) {
            msg_free(env);
            env = NULL;
        }
        if (!env) {
            log_warn("dropped a message from the coordinator: %s", err);
            continue;
        }
        int status = -1;
        if (env->body_case != PI2__ENVELOPE__BODY_PROMPT_PROGRESS) progress_end(&pv);
        if (!started && (env->body_case == PI2__ENVELOPE__BODY_TOKEN_PIECE ||
                         env->body_case == PI2__ENVELOPE__BODY_GENERATE_DONE)) {
            fputs(o->prompt, stdout); /* as pi2-ref: only once the prompt was accepted */
            started = true;
        }
        switch (env->body_case) {
        case PI2__ENVELOPE__BODY_PROMPT_PROGRESS: progress_show(&pv, env->prompt_progress); break;
        case PI2__ENVELOPE__BODY_GENERATE_QUEUED:
            if (env->generate_queued->ahead != ahead) /* a line when the queue moves, not every second */
                log_info("waiting for the stack: %u generation%s ahead (%.0f s so far, --wait %d)",
                         env->generate_queued->ahead, env->generate_queued->ahead > 1 ? "s" : "",
                         env->generate_queued->waited_ms / 1e3, o->wait_s);
            ahead = env->generate_queued->ahead;
            sent_ms = clock_ms(); /* time to first token counts from our turn */
            break;
        case PI2__ENVELOPE__BODY_TOKEN_PIECE: {
            const Pi2__TokenPiece *t = env->token_piece;
            if (ttft_ms < 0) ttft_ms = (double)(clock_ms() - sent_ms);
            if (t->index != next_index) {
                fflush(stdout);
                log_error("piece %u arrived where %u was expected", t->index, next_index);
                status = 1;
                break;
            }
            next_index++;
            if (t->piece.len) fwrite(t->piece.data, 1, t->piece.len, stdout); /* an empty piece has no data */
            fflush(stdout);
            break;
        }
        case PI2__ENVELOPE__BODY_GENERATE_DONE:
            fputc('\n', stdout);
            fflush(stdout);
            if (env->generate_done->n_generated != next_index)
                log_warn("the stack counts %u tokens, %u arrived", env->generate_done->n_generated, next_index);
            log_timings(env->generate_done, ttft_ms);
            status = 0;
            break;
        case PI2__ENVELOPE__BODY_ERROR:
            if (started) fputc('\n', stdout);
            fflush(stdout);
            log_error("%s (%s)", env->error->message,
                      protobuf_c_enum_descriptor_get_value(&pi2__error_code__descriptor, env->error->code)->name);
            status = 1;
            break;
        default:
            log_warn("ignored an unexpected %s", msg_body_name(env->body_case));
            break;
        }
        msg_free(env);
        if (status >= 0) return status;
    }
}

int main(int argc, char **argv) {
    log_init(argv[0]);
    options o;
    if (parse_args(argc, argv, &o)) return PI2_EXIT_USAGE;
    char ep[BUS_ENDPOINT_MAX], identity[32];
    if (find_endpoint(&o, ep, sizeof ep)) return 1;
    snprintf(identity, sizeof identity, "client-%d", (int)getpid());
    bus_ctx *ctx = bus_ctx_new();
    bus_socket *s = ctx ? bus_connect(ctx, BUS_DEALER, ep, identity, NULL) : NULL;
    int rc = 1;
    if (!s) log_error("connecting to %s: %s", ep, bus_last_error());
    shm_segment *ctl_seg;
    const proc_row *coordinator = coordinator_row(o.runid, &ctl_seg);
    int64_t sent_ms = clock_ms();
    if (s && !send_request(s, &o)) rc = receive(s, &o, coordinator, sent_ms);
    shm_detach(ctl_seg);
    bus_close(s);
    bus_ctx_free(ctx);
    return rc;
}
