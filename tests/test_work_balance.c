/* lib/stack/work_balance.c and the cuts of stack.h's work_share: the split
 * is parsed as written, its cuts cover every dimension once for any shares,
 * and a balanced split settles where simulated workers of known speeds (and
 * a fixed cost each) finish together, checked against that speed ratio
 * computed here, not against the balancer's own output. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "rng.h"
#include "stack/stack.h"
#include "stack/work_balance.h"
#include "test.h"

static double share_of(const work_balance *b, int i) {
    return (double)(b->cut[i + 1] - b->cut[i]) / WORK_SHARE_ONE;
}

static void check_cuts(const char *what, const work_balance *b) {
    int ok = b->cut[0] == 0 && b->cut[b->n] == WORK_SHARE_ONE;
    for (int i = 0; i < b->n; i++) ok &= b->cut[i] < b->cut[i + 1];
    CHECK(ok, "%s: cuts not strictly increasing from 0 to %u", what, WORK_SHARE_ONE);
}

static void test_parse(void) {
    char err[256];
    work_balance b;
    CHECK(!work_balance_parse(&b, "auto", 2, err, sizeof err) && b.adaptive && b.cut[1] == 32768, "auto: %s", err);
    CHECK(!work_balance_parse(&b, "even", 3, err, sizeof err) && !b.adaptive && b.cut[1] == 21845 &&
              b.cut[2] == 43690, "even over 3: cuts %u %u", b.cut[1], b.cut[2]);
    CHECK(!work_balance_parse(&b, "1,3", 2, err, sizeof err) && !b.adaptive && b.cut[1] == 16384,
          "1,3: cut %u (expected a quarter, 16384)", b.cut[1]);
    CHECK(!work_balance_parse(&b, "2.5,2.5,5", 3, err, sizeof err) && b.cut[1] == 16384 && b.cut[2] == 32768,
          "2.5,2.5,5: cuts %u %u", b.cut[1], b.cut[2]);
    check_cuts("2.5,2.5,5", &b);
    const char *bad[] = {"", "x", "1", "1,2,3", "1,", "0,1", "-1,2", "1,,2", "1;2", "nan,1", "1,2e9"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CHECK(work_balance_parse(&b, bad[i], 2, err, sizeof err) && err[0], "'%s' over 2 workers accepted", bad[i]);
    }
    CHECK(work_balance_parse(&b, "auto", STACK_MAX_CPU_WORKERS + 1, err, sizeof err), "17 workers accepted");
    /* one worker: its cut is everything, and updates leave it so */
    CHECK(!work_balance_parse(&b, "auto", 1, err, sizeof err) && b.cut[1] == WORK_SHARE_ONE, "one worker");
    uint64_t busy1 = 5;
    work_balance_update(&b, &busy1);
    CHECK(b.cut[1] == WORK_SHARE_ONE, "one worker's cut moved to %u", b.cut[1]);
}

/* Items [0, n) of every dimension are each some worker's, exactly once, for any cuts. */
static void test_cuts_cover(void) {
    model m = {0};
    m.n_head_kv = 8, m.n_embd = 4096, m.n_ff = 11008, m.n_vocab = 32000;
    rng_seed(7);
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        int nw = 1 + (int)(rng_u32() % 5);
        uint32_t cut[6] = {0};
        for (int i = 1; i < nw; i++) cut[i] = cut[i - 1] + 1 + rng_u32() % (WORK_SHARE_ONE / (uint32_t)nw);
        cut[nw] = WORK_SHARE_ONE;
        long next[4] = {0, 0, 0, 0};
        for (int w = 0; w < nw; w++) {
            work_share s;
            work_share_from_cut(&s, &m, cut[w], cut[w + 1]);
            long b[4] = {s.kvh_begin, s.row_begin, s.ff_begin, s.vocab_begin};
            long e[4] = {s.kvh_end, s.row_end, s.ff_end, s.vocab_end};
            for (int d = 0; d < 4; d++) {
                bad += b[d] != next[d] || e[d] < b[d];
                next[d] = e[d];
            }
        }
        bad += next[0] != m.n_head_kv || next[1] != m.n_embd || next[2] != m.n_ff || next[3] != m.n_vocab;
    }
    CHECK(bad == 0, "%d gaps or overlaps in 200 random splits", bad);
    /* the even split of three: each boundary at the nearest item to a third */
    work_share s;
    work_share_compute(&s, &m, 1, 3);
    CHECK(s.row_begin == 1365 && s.row_end == 2731 && s.kvh_begin == 3 && s.kvh_end == 5,
          "even split of 3, worker 1: rows [%ld, %ld), heads [%ld, %ld)", s.row_begin, s.row_end, s.kvh_begin,
          s.kvh_end);
    /* a cut a little off the middle of 32 heads leaves them 16 / 16 */
    m.n_head_kv = 32;
    work_share_from_cut(&s, &m, 0, 32768 - 600);
    CHECK(s.kvh_end == 16, "a cut at 49.1 %% gave worker 0 %ld of 32 heads", s.kvh_end);
}

/* Simulated workers: worker i computes a share s in fixed[i] + s * per_share[i] ns (noise: +- jitter). */
static void run_tokens(work_balance *b, int tokens, const double *fixed, const double *per_share, double jitter) {
    for (int t = 0; t < tokens; t++) {
        uint64_t busy[STACK_MAX_CPU_WORKERS];
        for (int i = 0; i < b->n; i++) {
            double noise = 1 + jitter * rng_uniform();
            busy[i] = (uint64_t)((fixed[i] + share_of(b, i) * per_share[i]) * noise);
        }
        work_balance_update(b, busy);
    }
}

static void test_converges(void) {
    char err[256];
    work_balance b;
    rng_seed(11);
    /* a big core and a LITTLE one at a third of its speed: 3/4 and 1/4 finish together */
    work_balance_parse(&b, "auto", 2, err, sizeof err);
    const double fixed0[2] = {0, 0}, big_little[2] = {100e6, 300e6};
    run_tokens(&b, 20, fixed0, big_little, 0);
    CHECK(fabs(share_of(&b, 0) - 0.75) < 0.005, "big.LITTLE 3:1: worker 0 has %.4f, expected 0.75", share_of(&b, 0));
    check_cuts("3:1", &b);
    /* with a fixed cost on one worker (another process on its core): equal times, worked out here */
    work_balance_parse(&b, "auto", 2, err, sizeof err);
    const double fixed1[2] = {20e6, 0}, same[2] = {160e6, 160e6};
    run_tokens(&b, 30, fixed1, same, 0);
    double expect = (160e6 - 20e6) / (2 * 160e6); /* 20 + 160 s = 160 (1 - s) */
    CHECK(fabs(share_of(&b, 0) - expect) < 0.005, "fixed 20 ms on worker 0: share %.4f, expected %.4f",
          share_of(&b, 0), expect);
    /* four workers of speeds 1, 2, 3, 4, with 10 % noise: near 0.1, 0.2, 0.3, 0.4 throughout */
    work_balance_parse(&b, "auto", 4, err, sizeof err);
    const double fixed4[4] = {0, 0, 0, 0}, speeds4[4] = {400e6, 200e6, 400e6 / 3, 100e6};
    run_tokens(&b, 20, fixed4, speeds4, 0.1);
    double worst = 0;
    for (int t = 0; t < 200; t++) {
        run_tokens(&b, 1, fixed4, speeds4, 0.1);
        for (int i = 0; i < 4; i++) { /* a plain compare: gcc 12's aarch64 vectorizer fails on an fmax reduction here */
            const double off = fabs(share_of(&b, i) - 0.1 * (i + 1));
            if (off > worst) worst = off;
        }
    }
    CHECK(worst < 0.04, "speeds 1:2:3:4 with 10 %% noise: a share strayed %.3f from its target", worst);
    /* a worker nearly stopped keeps the floor, and gets its share back once it recovers */
    work_balance_parse(&b, "auto", 2, err, sizeof err);
    const double stalled[2] = {100e6, 100e6 * 1000};
    run_tokens(&b, 40, fixed0, stalled, 0);
    CHECK(fabs(share_of(&b, 1) - WORK_BALANCE_MIN_OF_EVEN / 2) < 0.002, "stalled worker has %.4f, floor %.4f",
          share_of(&b, 1), WORK_BALANCE_MIN_OF_EVEN / 2);
    const double equal[2] = {100e6, 100e6};
    run_tokens(&b, 30, fixed0, equal, 0);
    CHECK(fabs(share_of(&b, 1) - 0.5) < 0.005, "recovered worker has %.4f, expected 0.5", share_of(&b, 1));
    /* a token without a measurement (a restarted worker) leaves the split */
    uint32_t before = b.cut[1];
    uint64_t none[2] = {50000000, 0};
    work_balance_update(&b, none);
    CHECK(b.cut[1] == before, "a token with no busy time moved the cut %u -> %u", before, b.cut[1]);
    /* fixed splits never move */
    work_balance_parse(&b, "1,3", 2, err, sizeof err);
    run_tokens(&b, 10, fixed0, big_little, 0);
    CHECK(b.cut[1] == 16384, "a fixed split moved to %u", b.cut[1]);
}

/* What `pi2 status` and the coordinator's log say: the published cuts, as shares. */
static void test_describe(void) {
    static stack_ctl ctl;
    char err[256], line[256];
    memset(&ctl, 0, sizeof ctl);
    ctl.params.n_cpu_workers = 2;
    CHECK(work_balance_describe(&ctl, line, sizeof line) == -1, "a split described before any was published");
    work_balance b;
    work_balance_parse(&b, "1,3", 2, err, sizeof err);
    work_balance_publish(&b, &ctl);
    CHECK(!work_balance_describe(&ctl, line, sizeof line) &&
              !strcmp(line, "decode split (fixed): cpu-worker.0 25.0 %, cpu-worker.1 75.0 %"),
          "described as '%s'", line);
    work_balance_parse(&b, "auto", 2, err, sizeof err);
    work_balance_publish(&b, &ctl);
    CHECK(!work_balance_describe(&ctl, line, sizeof line) &&
              !strcmp(line, "decode split (balanced): cpu-worker.0 50.0 %, cpu-worker.1 50.0 %"),
          "described as '%s'", line);
    atomic_store(&ctl.split_cut[1], WORK_SHARE_ONE + 1); /* a read between two updates, or garbage */
    CHECK(work_balance_describe(&ctl, line, sizeof line) == -1, "cuts out of order described as '%s'", line);
}

int main(void) {
    test_parse();
    test_describe();
    test_cuts_cover();
    test_converges();
    return test_summary();
}
