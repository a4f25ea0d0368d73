/* The memory limit that applies to this process: see mem_limit.h. */
#include "util/mem_limit.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define UNLIMITED_FROM (1ull << 62) /* cgroup v1 writes "no limit" as ~2^63 rounded to pages */

/* The whole of a small text file into buf (terminated), or -1. */
static long read_small(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    bool err = ferror(f);
    fclose(f);
    if (err) return -1;
    buf[n] = 0;
    return (long)n;
}

/* A decimal u64 followed only by white space. */
static bool parse_u64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9') return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    while (*p == ' ' || *p == '\n' || *p == '\t') p++;
    if (*p) return false;
    *out = v;
    return true;
}

/* Whether the comma-separated list holds word. */
static bool list_has(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

/* The mount of the memory cgroup hierarchy (v2: want_v1 false) from
 * mountinfo: its root inside the hierarchy and its mount point. */
static bool find_mount(const char *root, bool want_v1, char *mnt_root, char *mnt_point, size_t cap) {
    char path[PATH_MAX], line[4096];
    snprintf(path, sizeof path, "%s/proc/self/mountinfo", root);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *fields[64];
        int n = 0;
        for (char *save = NULL, *t = strtok_r(line, " \n", &save); t && n < 64; t = strtok_r(NULL, " \n", &save))
            fields[n++] = t;
        int dash = -1;
        for (int i = 6; i < n; i++)
            if (!strcmp(fields[i], "-")) { dash = i; break; }
        if (dash < 0 || dash + 1 >= n) continue;
        const char *fstype = fields[dash + 1], *super = dash + 3 < n ? fields[dash + 3] : "";
        bool match = want_v1 ? !strcmp(fstype, "cgroup") && list_has(super, "memory") : !strcmp(fstype, "cgroup2");
        if (!match || strlen(fields[3]) >= cap || strlen(fields[4]) >= cap) continue;
        strcpy(mnt_root, fields[3]);
        strcpy(mnt_point, fields[4]);
        found = true;
    }
    fclose(f);
    return found;
}

/* This process's path in the memory hierarchy from /proc/self/cgroup. */
static bool cgroup_path(const char *root, bool want_v1, char *out, size_t cap) {
    char path[PATH_MAX], line[4096];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        bool match = want_v1 ? list_has(c1 + 1, "memory") : !strcmp(line, "0") && !c1[1];
        if (!match || strlen(c2 + 1) >= cap || c2[1] != '/') continue;
        strcpy(out, c2 + 1);
        found = true;
    }
    fclose(f);
    return found;
}

/* The directory of this process's cgroup in the hierarchy mounted as found. */
static bool cgroup_dir(const char *root, bool want_v1, char *dir, size_t cap, size_t *mount_len) {
    char mnt_root[PATH_MAX], mnt_point[PATH_MAX], cg[PATH_MAX];
    if (!find_mount(root, want_v1, mnt_root, mnt_point, sizeof mnt_root) ||
        !cgroup_path(root, want_v1, cg, sizeof cg))
        return false;
    /* a container mounts its own cgroup as the hierarchy's root */
    const char *rel = cg;
    size_t r = strlen(mnt_root);
    if (strcmp(mnt_root, "/") && !strncmp(cg, mnt_root, r) && (cg[r] == '/' || cg[r] == 0)) rel = cg + r;
    int n = snprintf(dir, cap, "%s%s", root, mnt_point);
    if (n < 0 || (size_t)n >= cap) return false;
    *mount_len = (size_t)n;
    if (strcmp(rel, "/") && rel[0]) {
        int m = snprintf(dir + n, cap - (size_t)n, "%s", rel);
        if (m < 0 || (size_t)m >= cap - (size_t)n) return false;
    }
    return true;
}

/* cgroup v1: the limit of this cgroup and its ancestors. */
static bool v1_limit(const char *root, uint64_t *bytes, char *source, size_t cap) {
    char dir[PATH_MAX], path[PATH_MAX + 32], buf[8192];
    size_t mount_len;
    if (!cgroup_dir(root, true, dir, sizeof dir, &mount_len)) return false;
    uint64_t v;
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    if (read_small(path, buf, sizeof buf) > 0) {
        for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
            if (!strncmp(l, "hierarchical_memory_limit ", 26) && parse_u64(l + 26, &v) && v < UNLIMITED_FROM) {
                *bytes = v;
                snprintf(source, cap, "cgroup v1 %s: hierarchical_memory_limit", dir + strlen(root));
                return true;
            }
    }
    snprintf(path, sizeof path, "%s/memory.limit_in_bytes", dir);
    if (read_small(path, buf, sizeof buf) > 0 && parse_u64(buf, &v) && v < UNLIMITED_FROM) {
        *bytes = v;
        snprintf(source, cap, "cgroup v1 %s: memory.limit_in_bytes", dir + strlen(root));
        return true;
    }
    return false;
}

/* cgroup v2: the smallest memory.max from this cgroup up to the hierarchy's root. */
static bool v2_limit(const char *root, uint64_t *bytes, char *source, size_t cap) {
    char dir[PATH_MAX], path[PATH_MAX + 32], buf[256];
    size_t mount_len;
    if (!cgroup_dir(root, false, dir, sizeof dir, &mount_len)) return false;
    bool found = false;
    for (;;) {
        uint64_t v;
        snprintf(path, sizeof path, "%s/memory.max", dir);
        if (read_small(path, buf, sizeof buf) > 0 && parse_u64(buf, &v) && (!found || v < *bytes)) {
            *bytes = v;
            snprintf(source, cap, "cgroup v2 %s: memory.max", dir + strlen(root));
            found = true;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < mount_len) break;
        *slash = 0;
    }
    return found;
}

static bool mem_available(const char *root, uint64_t *bytes) {
    char path[PATH_MAX], buf[16384];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    if (read_small(path, buf, sizeof buf) <= 0) return false;
    char *l = strstr(buf, "MemAvailable:");
    if (!l) return false;
    l += strlen("MemAvailable:");
    while (*l == ' ' || *l == '\t') l++;
    char *end = strstr(l, " kB\n");
    if (!end) return false;
    *end = 0;
    uint64_t kb;
    if (!parse_u64(l, &kb) || kb > UINT64_MAX / 1024) return false;
    *bytes = kb * 1024;
    return true;
}

int mem_limit_read(const char *root, mem_limit *out) {
    uint64_t avail = 0, cg = 0, v2 = 0;
    char src_v2[sizeof out->source];
    bool have_cg = v1_limit(root, &cg, out->source, sizeof out->source);
    if (v2_limit(root, &v2, src_v2, sizeof src_v2) && (!have_cg || v2 < cg)) {
        cg = v2;
        memcpy(out->source, src_v2, sizeof src_v2);
        have_cg = true;
    }
    if (!mem_available(root, &avail)) {
        if (have_cg) {
            out->bytes = cg;
            return 0;
        }
        snprintf(out->source, sizeof out->source, "%s/proc/meminfo: no readable MemAvailable", root);
        return -1;
    }
    if (!have_cg || avail < cg) {
        out->bytes = avail;
        snprintf(out->source, sizeof out->source, "MemAvailable in /proc/meminfo");
    } else {
        out->bytes = cg;
    }
    return 0;
}
