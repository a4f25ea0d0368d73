#include "stack/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"

_Static_assert(sizeof(struct shm_header) <= SHM_HEADER_SIZE, "header must fit its reserved page");

/* Where glibc's shm_open keeps its objects: listing needs the directory. */
#define SHM_DIR "/dev/shm"

struct shm_segment {
    char name[SHM_NAME_MAX];
    int fd;
    uint8_t *base;
    uint64_t size;
    struct shm_header *hdr;
    uint64_t attached_generation;
    double prefault_seconds;
    double huge_seconds;       /* spent collapsing into 2 MiB pages (creator) */
    int huge_errno;            /* 0: every page is a 2 MiB one; else why not (creator) */
    int n_regions;
    struct shm_region regions[SHM_MAX_REGIONS]; /* validated private copy */
};

static _Thread_local char shm_err[256];

__attribute__((format(printf, 1, 2))) static void set_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shm_err, sizeof shm_err, fmt, ap);
    va_end(ap);
}

const char *shm_last_error(void) { return shm_err; }

static bool valid_token(const char *s) {
    if (!s || !*s) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.' || *s == '-'))
            return false;
    return true;
}

int shm_make_name(char *buf, size_t len, const char *runid, const char *what) {
    if (!valid_token(runid) || !valid_token(what)) {
        set_err("shm name: run id and segment name must be [A-Za-z0-9_.-]+");
        return -1;
    }
    int n = snprintf(buf, len, "/pi2-%s-%s", runid, what);
    if (n < 0 || (size_t)n >= len || (size_t)n >= SHM_NAME_MAX) {
        set_err("shm name: '/pi2-%s-%s' too long", runid, what);
        return -1;
    }
    return 0;
}

static int check_name(const char *name) {
    size_t n = name ? strnlen(name, SHM_NAME_MAX) : 0;
    if (n < 2 || n >= SHM_NAME_MAX || name[0] != '/' || strchr(name + 1, '/')) {
        set_err("shm name '%s': must be '/' followed by 1..%d characters without '/'",
                name ? name : "(null)", SHM_NAME_MAX - 2);
        return -1;
    }
    return 0;
}

int shm_validate_header(const struct shm_header *h, uint64_t file_size, enum shm_kind kind) {
    if (memcmp(h->magic, SHM_MAGIC, sizeof h->magic) != 0) {
        set_err("magic: not a pi2 segment");
        return -1;
    }
    if (h->version != SHM_VERSION) {
        set_err("version: %u, expected %u", h->version, SHM_VERSION);
        return -1;
    }
    if (h->kind != (uint32_t)kind) {
        set_err("kind: %u, expected %u", h->kind, (unsigned)kind);
        return -1;
    }
    if (h->header_size != SHM_HEADER_SIZE) {
        set_err("header_size: %llu, expected %u", (unsigned long long)h->header_size, SHM_HEADER_SIZE);
        return -1;
    }
    if (h->total_size != file_size) {
        set_err("total_size: header says %llu bytes, segment has %llu", (unsigned long long)h->total_size,
                (unsigned long long)file_size);
        return -1;
    }
    if (h->n_regions > SHM_MAX_REGIONS) {
        set_err("n_regions: %u, at most %d", h->n_regions, SHM_MAX_REGIONS);
        return -1;
    }
    for (uint32_t i = 0; i < h->n_regions; i++) {
        const struct shm_region *r = &h->regions[i];
        size_t name_len = strnlen(r->name, sizeof r->name);
        if (name_len == 0 || name_len == sizeof r->name) {
            set_err("region %u name: empty or not NUL-terminated", i);
            return -1;
        }
        if (r->align != SHM_ALIGN_CACHELINE && r->align != SHM_ALIGN_PAGE) {
            set_err("region '%s' align: %u, must be 64 or 4096", r->name, r->align);
            return -1;
        }
        if (r->offset % r->align) {
            set_err("region '%s' offset: %llu not aligned to %u", r->name, (unsigned long long)r->offset, r->align);
            return -1;
        }
        if (r->flags & ~SHM_REGION_SPARSE) {
            set_err("region '%s' flags: %#x, only sparse (1) is known", r->name, r->flags);
            return -1;
        }
        if (i > 0 && (h->regions[i - 1].flags & SHM_REGION_SPARSE) && !(r->flags & SHM_REGION_SPARSE)) {
            set_err("region '%s' flags: not sparse after a sparse region", r->name);
            return -1;
        }
        if ((r->flags & SHM_REGION_SPARSE) && (r->align != SHM_ALIGN_PAGE || r->size % SHM_ALIGN_PAGE)) {
            set_err("region '%s' flags: sparse, but not whole pages", r->name);
            return -1;
        }
        if (r->offset < SHM_HEADER_SIZE || r->offset > file_size || r->size > file_size - r->offset) {
            set_err("region '%s' offset/size: [%llu, +%llu) outside the segment data [%u, %llu)", r->name,
                    (unsigned long long)r->offset, (unsigned long long)r->size, SHM_HEADER_SIZE,
                    (unsigned long long)file_size);
            return -1;
        }
        for (uint32_t j = 0; j < i; j++) {
            const struct shm_region *q = &h->regions[j];
            if (!strncmp(q->name, r->name, sizeof r->name)) {
                set_err("region '%s' name: duplicate", r->name);
                return -1;
            }
            /* Both ranges are inside the segment, so these sums cannot overflow. */
            if (r->size && q->size && r->offset < q->offset + q->size && q->offset < r->offset + r->size) {
                set_err("region '%s' offset: overlaps region '%s'", r->name, q->name);
                return -1;
            }
        }
    }
    return 0;
}

/* Lays the specs out after the header; fills h->regions and h->total_size. */
static int layout_regions(struct shm_header *h, const struct shm_region_spec *specs, int n_specs) {
    if (n_specs < 0 || n_specs > SHM_MAX_REGIONS) {
        set_err("regions: %d requested, at most %d", n_specs, SHM_MAX_REGIONS);
        return -1;
    }
    uint64_t end = SHM_HEADER_SIZE;
    for (int i = 0; i < n_specs; i++) {
        const struct shm_region_spec *s = &specs[i];
        struct shm_region *r = &h->regions[i];
        if (!s->name || strlen(s->name) >= sizeof r->name || !*s->name) {
            set_err("region %d name: empty or longer than %d", i, SHM_REGION_NAME_MAX - 1);
            return -1;
        }
        if (s->align != SHM_ALIGN_CACHELINE && s->align != SHM_ALIGN_PAGE) {
            set_err("region '%s' align: must be 64 or 4096", s->name);
            return -1;
        }
        const bool first_sparse = (s->flags & SHM_REGION_SPARSE) && !(i > 0 && (specs[i - 1].flags & SHM_REGION_SPARSE));
        const uint64_t align = first_sparse ? SHM_SPARSE_ALIGN : s->align;
        uint64_t off = (end + align - 1) & ~(align - 1);
        if (s->size > UINT64_MAX / 2 || off > UINT64_MAX / 2 - s->size) {
            set_err("region '%s' size: too large", s->name);
            return -1;
        }
        strcpy(r->name, s->name);
        r->offset = off;
        r->size = s->size;
        r->align = s->align;
        r->flags = s->flags;
        end = off + s->size;
    }
    h->n_regions = (uint32_t)n_specs;
    /* Whole pages, so the mapping has no partial page past the last region. */
    h->total_size = (end + SHM_ALIGN_PAGE - 1) & ~(uint64_t)(SHM_ALIGN_PAGE - 1);
    return 0;
}

/* The end of the segment's last region that is not sparse, in whole pages
 * (its size when none is sparse): the part that is reserved, prefaulted and
 * populated. The gap up to the first sparse region stays a hole. */
static uint64_t dense_end(const struct shm_region *regions, int n, uint64_t size) {
    uint64_t end = SHM_HEADER_SIZE;
    for (int i = 0; i < n; i++) {
        if (!(regions[i].flags & SHM_REGION_SPARSE)) end = regions[i].offset + regions[i].size;
        else return (end + SHM_ALIGN_PAGE - 1) & ~(uint64_t)(SHM_ALIGN_PAGE - 1);
    }
    return size;
}

/* Marks a segment about to be replaced as stale (for processes still
 * mapping it) and returns its generation, or 0 if it is not a pi2 segment. */
static uint64_t retire_existing(const char *name) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return 0;
    uint64_t gen = 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= SHM_HEADER_SIZE) {
        struct shm_header *h = mmap(NULL, SHM_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            if (!memcmp(h->magic, SHM_MAGIC, sizeof h->magic))
                gen = __atomic_add_fetch(&h->generation, 1, __ATOMIC_ACQ_REL);
            munmap(h, SHM_HEADER_SIZE);
        }
    }
    close(fd);
    return gen;
}

/* Allocates every page now: fallocate fails cleanly when /dev/shm is full,
 * where a later first touch would SIGBUS. */
static int reserve(int fd, uint64_t size) {
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc) {
        set_err("reserve: fallocate %llu bytes: %s", (unsigned long long)size, strerror(rc));
        return -1;
    }
    return 0;
}

/* Maps every (reserved) page now, so the token path takes no page faults. */
static int prefault(uint8_t *base, uint64_t size) {
    if (madvise(base, size, MADV_POPULATE_WRITE) == 0) return 0;
    if (errno != EINVAL) {
        set_err("prefault: madvise(MADV_POPULATE_WRITE): %s", strerror(errno));
        return -1;
    }
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t off = 0; off < size; off += (uint64_t)page) ((volatile uint8_t *)base)[off] = 0;
    return 0;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* 2 MiB pages (huge pages) for the segments: a decode token reads weight
 * rows scattered over gigabytes, and with 4 KiB pages nearly every row costs
 * a TLB miss and a page walk (a nested one in a VM). tmpfs (/dev/shm) gives
 * 4 KiB pages unless mounted huge=...; MADV_COLLAPSE (Linux 6.1) moves a
 * file's pages into 2 MiB ones whatever the mount says, and a process whose
 * mapping is 2 MiB-aligned then maps them with one page-table entry each.
 * On the 7B bench model this took decode from 4.76 to 4.25-4.36 s per 64
 * tokens in predictor mode and from 8.75-9.27 to 8.41-8.48 s dense. */
#define HUGE_PAGE (2u << 20)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* Maps size bytes of fd at a 2 MiB-aligned address when size is at least
 * 2 MiB (so 2 MiB pages of the file map whole), else anywhere. */
static uint8_t *map_segment(int fd, uint64_t size, int prot, int flags) {
    if (size < HUGE_PAGE) {
        void *p = mmap(NULL, size, prot, flags, fd, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    uint8_t *span = mmap(NULL, size + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (span == MAP_FAILED) return NULL;
    uint8_t *at = (uint8_t *)(((uintptr_t)span + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (mmap(at, size, prot, flags | MAP_FIXED, fd, 0) == MAP_FAILED) {
        munmap(span, size + HUGE_PAGE);
        return NULL;
    }
    if (at > span) munmap(span, (size_t)(at - span));
    uint8_t *end = at + size, *span_end = span + size + HUGE_PAGE;
    if (span_end > end) munmap(end, (size_t)(span_end - end));
    return at;
}

/* Best effort: the segment's first `dense` bytes as 2 MiB pages, before
 * they are reserved. MADV_COLLAPSE refuses a range with no page at all, and
 * collapsing allocated 4 KiB pages copies each into its 2 MiB one (0.4-4.6 s
 * a GiB here, by how fragmented memory was); with one 4 KiB page in each
 * 2 MiB it fills the rest with zeros (0.06 s a GiB). A kernel without
 * MADV_COLLAPSE, or no free 2 MiB blocks, leaves 4 KiB pages. */
static void collapse_huge(shm_segment *seg, uint64_t dense, unsigned flags) {
    double t0 = clock_seconds();
    const uint64_t whole = dense & ~(uint64_t)(HUGE_PAGE - 1);
    seg->huge_errno = dense < HUGE_PAGE ? EINVAL : flags & SHM_CREATE_SMALL_PAGES ? ECANCELED : 0;
    for (uint64_t at = 0; !seg->huge_errno && at < whole; at += HUGE_PAGE)
        seg->huge_errno = posix_fallocate(seg->fd, (off_t)at, 4096);
    if (!seg->huge_errno && madvise(seg->base, whole, MADV_COLLAPSE)) seg->huge_errno = errno;
    seg->huge_seconds = clock_seconds() - t0;
}

static shm_segment *segment_new(const char *name) {
    shm_segment *seg = calloc(1, sizeof *seg);
    if (!seg) {
        set_err("out of memory");
        return NULL;
    }
    snprintf(seg->name, sizeof seg->name, "%s", name);
    seg->fd = -1;
    return seg;
}

static void copy_regions(shm_segment *seg, const struct shm_header *h) {
    seg->n_regions = (int)h->n_regions;
    memcpy(seg->regions, h->regions, sizeof seg->regions);
}

shm_segment *shm_create(const char *name, enum shm_kind kind, const struct shm_region_spec *specs,
                        int n_specs, unsigned flags) {
    if (check_name(name)) return NULL;
    struct shm_header h;
    memset(&h, 0, sizeof h);
    if (layout_regions(&h, specs, n_specs)) return NULL;
    memcpy(h.magic, SHM_MAGIC, sizeof h.magic);
    h.version = SHM_VERSION;
    h.kind = (uint32_t)kind;
    h.header_size = SHM_HEADER_SIZE;
    h.creator_pid = (int32_t)getpid();
    h.generation = 1;
    if (flags & SHM_CREATE_REPLACE) {
        h.generation = retire_existing(name) + 1;
        shm_unlink(name);
    }
    if (shm_validate_header(&h, h.total_size, kind)) return NULL;

    shm_segment *seg = segment_new(name);
    if (!seg) return NULL;
    seg->fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (seg->fd < 0) {
        set_err("shm_open(%s): %s", name, strerror(errno));
        free(seg);
        return NULL;
    }
    /* The umask can only remove bits; make the mode exact anyway. */
    if (fchmod(seg->fd, 0600) || ftruncate(seg->fd, (off_t)h.total_size)) {
        set_err("sizing %s to %llu bytes: %s", name, (unsigned long long)h.total_size, strerror(errno));
        goto fail;
    }
    seg->size = h.total_size;
    seg->base = map_segment(seg->fd, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED);
    if (!seg->base) {
        set_err("mmap %s: %s", name, strerror(errno));
        goto fail;
    }
    const uint64_t dense = dense_end(h.regions, (int)h.n_regions, seg->size);
    collapse_huge(seg, dense, flags);
    if (reserve(seg->fd, dense)) goto fail;
    double t0 = clock_seconds();
    if (!(flags & SHM_CREATE_NO_PREFAULT)) {
        if (prefault(seg->base, dense)) goto fail;
        seg->prefault_seconds = clock_seconds() - t0;
    }

    /* Magic goes in last, so a process attaching meanwhile sees either no
     * magic or a complete header, never a torn one. */
    seg->hdr = (struct shm_header *)seg->base;
    uint64_t magic;
    memcpy(&magic, h.magic, sizeof magic);
    memset(h.magic, 0, sizeof h.magic);
    memcpy(seg->hdr, &h, sizeof h);
    __atomic_store_n((uint64_t *)seg->hdr->magic, magic, __ATOMIC_RELEASE);
    seg->attached_generation = h.generation;
    copy_regions(seg, &h);
    return seg;
fail:
    shm_detach(seg);
    shm_unlink(name);
    return NULL;
}

shm_segment *shm_attach(const char *name, enum shm_kind kind, unsigned flags) {
    if (check_name(name)) return NULL;
    bool ro = flags & SHM_ATTACH_READONLY;
    shm_segment *seg = segment_new(name);
    if (!seg) return NULL;
    seg->fd = shm_open(name, (ro ? O_RDONLY : O_RDWR) | O_CLOEXEC, 0);
    if (seg->fd < 0) {
        set_err("shm_open(%s): %s", name, strerror(errno));
        free(seg);
        return NULL;
    }
    struct stat st;
    if (fstat(seg->fd, &st)) {
        set_err("fstat %s: %s", name, strerror(errno));
        goto fail;
    }
    if ((uint64_t)st.st_size < SHM_HEADER_SIZE) {
        set_err("total_size: segment %s has %lld bytes, smaller than the %u-byte header", name,
                (long long)st.st_size, SHM_HEADER_SIZE);
        goto fail;
    }
    /* Validate a private snapshot: the mapped header can change under us. */
    struct shm_header snap;
    if (pread(seg->fd, &snap, sizeof snap, 0) != (ssize_t)sizeof snap) {
        set_err("reading the header of %s: %s", name, strerror(errno));
        goto fail;
    }
    if (shm_validate_header(&snap, (uint64_t)st.st_size, kind)) goto fail;
    seg->size = (uint64_t)st.st_size;
    int prot = ro ? PROT_READ : PROT_READ | PROT_WRITE;
    /* MAP_POPULATE would allocate the holes of a sparse region: populate up to it instead */
    const uint64_t dense = dense_end(snap.regions, (int)snap.n_regions, seg->size);
    const bool populate = !(flags & SHM_ATTACH_NO_POPULATE);
    seg->base = map_segment(seg->fd, seg->size, prot, MAP_SHARED | (populate && dense == seg->size ? MAP_POPULATE : 0));
    if (!seg->base) {
        set_err("mmap %s: %s", name, strerror(errno));
        goto fail;
    }
    if (populate && dense < seg->size) (void)madvise(seg->base, dense, MADV_POPULATE_READ); /* best effort */
    seg->hdr = (struct shm_header *)seg->base;
    seg->attached_generation = snap.generation;
    copy_regions(seg, &snap);
    return seg;
fail:
    shm_detach(seg);
    return NULL;
}

void shm_detach(shm_segment *seg) {
    if (!seg) return;
    if (seg->base) munmap(seg->base, seg->size);
    if (seg->fd >= 0) close(seg->fd);
    free(seg);
}

int shm_unlink_name(const char *name) {
    if (check_name(name)) return -1;
    if (shm_unlink(name)) {
        set_err("shm_unlink(%s): %s", name, strerror(errno));
        return -1;
    }
    return 0;
}

void *shm_base(const shm_segment *seg) { return seg->base; }
uint64_t shm_size(const shm_segment *seg) { return seg->size; }
const char *shm_name(const shm_segment *seg) { return seg->name; }
int shm_region_count(const shm_segment *seg) { return seg->n_regions; }

int shm_region_punch(shm_segment *seg, const char *name) {
    for (int i = 0; i < seg->n_regions; i++) {
        const struct shm_region *r = &seg->regions[i];
        if (strcmp(r->name, name)) continue;
        if (!(r->flags & SHM_REGION_SPARSE)) {
            set_err("region '%s' of %s is not sparse", name, seg->name);
            return -1;
        }
        if (r->size && fallocate(seg->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)r->offset, (off_t)r->size)) {
            set_err("punching region '%s' of %s: %s", name, seg->name, strerror(errno));
            return -1;
        }
        return 0;
    }
    set_err("%s has no region '%s'", seg->name, name);
    return -1;
}
double shm_prefault_seconds(const shm_segment *seg) { return seg->prefault_seconds; }
int shm_huge_pages(const shm_segment *seg, double *seconds) {
    if (seconds) *seconds = seg->huge_seconds;
    return seg->huge_errno;
}

const struct shm_region *shm_region_at(const shm_segment *seg, int i) {
    return i >= 0 && i < seg->n_regions ? &seg->regions[i] : NULL;
}

void *shm_region_ptr(const shm_segment *seg, const char *name, uint64_t *size) {
    for (int i = 0; i < seg->n_regions; i++) {
        if (strcmp(seg->regions[i].name, name)) continue;
        if (size) *size = seg->regions[i].size;
        return seg->base + seg->regions[i].offset;
    }
    set_err("region '%s': not in segment %s", name, seg->name);
    return NULL;
}

uint64_t shm_generation(const shm_segment *seg) {
    return __atomic_load_n(&seg->hdr->generation, __ATOMIC_ACQUIRE);
}

bool shm_is_stale(const shm_segment *seg) { return shm_generation(seg) != seg->attached_generation; }

uint64_t shm_bump_generation(shm_segment *seg) {
    seg->attached_generation = __atomic_add_fetch(&seg->hdr->generation, 1, __ATOMIC_ACQ_REL);
    return seg->attached_generation;
}

int shm_list_prefix(const char *prefix, void (*fn)(const char *name, void *ctx), void *ctx) {
    if (!prefix || !*prefix || strchr(prefix, '/')) {
        set_err("shm prefix '%s': must be non-empty and without '/'", prefix ? prefix : "(null)");
        return -1;
    }
    DIR *d = opendir(SHM_DIR);
    if (!d) {
        set_err("opendir %s: %s", SHM_DIR, strerror(errno));
        return -1;
    }
    size_t plen = strlen(prefix);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen)) continue;
        char name[SHM_NAME_MAX];
        int n = snprintf(name, sizeof name, "/%s", e->d_name);
        if (n < 0 || (size_t)n >= sizeof name) continue; /* never one of ours */
        fn(name, ctx);
        count++;
    }
    closedir(d);
    return count;
}

struct unlink_state {
    int removed, failed;
};

static void unlink_one(const char *name, void *ctx) {
    struct unlink_state *st = ctx;
    retire_existing(name);
    if (shm_unlink(name) == 0 || errno == ENOENT) {
        st->removed++;
    } else {
        set_err("shm_unlink(%s): %s", name, strerror(errno));
        st->failed++;
    }
}

int shm_unlink_prefix(const char *prefix) {
    struct unlink_state st = {0, 0};
    if (shm_list_prefix(prefix, unlink_one, &st) < 0) return -1;
    return st.failed ? -1 : st.removed;
}

int shm_unlink_run(const char *runid) {
    char prefix[SHM_NAME_MAX];
    if (!valid_token(runid)) {
        set_err("run id '%s': must be [A-Za-z0-9_.-]+", runid ? runid : "(null)");
        return -1;
    }
    int n = snprintf(prefix, sizeof prefix, "pi2-%s-", runid);
    if (n < 0 || (size_t)n >= sizeof prefix) {
        set_err("run id '%s': too long", runid);
        return -1;
    }
    return shm_unlink_prefix(prefix);
}
