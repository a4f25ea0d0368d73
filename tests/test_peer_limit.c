/* lib/stack/peer_limit.c: one line a second per peer with the count of what
 * was held back, a closing count for a burst that stopped, and a bounded
 * table that a flood of fresh identities cannot grow. */
#include <stdio.h>
#include <string.h>

#include "stack/peer_limit.h"
#include "test.h"

static bool allow(peer_limit *t, const char *id, int64_t now, uint64_t *held) {
    return peer_limit_allow(t, id, strlen(id), now, held);
}

static void test_one_a_second(void) {
    peer_limit t = {0};
    uint64_t held = 99;
    CHECK(allow(&t, "a", 5000, &held) && held == 0, "a peer's first event goes out (held %llu)",
          (unsigned long long)held);
    int let = 0;
    for (int64_t ms = 5001; ms < 5000 + PEER_LIMIT_MS; ms++) let += allow(&t, "a", ms, &held);
    CHECK(let == 0, "%d more lines within its second", let);
    CHECK(allow(&t, "b", 5001, &held), "another peer has its own second");
    CHECK(allow(&t, "a", 5000 + PEER_LIMIT_MS, &held) && held == PEER_LIMIT_MS - 1,
          "the next second's line counts the %d held back (%llu)", PEER_LIMIT_MS - 1, (unsigned long long)held);
}

static void test_overdue(void) {
    peer_limit t = {0};
    uint64_t held;
    peer_limit_entry e;
    allow(&t, "a", 0, &held);
    CHECK(!peer_limit_overdue(&t, 2 * PEER_LIMIT_MS, &e), "nothing held back: no closing line");
    for (int i = 0; i < 7; i++) allow(&t, "a", 10 + i, &held);
    CHECK(!peer_limit_overdue(&t, PEER_LIMIT_MS - 1, &e), "not before its second is over");
    CHECK(peer_limit_overdue(&t, PEER_LIMIT_MS, &e) && e.held == 7 && e.id_len == 1 && e.id[0] == 'a',
          "a burst that stopped gets its count (%llu)", (unsigned long long)e.held);
    CHECK(!peer_limit_overdue(&t, PEER_LIMIT_MS, &e), "and only once");
    CHECK(!allow(&t, "a", PEER_LIMIT_MS + 1, &held), "the closing line took that second's turn");
}

static void test_bounded(void) {
    peer_limit t = {0};
    uint64_t held;
    char id[32];
    int let = 0;
    for (int i = 0; i < 10000; i++) {
        snprintf(id, sizeof id, "garbage-%d", i);
        let += allow(&t, id, 1000 + i / 100, &held);
    }
    CHECK(t.n == PEER_LIMIT_SLOTS, "%d entries after 10000 identities", t.n);
    CHECK(let == 10000, "each fresh identity's first line goes out (%d)", let);
    allow(&t, "garbage-9999", 2000, &held);
    snprintf(id, sizeof id, "garbage-%d", 10000);
    allow(&t, id, 2001, &held);
    CHECK(!allow(&t, "garbage-9999", 2002, &held), "the newest entries stay: not the one evicted");
    char long_id[BUS_PEER_MAX + 10];
    memset(long_id, 'x', sizeof long_id);
    long_id[sizeof long_id - 1] = 0;
    CHECK(allow(&t, long_id, 3000, &held) && !allow(&t, long_id, 3001, &held),
          "an over-long identity is cut, not overflowed");
}

int main(void) {
    test_one_a_second();
    test_overdue();
    test_bounded();
    return test_summary();
}
