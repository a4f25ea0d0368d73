#include "stack/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static _Thread_local char rundir_err[256];

__attribute__((format(printf, 1, 2))) static void set_err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rundir_err, sizeof rundir_err, fmt, ap);
    va_end(ap);
}

const char *rundir_last_error(void) { return rundir_err; }

static bool valid_runid(const char *s) {
    if (!s || !*s) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '.' || *s == '-'))
            return false;
    return true;
}

int rundir_path(char *buf, size_t len, const char *runid) {
    if (!valid_runid(runid)) {
        set_err("run id '%s': must be [A-Za-z0-9_.-]+", runid ? runid : "(null)");
        return -1;
    }
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n;
    if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode))
        n = snprintf(buf, len, "%s/pi2-%s", xdg, runid);
    else
        n = snprintf(buf, len, "/tmp/pi2-%u-%s", (unsigned)getuid(), runid);
    if (n < 0 || (size_t)n >= len || n >= RUNDIR_PATH_MAX) {
        set_err("run directory for '%s': path longer than %d bytes", runid, RUNDIR_PATH_MAX - 1);
        return -1;
    }
    return 0;
}

int rundir_create(const char *path) {
    if (!path || path[0] != '/' || strlen(path) >= RUNDIR_PATH_MAX) {
        set_err("run directory '%s': must be an absolute path shorter than %d bytes",
                path ? path : "(null)", RUNDIR_PATH_MAX);
        return -1;
    }
    if (mkdir(path, 0700) == 0) {
        /* The umask can only remove bits; make the mode exact anyway. */
        if (chmod(path, 0700)) {
            set_err("chmod %s: %s", path, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (errno != EEXIST) {
        set_err("mkdir %s: %s", path, strerror(errno));
        return -1;
    }
    return rundir_check(path);
}

int rundir_check(const char *path) {
    struct stat st;
    if (lstat(path, &st)) {
        set_err("lstat %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_err("run directory %s is not a directory (or is a symlink)", path);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        set_err("run directory %s is owned by uid %u, not us (%u)", path, (unsigned)st.st_uid,
                (unsigned)geteuid());
        return -1;
    }
    if ((st.st_mode & 07777) != 0700) {
        set_err("run directory %s has mode %04o, expected 0700", path, (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
}

int rundir_remove(const char *path) {
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        if (errno == ENOENT) return 0;
        set_err("open %s: %s", path, strerror(errno));
        return -1;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        set_err("fdopendir %s: %s", path, strerror(errno));
        close(dfd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
        if (S_ISDIR(st.st_mode)) {
            set_err("run directory %s holds a directory '%s'; not removing it", path, e->d_name);
            rc = -1;
            continue;
        }
        if (unlinkat(dfd, e->d_name, 0) && errno != ENOENT) {
            set_err("unlink %s/%s: %s", path, e->d_name, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    if (rc == 0 && rmdir(path)) {
        set_err("rmdir %s: %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}
