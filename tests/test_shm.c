/* Shared-memory segments: create/attach/validate/detach/unlink, mode 0600,
 * refusal of hostile or truncated headers, generation counter across
 * processes, cross-process data, cleanup by prefix. Every segment uses a run
 * id with our pid and is removed at exit, also when a check fails. */
#include "util/clock.h"
#include "stack/shm.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char run_id[64], other_run_id[64];

static void cleanup(void) {
    shm_unlink_run(run_id);
    shm_unlink_run(other_run_id);
}

static void seg_name(char *buf, const char *what) {
    if (shm_make_name(buf, SHM_NAME_MAX, run_id, what)) {
        fprintf(stderr, "shm_make_name: %s\n", shm_last_error());
        exit(1);
    }
}

static bool shm_file_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static const struct shm_region_spec test_regions[] = {
    {"embeddings", 10000, SHM_ALIGN_PAGE, 0},
    {"norms", 100, SHM_ALIGN_CACHELINE, 0},
    {"cold", 3 * 4096 + 5, SHM_ALIGN_PAGE, 0},
};
#define N_TEST_REGIONS 3

static bool error_mentions(const char *word) { return strstr(shm_last_error(), word) != NULL; }

static void test_names(void) {
    char buf[SHM_NAME_MAX];
    CHECK(shm_make_name(buf, sizeof buf, "run1", "weights") == 0 && !strcmp(buf, "/pi2-run1-weights"), "%s",
          buf);
    CHECK(shm_make_name(buf, sizeof buf, "../x", "weights") < 0, "a '/' in the run id is refused");
    CHECK(shm_make_name(buf, sizeof buf, "run1", "") < 0, "empty segment name refused");
    CHECK(shm_create("no-slash", SHM_KIND_TEST, test_regions, 1, 0) == NULL, "name without leading '/'");
}

static void test_create_attach(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "basic");
    shm_segment *seg = shm_create(name, SHM_KIND_WEIGHTS, test_regions, N_TEST_REGIONS, 0);
    CHECK(seg != NULL, "create: %s", shm_last_error());
    if (!seg) return;

    struct stat st;
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", (unsigned)(st.st_mode & 0777));
    CHECK((uint64_t)st.st_size == shm_size(seg) && shm_size(seg) % 4096 == 0, "size %lld vs %llu",
          (long long)st.st_size, (unsigned long long)shm_size(seg));
    /* Prefaulted: tmpfs holds every page of the segment already. */
    CHECK((uint64_t)st.st_blocks * 512 >= shm_size(seg), "allocated %lld of %llu bytes",
          (long long)st.st_blocks * 512, (unsigned long long)shm_size(seg));

    CHECK(shm_region_count(seg) == N_TEST_REGIONS, "regions %d", shm_region_count(seg));
    for (int i = 0; i < shm_region_count(seg); i++) {
        const struct shm_region *r = shm_region_at(seg, i);
        CHECK(r->offset % test_regions[i].align == 0 && r->offset >= SHM_HEADER_SIZE, "region %d offset %llu",
              i, (unsigned long long)r->offset);
        CHECK(r->size == test_regions[i].size && r->offset + r->size <= shm_size(seg), "region %d size", i);
        if (i) {
            const struct shm_region *p = shm_region_at(seg, i - 1);
            CHECK(p->offset + p->size <= r->offset, "regions %d and %d overlap", i - 1, i);
        }
    }
    CHECK(shm_region_at(seg, N_TEST_REGIONS) == NULL && shm_region_at(seg, -1) == NULL, "index bounds");

    CHECK(shm_create(name, SHM_KIND_WEIGHTS, test_regions, N_TEST_REGIONS, 0) == NULL,
          "create refuses an existing name");

    uint64_t cold_size;
    uint8_t *cold = shm_region_ptr(seg, "cold", &cold_size);
    CHECK(cold && cold_size == test_regions[2].size, "region lookup");
    CHECK(shm_region_ptr(seg, "nope", NULL) == NULL, "unknown region");
    if (cold) memset(cold, 0xab, cold_size);

    shm_segment *att = shm_attach(name, SHM_KIND_WEIGHTS, 0);
    CHECK(att != NULL, "attach: %s", shm_last_error());
    if (att) {
        uint64_t sz;
        uint8_t *c2 = shm_region_ptr(att, "cold", &sz);
        CHECK(c2 && sz == cold_size && c2[0] == 0xab && c2[sz - 1] == 0xab, "attached process sees the data");
        CHECK(shm_generation(att) == shm_generation(seg) && !shm_is_stale(att), "same generation");
        shm_detach(att);
    }
    shm_segment *lazy = shm_attach(name, SHM_KIND_WEIGHTS, SHM_ATTACH_NO_POPULATE);
    CHECK(lazy != NULL, "attach without populating: %s", shm_last_error());
    if (lazy) {
        uint64_t sz;
        uint8_t *c4 = shm_region_ptr(lazy, "cold", &sz);
        if (c4) c4[sz - 2] = 0x5a; /* the io-worker's way in: written through this mapping */
        CHECK(c4 && sz == cold_size && c4[1] == 0xab && cold && cold[sz - 2] == 0x5a,
              "a mapping without populated page tables reads and writes the same memory");
        if (cold) cold[sz - 2] = 0xab;
        shm_detach(lazy);
    }
    shm_segment *ro = shm_attach(name, SHM_KIND_WEIGHTS, SHM_ATTACH_READONLY);
    CHECK(ro != NULL, "read-only attach: %s", shm_last_error());
    if (ro) {
        const uint8_t *c3 = shm_region_ptr(ro, "cold", NULL);
        CHECK(c3 && c3[7] == 0xab, "read-only view");
        shm_detach(ro);
    }
    CHECK(shm_attach(name, SHM_KIND_KV, 0) == NULL && error_mentions("kind"), "wrong kind: %s",
          shm_last_error());

    shm_detach(seg);
    CHECK(shm_file_exists(name), "detach keeps the segment");
    CHECK(shm_unlink_name(name) == 0 && !shm_file_exists(name), "unlink removes it");
    CHECK(shm_attach(name, SHM_KIND_WEIGHTS, 0) == NULL, "attach after unlink fails");
}

/* Corrupts one header field of a live segment and expects attach to fail
 * naming that field; restores the header afterwards. */
static void expect_refused(shm_segment *seg, const char *name, void (*corrupt)(struct shm_header *),
                           const char *field) {
    struct shm_header *h = shm_base(seg);
    struct shm_header saved = *h;
    corrupt(h);
    shm_segment *att = shm_attach(name, SHM_KIND_TEST, 0);
    CHECK(att == NULL, "corrupt %s accepted", field);
    CHECK(strstr(shm_last_error(), field) != NULL, "error for %s: '%s'", field, shm_last_error());
    shm_detach(att);
    *h = saved;
}

static void bad_magic(struct shm_header *h) { h->magic[3] = 'X'; }
static void bad_version(struct shm_header *h) { h->version = SHM_VERSION + 1; }
static void bad_kind(struct shm_header *h) { h->kind = SHM_KIND_KV; }
static void bad_header_size(struct shm_header *h) { h->header_size = 64; }
static void bad_total(struct shm_header *h) { h->total_size += 4096; }
static void too_many_regions(struct shm_header *h) { h->n_regions = SHM_MAX_REGIONS + 1; }
static void region_past_end(struct shm_header *h) { h->regions[2].size = h->total_size; }
static void region_wraps(struct shm_header *h) { h->regions[1].size = UINT64_MAX - 100; }
static void region_in_header(struct shm_header *h) { h->regions[0].offset = 0; }
static void region_misaligned(struct shm_header *h) { h->regions[0].offset += 64; }
static void region_bad_align(struct shm_header *h) { h->regions[1].align = 8; }
static void regions_overlap(struct shm_header *h) { h->regions[1].offset = h->regions[0].offset + 64; }
static void region_name_unterminated(struct shm_header *h) {
    memset(h->regions[1].name, 'a', sizeof h->regions[1].name);
}
static void region_name_empty(struct shm_header *h) { h->regions[1].name[0] = 0; }
static void region_bad_flags(struct shm_header *h) { h->regions[0].flags = 6; }
/* a dense region after a sparse one */
static void region_dense_after_sparse(struct shm_header *h) { h->regions[0].flags = SHM_REGION_SPARSE; }
static void region_name_duplicate(struct shm_header *h) { strcpy(h->regions[2].name, h->regions[0].name); }

static void test_hostile_headers(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "hostile");
    shm_segment *seg = shm_create(name, SHM_KIND_TEST, test_regions, N_TEST_REGIONS, 0);
    CHECK(seg != NULL, "create: %s", shm_last_error());
    if (!seg) return;
    expect_refused(seg, name, bad_magic, "magic");
    expect_refused(seg, name, bad_version, "version");
    expect_refused(seg, name, bad_kind, "kind");
    expect_refused(seg, name, bad_header_size, "header_size");
    expect_refused(seg, name, bad_total, "total_size");
    expect_refused(seg, name, too_many_regions, "n_regions");
    expect_refused(seg, name, region_past_end, "offset/size");
    expect_refused(seg, name, region_wraps, "offset/size");
    expect_refused(seg, name, region_in_header, "offset/size");
    expect_refused(seg, name, region_misaligned, "offset");
    expect_refused(seg, name, region_bad_align, "align");
    expect_refused(seg, name, regions_overlap, "overlaps");
    expect_refused(seg, name, region_name_unterminated, "name");
    expect_refused(seg, name, region_name_empty, "name");
    expect_refused(seg, name, region_name_duplicate, "duplicate");
    expect_refused(seg, name, region_bad_flags, "flags");
    expect_refused(seg, name, region_dense_after_sparse, "flags");

    shm_segment *ok = shm_attach(name, SHM_KIND_TEST, 0);
    CHECK(ok != NULL, "restored header attaches again: %s", shm_last_error());
    shm_detach(ok);

    /* Random damage: attach either refuses or yields regions inside the
     * segment, never crashes. */
    struct shm_header *h = shm_base(seg);
    struct shm_header saved = *h;
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    int accepted_bad = 0;
    for (int iter = 0; iter < 2000; iter++) {
        *h = saved;
        int flips = 1 + iter % 4;
        for (int f = 0; f < flips; f++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(seed >> 33) % sizeof *h;
            ((uint8_t *)h)[pos] = (uint8_t)(seed >> 17);
        }
        shm_segment *att = shm_attach(name, SHM_KIND_TEST, 0);
        if (!att) continue;
        for (int i = 0; i < shm_region_count(att); i++) {
            const struct shm_region *r = shm_region_at(att, i);
            if (r->offset < SHM_HEADER_SIZE || r->offset + r->size > shm_size(att)) accepted_bad++;
        }
        shm_detach(att);
    }
    CHECK(accepted_bad == 0, "%d out-of-bounds regions accepted", accepted_bad);
    *h = saved;
    shm_detach(seg);

    /* Truncated segments: shorter than the header says, shorter than a header. */
    int fd = shm_open(name, O_RDWR, 0);
    CHECK(fd >= 0, "reopen");
    if (fd >= 0) {
        struct stat st;
        fstat(fd, &st);
        CHECK(ftruncate(fd, st.st_size - 4096) == 0, "truncate");
        CHECK(shm_attach(name, SHM_KIND_TEST, 0) == NULL && error_mentions("total_size"), "truncated: %s",
              shm_last_error());
        CHECK(ftruncate(fd, 100) == 0, "truncate");
        CHECK(shm_attach(name, SHM_KIND_TEST, 0) == NULL && error_mentions("header"), "tiny: %s",
              shm_last_error());
        CHECK(ftruncate(fd, 0) == 0, "truncate");
        CHECK(shm_attach(name, SHM_KIND_TEST, 0) == NULL, "empty segment refused");
        /* A page of random bytes: no magic. */
        uint8_t junk[8192];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 131 + 7);
        CHECK(pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk, "write junk");
        CHECK(shm_attach(name, SHM_KIND_TEST, 0) == NULL && error_mentions("magic"), "junk: %s",
              shm_last_error());
        close(fd);
    }
    shm_unlink_name(name);
}

/* The creator bumps the generation; an attached child process sees it. */
static void test_generation_across_processes(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "gen");
    shm_segment *seg = shm_create(name, SHM_KIND_ACTIVATIONS, test_regions, N_TEST_REGIONS, 0);
    CHECK(seg != NULL, "create: %s", shm_last_error());
    if (!seg) return;
    uint64_t g0 = shm_generation(seg);
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) {
        CHECK(0, "pipe");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: attach, report, wait for the bump, check it, write data. */
        shm_segment *att = shm_attach(name, SHM_KIND_ACTIVATIONS, 0);
        char c = att ? 'a' : 'x';
        if (write(to_parent[1], &c, 1) != 1 || !att) _exit(10);
        if (read(to_child[0], &c, 1) != 1) _exit(11);
        if (!shm_is_stale(att)) _exit(12);
        if (shm_generation(att) != g0 + 1) _exit(13);
        uint64_t sz;
        uint8_t *emb = shm_region_ptr(att, "embeddings", &sz);
        for (uint64_t i = 0; i < sz; i++) emb[i] = (uint8_t)(i * 7);
        shm_detach(att);
        _exit(0);
    }
    char c = 0;
    CHECK(read(to_parent[0], &c, 1) == 1 && c == 'a', "child attached");
    CHECK(shm_bump_generation(seg) == g0 + 1 && !shm_is_stale(seg), "creator bump");
    CHECK(write(to_child[1], "b", 1) == 1, "signal child");
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    uint64_t sz;
    const uint8_t *emb = shm_region_ptr(seg, "embeddings", &sz);
    int bad = 0;
    for (uint64_t i = 0; emb && i < sz; i++) bad += emb[i] != (uint8_t)(i * 7);
    CHECK(emb && bad == 0, "parent sees the child's writes (%d wrong)", bad);
    close(to_child[0]);
    close(to_child[1]);
    close(to_parent[0]);
    close(to_parent[1]);

    /* Replacing the segment marks the old mapping stale and starts the new
     * one at a higher generation. */
    shm_segment *att = shm_attach(name, SHM_KIND_ACTIVATIONS, 0);
    CHECK(att && !shm_is_stale(att), "attach before replace");
    shm_segment *fresh = shm_create(name, SHM_KIND_ACTIVATIONS, test_regions, 1, SHM_CREATE_REPLACE);
    CHECK(fresh != NULL, "replace: %s", shm_last_error());
    if (att) {
        CHECK(shm_is_stale(att), "old mapping sees it is stale");
        shm_detach(att);
    }
    if (fresh) {
        CHECK(shm_generation(fresh) > g0 + 1, "new generation %llu", (unsigned long long)shm_generation(fresh));
        shm_segment *again = shm_attach(name, SHM_KIND_ACTIVATIONS, 0);
        CHECK(again && shm_region_count(again) == 1, "re-attach sees the new layout");
        shm_detach(again);
        shm_detach(fresh);
    }
    shm_detach(seg);
    shm_unlink_name(name);
}

static void test_prefault_speed(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "big");
    const uint64_t size = 256ull << 20;
    struct shm_region_spec spec = {"cache", size, SHM_ALIGN_PAGE, 0};
    shm_segment *seg = shm_create(name, SHM_KIND_WEIGHTS, &spec, 1, 0);
    CHECK(seg != NULL, "create 256 MiB: %s", shm_last_error());
    if (!seg) return;
    double s = shm_prefault_seconds(seg);
    printf("prefault: %llu MiB in %.1f ms = %.2f GB/s\n", (unsigned long long)(shm_size(seg) >> 20), s * 1e3,
           s > 0 ? (double)shm_size(seg) / s / 1e9 : 0.0);
    double t0 = clock_seconds();
    shm_segment *att = shm_attach(name, SHM_KIND_WEIGHTS, 0);
    double as = clock_seconds() - t0;
    CHECK(att != NULL, "attach big: %s", shm_last_error());
    printf("attach (page tables populated): %.1f ms = %.2f GB/s\n", as * 1e3, (double)shm_size(seg) / as / 1e9);
    shm_detach(att);
    shm_detach(seg);
    shm_unlink_name(name);
}

/* kB of this process's shared-memory mappings that are mapped by 2 MiB
 * page-table entries (/proc/self/smaps_rollup: the kernel's own count). */
static long shmem_pmd_kb(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* Whether /dev/shm is mounted to give huge pages by itself (huge=always,
 * within_size or advise): then a segment gets them without the move. */
static bool shm_mount_gives_huge(void) {
    FILE *f = fopen("/proc/mounts", "r");
    char line[512];
    bool huge = false;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, " /dev/shm ") && strstr(line, "huge=") && !strstr(line, "huge=never")) huge = true;
    if (f) fclose(f);
    return huge;
}

/* Segments of 2 MiB or more are mapped 2 MiB-aligned by creator and
 * attacher, and moved into 2 MiB pages where the kernel can; then both
 * processes map them with 2 MiB entries. A small segment reports EINVAL. */
static void test_huge_pages(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "huge");
    const uint64_t mib = 1ull << 20;
    struct shm_region_spec spec = {"cache", 8 * mib, SHM_ALIGN_PAGE, 0};
    long before = shmem_pmd_kb();
    shm_segment *seg = shm_create(name, SHM_KIND_WEIGHTS, &spec, 1, 0);
    CHECK(seg != NULL, "create 8 MiB: %s", shm_last_error());
    if (!seg) return;
    shm_segment *att = shm_attach(name, SHM_KIND_WEIGHTS, 0);
    CHECK(att != NULL, "attach: %s", shm_last_error());
    CHECK((uintptr_t)shm_base(seg) % (2 * mib) == 0, "creator's mapping at %p is not 2 MiB-aligned", shm_base(seg));
    CHECK(att && (uintptr_t)shm_base(att) % (2 * mib) == 0, "attacher's mapping is not 2 MiB-aligned");
    double seconds = -1;
    int err = shm_huge_pages(seg, &seconds);
    CHECK(seconds >= 0, "the move's time is reported");
    if (!err) {
        /* both mappings (8 MiB + a header page: 4 whole 2 MiB pages each) */
        long got = shmem_pmd_kb() - before;
        CHECK(got >= 2 * 8 * 1024, "on 2 MiB pages, yet only %ld kB of the two mappings use 2 MiB entries", got);
    } else {
        CHECK(err == EINVAL || err == EAGAIN || err == ENOMEM, "unexpected reason %d", err);
        printf("note: this kernel left the segment on 4 KiB pages: %s\n", strerror(err));
    }
    shm_detach(att);
    shm_detach(seg);
    shm_unlink_name(name);
    /* asked for 4 KiB pages: no move, no 2 MiB entries in either mapping */
    before = shmem_pmd_kb();
    seg = shm_create(name, SHM_KIND_WEIGHTS, &spec, 1, SHM_CREATE_SMALL_PAGES);
    att = seg ? shm_attach(name, SHM_KIND_WEIGHTS, 0) : NULL;
    CHECK(seg && att && shm_huge_pages(seg, NULL) == ECANCELED, "SHM_CREATE_SMALL_PAGES reports ECANCELED");
    if (!shm_mount_gives_huge())
        CHECK(shmem_pmd_kb() - before <= 0, "SHM_CREATE_SMALL_PAGES: %ld kB mapped with 2 MiB entries",
              shmem_pmd_kb() - before);
    shm_detach(att);
    shm_detach(seg);
    shm_unlink_name(name);
    seg_name(name, "small");
    struct shm_region_spec small = {"cache", 64 * 1024, SHM_ALIGN_PAGE, 0};
    seg = shm_create(name, SHM_KIND_WEIGHTS, &small, 1, 0);
    CHECK(seg && shm_huge_pages(seg, NULL) == EINVAL, "a 68 KiB segment stays on 4 KiB pages (EINVAL)");
    shm_detach(seg);
    shm_unlink_name(name);
}

/* Bytes of the segment's file that hold pages. */
static uint64_t allocated_bytes(const char *name) {
    struct stat st;
    int fd = shm_open(name, O_RDONLY, 0);
    uint64_t bytes = fd >= 0 && fstat(fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : UINT64_MAX;
    if (fd >= 0) close(fd);
    return bytes;
}

/* A sparse region holds no pages until written: not when made, nor when an
 * attacher populates its mapping; written pages read back in every mapping;
 * a punch gives them back (in every mapping: they read zero again), and only
 * a sparse region can be punched. It starts at a 2 MiB boundary after the
 * dense ones. */
static void test_sparse_region(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "sparse");
    const uint64_t mib = 1ull << 20;
    const struct shm_region_spec specs[] = {{"table", 5000, SHM_ALIGN_CACHELINE, 0},
                                            {"lent", 6 * mib, SHM_ALIGN_PAGE, SHM_REGION_SPARSE}};
    shm_segment *seg = shm_create(name, SHM_KIND_TEST, specs, 2, 0);
    CHECK(seg != NULL, "create with a sparse region: %s", shm_last_error());
    if (!seg) return;
    const struct shm_region *r = shm_region_at(seg, 1);
    CHECK(r && r->offset % (2 * mib) == 0 && r->flags == SHM_REGION_SPARSE, "the sparse region at %llu",
          r ? (unsigned long long)r->offset : 0ULL);
    CHECK(allocated_bytes(name) < mib, "made: %llu bytes allocated", (unsigned long long)allocated_bytes(name));
    shm_segment *att = shm_attach(name, SHM_KIND_TEST, 0);
    CHECK(att != NULL, "attach: %s", shm_last_error());
    if (!att) goto out;
    CHECK(allocated_bytes(name) < mib, "attached (populated): %llu bytes allocated",
          (unsigned long long)allocated_bytes(name));
    uint64_t bytes;
    uint8_t *w = shm_region_ptr(seg, "lent", &bytes), *rd = shm_region_ptr(att, "lent", &bytes);
    memset(w, 0x5a, 4 * mib);
    CHECK(rd[0] == 0x5a && rd[4 * mib - 1] == 0x5a && rd[4 * mib] == 0, "the attacher reads what was written");
    CHECK(allocated_bytes(name) >= 4 * mib, "written: %llu bytes allocated", (unsigned long long)allocated_bytes(name));
    CHECK(shm_region_punch(att, "lent") == 0, "punch: %s", shm_last_error());
    CHECK(allocated_bytes(name) < mib, "punched: %llu bytes allocated", (unsigned long long)allocated_bytes(name));
    CHECK(w[0] == 0 && rd[4 * mib - 1] == 0, "punched pages read zero in both mappings");
    CHECK(shm_region_punch(att, "table") != 0 && strstr(shm_last_error(), "not sparse"), "a dense region punched");
    CHECK(shm_region_punch(att, "none") != 0 && strstr(shm_last_error(), "no region"), "a missing region punched");
    shm_detach(att);
out:
    shm_detach(seg);
    shm_unlink_name(name);
    const struct shm_region_spec dense_after[] = {{"lent", 4096, SHM_ALIGN_PAGE, SHM_REGION_SPARSE},
                                                  {"table", 64, SHM_ALIGN_CACHELINE, 0}};
    CHECK(shm_create(name, SHM_KIND_TEST, dense_after, 2, 0) == NULL && strstr(shm_last_error(), "flags"),
          "a dense region after a sparse one was laid out");
    const struct shm_region_spec unaligned[] = {{"lent", 4096, SHM_ALIGN_CACHELINE, SHM_REGION_SPARSE}};
    CHECK(shm_create(name, SHM_KIND_TEST, unaligned, 1, 0) == NULL && strstr(shm_last_error(), "flags"),
          "a sparse region aligned to cache lines was laid out");
}

/* A reserved-only segment is as valid as a prefaulted one: same header,
 * attachable, every page reads zero; only the prefault time is skipped. */
static void test_no_prefault(void) {
    char name[SHM_NAME_MAX];
    seg_name(name, "lazy");
    shm_segment *seg = shm_create(name, SHM_KIND_WEIGHTS, test_regions, N_TEST_REGIONS, SHM_CREATE_NO_PREFAULT);
    CHECK(seg != NULL, "create without prefault: %s", shm_last_error());
    if (!seg) return;
    CHECK(shm_prefault_seconds(seg) == 0.0, "prefault seconds %g", shm_prefault_seconds(seg));
    struct stat st;
    int fd = shm_open(name, O_RDONLY, 0);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size == shm_size(seg) &&
              (uint64_t)st.st_blocks * 512 >= shm_size(seg),
          "every page reserved (%lld of %llu bytes)", fd >= 0 ? (long long)st.st_blocks * 512 : -1LL,
          (unsigned long long)shm_size(seg));
    if (fd >= 0) close(fd);
    shm_segment *att = shm_attach(name, SHM_KIND_WEIGHTS, SHM_ATTACH_READONLY);
    CHECK(att != NULL && shm_region_count(att) == N_TEST_REGIONS, "attach: %s", shm_last_error());
    if (att) {
        int nonzero = 0;
        for (int i = 0; i < N_TEST_REGIONS; i++) {
            uint64_t sz = 0;
            const uint8_t *p = shm_region_ptr(att, test_regions[i].name, &sz);
            CHECK(p && sz == test_regions[i].size, "region %s", test_regions[i].name);
            for (uint64_t j = 0; p && j < sz; j++) nonzero += p[j] != 0;
        }
        CHECK(nonzero == 0, "%d non-zero bytes in a fresh segment", nonzero);
        uint8_t *emb = shm_region_ptr(seg, "embeddings", NULL);
        const uint8_t *seen = shm_region_ptr(att, "embeddings", NULL);
        if (emb) emb[123] = 0x5a;
        CHECK(seen && seen[123] == 0x5a, "a write by the creator reaches the attached mapping");
        shm_detach(att);
    }
    shm_detach(seg);
    shm_unlink_name(name);
}

static void count_name(const char *name, void *ctx) {
    (void)name;
    (*(int *)ctx)++;
}

static void test_unlink_by_prefix(void) {
    const char *whats[] = {"weights", "activations", "kv", "slots"};
    for (int i = 0; i < 4; i++) {
        char name[SHM_NAME_MAX];
        seg_name(name, whats[i]);
        shm_segment *seg = shm_create(name, SHM_KIND_TEST, test_regions, 1, 0);
        CHECK(seg != NULL, "create %s: %s", name, shm_last_error());
        shm_detach(seg);
    }
    /* A run whose id extends ours must survive our cleanup. */
    char other[SHM_NAME_MAX];
    shm_make_name(other, sizeof other, other_run_id, "weights");
    shm_segment *o = shm_create(other, SHM_KIND_TEST, test_regions, 1, 0);
    CHECK(o != NULL, "create other: %s", shm_last_error());
    shm_detach(o);

    char prefix[SHM_NAME_MAX];
    snprintf(prefix, sizeof prefix, "pi2-%s-", run_id);
    int listed = 0;
    CHECK(shm_list_prefix(prefix, count_name, &listed) == 4 && listed == 4, "listed %d", listed);
    CHECK(shm_unlink_run(run_id) == 4, "removed: %s", shm_last_error());
    listed = 0;
    CHECK(shm_list_prefix(prefix, count_name, &listed) == 0, "left %d", listed);
    for (int i = 0; i < 4; i++) {
        char name[SHM_NAME_MAX];
        seg_name(name, whats[i]);
        CHECK(!shm_file_exists(name), "%s still in /dev/shm", name);
    }
    CHECK(shm_file_exists(other), "other run untouched");
    CHECK(shm_unlink_run(other_run_id) == 1 && !shm_file_exists(other), "other run removed");
    CHECK(shm_unlink_prefix("") < 0 && shm_unlink_prefix("a/b") < 0, "bad prefixes refused");
}

int main(void) {
    snprintf(run_id, sizeof run_id, "tshm%d", (int)getpid());
    snprintf(other_run_id, sizeof other_run_id, "tshm%d0", (int)getpid());
    atexit(cleanup);
    test_names();
    test_create_attach();
    test_hostile_headers();
    test_generation_across_processes();
    test_prefault_speed();
    test_no_prefault();
    test_huge_pages();
    test_sparse_region();
    test_unlink_by_prefix();
    cleanup();
    char prefix[SHM_NAME_MAX];
    snprintf(prefix, sizeof prefix, "pi2-%s", run_id);
    int left = 0;
    shm_list_prefix(prefix, count_name, &left);
    CHECK(left == 0, "%d segments left in /dev/shm", left);
    return test_summary();
}
