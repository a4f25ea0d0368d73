/* lib/util/mem_limit.c on made-up /proc and /sys trees: cgroup v1 (the
 * hierarchical limit, the plain one, "no limit"), cgroup v2 (the smallest
 * memory.max up the tree, a container's own root), MemAvailable capping
 * both, and files that lie (garbage, overflow, missing) falling back to what
 * can be trusted. Then this machine's own figure. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "util/mem_limit.h"

#define GiB (1024ull * 1024 * 1024)

static char root[256];

/* Writes text to root/rel, making the directories on the way. */
static void put(const char *rel, const char *fmt, ...) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(path, 0700);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); exit(2); }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static void fresh_root(void) {
    char cmd[300];
    if (root[0]) { snprintf(cmd, sizeof cmd, "rm -rf '%s'", root); if (system(cmd)) exit(2); }
    snprintf(root, sizeof root, "/tmp/pi2-memlimit-XXXXXX");
    if (!mkdtemp(root)) { perror("mkdtemp"); exit(2); }
}

static void meminfo_gib(unsigned long long gib) {
    put("proc/meminfo", "MemTotal:       25165824 kB\nMemFree:        1000 kB\nMemAvailable:   %llu kB\n", gib * 1024 * 1024);
}

#define V1_MOUNT "30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
#define V2_MOUNT "31 25 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
#define OTHER_MOUNTS "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n29 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"

int main(void) {
    mem_limit l;

    /* v1, limited: the hierarchical figure binds (a parent's smaller cap) */
    fresh_root();
    meminfo_gib(20);
    put("proc/self/mountinfo", OTHER_MOUNTS V1_MOUNT);
    put("proc/self/cgroup", "5:cpu:/\n4:memory:/phone\n0::/\n");
    put("sys/fs/cgroup/memory/phone/memory.limit_in_bytes", "%llu\n", 4 * GiB);
    put("sys/fs/cgroup/memory/phone/memory.stat", "cache 0\nrss 0\nhierarchical_memory_limit %llu\ntotal_rss 0\n", 2 * GiB);
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 2 * GiB, "v1 hierarchical: %llu", (unsigned long long)l.bytes);
    CHECK(strstr(l.source, "/sys/fs/cgroup/memory/phone") && strstr(l.source, "hierarchical_memory_limit"),
          "source names the cgroup and file: %s", l.source);

    /* v1 without memory.stat: memory.limit_in_bytes */
    put("sys/fs/cgroup/memory/phone/memory.stat", "cache 0\n");
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 4 * GiB && strstr(l.source, "memory.limit_in_bytes"),
          "v1 plain: %llu %s", (unsigned long long)l.bytes, l.source);

    /* v1 "no limit" (2^63 rounded down to pages): MemAvailable */
    put("sys/fs/cgroup/memory/phone/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 20 * GiB && strstr(l.source, "MemAvailable"),
          "v1 unlimited -> MemAvailable: %llu %s", (unsigned long long)l.bytes, l.source);

    /* a limit above what the machine has free: MemAvailable binds */
    put("sys/fs/cgroup/memory/phone/memory.limit_in_bytes", "%llu\n", 64 * GiB);
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 20 * GiB && strstr(l.source, "MemAvailable"),
          "cgroup above MemAvailable: %llu %s", (unsigned long long)l.bytes, l.source);

    /* hostile files: garbage, a number that overflows, trailing junk -> no limit from them */
    const char *bad[] = {"lots\n", "99999999999999999999999\n", "123abc\n", "", "-5\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put("sys/fs/cgroup/memory/phone/memory.limit_in_bytes", "%s", bad[i]);
        CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 20 * GiB, "limit file '%s' is ignored: %llu", bad[i],
              (unsigned long long)l.bytes);
    }

    /* v2: the smallest memory.max on the way up; "max" is no limit */
    fresh_root();
    meminfo_gib(20);
    put("proc/self/mountinfo", OTHER_MOUNTS V2_MOUNT);
    put("proc/self/cgroup", "0::/user.slice/app/inner\n");
    put("sys/fs/cgroup/user.slice/memory.max", "max\n");
    put("sys/fs/cgroup/user.slice/app/memory.max", "%llu\n", 3 * GiB);
    put("sys/fs/cgroup/user.slice/app/inner/memory.max", "max\n");
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 3 * GiB && strstr(l.source, "user.slice/app:") &&
              strstr(l.source, "memory.max"),
          "v2 parent's memory.max: %llu %s", (unsigned long long)l.bytes, l.source);
    put("sys/fs/cgroup/user.slice/app/inner/memory.max", "%llu\n", 1 * GiB);
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 1 * GiB && strstr(l.source, "app/inner"),
          "v2 own memory.max: %llu %s", (unsigned long long)l.bytes, l.source);

    /* v2 in a container: the hierarchy mounted at its own cgroup */
    fresh_root();
    meminfo_gib(20);
    put("proc/self/mountinfo", OTHER_MOUNTS "31 25 0:28 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("proc/self/cgroup", "0::/docker/abc\n");
    put("sys/fs/cgroup/memory.max", "%llu\n", 2 * GiB);
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 2 * GiB, "container's own root: %llu %s",
          (unsigned long long)l.bytes, l.source);

    /* no cgroup files at all: MemAvailable; not even that: an error */
    fresh_root();
    meminfo_gib(7);
    CHECK(mem_limit_read(root, &l) == 0 && l.bytes == 7 * GiB, "no cgroups: %llu", (unsigned long long)l.bytes);
    put("proc/meminfo", "MemTotal: 1 kB\n");
    CHECK(mem_limit_read(root, &l) == -1 && strstr(l.source, "MemAvailable"), "no MemAvailable: %s", l.source);
    put("proc/meminfo", "MemAvailable:   99999999999999999999 kB\n");
    CHECK(mem_limit_read(root, &l) == -1, "an overflowing MemAvailable is refused");

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) return 2;

    /* this machine: some figure, at most MemAvailable */
    CHECK(mem_limit_read("", &l) == 0 && l.bytes > (64u << 20), "this machine: %llu bytes (%s)",
          (unsigned long long)l.bytes, l.source);
    return test_summary();
}
