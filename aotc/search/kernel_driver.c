/* Runs one aotc kernel from a shared library on raw buffers where Python cannot run it (an AArch64
 * kernel under qemu): the emulated runner of aotc.search.timing and tests/test_aarch64.py use it.
 * usage: kernel_driver LIB SYMBOL REPEAT NUMBER FILE...
 * Each FILE is one kernel argument, read whole and written back after the first (checked) call, so the
 * outputs come back in their files. Then REPEAT lines follow on stdout, each the mean seconds of NUMBER
 * more calls. Exit status: 0, or 2 on any failure (its message on stderr). */
#define _POSIX_C_SOURCE 199309L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *read_file(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(*size > 0 ? *size : 1);
    if (data && fread(data, 1, *size, f) != (size_t)*size) { free(data); data = NULL; }
    fclose(f);
    return data;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: %s LIB SYMBOL REPEAT NUMBER FILE...\n", argv[0]); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*kernel)(void **) = (int (*)(void **))dlsym(lib, argv[2]);
    if (!kernel) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 2; }
    int repeat = atoi(argv[3]), number = atoi(argv[4]), n = argc - 5;
    void **args = calloc(n, sizeof(void *));
    long *sizes = calloc(n, sizeof(long));
    for (int i = 0; i < n; i++) {
        args[i] = read_file(argv[5 + i], &sizes[i]);
        if (!args[i]) { fprintf(stderr, "cannot read %s\n", argv[5 + i]); return 2; }
    }
    int status = kernel(args);
    if (status) { fprintf(stderr, "kernel status %d\n", status); return 2; }
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[5 + i], "wb");
        if (!f || fwrite(args[i], 1, sizes[i], f) != (size_t)sizes[i]) {
            fprintf(stderr, "cannot write %s\n", argv[5 + i]);
            return 2;
        }
        fclose(f);
    }
    for (int r = 0; r < repeat; r++) {
        double start = now();
        for (int k = 0; k < (number > 0 ? number : 1); k++) kernel(args);
        printf("%.9e\n", (now() - start) / (number > 0 ? number : 1));
    }
    return 0;
}
