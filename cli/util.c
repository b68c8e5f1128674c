/* util.c -- process facts the CLI reports (peak RSS), and printing JSON. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <sys/resource.h>

#include "cli.h"

void kvs_cli_print_json(cJSON *j) {
    char *text = cJSON_Print(j);
    if (text) puts(text);
    cJSON_free(text);
    cJSON_Delete(j);
}

double kvs_peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1.0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}
