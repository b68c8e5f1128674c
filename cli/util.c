/* util.c -- process facts the CLI reports (peak RSS). */
#include <sys/resource.h>

#include "cli.h"

double kvs_peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1.0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}
