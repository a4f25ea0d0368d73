/* The private directory of one run, holding the ipc:// sockets of the bus:
 * $XDG_RUNTIME_DIR/pi2-<runid>, else /tmp/pi2-<uid>-<runid>. Created with
 * mode 0700; an existing one is used only if it is a real directory (not a
 * symlink) owned by us with mode 0700, so no other user can reach or
 * pre-plant our sockets. Errors leave a message in rundir_last_error(). */
#ifndef PI2_RUNDIR_H
#define PI2_RUNDIR_H

#include <stddef.h>

#define RUNDIR_PATH_MAX 96 /* leaves room for "/<name>.sock" within a 108-byte sun_path */

const char *rundir_last_error(void);

/* The run directory path for runid ([A-Za-z0-9_.-]+). */
int rundir_path(char *buf, size_t len, const char *runid);
/* Creates path (mode 0700) or checks an existing one; -1 if unsafe. */
int rundir_create(const char *path);
/* 0 if path is a real directory (not a symlink) owned by us, mode 0700. */
int rundir_check(const char *path);
/* Removes the sockets and plain files in path, then path itself. */
int rundir_remove(const char *path);

#endif
