/* aotc C runtime: open an aotc CPU package (name.aotc) and run it, from C or C++, without Python.
 *
 * It reads the same package format as the Python runtime (docs/package.md) and checks it the same way
 * before running any of its code: the zip, the manifest's format and version, the size and sha256 of
 * every member, the kernel library's ELF machine and its `.aotc_plan` against the manifest, the size
 * of weights.bin, and the host's architecture and CPU features. Only then is the verified library
 * loaded (from memory, through a memfd) and its entry functions called.
 *
 *     aotc_model *model;
 *     if (aotc_model_open("mlp.aotc", NULL, &model) != AOTC_OK) {
 *         fprintf(stderr, "%s\n", aotc_last_error());
 *         return 1;
 *     }
 *     const void *inputs[] = {x};      size_t in_sizes[] = {sizeof x};
 *     void *outputs[] = {y};           size_t out_sizes[] = {sizeof y};
 *     aotc_model_run(model, 0, inputs, in_sizes, outputs, out_sizes);
 *     aotc_model_close(model);
 *
 * Full documentation: docs/c-runtime.md. Needs Linux with glibc (libc, libdl, libpthread, libm). */
#ifndef AOTC_RUNTIME_H
#define AOTC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AOTC_API __attribute__((visibility("default")))

#define AOTC_RUNTIME_VERSION "0.1.0"
#define AOTC_PACKAGE_FORMAT_VERSION 2 /* the only package format version this runtime reads */

typedef enum aotc_status {
    AOTC_OK = 0,
    AOTC_ERR_IO = 1,               /* the file cannot be opened or read */
    AOTC_ERR_FORMAT = 2,           /* not an aotc package, damaged, edited, or of another format version */
    AOTC_ERR_CHECKSUM = 3,         /* a member's sha256 (or zip CRC) differs from what the package says */
    AOTC_ERR_UNSUPPORTED = 4,      /* another architecture, missing CPU features, a GPU package, signatures */
    AOTC_ERR_LIBRARY = 5,          /* the verified kernel library did not load (dlopen/dlsym) */
    AOTC_ERR_INVALID_ARGUMENT = 6, /* a NULL pointer, a variant or index out of range, a wrong byte count */
    AOTC_ERR_KERNEL = 7,           /* the model's code returned nonzero (a kernel could not allocate) */
    AOTC_ERR_NO_MEMORY = 8         /* this runtime could not allocate */
} aotc_status;

/* An opened package: its checked plan, its library, its weights and one workspace. */
typedef struct aotc_model aotc_model;

/* Options of aotc_model_open; zero-initialise (`aotc_open_options o = {0};`) for the defaults. */
typedef struct aotc_open_options {
    /* threads each run uses: 1 to the cores this process may run on; 0: the package's default (those
     * cores, at most 64) */
    int num_threads;
    /* nonzero: require a trusted signature. The C runtime cannot verify signatures, so this (or
     * AOTC_REQUIRE_SIGNATURE=1, or AOTC_TRUSTED_KEYS set, as for the Python runtime) makes
     * aotc_model_open fail with AOTC_ERR_UNSUPPORTED; verify such packages with the Python runtime. */
    int require_signature;
} aotc_open_options;

/* One input or output of a variant, as the package's plan describes it. Valid until the model is
 * closed. */
typedef struct aotc_tensor_info {
    const char *name;
    const char *dtype;     /* numpy's name: "float32", "int8", "uint8", "int32", "int64", "bool", ... */
    size_t itemsize;       /* bytes per element */
    int rank;
    const int64_t *shape;  /* rank dimensions, row-major */
    size_t nbytes;         /* itemsize times every dimension: what aotc_model_run expects */
} aotc_tensor_info;

/* "AOTC_OK", "AOTC_ERR_FORMAT", ...; "AOTC_ERR_UNKNOWN" for a value not listed above. */
AOTC_API const char *aotc_status_name(aotc_status status);

/* The message of the last call that failed on this thread, naming the file and the member, manifest
 * field, symbol or input at fault; "" before any failure. Successful calls leave it as it was. */
AOTC_API const char *aotc_last_error(void);

/* Verify the package at `path` for this host, load its library and read its weights. `options` may be
 * NULL. On success *out is the model (close it with aotc_model_close); on failure *out is NULL and
 * aotc_last_error() says why. No code of the package runs before every check has passed. */
AOTC_API aotc_status aotc_model_open(const char *path, const aotc_open_options *options, aotc_model **out);

/* Unload the model's library and free everything it holds; NULL is ignored. No run may be in flight. */
AOTC_API void aotc_model_close(aotc_model *model);

/* The manifest's name, target string, and the package digest (sha256 of manifest.json, 64 hex digits). */
AOTC_API const char *aotc_model_name(const aotc_model *model);
AOTC_API const char *aotc_model_target(const aotc_model *model);
AOTC_API const char *aotc_model_digest(const aotc_model *model);

/* A package compiled for several input shapes (batch sizes) holds one variant per shape, each with the
 * same input and output names and dtypes; others have one variant, number 0. The queries return -1 or
 * NULL (and set the last error) for a NULL model or an index out of range. */
AOTC_API int aotc_model_num_variants(const aotc_model *model);
AOTC_API int aotc_model_num_inputs(const aotc_model *model, int variant);
AOTC_API int aotc_model_num_outputs(const aotc_model *model, int variant);
AOTC_API const aotc_tensor_info *aotc_model_input(const aotc_model *model, int variant, int index);
AOTC_API const aotc_tensor_info *aotc_model_output(const aotc_model *model, int variant, int index);

/* Run variant `variant` once. inputs[i] points to input i's bytes (row-major, little-endian, the
 * tensor's dtype) and input_nbytes[i] says how many there are; outputs[i] and output_nbytes[i] the
 * same for the outputs, which are written. Each count must equal the tensor's nbytes and each pointer
 * be aligned to its itemsize; outputs must not overlap each other or any input. Calls on one model
 * run one at a time (they share its workspace; a second caller waits); open the package twice to run
 * two calls side by side. Returns AOTC_ERR_INVALID_ARGUMENT naming the input or output at fault, or
 * AOTC_ERR_KERNEL when the model's code fails. */
AOTC_API aotc_status aotc_model_run(aotc_model *model, int variant, const void *const *inputs,
                                    const size_t *input_nbytes, void *const *outputs,
                                    const size_t *output_nbytes);

/* Threads the model's runs use from now on: 1 to the cores this process may run on, or 0 for the
 * package's default. Each opened model has its own library and thread pool. */
AOTC_API aotc_status aotc_model_set_num_threads(aotc_model *model, int num_threads);
/* The threads a run uses now (the setting, else the package's default); -1 for a NULL model. */
AOTC_API int aotc_model_num_threads(const aotc_model *model);

#ifdef __cplusplus
}
#endif

#endif
