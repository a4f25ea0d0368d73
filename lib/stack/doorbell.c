/* The io-worker's doorbell (doorbell.h). */
#include "stack/doorbell.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stack/rundir.h"

int doorbell_open(const char *runid, char *err, size_t errlen) {
    char dir[RUNDIR_PATH_MAX], path[RUNDIR_PATH_MAX + 16];
    if (rundir_path(dir, sizeof dir, runid)) {
        snprintf(err, errlen, "run '%s': no run directory path", runid);
        return -1;
    }
    snprintf(path, sizeof path, "%s/io.bell", dir);
    if (mkfifo(path, 0600) && errno != EEXIST) {
        snprintf(err, errlen, "mkfifo %s: %s", path, strerror(errno));
        return -1;
    }
    const int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return fd;
}

void doorbell_ring(int fd) {
    ssize_t n;
    do n = write(fd, "", 1);
    while (n < 0 && errno == EINTR); /* EAGAIN: rung often enough already */
}

void doorbell_drain(int fd) {
    char buf[256];
    while (read(fd, buf, sizeof buf) == (ssize_t)sizeof buf) { /* a shorter read emptied the pipe */
    }
}
