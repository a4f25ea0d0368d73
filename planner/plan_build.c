/* pi2 plan's steps (plan_build.h). */
#include "plan_build.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "calib/model_profile.h"
#include "calib/prompts_file.h"
#include "engine/predictor.h" /* model_fingerprint */
#include "plan/bundle.h"
#include "plan/plan_file.h"
#include "bundle_order.h"
#include "hw_profile.h"
#include "layout.h"
#include "plan_report.h"
#include "progress.h"
#include "stack_conf.h"
#include "util/log.h"
#include "util/mkdirs.h"

static const int per_bundle_choice[] = {1, 2, 4};
#define N_CHOICES ((int)(sizeof per_bundle_choice / sizeof *per_bundle_choice))
/* Prompt tokens per prefill step weighed when the stack config does not set max-prefill, largest first. A
 * smaller step frees the npu-worker's prompt buffers (prompt_pass_bytes: 0.28 MB a token on the 7B file) for
 * neurons; a prompt longer than a step goes in several, and under a budget each streams the FFN rows that
 * are not resident again. A smaller step is taken when predicted SMALLER_PREFILL_MARGIN faster. */
static const int prefill_choice[] = {PREFILL_TOKENS, PREFILL_TOKENS / 2, PREFILL_TOKENS / 4};
#define PREFILL_CHOICES ((int)(sizeof prefill_choice / sizeof *prefill_choice))
#define SMALLER_PREFILL_MARGIN 0.03
#define CURVE_POINTS 12
#define GEN_PER_PROMPT 8 /* longer greedy runs loop on synthetic models and skew the counts */

typedef struct {
    const plan_options *o;
    model m;
    bool model_loaded;
    stack_conf conf;
    hw_profile hw;
    char hw_path[1024];
    model_profile prof;
    char **extra_prompts;
    int n_extra;
    layout_inputs in;    /* at the largest prefill step weighed */
    int n_prefill;       /* prefill steps weighed: the config's, or prefill_choice's */
    layout_inputs prefill_in[PREFILL_CHOICES];
    layout_fixed prefill_fixed[PREFILL_CHOICES]; /* [0]: at the largest step, pl->in's */
    bundle_order orders[N_CHOICES];
} planning;

static void out_path(const planning *pl, const char *name, char *buf, size_t len) {
    snprintf(buf, len, "%s/%s", pl->o->out_dir, name);
}

/* ---- profiles ---- */

static void hw_progress(void *ctx, const char *step, double done) {
    progress *p = ctx;
    p->step = step;
    progress_show(p, done);
}

/* a cached profile is this machine's: its CPU, CPU count, kernel set and read engine (a file system's
 * st_dev can repeat across machines sharing a home directory, and a container that refuses io_uring
 * may share one with its host) */
static bool same_machine(const hw_profile *h) {
    hw_profile now = {0};
    hw_profile_identify(&now);
    return strcmp(now.cpu, h->cpu) == 0 && strcmp(now.kernels, h->kernels) == 0 && now.n_cpus == h->n_cpus &&
           strcmp(now.io_engine, h->io_engine) == 0;
}

static int hardware_profile(planning *pl) {
    char err[512];
    if (hw_profile_cache_path(&pl->m, pl->o->model_path, pl->hw_path, sizeof pl->hw_path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    if (!pl->o->reprofile && hw_profile_load(&pl->hw, pl->hw_path, err, sizeof err) == 0) {
        if (same_machine(&pl->hw)) {
            log_info("hardware profile: %s (measured in %.0f s; --reprofile measures again)", pl->hw_path,
                     pl->hw.seconds);
            return 0;
        }
        log_info("hardware profile %s was measured on another machine (%s, %d CPUs, %s kernels, reads by %s): "
                 "measuring again", pl->hw_path, pl->hw.cpu, pl->hw.n_cpus, pl->hw.kernels, pl->hw.io_engine);
    }
    progress p;
    progress_begin(&p, "hardware profile");
    const hw_profile_opts ho = {pl->o->model_path, pl->o->hw_point_seconds, hw_progress, &p};
    if (hw_profile_measure(&pl->hw, &pl->m, &ho, err, sizeof err)) {
        log_error("hardware profile: %s", err);
        return -1;
    }
    p.step = "hardware profile";
    progress_end(&p);
    if (hw_profile_save(&pl->hw, pl->hw_path, err, sizeof err)) log_warn("hardware profile not cached: %s", err);
    return 0;
}

static int read_prompts(planning *pl) {
    const char *path = pl->o->prompts_path;
    if (!path) return 0;
    char err[512];
    pl->n_extra = calib_read_prompts(path, &pl->extra_prompts, err, sizeof err);
    if (pl->n_extra < 0) {
        pl->n_extra = 0;
        log_error("-f %s", err);
        return -1;
    }
    if (pl->n_extra == 0) log_warn("-f %s: no prompts in it", path);
    return 0;
}

static void profile_progress(void *ctx, int done, int total) { progress_show(ctx, (double)done / total); }

static int model_profile_step(planning *pl) {
    const int n = model_profile_n_builtin + pl->n_extra;
    const char **prompts = malloc(sizeof(char *) * (size_t)n);
    if (!prompts) {
        log_error("out of memory for %d prompts", n);
        return -1;
    }
    for (int i = 0; i < model_profile_n_builtin; i++) prompts[i] = model_profile_builtin_prompts[i];
    for (int i = 0; i < pl->n_extra; i++) prompts[model_profile_n_builtin + i] = pl->extra_prompts[i];
    char path[1024], err[512];
    out_path(pl, "model-profile.gguf", path, sizeof path);
    const model_profile_opts mo = {.prompts = prompts,
                                   .n_prompts = n,
                                   .n_tokens = pl->o->tokens,
                                   .gen_per_prompt = GEN_PER_PROMPT,
                                   .mode = pl->in.mode,
                                   .predictor_path = pl->in.mode == FFN_PREDICTOR ? pl->o->predictor_path : NULL,
                                   .threads = pl->o->threads,
                                   .model_name = pl->o->model_path,
                                   .progress = profile_progress};
    if (model_profile_load(&pl->prof, path, &pl->m, pl->o->model_path, err, sizeof err) == 0) {
        if (pl->prof.run_hash == model_profile_run_hash(&mo)) {
            log_info("model profile: %s (%d tokens)", path, pl->prof.n_tokens);
            free(prompts);
            return 0;
        }
        model_profile_free(&pl->prof);
    }
    progress p;
    progress_begin(&p, "model profile");
    model_profile_opts run = mo;
    run.progress_ctx = &p;
    const int rc = model_profile_run(&pl->prof, &pl->m, &run, err, sizeof err);
    free(prompts);
    if (rc) {
        log_error("model profile: %s", err);
        return -1;
    }
    progress_end(&p);
    if (pl->o->tokens_given && pl->prof.n_tokens < pl->o->tokens)
        log_warn("model profile: the prompts ran out at %d of the %d calibration tokens asked; -f FILE gives more "
                 "(one prompt a line)", pl->prof.n_tokens, pl->o->tokens);
    if (model_profile_save(&pl->prof, &pl->m, pl->o->model_path, path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    return 0;
}

/* ---- layouts ---- */

/* A bigger bundle must be predicted this much faster to be chosen over a smaller one: it reads bytes a
 * token may not need, and predictions closer than the model's own error do not tell which is faster.
 * On the 7B file (Intel Xeon, virtio disk): at 3 GiB 1, 2 and 4 neurons were predicted within 1 % of
 * each other, and 4 decoded 8.78 tok/s against 10.0 with 1; at 2 GiB 2 neurons were predicted 6.8 %
 * faster from a profile that read 16 KiB at 87 k/s (an hour before: 50 k/s; 8 KiB: 101 and 103 k/s),
 * and decoded 3.29 against 3.5-3.95. */
#define BIGGER_BUNDLE_MARGIN 0.10

/* at prefill step p, the layout of the order that predicts the most tok/s under budget, bigger bundles
 * only by BIGGER_BUNDLE_MARGIN; -1 if none fits. tell: log every candidate's prediction (what decided the
 * bundle size) */
static int best_bundles(planning *pl, int p, uint64_t budget, layout *best, bool tell) {
    int found = -1;
    bool fits[N_CHOICES] = {false};
    cost_prediction pred[N_CHOICES];
    uint64_t stride[N_CHOICES];
    for (int c = 0; c < N_CHOICES; c++) {
        layout lay;
        fits[c] = layout_make(&pl->prefill_in[p], &pl->prefill_fixed[p], &pl->orders[c], budget, &lay) == 0;
        pred[c] = lay.pred, stride[c] = lay.stride;
        if (fits[c] && (found < 0 || lay.pred.tok_s > best->pred.tok_s * (1 + BIGGER_BUNDLE_MARGIN))) {
            if (found >= 0) layout_free(best);
            *best = lay;
            found = c;
        } else {
            layout_free(&lay);
        }
    }
    for (int c = 0; tell && c < N_CHOICES; c++)
        if (fits[c])
            log_info("bundles of %d neuron%s (%llu bytes): predicted %.2f tok/s, hit rate %.1f %%%s",
                     pl->orders[c].per_bundle, pl->orders[c].per_bundle > 1 ? "s" : "", (unsigned long long)stride[c],
                     pred[c].tok_s, 100 * pred[c].hit_rate, c == found ? " (chosen)" : "");
    return found < 0 ? -1 : 0;
}

/* the best layout (best_bundles) over the prefill steps weighed, a smaller step only by
 * SMALLER_PREFILL_MARGIN; -1 if none fits. tell: log what decided the step and the bundle size */
static int best_layout(planning *pl, uint64_t budget, layout *best, bool tell) {
    int found = -1;
    double tok_s[PREFILL_CHOICES] = {0};
    for (int p = 0; p < pl->n_prefill; p++) {
        layout lay;
        if (best_bundles(pl, p, budget, &lay, false)) continue;
        tok_s[p] = lay.pred.tok_s;
        if (found < 0 || lay.pred.tok_s > best->pred.tok_s * (1 + SMALLER_PREFILL_MARGIN)) {
            if (found >= 0) layout_free(best);
            *best = lay;
            found = p;
        } else {
            layout_free(&lay);
        }
    }
    if (!tell || found < 0) return found < 0 ? -1 : 0;
    for (int p = 0; p < pl->n_prefill && pl->n_prefill > 1; p++)
        if (tok_s[p] > 0)
            log_info("prompt steps of %d tokens: predicted %.2f tok/s%s", pl->prefill_in[p].max_prefill, tok_s[p],
                     p == found ? " (chosen)" : "");
    layout again;
    if (best_bundles(pl, found, budget, &again, true) == 0) layout_free(&again);
    return 0;
}

static uint64_t floor_of(planning *pl) {
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < pl->n_prefill; p++)
        for (int c = 0; c < N_CHOICES; c++) {
            layout lay;
            layout_make(&pl->prefill_in[p], &pl->prefill_fixed[p], &pl->orders[c], 0, &lay);
            if (lay.floor < least) least = lay.floor;
            layout_free(&lay);
        }
    return least;
}

/* A bound under every layout's floor that needs no profile: the preloaded weights and processes, and
 * either the prefill's staging (a cache of any size beside it) or every neuron resident. */
static uint64_t least_budget_before_profiles(const planning *pl, const layout_fixed **least) {
    const uint64_t every_neuron = (uint64_t)pl->m.n_layer * (uint64_t)pl->m.n_ff * pl->prefill_fixed[0].neuron_bytes;
    uint64_t lowest = UINT64_MAX;
    for (int p = 0; p < pl->n_prefill; p++) {
        const layout_fixed *f = &pl->prefill_fixed[p];
        const uint64_t b = f->preload + f->process + (f->staging < every_neuron ? f->staging : every_neuron);
        if (b < lowest) {
            lowest = b;
            *least = f;
        }
    }
    return lowest;
}

/* The refusal of a budget under `needed`: its preloaded weights and processes (f), then `part` of
 * part_bytes, then what comes beside them (`beside`). */
static void log_needs(uint64_t needed, const layout_fixed *f, const char *part, uint64_t part_bytes,
                      const char *beside, uint64_t given) {
    log_error("this model needs at least %.2f GB (%.0f MiB: preloaded %.0f, processes %.0f, %s %.0f, %s); %.2f GB "
              "was given",
              needed / 1e9, needed / 1048576.0, f->preload / 1048576.0, f->process / 1048576.0, part,
              part_bytes / 1048576.0, beside, given / 1e9);
}

/* the least budget that keeps every bundle resident, over the bundle sizes */
static uint64_t all_resident_budget(const planning *pl) {
    uint64_t least = UINT64_MAX;
    for (int c = 0; c < N_CHOICES; c++) {
        const uint64_t ffn = (uint64_t)pl->m.n_layer * (uint64_t)pl->orders[c].n_bundles *
                             layout_stride(&pl->prefill_fixed[0], pl->orders[c].per_bundle);
        if (ffn < least) least = ffn;
    }
    return pl->prefill_fixed[0].preload + pl->prefill_fixed[0].process + least;
}

/* the smallest budget (to a MiB) predicted to reach the target */
static int budget_for_target(planning *pl, double target, uint64_t *budget) {
    uint64_t lo = floor_of(pl), hi = all_resident_budget(pl);
    layout top;
    if (best_layout(pl, hi, &top, false)) return -1;
    const double most = top.pred.tok_s;
    layout_free(&top);
    if (most < target) {
        log_error("--target-speed %.2f: even with the whole model in memory (%.0f MiB) this machine is predicted "
                  "to decode %.2f tok/s",
                  target, hi / 1048576.0, most);
        return -1;
    }
    /* in whole MiB: lo does not reach the target (or is under the floor), hi does */
    uint64_t lo_mib = lo >> 20, hi_mib = (hi + (1u << 20) - 1) >> 20;
    while (hi_mib - lo_mib > 1) {
        const uint64_t mid = lo_mib + (hi_mib - lo_mib) / 2;
        layout lay;
        const bool fits = best_layout(pl, mid << 20, &lay, false) == 0, reaches = fits && lay.pred.tok_s >= target;
        if (fits) layout_free(&lay);
        if (reaches) hi_mib = mid;
        else lo_mib = mid;
    }
    *budget = hi_mib << 20;
    return 0;
}

/* neurons a worker computes as one unit: about one read's latency of work, so each arriving read
 * computes while the next lands */
static uint32_t cluster_neurons(const planning *pl, const layout *lay, int threads) {
    const double read_s = 1 / hw_io_iops(&pl->hw, lay->stride, 1);
    const double neuron_s = 2 / pl->hw.sparse_rows_s + 1 / pl->hw.axpy_rows_s;
    const int k = lay->order->per_bundle;
    long n = (long)(read_s / neuron_s * threads) / k * k;
    if (n < k) n = k;
    if (n > pl->m.n_ff) n = pl->m.n_ff;
    return (uint32_t)n;
}

/* the predictions with everything resident: in the plan's mode, and dense */
static void in_memory_speeds(planning *pl, double *resident, double *dense) {
    layout all;
    *resident = best_layout(pl, all_resident_budget(pl), &all, false) == 0 ? all.pred.tok_s : 0;
    if (*resident > 0) layout_free(&all);
    layout_inputs din = pl->in;
    din.mode = FFN_DENSE;
    layout_fixed dfix;
    layout_fixed_of(&din, &dfix);
    const bundle_order *o = &pl->orders[0];
    const cost_inputs ci = {.n_layer = pl->m.n_layer,
                            .n_ff = pl->m.n_ff,
                            .mode = FFN_DENSE,
                            .dense_bytes = dfix.dense_bytes,
                            .gate_row = dfix.gate_row,
                            .up_row = dfix.up_row,
                            .down_row = dfix.down_row,
                            .active = o->active,
                            .n_bundles = o->n_bundles,
                            .stride = (size_t)layout_stride(&dfix, 1),
                            .p_bundle = o->p_bundle};
    const cost_layout cl = {.queue_depth = 1, .threads = pl->in.threads};
    cost_prediction pred;
    cost_predict(&ci, &pl->hw, &cl, &pred);
    *dense = pred.tok_s;
}

/* ---- output ---- */

static void bundle_progress(void *ctx, int done, int n_layer) { progress_show(ctx, (double)done / n_layer); }

static int write_bundles(planning *pl, const layout *lay, const char *path) {
    char err[512];
    const bundle_order *o = lay->order;
    bundle_file b;
    if (bundle_open(&b, path, &pl->m, pl->o->model_path, err, sizeof err) == 0) {
        const bool same = b.per_bundle == o->per_bundle &&
                          memcmp(b.order, o->order, sizeof(int32_t) * (size_t)pl->m.n_layer * (size_t)pl->m.n_ff) == 0;
        bundle_close(&b);
        if (same) {
            log_info("bundle file: %s (unchanged)", path);
            return 0;
        }
    }
    progress p;
    progress_begin(&p, "bundle file");
    if (bundle_write(&pl->m, pl->o->model_path, o->order, o->per_bundle, path, bundle_progress, &p, err,
                     sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    progress_end(&p);
    return 0;
}

static int write_plan(planning *pl, const layout *lay, uint64_t floor) {
    const plan_options *o = pl->o;
    char plan_path[1024], svg_path[1024], err[512], name[1024];
    out_path(pl, "plan.pb", plan_path, sizeof plan_path);
    out_path(pl, "curve.svg", svg_path, sizeof svg_path);
    snprintf(name, sizeof name, "%s", o->model_path);

    Pi2__Plan plan = PI2__PLAN__INIT;
    Pi2__PlanPrediction pred = PI2__PLAN_PREDICTION__INIT;
    const int n_layer = pl->m.n_layer;
    uint32_t *hot = malloc(sizeof(uint32_t) * (size_t)n_layer), *lent = malloc(sizeof(uint32_t) * (size_t)n_layer);
    uint32_t *clusters = malloc(sizeof(uint32_t) * (size_t)pl->conf.cpu_workers);
    Pi2__PlanCurvePoint points[CURVE_POINTS + 2], *curve[CURVE_POINTS + 2];
    if (!hot || !lent || !clusters) {
        free(hot), free(lent), free(clusters);
        log_error("out of memory writing the plan");
        return -1;
    }
    uint64_t hot_total = 0, lent_total = 0;
    for (int l = 0; l < n_layer; l++) hot[l] = (uint32_t)lay->hot_bundles[l], hot_total += hot[l];
    for (int l = 0; l < n_layer; l++) lent[l] = (uint32_t)lay->lent_bundles[l], lent_total += lent[l];
    const int threads_per_worker = pl->conf.threads / pl->conf.cpu_workers;
    for (int w = 0; w < pl->conf.cpu_workers; w++) clusters[w] = cluster_neurons(pl, lay, threads_per_worker);

    plan.version = PLAN_VERSION;
    plan.model_name = basename(name);
    plan.model_size = pl->m.gguf.size;
    plan.model_fingerprint = model_fingerprint(&pl->m);
    plan.n_layer = (uint32_t)n_layer;
    plan.n_ff = (uint32_t)pl->m.n_ff;
    plan.n_embd = (uint32_t)pl->m.n_embd;
    plan.mode = pl->in.mode == FFN_PREDICTOR ? PI2__PLAN_MODE__PLAN_MODE_PREDICTOR : PI2__PLAN_MODE__PLAN_MODE_GATE_FIRST;
    plan.ctx = (uint32_t)o->ctx;
    plan.budget_bytes = lay->budget;
    plan.floor_bytes = floor < lay->budget ? floor : lay->budget;
    plan.preload_bytes = pl->prefill_fixed[0].preload;
    plan.process_bytes = lay->process;
    plan.max_prefill = (uint32_t)lay->max_prefill;
    plan.staging_bytes = lay->all_resident ? 0 : pl->prefill_fixed[0].staging;
    plan.hot_bytes = hot_total * lay->hot_stride;
    plan.hot_bundle_bytes = lay->hot_stride;
    plan.cold_bytes = (uint64_t)lay->cold_slots * lay->stride;
    plan.n_hot_bundles = (size_t)n_layer;
    plan.hot_bundles = hot;
    plan.cold_slots = (uint32_t)lay->cold_slots;
    if (lent_total) {
        plan.n_lent_bundles = (size_t)n_layer;
        plan.lent_bundles = lent;
        plan.lent_bytes = lent_total * lay->stride;
    }
    plan.bundle_file = "bundles.gguf";
    plan.per_bundle = (uint32_t)lay->order->per_bundle;
    plan.bundle_stride = lay->stride;
    plan.queue_depth = (uint32_t)lay->queue_depth;
    plan.cpu_workers = (uint32_t)pl->conf.cpu_workers;
    plan.threads_per_worker = (uint32_t)(threads_per_worker > 0 ? threads_per_worker : 1);
    plan.n_cluster_neurons = (size_t)pl->conf.cpu_workers;
    plan.cluster_neurons = clusters;
    plan.placement = pl->conf.placement;
    pred.tok_s = lay->pred.tok_s;
    pred.hit_rate = lay->pred.hit_rate;
    pred.misses_per_token = lay->pred.misses_per_token;
    pred.compute_ms = lay->pred.compute_ms;
    pred.io_ms = lay->pred.io_ms;
    pred.exposed_io_ms = lay->pred.exposed_io_ms;
    plan.prediction = &pred;
    plan.target_tok_s = o->target;
    in_memory_speeds(pl, &plan.resident_tok_s, &plan.dense_tok_s);
    plan.hw_profile = pl->hw_path;
    plan.model_profile = "model-profile.gguf";
    plan.predictor = (char *)(pl->in.mode == FFN_PREDICTOR && o->predictor_path ? o->predictor_path : "");

    /* the curve: from the floor to everything resident, with the plan's budget among the points */
    const uint64_t lo = floor, hi = all_resident_budget(pl) > lo ? all_resident_budget(pl) : lo + 1;
    uint64_t budgets[CURVE_POINTS + 2];
    int nb = 0;
    for (int i = 0; i < CURVE_POINTS; i++) {
        const uint64_t b = lo + (hi - lo) * (uint64_t)i / (CURVE_POINTS - 1);
        if (nb && budgets[nb - 1] < lay->budget && b > lay->budget) budgets[nb++] = lay->budget;
        if (!nb || b > budgets[nb - 1]) budgets[nb++] = b;
    }
    if (budgets[nb - 1] < lay->budget) budgets[nb++] = lay->budget;
    size_t n = 0;
    for (int i = 0; i < nb; i++) {
        layout at;
        if (best_layout(pl, budgets[i], &at, false)) continue;
        points[n] = (Pi2__PlanCurvePoint)PI2__PLAN_CURVE_POINT__INIT;
        points[n].budget_bytes = budgets[i], points[n].tok_s = at.pred.tok_s, points[n].hit_rate = at.pred.hit_rate;
        curve[n] = &points[n];
        n++;
        layout_free(&at);
    }
    plan.n_curve = n;
    plan.curve = curve;

    int rc = plan_save(&plan, plan_path, err, sizeof err);
    if (rc) log_error("%s", err);
    if (!rc && plan_write_svg(&plan, svg_path, err, sizeof err)) log_warn("%s", err);
    if (!rc) {
        plan_print(stdout, &plan);
        printf("\npredicted speed by memory budget (also %s):\n", svg_path);
        plan_print_curve(stdout, &plan);
        printf("\nwrote %s\n", plan_path);
    }
    free(hot), free(lent), free(clusters);
    return rc;
}

static double max_active(const planning *pl) {
    double v = 0;
    for (int l = 0; l < pl->m.n_layer; l++) v = fmax(v, pl->orders[0].active[l]);
    return v;
}

static double min_active(const planning *pl) {
    double v = pl->m.n_ff;
    for (int l = 0; l < pl->m.n_layer; l++) v = fmin(v, pl->orders[0].active[l]);
    return v;
}

/* ---- the steps ---- */

/* ORDER_AUTO: the file's order when pi2-reorder made it hottest-first (its pi2.reorder.* keys). */
static bundle_order_kind bundle_order_for(const model *m, bundle_order_kind asked) {
    uint64_t granularity;
    const bool hottest_first = gguf_get_uint(&m->gguf, REORDER_KEY_GRANULARITY, &granularity);
    const bundle_order_kind kind = asked != ORDER_AUTO ? asked : hottest_first ? ORDER_FILE : ORDER_PROFILE;
    if (kind == ORDER_FILE)
        log_info("bundles in the model file's neuron order%s: the pinned neurons are a prefix of each layer in it",
                 hottest_first ? " (hottest-first, by pi2-reorder)" : " (--order file)");
    else if (hottest_first)
        log_info("--order profile: bundles hottest-first by the calibration, not in the file's order");
    else if (m->layers[0].down_t.data) /* a PWRI file: its prompt could copy pinned rows instead of reading them */
        log_info("a prompt under the budget copies pinned neurons' rows only where they lie together in the "
                 "file: a copy ordered hottest-first (pi2-reorder -m MODEL -o HOT.pwri, then plan HOT.pwri) keeps "
                 "them together (docs/offload.md)");
    return kind;
}

static int plan_steps(planning *pl) {
    const plan_options *o = pl->o;
    char err[512];
    if (model_load(&pl->m, o->model_path, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    pl->model_loaded = true;
    if (stack_conf_read(o->conf_path, (int)sysconf(_SC_NPROCESSORS_ONLN), &pl->conf, err, sizeof err)) {
        log_error("%s", err);
        return -1;
    }
    char failed[1024];
    if (mkdirs(o->out_dir, failed, sizeof failed)) {
        log_error("-o %s: cannot create %s: %s", o->out_dir, failed, strerror(errno));
        return -1;
    }
    const bool has_predictor = pl->m.layers[0].fc1.data != NULL || o->predictor_path;
    ffn_mode mode = o->mode_given ? o->mode : has_predictor ? FFN_PREDICTOR : FFN_GATE_FIRST;
    uint64_t side_bytes = 0;
    if (o->predictor_path && mode == FFN_PREDICTOR) {
        struct stat st;
        if (stat(o->predictor_path, &st)) {
            log_error("--predictor %s: %s", o->predictor_path, strerror(errno));
            return -1;
        }
        side_bytes = (uint64_t)st.st_size;
    }
    pl->in = (layout_inputs){.m = &pl->m,
                             .mode = mode,
                             .ctx = o->ctx,
                             .n_processes = pl->conf.n_processes,
                             .threads = pl->conf.threads,
                             .cpu_workers = pl->conf.cpu_workers,
                             .max_prefill = pl->conf.max_prefill,
                             .side_predictor_bytes = side_bytes,
                             .io_shares_compute = pl->conf.io_shares_compute,
                             .checksums = pl->conf.checksums,
                             .hw = &pl->hw};
    pl->n_prefill = pl->conf.max_prefill_set ? 1 : PREFILL_CHOICES;
    for (int p = 0; p < pl->n_prefill; p++) {
        pl->prefill_in[p] = pl->in;
        if (!pl->conf.max_prefill_set) pl->prefill_in[p].max_prefill = prefill_choice[p];
        layout_fixed_of(&pl->prefill_in[p], &pl->prefill_fixed[p]);
    }
    if (o->budget) {
        /* refused before the profiles, which take minutes on a large model */
        const layout_fixed *least = NULL;
        const uint64_t lowest = least_budget_before_profiles(pl, &least);
        if (o->budget < lowest) {
            const uint64_t rest = lowest - least->preload - least->process;
            log_needs(lowest, least, rest == least->staging ? "prefill staging" : "every neuron resident", rest,
                      "before the cache the model profile sizes", o->budget);
            return -1;
        }
    }
    if (read_prompts(pl) || hardware_profile(pl) || model_profile_step(pl)) return -1;
    const bundle_order_kind order = bundle_order_for(&pl->m, o->order);
    for (int c = 0; c < N_CHOICES; c++)
        if (bundle_order_make(&pl->orders[c], &pl->prof, per_bundle_choice[c], order)) {
            log_error("out of memory ordering bundles");
            return -1;
        }

    printf("model profile: %d calibration tokens; neurons fired per token, by layer (of %d):", pl->prof.n_tokens,
           pl->m.n_ff);
    for (int l = 0; l < pl->m.n_layer; l++)
        printf("%s%.0f", l % 16 ? " " : "\n  ", pl->orders[0].active[l]);
    printf("\n  sparsity %.1f %% to %.1f %% of the neurons idle per token\n\n", 100 * (1 - max_active(pl) / pl->m.n_ff),
           100 * (1 - min_active(pl) / pl->m.n_ff));
    uint64_t budget = o->budget;
    if (o->target > 0) {
        uint64_t needed;
        if (budget_for_target(pl, o->target, &needed)) return -1;
        if (budget && needed > budget) {
            log_error("--target-speed %.2f needs a budget of %.0f MiB, more than --mem-budget %.0f MiB", o->target,
                      needed / 1048576.0, budget / 1048576.0);
            return -1;
        }
        log_info("--target-speed %.2f tok/s: a budget of %.0f MiB is predicted to reach it", o->target,
                 needed / 1048576.0);
        budget = needed;
    }
    const uint64_t floor = floor_of(pl);
    layout lay;
    if (best_layout(pl, budget, &lay, true)) {
        const layout_fixed *least = &pl->prefill_fixed[pl->n_prefill - 1];
        log_needs(floor, least, "prefill staging", least->staging, "a minimal cache", budget);
        return -1;
    }
    char bundle_path[1024];
    out_path(pl, "bundles.gguf", bundle_path, sizeof bundle_path);
    const int rc = write_bundles(pl, &lay, bundle_path) || write_plan(pl, &lay, floor) ? -1 : 0;
    layout_free(&lay);
    return rc;
}

int plan_run(const plan_options *o) {
    planning pl = {.o = o};
    const int rc = plan_steps(&pl);
    for (int c = 0; c < N_CHOICES; c++) bundle_order_free(&pl.orders[c]);
    if (pl.prof.counts) model_profile_free(&pl.prof);
    calib_free_prompts(pl.extra_prompts, pl.n_extra);
    if (pl.model_loaded) model_free(&pl.m);
    return rc;
}
