/* Runs one aotc kernel from a shared library on raw buffers, for tests under qemu (no Python there).
 * usage: kernel_driver LIB SYMBOL FILE... ; each FILE is one kernel argument, read whole and, after
 * the call, written back (outputs come back in the same files). Exit status: 0, or 2 on a failure. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s LIB SYMBOL FILE...\n", argv[0]); return 2; }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*kernel)(void **) = (int (*)(void **))dlsym(lib, argv[2]);
    if (!kernel) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 2; }
    int n = argc - 3;
    void **args = calloc(n, sizeof(void *));
    long *sizes = calloc(n, sizeof(long));
    for (int i = 0; i < n; i++) {
        args[i] = read_file(argv[3 + i], &sizes[i]);
        if (!args[i]) { fprintf(stderr, "cannot read %s\n", argv[3 + i]); return 2; }
    }
    int status = kernel(args);
    if (status) { fprintf(stderr, "kernel status %d\n", status); return 2; }
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(argv[3 + i], "wb");
        if (!f || fwrite(args[i], 1, sizes[i], f) != (size_t)sizes[i]) { fprintf(stderr, "cannot write %s\n", argv[3 + i]); return 2; }
        fclose(f);
    }
    return 0;
}
