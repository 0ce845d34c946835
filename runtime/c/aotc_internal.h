/* Internal interfaces of the aotc C runtime: SHA-256, CRC-32, JSON, zip, ELF, plan and host checks.
 * Nothing here is exported from libaotc_runtime.so (-fvisibility=hidden); selftest.c links the static
 * library to test these pieces directly. */
#ifndef AOTC_INTERNAL_H
#define AOTC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "aotc_runtime.h"

/* Why a check failed, in words; the caller adds the file name and what was being read. */
typedef struct aotc_reason {
    char text[768];
} aotc_reason;

/* Formats into `why` and returns -1, so that checks read `return reason(why, "...", ...);`. */
int aotc_reason_set(aotc_reason *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records the thread's last error message and returns `status`. */
aotc_status aotc_fail(aotc_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------------------------------------ hashes */

typedef struct aotc_sha256 {
    uint32_t state[8];
    uint64_t length; /* bytes hashed so far */
    uint8_t block[64];
    size_t used; /* bytes waiting in `block` */
} aotc_sha256;

void aotc_sha256_init(aotc_sha256 *h);
void aotc_sha256_update(aotc_sha256 *h, const void *data, size_t n);
void aotc_sha256_final(aotc_sha256 *h, uint8_t digest[32]);
void aotc_hex(const uint8_t *bytes, size_t n, char *out); /* writes 2n hex digits and a NUL */

/* zip's CRC-32 (reflected, polynomial 0xEDB88320); start from 0 */
uint32_t aotc_crc32(uint32_t crc, const void *data, size_t n);

/* ------------------------------------------------------------------------------------------ JSON */

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_INT,
    JSON_FLOAT,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

/* One value. Arrays and objects keep their children as a list (`first`, then each child's `next`);
 * an object's children carry their `key`. Strings are decoded to UTF-8 (NUL-terminated, `len` bytes;
 * \u0000 may put a NUL inside). A float keeps a copy of its source text in `str` (the parsed text may be
 * freed before the document): nothing here computes with it, so no locale-dependent conversion is needed. */
typedef struct json_node {
    json_type type;
    const char *key;
    size_t key_len;
    const char *str;
    size_t len;
    int64_t i;
    size_t count;
    struct json_node *first;
    struct json_node *next;
} json_node;

typedef struct json_chunk json_chunk;

/* A parsed document; every node and string lives in its arena, freed at once by json_free. */
typedef struct json_doc {
    json_node *root;
    json_chunk *chunks;
} json_doc;

#define JSON_MAX_DEPTH 64

int json_parse(const char *text, size_t len, json_doc *doc, aotc_reason *why);
void json_free(json_doc *doc);
void *json_alloc(json_doc *doc, size_t n); /* more memory in the document's arena (8-aligned), or NULL */

const json_node *json_get(const json_node *object, const char *key); /* NULL when absent */
const json_node *json_at(const json_node *array, size_t index);
int json_is_string(const json_node *n, const char *s);
/* equal as JSON values with types (1 is not 1.0 nor true); objects regardless of key order */
int json_equal(const json_node *a, const json_node *b);

typedef struct json_buffer {
    char *data;
    size_t len, cap;
    int failed; /* out of memory */
} json_buffer;

/* Python's json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True): the canonical
 * form of a plan. A float (never in a plan) makes it fail unless `floats_as_text`, which writes a
 * float's source text (for messages). Returns 0, or -1 with `why`. */
int json_encode(const json_node *n, json_buffer *out, int floats_as_text, aotc_reason *why);
void json_buffer_free(json_buffer *b);
/* a short rendering of `n` for messages: its JSON text, cut at 200 characters */
void json_show(const json_node *n, char *out, size_t size);

/* ------------------------------------------------------------------------------------------ zip */

typedef struct zip_member {
    char *name;
    uint64_t size;            /* uncompressed */
    uint64_t compressed_size; /* equal to size for a stored member */
    uint64_t header_offset;   /* of its local file header */
    uint32_t crc32;
    uint16_t method;
    uint16_t flags;
    uint8_t version_needed; /* the low byte of "version needed to extract": 45 is zip 4.5 */
} zip_member;

typedef struct zip_archive {
    const char *path;
    int fd;
    uint64_t file_size;
    zip_member *members;
    size_t count;
} zip_archive;

#define ZIP_MAX_MEMBERS 256

/* Opens `path` and reads its central directory (zip64 included); every offset is checked against the
 * file's size. Fails with IO (cannot read) or FORMAT (not a zip, damaged), setting the message. */
aotc_status zip_open(zip_archive *z, const char *path);
void zip_close(zip_archive *z);
const zip_member *zip_find(const zip_archive *z, const char *name);
/* Reads a stored member whole into `out` (`m->size` bytes), checking its zip CRC-32, and gives its
 * sha256. A compressed member is FORMAT (aotc writes every member stored). */
aotc_status zip_read(const zip_archive *z, const zip_member *m, void *out, uint8_t sha256[32]);

/* ------------------------------------------------------------------------------------------ ELF */

typedef struct elf_image {
    const uint8_t *data;
    size_t size;
    uint16_t machine;
    uint64_t shoff;   /* section header table */
    uint64_t shnum;   /* section count */
    uint64_t shstr_offset, shstr_size; /* the section name string table */
} elf_image;

#define ELF_MACHINE_X86_64 62
#define ELF_MACHINE_AARCH64 183

/* Parses the header and section headers of a 64-bit little-endian ELF file; -1 with `why` if malformed. */
int elf_parse(const uint8_t *data, size_t size, elf_image *elf, aotc_reason *why);
/* The bytes of the one section called `name`: 1 found, 0 none, -1 malformed or found twice. */
int elf_section(const elf_image *elf, const char *name, const uint8_t **bytes, size_t *size, aotc_reason *why);
/* Checks every dynamic symbol table: entry size, string table, and the name of every function it
 * exports (inside the table, ASCII); -1 with `why` when malformed. */
int elf_check_symbols(const elf_image *elf, aotc_reason *why);
/* Sets found[i] to whether the file defines and exports the function names[i] (global or weak, default
 * visibility, in an executable section) in its dynamic symbol table, in one scan; -1 when malformed. */
int elf_find_functions(const elf_image *elf, const char *const *names, size_t n, unsigned char *found,
                       aotc_reason *why);
const char *elf_machine_arch(uint16_t machine); /* "x86_64", "aarch64", ... or NULL */

/* ------------------------------------------------------------------------------------------ plan */

typedef struct plan_variant {
    const char *entry;
    int num_inputs, num_outputs;
    aotc_tensor_info *inputs;
    aotc_tensor_info *outputs;
    uint64_t workspace_bytes;
} plan_variant;

typedef struct plan_kernel {
    const char *symbol;
} plan_kernel;

/* A checked `.aotc_plan`: every call of every variant lies inside the buffers it names. Strings and
 * arrays live in `doc`'s arena. */
typedef struct model_plan {
    json_doc doc;
    int version;
    const char *target, *triple;
    const json_node *requires; /* array of strings */
    uint64_t weights_nbytes;        /* what the code reads */
    uint64_t weights_stored_nbytes; /* what weights.bin holds (equal unless `prepare` fills the rest) */
    const char *prepare;            /* int32_t prepare(uint8_t *weights), computing the weights past
                                       weights_stored_nbytes by the plan's prepare_plan; or NULL */
    int num_variants;
    plan_variant *variants;
    int num_kernels;
    plan_kernel *kernels;
} model_plan;

#define PLAN_MAX_BYTES ((uint64_t)1 << 48)

/* Parses and checks the plan's bytes (without the NUL); -1 with `why` ("the plan's ... is ..."). */
int plan_parse(const char *raw, size_t len, model_plan *plan, aotc_reason *why);
void plan_free(model_plan *plan);
size_t dtype_size(const char *dtype); /* 0 for a dtype packages never use */

/* --------------------------------------------------------------------------------------- manifest */

#define MANIFEST_MEMBER "manifest.json"
#define LIBRARY_MEMBER "lib/model.so"
#define WEIGHTS_MEMBER "weights.bin"
#define SIGNATURE_MEMBER "signature.json"
#define GPU_PLAN_MEMBER "plan.json"
#define PACKAGE_FORMAT "aotc-package"

/* manifest.json's schema, format and version (status FORMAT with the message set, prefixed by path) */
aotc_status manifest_check(const json_node *manifest, const char *path);
/* "opencl"/"cuda" when the manifest describes a GPU package, else NULL */
const char *manifest_gpu_kind(const json_node *manifest);
/* Every execution-critical manifest field equals the plan's (Python's check_manifest_matches). */
int manifest_matches_plan(const json_node *manifest, const model_plan *plan, aotc_reason *why);

/* ------------------------------------------------------------------------------------------ host */

const char *host_arch(void);                    /* "x86_64", "aarch64", or "unknown" */
void triple_arch(const char *triple, char *out, size_t size); /* normalised first part of a triple */
/* The plan's CPU features against this host; UNSUPPORTED naming what is missing or unknown. */
aotc_status host_check(const model_plan *plan, const char *path);

#endif
