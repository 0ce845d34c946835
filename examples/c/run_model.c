/* run_model: run an aotc CPU package from C with the aotc C runtime (runtime/c, docs/c-runtime.md).
 *
 *   run_model PACKAGE                          list the package's variants, inputs and outputs
 *   run_model PACKAGE [--threads N] [--variant K] [--repeat N] [-o OUTDIR] INPUT.bin...
 *
 * Each INPUT.bin holds one input's raw bytes, in the model's input order: row-major, little-endian,
 * of the input's dtype (numpy: `x.astype("float32").tofile("x.bin")`). Without --variant the first
 * variant whose input sizes equal the files' is run. Each output is written to OUTDIR/<name>.bin
 * (OUTDIR is created if missing; characters outside [A-Za-z0-9._-] in the name become '_'). The time
 * per run is printed.
 *
 * Exit status: 0; the aotc_status of a failed runtime call (1 to 8: IO, FORMAT, CHECKSUM, UNSUPPORTED,
 * LIBRARY, INVALID_ARGUMENT, KERNEL, NO_MEMORY), printed with aotc_last_error(); 64 for a usage error;
 * 65 when this program cannot read an input file or write an output file. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "aotc_runtime.h"

#define EXIT_USAGE 64
#define EXIT_FILES 65

typedef struct args {
    const char *package;
    const char *outdir;
    int threads, variant, repeat;
    int num_inputs;
    char **inputs;
} args;

static int usage(const char *why) {
    fprintf(stderr,
            "run_model: %s\n"
            "usage: run_model PACKAGE [--threads N] [--variant K] [--repeat N] [-o OUTDIR] INPUT.bin...\n",
            why);
    return EXIT_USAGE;
}

static int parse_int(const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < 0 || v > 1000000)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->variant = -1;
    a->repeat = 1;
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int *number = !strcmp(arg, "--threads")   ? &a->threads
                      : !strcmp(arg, "--variant") ? &a->variant
                      : !strcmp(arg, "--repeat")  ? &a->repeat
                                                  : NULL;
        if (number || !strcmp(arg, "-o")) {
            if (i + 1 >= argc)
                return usage("an option lacks its value");
            if (!number)
                a->outdir = argv[++i];
            else if (parse_int(argv[++i], number))
                return usage("--threads, --variant and --repeat take a non-negative integer");
        } else if (arg[0] == '-' && arg[1]) {
            return usage("unknown option");
        } else if (!a->package) {
            a->package = arg;
        } else {
            a->inputs[a->num_inputs++] = argv[i];
        }
    }
    if (!a->package)
        return usage("no package given");
    if (a->repeat < 1)
        return usage("--repeat must be at least 1");
    return 0;
}

static void print_tensor(const char *role, const aotc_tensor_info *t) {
    printf("  %s %s: %s[", role, t->name, t->dtype);
    for (int d = 0; d < t->rank; d++)
        printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
    printf("] (%zu bytes)\n", t->nbytes);
}

static void print_model(const aotc_model *model) {
    printf("%s (%s)\n  target %s\n", aotc_model_name(model), aotc_model_digest(model), aotc_model_target(model));
    for (int v = 0; v < aotc_model_num_variants(model); v++) {
        printf("variant %d\n", v);
        for (int i = 0; i < aotc_model_num_inputs(model, v); i++)
            print_tensor("input", aotc_model_input(model, v, i));
        for (int i = 0; i < aotc_model_num_outputs(model, v); i++)
            print_tensor("output", aotc_model_output(model, v, i));
    }
}

/* A whole file in a 64-byte aligned buffer (aligned for any dtype). */
static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    void *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        posix_memalign(&buf, 64, n ? (size_t)n : 1) == 0 && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        fclose(f);
        *size = (size_t)n;
        return buf;
    }
    fprintf(stderr, "run_model: cannot read %s (%s)\n", path, strerror(errno));
    free(buf);
    if (f)
        fclose(f);
    return NULL;
}

static int write_output(const char *outdir, const aotc_tensor_info *t, const void *data) {
    char path[4096];
    size_t used = (size_t)snprintf(path, sizeof path, "%s/", outdir);
    for (const char *c = t->name; *c && used + 5 < sizeof path; c++)
        path[used++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                               *c == '.' || *c == '-' || *c == '_'
                           ? *c
                           : '_';
    snprintf(path + used, sizeof path - used, ".bin");
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, t->nbytes, f) != t->nbytes || fclose(f) != 0) {
        fprintf(stderr, "run_model: cannot write %s (%s)\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The first variant whose input sizes equal the files'; variant 0 when none does (the runtime then
 * says which input has the wrong size). */
static int pick_variant(const aotc_model *model, int num_inputs, const size_t *sizes) {
    for (int v = 0; v < aotc_model_num_variants(model); v++) {
        int match = aotc_model_num_inputs(model, v) == num_inputs;
        for (int i = 0; match && i < num_inputs; i++)
            match = aotc_model_input(model, v, i)->nbytes == sizes[i];
        if (match)
            return v;
    }
    return 0;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int fail(aotc_status status) {
    fprintf(stderr, "run_model: %s: %s\n", aotc_status_name(status), aotc_last_error());
    return (int)status;
}

/* Runs the chosen variant `repeat` times and writes its outputs. */
static int run(aotc_model *model, const args *a) {
    size_t *in_sizes = calloc((size_t)a->num_inputs + 1, sizeof *in_sizes);
    void **in = calloc((size_t)a->num_inputs + 1, sizeof *in);
    int rc = 0;
    for (int i = 0; i < a->num_inputs && !rc; i++)
        if (!(in[i] = read_file(a->inputs[i], &in_sizes[i])))
            rc = EXIT_FILES;
    int variant = a->variant >= 0 ? a->variant : pick_variant(model, a->num_inputs, in_sizes);
    int num_outputs = rc ? -1 : aotc_model_num_outputs(model, variant);
    if (!rc && num_outputs < 0)
        rc = fail(AOTC_ERR_INVALID_ARGUMENT);
    if (!rc && a->num_inputs != aotc_model_num_inputs(model, variant)) {
        fprintf(stderr, "run_model: variant %d takes %d inputs, %d files given\n", variant,
                aotc_model_num_inputs(model, variant), a->num_inputs);
        rc = EXIT_USAGE;
    }
    void **out = calloc((size_t)(num_outputs > 0 ? num_outputs : 1), sizeof *out);
    size_t *out_sizes = calloc((size_t)(num_outputs > 0 ? num_outputs : 1), sizeof *out_sizes);
    for (int i = 0; !rc && i < num_outputs; i++) {
        out_sizes[i] = aotc_model_output(model, variant, i)->nbytes;
        if (posix_memalign(&out[i], 64, out_sizes[i] ? out_sizes[i] : 1))
            rc = fail(AOTC_ERR_NO_MEMORY);
    }
    double best = 1e300, total = 0;
    for (int r = 0; !rc && r < a->repeat; r++) {
        double start = now_ms();
        aotc_status st = aotc_model_run(model, variant, (const void *const *)in, in_sizes, out, out_sizes);
        double spent = now_ms() - start;
        if (st)
            rc = fail(st);
        total += spent;
        best = spent < best ? spent : best;
    }
    if (!rc)
        printf("ran variant %d with %d threads: %.4f ms per run (mean of %d), best %.4f ms\n", variant,
               aotc_model_num_threads(model), total / a->repeat, a->repeat, best);
    if (!rc && a->outdir && mkdir(a->outdir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "run_model: cannot create %s (%s)\n", a->outdir, strerror(errno));
        rc = EXIT_FILES;
    }
    for (int i = 0; !rc && a->outdir && i < num_outputs; i++)
        if (write_output(a->outdir, aotc_model_output(model, variant, i), out[i]))
            rc = EXIT_FILES;
    for (int i = 0; i < a->num_inputs; i++)
        free(in[i]);
    for (int i = 0; i < num_outputs; i++)
        free(out[i]);
    free(in);
    free(in_sizes);
    free(out);
    free(out_sizes);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        free(a.inputs);
        return rc;
    }
    aotc_open_options options = {0};
    options.num_threads = a.threads;
    aotc_model *model;
    aotc_status st = aotc_model_open(a.package, &options, &model);
    if (st) {
        free(a.inputs);
        return fail(st);
    }
    print_model(model);
    if (a.num_inputs)
        rc = run(model, &a);
    aotc_model_close(model);
    free(a.inputs);
    return rc;
}
