/* Named POSIX shared-memory segments ("/pi2-<runid>-<what>", mode 0600) that
 * carry weights, activations, the KV cache and slot tables between the
 * processes of a run. Each segment starts with a header (magic, layout
 * version, kind, size, a table of named regions, a generation counter) so a
 * restarted process can re-attach and validate it. Nothing in a header is
 * trusted: attaching a hostile or truncated segment is an error, not a crash.
 *
 * Errors: functions return NULL or -1 and leave a message naming the failing
 * field in shm_last_error() (per thread). */
#ifndef PI2_SHM_H
#define PI2_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_MAGIC "PI2SHM\0\0"
#define SHM_VERSION 1u
#define SHM_MAX_REGIONS 16
#define SHM_REGION_NAME_MAX 32 /* bytes, including the NUL */
/* Bytes reserved for the header: one page, so the first region can be
 * 4096-aligned for O_DIRECT reads straight into the segment. */
#define SHM_HEADER_SIZE 4096u
#define SHM_NAME_MAX 128

enum shm_kind {
    SHM_KIND_WEIGHTS = 1,
    SHM_KIND_ACTIVATIONS = 2,
    SHM_KIND_KV = 3,
    SHM_KIND_SLOTS = 4,
    SHM_KIND_TEST = 5,
    SHM_KIND_CONTROL = 6,  /* the stack's control block (lib/stack/stack.h) */
};

/* Region alignments allowed: cache lines, or pages for O_DIRECT targets. */
#define SHM_ALIGN_CACHELINE 64u
#define SHM_ALIGN_PAGE 4096u

/* Region flags. A sparse region holds memory only while its owner fills it:
 * shm_create neither reserves nor prefaults it, shm_attach does not populate
 * it, and shm_region_punch gives its pages back. Sparse regions come after
 * every other one, the first at a 2 MiB boundary, so the segment's 2 MiB
 * pages end before it. */
#define SHM_REGION_SPARSE 1u
#define SHM_SPARSE_ALIGN (2u << 20)

struct shm_region {
    char name[SHM_REGION_NAME_MAX];
    uint64_t offset; /* from the start of the segment */
    uint64_t size;
    uint32_t align; /* SHM_ALIGN_CACHELINE or SHM_ALIGN_PAGE */
    uint32_t flags; /* SHM_REGION_SPARSE or 0 */
};

/* The on-segment header. Fixed-width fields; read it only through
 * shm_attach, which validates every field against the file itself. */
struct shm_header {
    char magic[8];
    uint32_t version;
    uint32_t kind;
    uint64_t total_size;
    uint64_t header_size;
    uint64_t generation; /* atomic: __atomic builtins, bumped by the creator */
    int32_t creator_pid;
    uint32_t n_regions;
    struct shm_region regions[SHM_MAX_REGIONS];
};

/* What a creator asks for; shm_create lays the regions out in order. */
struct shm_region_spec {
    const char *name;
    uint64_t size;
    uint32_t align; /* SHM_ALIGN_CACHELINE or SHM_ALIGN_PAGE */
    uint32_t flags; /* SHM_REGION_SPARSE: page-aligned, after the others */
};

typedef struct shm_segment shm_segment;

enum {
    SHM_CREATE_REPLACE = 1 << 0, /* an existing segment of that name is marked stale and replaced */
    SHM_ATTACH_READONLY = 1 << 1,
    /* Reserve the pages (a full /dev/shm still fails here) but do not map
     * them: for a segment the creator overwrites anyway, e.g. weights. */
    SHM_CREATE_NO_PREFAULT = 1 << 2,
    /* Map without populating the page tables: for a process that only
     * writes the segment once (the io-worker's reads), whose first touch of
     * each page would otherwise be paid twice. */
    SHM_ATTACH_NO_POPULATE = 1 << 3,
    /* Leave the segment on 4 KiB pages: the move into 2 MiB pages costs
     * seconds at start-up (shm_huge_pages then reports ECANCELED). */
    SHM_CREATE_SMALL_PAGES = 1 << 4,
};

const char *shm_last_error(void);

/* "/pi2-<runid>-<what>" into buf; runid and what are [A-Za-z0-9_.-]+. */
int shm_make_name(char *buf, size_t len, const char *runid, const char *what);

/* Creates, sizes (header + regions), fills the header and prefaults every
 * page (allocation happens here, at start-up, not on the token path;
 * SHM_CREATE_NO_PREFAULT only reserves them). A segment of 2 MiB or more is
 * moved into 2 MiB pages where the kernel can (shm_huge_pages), and every
 * process maps it 2 MiB-aligned. Fails if the name exists unless
 * SHM_CREATE_REPLACE. */
shm_segment *shm_create(const char *name, enum shm_kind kind, const struct shm_region_spec *specs,
                        int n_specs, unsigned flags);
/* Maps an existing segment after validating magic, version, kind, size
 * (against fstat) and the region table. Page tables are populated now,
 * unless SHM_ATTACH_NO_POPULATE. */
shm_segment *shm_attach(const char *name, enum shm_kind kind, unsigned flags);
/* Unmaps and closes; the segment itself stays (see shm_unlink_name). */
void shm_detach(shm_segment *seg);
int shm_unlink_name(const char *name);

/* Validates a header image of a segment whose real size is file_size;
 * returns 0, or -1 with shm_last_error() naming the field. */
int shm_validate_header(const struct shm_header *hdr, uint64_t file_size, enum shm_kind kind);

void *shm_base(const shm_segment *seg);
uint64_t shm_size(const shm_segment *seg);
const char *shm_name(const shm_segment *seg);
/* Region lookup in the validated private copy of the table. */
int shm_region_count(const shm_segment *seg);
const struct shm_region *shm_region_at(const shm_segment *seg, int i);
void *shm_region_ptr(const shm_segment *seg, const char *name, uint64_t *size);
/* Gives a sparse region's pages back (in every process mapping it; a later
 * touch reads zeros and allocates again). 0, or -1 with shm_last_error(). */
int shm_region_punch(shm_segment *seg, const char *name);

uint64_t shm_generation(const shm_segment *seg);
/* True when the creator re-initialised or replaced the segment since this
 * process attached: its layout and contents must be re-read. */
bool shm_is_stale(const shm_segment *seg);
/* The creator calls this after re-initialising the contents in place. */
uint64_t shm_bump_generation(shm_segment *seg);
/* Seconds spent prefaulting in shm_create (0 for an attached segment or
 * one created with SHM_CREATE_NO_PREFAULT). */
double shm_prefault_seconds(const shm_segment *seg);
/* The creator's segment: 0 when all of it is on 2 MiB pages, else the errno
 * of why not (EINVAL: smaller than 2 MiB or a kernel without MADV_COLLAPSE;
 * EAGAIN / ENOMEM: not enough free 2 MiB blocks, some pages stay 4 KiB;
 * ECANCELED: created with SHM_CREATE_SMALL_PAGES).
 * *seconds (may be NULL): the time the move took. */
int shm_huge_pages(const shm_segment *seg, double *seconds);

/* Cleanup for `pi2 down`: every segment whose name (without the leading
 * '/') starts with prefix. Each one that is a pi2 segment gets its
 * generation bumped first so attached processes notice. Returns the number
 * removed, or -1. */
int shm_list_prefix(const char *prefix, void (*fn)(const char *name, void *ctx), void *ctx);
int shm_unlink_prefix(const char *prefix);
/* shm_unlink_prefix("pi2-<runid>-"). */
int shm_unlink_run(const char *runid);

#endif
