/* The plan file (lib/plan/plan_file.h): a plan saved and loaded is the same
 * message; every kind of bad plan is refused with an error naming the file
 * and the field: a truncated or corrupted file, an empty one, a directory,
 * another version, each field out of range, parts that exceed the budget,
 * counts that disagree (lent bundles among them: past a layer's bundles, or
 * more than the prompt's memory they live in), paths that leave the plan's directory, and a plan
 * made for another model file; any single corrupted byte; a bundle file
 * that is not the plan's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/predictor.h"
#include "mkmodel_run.h"
#include "plan/plan_file.h"
#include "test.h"
#include "util/checksum.h"

enum { LAYERS = 3, N_FF = 40, PER_BUNDLE = 2, STRIDE = 8192 };

typedef struct {
    Pi2__Plan plan;
    Pi2__PlanPrediction pred;
    Pi2__PlanCurvePoint points[2];
    Pi2__PlanCurvePoint *curve[2];
    uint32_t hot[LAYERS], lent[LAYERS];
    uint32_t clusters[2];
} fixture;

/* a consistent plan for a made-up model of LAYERS x N_FF */
static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->plan = (Pi2__Plan)PI2__PLAN__INIT;
    f->pred = (Pi2__PlanPrediction)PI2__PLAN_PREDICTION__INIT;
    Pi2__Plan *p = &f->plan;
    p->version = PLAN_VERSION;
    p->model_name = "model.gguf";
    p->model_size = 123456;
    p->model_fingerprint = 0x1234;
    p->n_layer = LAYERS, p->n_ff = N_FF, p->n_embd = 64, p->ctx = 256;
    p->mode = PI2__PLAN_MODE__PLAN_MODE_PREDICTOR;
    for (int l = 0; l < LAYERS; l++) f->hot[l] = (uint32_t)(5 + l);
    p->n_hot_bundles = LAYERS, p->hot_bundles = f->hot;
    p->per_bundle = PER_BUNDLE, p->bundle_stride = STRIDE;
    p->hot_bytes = (5 + 6 + 7) * (uint64_t)STRIDE;
    p->cold_slots = 4, p->cold_bytes = 4 * (uint64_t)STRIDE;
    for (int l = 0; l < LAYERS; l++) f->lent[l] = (uint32_t)(2 + l);
    p->n_lent_bundles = LAYERS, p->lent_bundles = f->lent, p->lent_bytes = (2 + 3 + 4) * (uint64_t)STRIDE;
    p->preload_bytes = 1 << 20, p->process_bytes = 1 << 20, p->staging_bytes = 1 << 16;
    p->budget_bytes = 4 << 20, p->floor_bytes = 3 << 20;
    p->bundle_file = "bundles.gguf";
    p->model_profile = "model-profile.gguf";
    p->hw_profile = "/tmp/hw.txt";
    p->queue_depth = 16, p->cpu_workers = 2, p->threads_per_worker = 1;
    f->clusters[0] = f->clusters[1] = 8;
    p->n_cluster_neurons = 2, p->cluster_neurons = f->clusters;
    p->placement = "cpu-worker cpus=0 threads=1\ncpu-worker cpus=1 threads=1";
    f->pred.tok_s = 5.5, f->pred.hit_rate = 0.9, f->pred.misses_per_token = 3;
    f->pred.compute_ms = 100, f->pred.io_ms = 20, f->pred.exposed_io_ms = 5;
    p->prediction = &f->pred;
    for (int i = 0; i < 2; i++) {
        f->points[i] = (Pi2__PlanCurvePoint)PI2__PLAN_CURVE_POINT__INIT;
        f->points[i].budget_bytes = (uint64_t)(3 + i) << 20;
        f->points[i].tok_s = 4 + i, f->points[i].hit_rate = 0.8 + 0.1 * i;
        f->curve[i] = &f->points[i];
    }
    p->n_curve = 2, p->curve = f->curve;
}

static char dir[] = "/tmp/pi2-test-plan-XXXXXX";

static void path_of(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", dir, name); }

static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) fwrite(buf, 1, n, f), fclose(f);
}

/* p framed as plan_save frames it, without its validation: *n bytes */
static uint8_t *frame(const Pi2__Plan *p, size_t *n) {
    const size_t body = pi2__plan__get_packed_size(p);
    uint8_t *buf = malloc(body + 16);
    memcpy(buf, PLAN_MAGIC, 8);
    pi2__plan__pack(p, buf + 8);
    const uint64_t sum = checksum64(buf + 8, body);
    for (int i = 0; i < 8; i++) buf[8 + body + (size_t)i] = (uint8_t)(sum >> (8 * i));
    *n = body + 16;
    return buf;
}

static void test_round_trip(void) {
    fixture f;
    fixture_init(&f);
    char path[256], err[512] = "";
    path_of(path, sizeof path, "good.pb");
    CHECK(plan_save(&f.plan, path, err, sizeof err) == 0, "plan_save: %s", err);
    Pi2__Plan *p = plan_load(path, NULL, NULL, err, sizeof err);
    CHECK(p != NULL, "plan_load: %s", err);
    if (!p) return;
    CHECK(p->n_layer == LAYERS && p->per_bundle == PER_BUNDLE && p->hot_bundles[2] == 7 && p->cold_slots == 4 &&
              p->n_lent_bundles == LAYERS && p->lent_bundles[2] == 4 && p->lent_bytes == 9 * (uint64_t)STRIDE &&
              p->n_curve == 2 && p->curve[1]->tok_s == 5 && p->prediction->tok_s == 5.5 &&
              strcmp(p->placement, f.plan.placement) == 0 && strcmp(p->bundle_file, "bundles.gguf") == 0,
          "a loaded plan differs from the saved one");
    plan_free(p);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "plan_save left %s behind", tmp);
}

/* one broken field: saved unchecked, then plan_load must refuse it naming the field */
typedef void (*breaker)(fixture *f);
static void b_version(fixture *f) { f->plan.version = 2; }
static void b_mode(fixture *f) { f->plan.mode = PI2__PLAN_MODE__PLAN_MODE_UNSPECIFIED; }
static void b_layers(fixture *f) { f->plan.n_layer = 0; }
static void b_hot_count(fixture *f) { f->plan.n_hot_bundles = LAYERS - 1; }
static void b_hot_range(fixture *f) {
    f->hot[1] = N_FF / PER_BUNDLE + 1;
    f->plan.hot_bytes = (5 + 7 + N_FF / PER_BUNDLE + 1) * (uint64_t)STRIDE;
}
static void b_hot_bytes(fixture *f) { f->plan.hot_bytes += STRIDE; }
static void b_cold_bytes(fixture *f) { f->plan.cold_bytes = 0; }
static void b_hot_bundle_over(fixture *f) { f->plan.hot_bundle_bytes = STRIDE + 4096; }
/* packed hot bundles: hot_bytes counts them at hot_bundle_bytes */
static void b_hot_bundle_bytes(fixture *f) { f->plan.hot_bundle_bytes = STRIDE / 2; }
static void b_packed_no_cold(fixture *f) {
    f->plan.hot_bundle_bytes = STRIDE / 2, f->plan.hot_bytes = (5 + 6 + 7) * (uint64_t)(STRIDE / 2);
    f->plan.cold_slots = 0, f->plan.cold_bytes = 0;
}
static void b_lent_count(fixture *f) { f->plan.n_lent_bundles = LAYERS - 1; }
/* layer 2 has 20 bundles, 7 of them hot */
static void b_lent_range(fixture *f) { f->lent[2] = 14, f->plan.lent_bytes = (2 + 3 + 14) * (uint64_t)STRIDE; }
static void b_lent_bytes(fixture *f) { f->plan.lent_bytes -= STRIDE; }
static void b_lent_over(fixture *f) { f->plan.process_bytes = 0, f->plan.staging_bytes = 8 * STRIDE; }
static void b_over_budget(fixture *f) { f->plan.preload_bytes = f->plan.budget_bytes; }
static void b_floor(fixture *f) { f->plan.floor_bytes = f->plan.budget_bytes + 1; }
static void b_stride(fixture *f) { f->plan.bundle_stride = 5000; }
static void b_per_bundle(fixture *f) { f->plan.per_bundle = 65; }
static void b_depth(fixture *f) { f->plan.queue_depth = 0; }
static void b_clusters(fixture *f) { f->plan.n_cluster_neurons = 1; }
static void b_cluster_size(fixture *f) { f->clusters[1] = N_FF + 1; }
static void b_abs_path(fixture *f) { f->plan.bundle_file = "/etc/passwd"; }
static void b_dotdot(fixture *f) { f->plan.bundle_file = "../other/bundles.gguf"; }
static void b_profile_path(fixture *f) { f->plan.model_profile = "a/../../x"; }
static void b_nan(fixture *f) { f->pred.tok_s = NAN; }
static void b_hit(fixture *f) { f->pred.hit_rate = 1.5; }
static void b_curve(fixture *f) { f->points[1].budget_bytes = f->points[0].budget_bytes; }
static void b_prediction(fixture *f) { f->plan.prediction = NULL; }

static void test_bad_fields(void) {
    const struct {
        const char *name, *field;
        breaker fn;
    } cases[] = {
        {"version", "version", b_version},       {"mode", "mode", b_mode},
        {"n_layer", "n_layer", b_layers},         {"hot count", "hot_bundles", b_hot_count},
        {"hot range", "hot_bundles", b_hot_range}, {"hot bytes", "hot_bytes", b_hot_bytes},
        {"cold bytes", "cold_bytes", b_cold_bytes}, {"over budget", "budget_bytes", b_over_budget},
        {"floor", "floor_bytes", b_floor},         {"stride", "bundle_stride", b_stride},
        {"per_bundle", "per_bundle", b_per_bundle}, {"depth", "queue_depth", b_depth},
        {"clusters", "cluster_neurons", b_clusters}, {"cluster size", "cluster_neurons", b_cluster_size},
        {"absolute path", "bundle_file", b_abs_path}, {"dotdot", "bundle_file", b_dotdot},
        {"profile path", "model_profile", b_profile_path}, {"nan", "prediction", b_nan},
        {"hit rate", "prediction", b_hit},         {"curve", "curve", b_curve},
        {"no prediction", "prediction", b_prediction}, {"lent count", "lent_bundles", b_lent_count},
        {"lent range", "lent_bundles", b_lent_range}, {"lent bytes", "lent_bytes", b_lent_bytes},
        {"lent over", "lent_bytes", b_lent_over}, {"hot bundle over", "hot_bundle_bytes", b_hot_bundle_over},
        {"hot bundle bytes", "hot_bytes", b_hot_bundle_bytes}, {"packed, no cold", "cold_slots", b_packed_no_cold},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture f;
        fixture_init(&f);
        cases[i].fn(&f);
        char path[256], err[512] = "";
        path_of(path, sizeof path, "bad.pb");
        size_t n;
        uint8_t *buf = frame(&f.plan, &n);
        write_bytes(path, buf, n);
        free(buf);
        Pi2__Plan *p = plan_load(path, NULL, NULL, err, sizeof err);
        CHECK(p == NULL, "%s: a plan with a bad %s was accepted", cases[i].name, cases[i].field);
        CHECK(strstr(err, path) && (strstr(err, cases[i].field) || (strcmp(cases[i].field, "version") == 0 &&
                                                                     strstr(err, "version"))),
              "%s: the error does not name the file and '%s': %s", cases[i].name, cases[i].field, err);
        plan_free(p);
        char save_err[512] = "";
        fixture g;
        fixture_init(&g);
        cases[i].fn(&g);
        CHECK(plan_save(&g.plan, path, save_err, sizeof save_err) != 0, "%s: plan_save wrote a bad plan",
              cases[i].name);
    }
}

static void test_bad_files(void) {
    fixture f;
    fixture_init(&f);
    size_t n;
    uint8_t *buf = frame(&f.plan, &n);
    char path[256], err[512];
    path_of(path, sizeof path, "cut.pb");
    int refused = 0, cuts = 0;
    for (size_t len = 0; len < n; len += 7, cuts++) { /* every 7th truncation */
        write_bytes(path, buf, len);
        err[0] = '\0';
        Pi2__Plan *p = plan_load(path, NULL, NULL, err, sizeof err);
        refused += p == NULL && strstr(err, path) != NULL;
        plan_free(p);
    }
    CHECK(refused == cuts, "truncated plans: %d of %d refused with the file named", refused, cuts);
    int flips = 0, flip_refused = 0;
    for (size_t i = 0; i < n; i++) { /* every byte corrupted in turn: the header or the checksum catches it */
        uint8_t *bad = malloc(n);
        memcpy(bad, buf, n);
        bad[i] ^= 0xa5;
        write_bytes(path, bad, n);
        err[0] = '\0';
        Pi2__Plan *p = plan_load(path, NULL, NULL, err, sizeof err);
        flips++;
        flip_refused += p == NULL && strstr(err, path) != NULL;
        plan_free(p);
        free(bad);
    }
    CHECK(flip_refused == flips, "corrupted plans: %d of %d refused with the file named", flip_refused, flips);
    free(buf);
    CHECK(plan_load(dir, NULL, NULL, err, sizeof err) == NULL && strstr(err, dir), "a directory was read as a plan");
    char missing[256];
    path_of(missing, sizeof missing, "missing.pb");
    CHECK(plan_load(missing, NULL, NULL, err, sizeof err) == NULL && strstr(err, missing),
          "a missing plan file: %s", err);
}

/* a plan for one model file refused for another */
static void test_other_model(void) {
    char model_path[512], err[512] = "";
    if (mkmodel_run(dir, "tiny.gguf", "--preset tiny --act relu --seed 3", model_path, sizeof model_path)) {
        CHECK(0, "mkmodel failed");
        return;
    }
    model m;
    if (model_load(&m, model_path, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    fixture f;
    fixture_init(&f);
    f.plan.n_layer = (uint32_t)m.n_layer, f.plan.n_ff = (uint32_t)m.n_ff, f.plan.n_embd = (uint32_t)m.n_embd;
    uint32_t hot[64] = {0};
    f.plan.n_hot_bundles = (size_t)m.n_layer, f.plan.hot_bundles = hot, f.plan.hot_bytes = 0;
    f.plan.n_lent_bundles = 0, f.plan.lent_bytes = 0;
    f.plan.model_size = m.gguf.size;
    f.plan.model_fingerprint = model_fingerprint(&m);
    f.plan.per_bundle = PER_BUNDLE;
    char path[256];
    path_of(path, sizeof path, "for-tiny.pb");
    CHECK(m.n_layer <= 64 && plan_save(&f.plan, path, err, sizeof err) == 0, "plan_save: %s", err);
    Pi2__Plan *p = plan_load(path, &m, model_path, err, sizeof err);
    CHECK(p != NULL, "the plan for this model refused: %s", err);
    plan_free(p);
    /* the bundle file the plan names: its own, then one of another shape */
    char bpath[256];
    path_of(bpath, sizeof bpath, "bundles.gguf");
    bundle_file b;
    CHECK(bundle_write(&m, model_path, NULL, PER_BUNDLE, bpath, NULL, NULL, err, sizeof err) == 0 &&
              bundle_open(&b, bpath, &m, model_path, err, sizeof err) == 0,
          "bundle file: %s", err);
    f.plan.bundle_stride = b.stride;
    f.plan.cold_bytes = f.plan.cold_slots * (uint64_t)b.stride;
    f.plan.budget_bytes += f.plan.cold_bytes; /* the parts still fit */
    CHECK(plan_check_bundle(&f.plan, path, &b, bpath, err, sizeof err) == 0, "the plan's own bundle file: %s", err);
    /* hot bundles as the file has them, or packed: their neurons' rows, nothing else */
    const uint64_t packed = (uint64_t)b.per_bundle * b.neuron_bytes;
    const uint64_t sizes[] = {b.stride, packed, packed + 64, packed - 64};
    for (int i = 0; i < 4; i++) {
        f.plan.hot_bundle_bytes = sizes[i];
        const int rc = plan_check_bundle(&f.plan, path, &b, bpath, err, sizeof err);
        CHECK(i < 2 ? rc == 0 : rc != 0 && strstr(err, "hot_bundle_bytes") && strstr(err, bpath),
              "hot_bundle_bytes %llu (packed %llu, stride %zu): %s", (unsigned long long)sizes[i],
              (unsigned long long)packed, b.stride, i < 2 ? "refused" : err);
    }
    f.plan.hot_bundle_bytes = 0;
    f.plan.per_bundle = PER_BUNDLE + 1;
    CHECK(plan_check_bundle(&f.plan, path, &b, bpath, err, sizeof err) != 0 && strstr(err, path) && strstr(err, bpath),
          "a bundle file of another granularity: %s", err);
    f.plan.per_bundle = PER_BUNDLE;
    f.plan.model_fingerprint ^= 1;
    CHECK(plan_check_bundle(&f.plan, path, &b, bpath, err, sizeof err) != 0 && strstr(err, "does not match"),
          "a bundle file of another model: %s", err);
    bundle_close(&b);
    plan_save(&f.plan, path, err, sizeof err);
    p = plan_load(path, &m, model_path, err, sizeof err);
    CHECK(p == NULL && strstr(err, path) && strstr(err, model_path) && strstr(err, "another model"),
          "a plan for another model file: %s", err);
    plan_free(p);
    model_free(&m);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    test_round_trip();
    test_bad_fields();
    test_bad_files();
    test_other_model();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    return test_summary();
}
