/* Plans in words and pictures (plan_report.h). */
#include "plan_report.h"

#include <errno.h>
#include <string.h>

#include "plan/plan_file.h"
#include "util/log.h"

static double mib(uint64_t bytes) { return (double)bytes / (1 << 20); }

static const char *mode_name(Pi2__PlanMode m) {
    return m == PI2__PLAN_MODE__PLAN_MODE_PREDICTOR ? "predictor" : m == PI2__PLAN_MODE__PLAN_MODE_GATE_FIRST ? "gate-first" : "?";
}

void plan_print(FILE *out, const Pi2__Plan *p) {
    const Pi2__PlanPrediction *q = p->prediction;
    fprintf(out, "plan for %s (%u layers, %u neurons per layer, dim %u), %s mode, context %u\n", p->model_name,
            p->n_layer, p->n_ff, p->n_embd, mode_name(p->mode), p->ctx);
    fprintf(out, "memory budget  %9.1f MiB (the model needs at least %.1f MiB)\n", mib(p->budget_bytes),
            mib(p->floor_bytes));
    fprintf(out, "  preloaded    %9.1f MiB  attention, norms, output, %s, KV cache\n", mib(p->preload_bytes),
            p->mode == PI2__PLAN_MODE__PLAN_MODE_PREDICTOR ? "predictors" : "every gate row");
    if (p->max_prefill)
        fprintf(out, "  processes    %9.1f MiB  the prompt's buffers for %u tokens a step (max-prefill)\n",
                mib(p->process_bytes), p->max_prefill);
    else
        fprintf(out, "  processes    %9.1f MiB\n", mib(p->process_bytes));
    fprintf(out, "  staging      %9.1f MiB  prefill: slots of FFN rows streamed from the model\n",
            mib(p->staging_bytes));
    uint64_t hot = 0, total = (uint64_t)p->n_layer * (uint64_t)plan_bundles_per_layer(p->n_ff, p->per_bundle);
    for (size_t l = 0; l < p->n_hot_bundles; l++) hot += p->hot_bundles[l];
    const uint64_t hot_bundle = plan_hot_bundle_bytes(p);
    fprintf(out, "  hot          %9.1f MiB  %llu of %llu bundles pinned (%.1f %%), %llu bytes each%s\n",
            mib(p->hot_bytes), (unsigned long long)hot, (unsigned long long)total,
            total ? 100.0 * (double)hot / (double)total : 0, (unsigned long long)hot_bundle,
            hot_bundle < p->bundle_stride ? " (packed)" : "");
    fprintf(out, "  cold cache   %9.1f MiB  %u slots, CLOCK\n", mib(p->cold_bytes), p->cold_slots);
    if (p->lent_bytes) {
        uint64_t lent = 0;
        for (size_t l = 0; l < p->n_lent_bundles; l++) lent += p->lent_bundles[l];
        fprintf(out, "  lent         %9.1f MiB  %llu more bundles between prompts, in the prompt's buffers and staging\n",
                mib(p->lent_bytes), (unsigned long long)lent);
    }
    fprintf(out, "hot bundles per layer:");
    for (size_t l = 0; l < p->n_hot_bundles; l++) fprintf(out, "%s%u", l % 16 ? " " : "\n  ", p->hot_bundles[l]);
    fprintf(out, "\nbundle file    %s: %u neuron%s per bundle, %llu bytes each\n", p->bundle_file, p->per_bundle,
            p->per_bundle > 1 ? "s" : "", (unsigned long long)p->bundle_stride);
    fprintf(out, "I/O            queue depth %u a cpu-worker (the io-worker keeps up to %u reads in flight)\n",
            p->queue_depth, plan_reads_in_flight(p->queue_depth, p->cpu_workers));
    fprintf(out, "compute        %u cpu-worker%s x %u thread%s, clusters of", p->cpu_workers,
            p->cpu_workers > 1 ? "s" : "", p->threads_per_worker, p->threads_per_worker > 1 ? "s" : "");
    for (size_t i = 0; i < p->n_cluster_neurons; i++) fprintf(out, " %u", p->cluster_neurons[i]);
    fprintf(out, " neurons\nplacement:\n");
    const char *line = p->placement;
    while (*line) {
        const size_t len = strcspn(line, "\n");
        fprintf(out, "  %.*s\n", (int)len, line);
        line += len + (line[len] == '\n');
    }
    fprintf(out, "predicted      %.2f tok/s: hit rate %.1f %%, %.1f bundle reads per token, compute %.1f ms, "
                 "reads %.1f ms of which %.1f ms not hidden\n",
            q->tok_s, 100 * q->hit_rate, q->misses_per_token, q->compute_ms, q->io_ms, q->exposed_io_ms);
    fprintf(out, "in memory      %.2f tok/s with the whole model resident; %.2f with a dense FFN\n", p->resident_tok_s,
            p->dense_tok_s);
    if (p->target_tok_s > 0) fprintf(out, "target         %.2f tok/s\n", p->target_tok_s);
    fprintf(out, "profiles       hardware %s, model %s\n", p->hw_profile, p->model_profile);
    if (p->predictor[0]) fprintf(out, "predictor      %s\n", p->predictor);
}

void plan_print_curve(FILE *out, const Pi2__Plan *p) {
    fprintf(out, "%12s %10s %10s\n", "budget MiB", "tok/s", "hit rate");
    for (size_t i = 0; i < p->n_curve; i++)
        fprintf(out, "%12.0f %10.2f %9.1f%%%s\n", mib(p->curve[i]->budget_bytes), p->curve[i]->tok_s,
                100 * p->curve[i]->hit_rate, p->curve[i]->budget_bytes == p->budget_bytes ? "  <- plan" : "");
}

int plan_write_svg(const Pi2__Plan *p, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        err_set(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    enum { W = 640, H = 400, L = 70, R = 20, T = 40, B = 50 };
    double x_max = mib(p->budget_bytes), y_max = p->prediction->tok_s;
    for (size_t i = 0; i < p->n_curve; i++) {
        if (mib(p->curve[i]->budget_bytes) > x_max) x_max = mib(p->curve[i]->budget_bytes);
        if (p->curve[i]->tok_s > y_max) y_max = p->curve[i]->tok_s;
    }
    x_max *= 1.05, y_max = y_max * 1.1 + 1e-9;
#define X(v) (L + (v) / x_max * (W - L - R))
#define Y(v) (H - B - (v) / y_max * (H - T - B))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"14\">%s: predicted decode speed by memory budget</text>\n", L,
            p->model_name);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int i = 0; i <= 5; i++) {
        const double xv = x_max * i / 5, yv = y_max * i / 5;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", X(xv), H - B + 18, xv);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n", L - 6, Y(yv) + 4, yv);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">memory budget, MiB</text>\n", (L + W - R) / 2, H - 12);
    fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">tok/s</text>\n",
            (T + H - B) / 2, (T + H - B) / 2);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"");
    for (size_t i = 0; i < p->n_curve; i++)
        fprintf(f, "%.1f,%.1f ", X(mib(p->curve[i]->budget_bytes)), Y(p->curve[i]->tok_s));
    fprintf(f, "\"/>\n");
    const double bx = X(mib(p->budget_bytes)), by = Y(p->prediction->tok_s);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\n", bx,
            T, bx, H - B);
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n", bx, by);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">plan: %.0f MiB, %.2f tok/s</text>\n", bx + 6, by - 8,
            mib(p->budget_bytes), p->prediction->tok_s);
    fprintf(f, "</svg>\n");
#undef X
#undef Y
    if (fclose(f)) {
        err_set(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
