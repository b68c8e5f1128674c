/*
 * cmd_devices.c -- `kvsieve devices`: which CUDA devices this build can use.
 *
 * What it is: prints one line per device found (name, compute capability,
 * memory, SMs, runtime / driver versions), or "no CUDA device: <reason>"
 * (built without CUDA, no driver, no device...). Exit code 0 in both cases
 * (absence of a GPU is an answer, not a failure); 2 on a usage error, 1 when
 * a device was counted but could not be described.
 * What it is not: no benchmark, no selection of a device.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvs_kernels.h"

int kvs_cmd_devices(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvsieve devices\n"
                   "Lists the CUDA devices the GPU path (kernels/) can use, or says why there is "
                   "none.\n");
            return 0;
        }
        fprintf(stderr, "kvsieve devices: unknown argument '%s' (takes none)\n", argv[i]);
        return 2;
    }
    kvs_err err;
    kvs_err_clear(&err);
    int n = 0;
    kvs_status st = kvs_gpu_device_count(&n, &err);
    if (st != KVS_OK) {
        /* the message already starts with "no CUDA device: ..." or names the
         * missing build support */
        if (strncmp(err.msg, "no CUDA device", 14) == 0)
            printf("%s\n", err.msg);
        else
            printf("no CUDA device: %s\n", err.msg);
        return 0;
    }
    printf("%d CUDA device%s:\n", n, n == 1 ? "" : "s");
    int rc = 0;
    for (int d = 0; d < n; d++) {
        char line[512];
        kvs_err_clear(&err);
        if (kvs_gpu_device_describe(d, line, sizeof line, &err) != KVS_OK) {
            fprintf(stderr, "kvsieve devices: device %d: %s\n", d, err.msg);
            rc = 1;
            continue;
        }
        printf("  %s\n", line);
    }
    return rc;
}
