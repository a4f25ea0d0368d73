#include "stack/proc_stop.h"

#include <string.h>

volatile sig_atomic_t proc_stop;

static void on_signal(int sig) {
    (void)sig;
    proc_stop = 1;
}

void proc_stop_on_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a blocking wait returns and its loop sees the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}
