/* lib/util/pi2_assert.h: a failed PI2_ASSERT names the file, the line and the
 * condition with its message, then aborts; PI2_DEBUG_ASSERT does the same in
 * a build with debug assertions (make asan) and, in any other, does not even
 * evaluate its condition. */
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "util/log.h"
#include "util/pi2_assert.h"

typedef struct {
    int status;          /* waitpid's */
    char stderr_[1024];  /* what the child wrote there */
} child_result;

/* Runs fn in a child process, its stderr captured. */
static child_result run_child(void (*fn)(void)) {
    child_result r = {0};
    int fds[2];
    if (pipe(fds)) return r;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got < sizeof r.stderr_ - 1 && (n = read(fds[0], r.stderr_ + got, sizeof r.stderr_ - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    waitpid(pid, &r.status, 0);
    return r;
}

static bool aborted(const child_result *r) { return WIFSIGNALED(r->status) && WTERMSIG(r->status) == SIGABRT; }

enum { FAIL_LINE = __LINE__ + 3 }; /* the line of the PI2_ASSERT below */
static void fail_assert(void) {
    const int answer = 42;
    PI2_ASSERT(answer == 41, "the answer was %d", answer);
}

static void pass_assert(void) { PI2_ASSERT(2 + 2 == 4, "arithmetic"); }

static void fail_debug_assert(void) { PI2_DEBUG_ASSERT(sizeof(int) == 1, "int is %zu bytes", sizeof(int)); }

int main(void) {
    log_init("test_assert");
    signal(SIGPIPE, SIG_IGN);

    child_result r = run_child(fail_assert);
    char where[64];
    snprintf(where, sizeof where, "test_assert.c:%d: ", FAIL_LINE);
    CHECK(aborted(&r), "a failed PI2_ASSERT aborts (status %#x)", r.status);
    CHECK(strstr(r.stderr_, where) != NULL, "it names the file and line (%s): %s", where, r.stderr_);
    CHECK(strstr(r.stderr_, "assertion `answer == 41' failed: the answer was 42") != NULL,
          "it names the condition and the message: %s", r.stderr_);
    CHECK(strstr(r.stderr_, "ERROR") != NULL, "at the error level: %s", r.stderr_);

    r = run_child(pass_assert);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && !r.stderr_[0], "a PI2_ASSERT that holds says nothing");

    int evaluated = 0;
    PI2_DEBUG_ASSERT(++evaluated > 0, "never fails");
    r = run_child(fail_debug_assert);
#ifdef PI2_DEBUG_ASSERTS
    CHECK(evaluated == 1, "debug assertions on: the condition is evaluated");
    CHECK(aborted(&r) && strstr(r.stderr_, "int is 4 bytes"), "a failed PI2_DEBUG_ASSERT aborts: %s", r.stderr_);
#else
    CHECK(evaluated == 0, "debug assertions off: the condition is not evaluated");
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "a failed PI2_DEBUG_ASSERT is not checked");
#endif
    return test_summary();
}
