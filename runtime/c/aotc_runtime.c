/* Opening and running an aotc CPU package: every check of the Python runtime's read_package, then the
 * verified library bytes loaded from a memfd, the weights read into one 64-byte aligned buffer, and
 * the plan's entry functions called with checked buffers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "aotc_internal.h"

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U /* Linux 6.3: ask for an executable memfd where vm.memfd_noexec defaults otherwise */
#endif

#define ALIGNMENT 64
#define MAX_MANIFEST_BYTES ((uint64_t)64 << 20)
#define PLAN_SECTION ".aotc_plan"

typedef int32_t (*entry_fn)(void **inputs, void **outputs, uint8_t *weights, uint8_t *workspace);
typedef int32_t (*prepare_fn)(uint8_t *weights);
typedef void (*set_threads_fn)(int n);
typedef int (*get_threads_fn)(void);

static const char *const RUNTIME_SYMBOLS[] = {"aotc_get_max_threads", "aotc_set_num_threads",
                                              "aotc_set_call_threads"};

struct aotc_model {
    char *path, *name, *target;
    char digest[65];
    model_plan plan;
    int has_plan;
    void *library;
    int library_fd; /* kept open while loaded: its /proc/self/fd name must not be reused meanwhile */
    entry_fn *entries;
    set_threads_fn set_call_threads;
    get_threads_fn get_max_threads;
    uint8_t *weights;
    uint8_t *workspace;
    void **in_argv, **out_argv;
    int num_threads;
    pthread_mutex_t lock;
    int has_lock;
};

/* ---------------------------------------------------------------------------------------- errors */

static __thread char last_error[2048];

aotc_status aotc_fail(aotc_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

int aotc_reason_set(aotc_reason *why, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, args);
    va_end(args);
    return -1;
}

const char *aotc_last_error(void) { return last_error; }

const char *aotc_status_name(aotc_status status) {
    switch (status) {
    case AOTC_OK: return "AOTC_OK";
    case AOTC_ERR_IO: return "AOTC_ERR_IO";
    case AOTC_ERR_FORMAT: return "AOTC_ERR_FORMAT";
    case AOTC_ERR_CHECKSUM: return "AOTC_ERR_CHECKSUM";
    case AOTC_ERR_UNSUPPORTED: return "AOTC_ERR_UNSUPPORTED";
    case AOTC_ERR_LIBRARY: return "AOTC_ERR_LIBRARY";
    case AOTC_ERR_INVALID_ARGUMENT: return "AOTC_ERR_INVALID_ARGUMENT";
    case AOTC_ERR_KERNEL: return "AOTC_ERR_KERNEL";
    case AOTC_ERR_NO_MEMORY: return "AOTC_ERR_NO_MEMORY";
    }
    return "AOTC_ERR_UNKNOWN";
}

/* --------------------------------------------------------------------------------------- helpers */

static void *aligned(size_t n) {
    void *p = NULL;
    size_t size = (n ? n + ALIGNMENT - 1 : ALIGNMENT) / ALIGNMENT * ALIGNMENT;
    return posix_memalign(&p, ALIGNMENT, size) == 0 ? p : NULL;
}

static int available_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static aotc_status check_num_threads(int n) {
    int cores = available_cores();
    if (n < 0 || n > cores)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT,
                         "num_threads must be from 1 to %d (the cores this process may run on), or 0 for the "
                         "package's default; got %d",
                         cores, n);
    return AOTC_OK;
}

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    return p ? memcpy(p, s, n) : NULL;
}

/* The signature policy the Python runtime reads from its options and environment. Required (or
 * trusted keys named) means the package must carry a trusted signature, which this runtime cannot
 * verify: refused, never silently loaded unverified. */
static aotc_status check_signature_policy(const aotc_open_options *options) {
    const char *why = NULL;
    const char *required = getenv("AOTC_REQUIRE_SIGNATURE"), *keys = getenv("AOTC_TRUSTED_KEYS");
    if (options && options->require_signature) {
        why = "require_signature is set";
    } else if (required) {
        char value[16] = "";
        const char *p = required;
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        size_t n = 0;
        for (; p[n] && n < sizeof value - 1; n++)
            value[n] = (char)(p[n] >= 'A' && p[n] <= 'Z' ? p[n] - 'A' + 'a' : p[n]);
        while (n && (value[n - 1] == ' ' || value[n - 1] == '\t' || value[n - 1] == '\n'))
            n--;
        value[n] = '\0';
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on"))
            why = "AOTC_REQUIRE_SIGNATURE is set";
        else if (strcmp(value, "") && strcmp(value, "0") && strcmp(value, "false") && strcmp(value, "no") &&
                 strcmp(value, "off"))
            return aotc_fail(AOTC_ERR_INVALID_ARGUMENT,
                             "AOTC_REQUIRE_SIGNATURE='%.60s': expected 1/true/yes/on or 0/false/no/off", required);
    }
    if (!why && keys && strspn(keys, ":") != strlen(keys))
        why = "AOTC_TRUSTED_KEYS names trusted keys";
    if (why)
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s, but signature verification is not available in the C runtime; verify the package "
                         "with the Python runtime (aotc inspect / aotc_runtime.load)",
                         why);
    return AOTC_OK;
}

/* ------------------------------------------------------------------------------------ the package */

/* A member's bytes (at least `capacity` bytes allocated, 64-byte aligned, the rest uninitialised),
 * checked against the sha256 the manifest lists when `sha256_hex` is given. */
static aotc_status read_member(const zip_archive *z, const zip_member *m, const char *sha256_hex,
                               size_t capacity, uint8_t **out) {
    *out = NULL;
    if (m->size > z->file_size)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is damaged (implausible size %llu)", z->path, m->name,
                         (unsigned long long)m->size);
    uint8_t *buf = aligned(capacity > m->size ? capacity : (size_t)m->size);
    if (!buf)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: cannot allocate %llu bytes for member %s", z->path,
                         (unsigned long long)m->size, m->name);
    uint8_t digest[32];
    char hex[65];
    aotc_status st = zip_read(z, m, buf, digest);
    if (!st && sha256_hex) {
        aotc_hex(digest, 32, hex);
        if (strcmp(hex, sha256_hex) != 0)
            st = aotc_fail(AOTC_ERR_CHECKSUM, "%s: member %s is corrupted (sha256 mismatch)", z->path, m->name);
    }
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    return AOTC_OK;
}

static const char *listed_sha256(const json_node *manifest, const char *member) {
    return json_get(json_get(json_get(manifest, "members"), member), "sha256")->str;
}

static aotc_status read_manifest(const zip_archive *z, json_doc *doc, char digest_hex[65]) {
    const zip_member *m = zip_find(z, MANIFEST_MEMBER);
    if (!m)
        return aotc_fail(AOTC_ERR_FORMAT, "%s is not an aotc package (foreign file: a zip without %s)", z->path,
                         MANIFEST_MEMBER);
    if (m->size > MAX_MANIFEST_BYTES)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: %s is implausibly large (%llu bytes)", z->path, MANIFEST_MEMBER,
                         (unsigned long long)m->size);
    uint8_t *raw;
    aotc_status st = read_member(z, m, NULL, 0, &raw);
    if (st)
        return st;
    uint8_t digest[32];
    aotc_sha256 h;
    aotc_sha256_init(&h);
    aotc_sha256_update(&h, raw, (size_t)m->size);
    aotc_sha256_final(&h, digest);
    aotc_hex(digest, 32, digest_hex);
    aotc_reason why;
    int bad = json_parse((const char *)raw, (size_t)m->size, doc, &why);
    free(raw);
    if (bad)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: %s is not valid JSON (%s)", z->path, MANIFEST_MEMBER, why.text);
    return manifest_check(doc->root, z->path);
}

/* The zip holds exactly the members the manifest lists (besides manifest.json and signature.json),
 * each of the listed size, every name once and a plain relative path. */
static aotc_status check_member_list(const zip_archive *z, const json_node *manifest) {
    const json_node *members = json_get(manifest, "members");
    for (size_t i = 0; i < z->count; i++) {
        const char *name = z->members[i].name;
        for (size_t j = 0; j < i; j++)
            if (strcmp(z->members[j].name, name) == 0)
                return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged: it holds a member name twice", z->path);
        const char *slash = name;
        int plain = name[0] != '/' && !strchr(name, '\\') && name[0] != '\0';
        while (plain && slash) {
            const char *next = strchr(slash, '/');
            size_t n = next ? (size_t)(next - slash) : strlen(slash);
            plain = n && !(n == 1 && slash[0] == '.') && !(n == 2 && slash[0] == '.' && slash[1] == '.');
            slash = next ? next + 1 : NULL;
        }
        if (!plain)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: member name \"%.100s\" is not a plain relative path", z->path, name);
    }
    for (const json_node *m = members->first; m; m = m->next)
        if (!zip_find(z, m->key))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is missing", z->path, m->key);
    for (size_t i = 0; i < z->count; i++) {
        const char *name = z->members[i].name;
        if (strcmp(name, MANIFEST_MEMBER) && strcmp(name, SIGNATURE_MEMBER) && !json_get(members, name))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is not listed in %s", z->path, name, MANIFEST_MEMBER);
    }
    for (const json_node *m = members->first; m; m = m->next)
        if (zip_find(z, m->key)->size != (uint64_t)json_get(m, "size")->i)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is corrupted (size mismatch)", z->path, m->key);
    return AOTC_OK;
}

/* Every entry, every kernel, prepare and the thread pool's functions: what the plan calls and what
 * the runtime will look up, all defined by the library itself. */
static aotc_status check_symbols(const elf_image *elf, const model_plan *plan, const char *path) {
    size_t count = (size_t)plan->num_variants + (size_t)plan->num_kernels + 3 + (plan->prepare != NULL);
    const char **symbols = malloc(count * sizeof *symbols);
    unsigned char *found = malloc(count);
    if (!symbols || !found) {
        free(symbols);
        free(found);
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    size_t n = 0;
    for (int i = 0; i < plan->num_variants; i++)
        symbols[n++] = plan->variants[i].entry;
    for (int i = 0; i < plan->num_kernels; i++)
        symbols[n++] = plan->kernels[i].symbol;
    for (int i = 0; i < 3; i++)
        symbols[n++] = RUNTIME_SYMBOLS[i];
    if (plan->prepare)
        symbols[n++] = plan->prepare;
    char missing[512] = "";
    aotc_reason why;
    int malformed = elf_find_functions(elf, symbols, n, found, &why) < 0;
    for (size_t i = 0; i < n && !malformed; i++) {
        if (!found[i]) {
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", symbols[i]);
        }
    }
    free(symbols);
    free(found);
    if (malformed)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library %s is not a well-formed ELF file (%s)", path,
                         LIBRARY_MEMBER, why.text);
    if (missing[0])
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library does not define %s, which the plan calls", path,
                         missing);
    return AOTC_OK;
}

/* The library's own plan, checked, and the manifest against it (Python's _library_plan). */
static aotc_status library_plan(const uint8_t *library, size_t size, const json_node *manifest, const char *path,
                                model_plan *plan, int *has_plan) {
    elf_image elf;
    aotc_reason why;
    if (size >= 5 && memcmp(library, "\177ELF", 4) == 0 && library[4] == 1)
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s: its kernel library is 32-bit ELF code; the C runtime runs x86_64 and aarch64 packages",
                         path);
    if (elf_parse(library, size, &elf, &why) || elf_check_symbols(&elf, &why))
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library %s is not a well-formed ELF file (%s)", path,
                         LIBRARY_MEMBER, why.text);
    const char *triple = json_get(manifest, "triple")->str;
    char arch[32], machine[32];
    triple_arch(triple, arch, sizeof arch);
    if (elf_machine_arch(elf.machine))
        snprintf(machine, sizeof machine, "%s", elf_machine_arch(elf.machine));
    else
        snprintf(machine, sizeof machine, "machine %u", elf.machine);
    if (strcmp(machine, arch) != 0)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library is %s code but manifest.json triple is '%s'", path,
                         machine, triple);
    const uint8_t *raw;
    size_t raw_size;
    int found = elf_section(&elf, PLAN_SECTION, &raw, &raw_size, &why);
    if (found < 0)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library %s is not a well-formed ELF file (%s)", path,
                         LIBRARY_MEMBER, why.text);
    if (!found)
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s: its kernel library carries no execution plan (%s section); rebuild it with a current "
                         "aotc",
                         path, PLAN_SECTION);
    if (raw_size == 0 || raw[raw_size - 1] != '\0')
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library's plan is unusable: the %s section is not "
                         "NUL-terminated", path, PLAN_SECTION);
    *has_plan = 1;
    if (plan_parse((const char *)raw, raw_size - 1, plan, &why))
        return aotc_fail(AOTC_ERR_FORMAT, "%s: its kernel library's plan is unusable: %s", path, why.text);
    if (manifest_matches_plan(manifest, plan, &why))
        return aotc_fail(AOTC_ERR_FORMAT, "%s: %s", path, why.text);
    return check_symbols(&elf, plan, path);
}

/* The sha256 of each listed member besides the library and the weights (Python checks them too). */
static aotc_status check_other_members(const zip_archive *z, const json_node *manifest) {
    for (const json_node *m = json_get(manifest, "members")->first; m; m = m->next) {
        if (!strcmp(m->key, LIBRARY_MEMBER) || !strcmp(m->key, WEIGHTS_MEMBER))
            continue;
        uint8_t *bytes;
        aotc_status st = read_member(z, zip_find(z, m->key), json_get(m, "sha256")->str, 0, &bytes);
        free(bytes);
        if (st)
            return st;
    }
    return AOTC_OK;
}

/* ----------------------------------------------------------------------------------- the library */

static aotc_status write_all(int fd, const uint8_t *p, size_t n, const char *path) {
    while (n) {
        ssize_t done = write(fd, p, n);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return aotc_fail(AOTC_ERR_IO, "%s: cannot write its kernel library to memory (%s)", path,
                             strerror(errno));
        p += done;
        n -= (size_t)done;
    }
    return AOTC_OK;
}

/* An anonymous file to load the library from: a memfd, else an unnamed (O_TMPFILE, or created and at
 * once unlinked) file in $TMPDIR. Only this process holds it. */
static int anonymous_file(void) {
    int fd = memfd_create("aotc-model", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
    if (fd < 0 && errno == EINVAL) /* a kernel before 6.3 does not know MFD_EXEC */
        fd = memfd_create("aotc-model", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0)
        return fd;
    const char *dir = getenv("TMPDIR");
    if (!dir || !dir[0])
        dir = "/tmp";
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0700);
    if (fd >= 0)
        return fd;
    char name[4096];
    snprintf(name, sizeof name, "%s/aotc-model-XXXXXX", dir);
    fd = mkstemp(name);
    if (fd >= 0) {
        unlink(name); /* loaded through /proc/self/fd: the name is never needed */
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    return fd;
}

/* Loads exactly the bytes that were verified: they are written to an anonymous file (sealed when it
 * is a memfd, so nothing can change it) and dlopen'ed through /proc/self/fd/N. glibc knows a loaded
 * library by that name: while a stale library still holds the name, the file moves to a new fd. */
static aotc_status load_library(aotc_model *m, const uint8_t *bytes, size_t n) {
    int fd = anonymous_file();
    if (fd < 0)
        return aotc_fail(AOTC_ERR_IO, "%s: cannot create a file to load its kernel library from (%s)", m->path,
                         strerror(errno));
    aotc_status st = write_all(fd, bytes, n, m->path);
    if (st) {
        close(fd);
        return st;
    }
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL); /* memfd only */
    char name[64];
    for (int attempt = 0;; attempt++) {
        snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
        void *stale = dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!stale)
            break;
        dlclose(stale);
        int moved = attempt < 64 ? fcntl(fd, F_DUPFD_CLOEXEC, fd + 1) : -1;
        close(fd);
        if (moved < 0)
            return aotc_fail(AOTC_ERR_LIBRARY, "%s: no free name to load its kernel library under", m->path);
        fd = moved;
    }
    m->library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!m->library) {
        const char *err = dlerror();
        close(fd);
        return aotc_fail(AOTC_ERR_LIBRARY, "%s: cannot load its kernel library %s (%s); the host needs glibc "
                         "(libc, libm)", m->path, LIBRARY_MEMBER, err ? err : "dlopen failed");
    }
    m->library_fd = fd;
    return AOTC_OK;
}

static aotc_status symbol(aotc_model *m, const char *name, void *fn, size_t fn_size) {
    dlerror();
    void *p = dlsym(m->library, name);
    if (!p) {
        const char *err = dlerror();
        return aotc_fail(AOTC_ERR_LIBRARY, "%s: its kernel library does not export %s (%s)", m->path, name,
                         err ? err : "dlsym found nothing");
    }
    memcpy(fn, &p, fn_size); /* POSIX: a function's address may be held in a void * */
    return AOTC_OK;
}

static aotc_status bind_symbols(aotc_model *m) {
    set_threads_fn set_num_threads;
    m->entries = calloc((size_t)m->plan.num_variants, sizeof *m->entries);
    if (!m->entries)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", m->path);
    aotc_status st = AOTC_OK;
    for (int i = 0; i < m->plan.num_variants && !st; i++)
        st = symbol(m, m->plan.variants[i].entry, &m->entries[i], sizeof m->entries[i]);
    if (!st)
        st = symbol(m, "aotc_set_num_threads", &set_num_threads, sizeof set_num_threads);
    if (!st)
        st = symbol(m, "aotc_set_call_threads", &m->set_call_threads, sizeof m->set_call_threads);
    if (!st)
        st = symbol(m, "aotc_get_max_threads", &m->get_max_threads, sizeof m->get_max_threads);
    return st;
}

/* The plan's prepare function derives the weights past what weights.bin stores, once, at open. */
static aotc_status run_prepare(aotc_model *m) {
    prepare_fn prepare;
    aotc_status st = symbol(m, m->plan.prepare, &prepare, sizeof prepare);
    if (st)
        return st;
    if (m->num_threads)
        m->set_call_threads(m->num_threads);
    int32_t status = prepare(m->weights);
    if (m->num_threads)
        m->set_call_threads(0);
    if (status)
        return aotc_fail(AOTC_ERR_KERNEL, "%s: its prepare function %s failed with status %d", m->path,
                         m->plan.prepare, (int)status);
    return AOTC_OK;
}

/* ------------------------------------------------------------------------------------------- open */

static aotc_status allocate_buffers(aotc_model *m) {
    uint64_t workspace = 0;
    int max_in = 1, max_out = 1;
    for (int i = 0; i < m->plan.num_variants; i++) {
        const plan_variant *v = &m->plan.variants[i];
        workspace = v->workspace_bytes > workspace ? v->workspace_bytes : workspace;
        max_in = v->num_inputs > max_in ? v->num_inputs : max_in;
        max_out = v->num_outputs > max_out ? v->num_outputs : max_out;
    }
    m->workspace = aligned((size_t)workspace);
    m->in_argv = calloc((size_t)max_in, sizeof(void *));
    m->out_argv = calloc((size_t)max_out, sizeof(void *));
    if (!m->workspace || !m->in_argv || !m->out_argv)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: cannot allocate a workspace of %llu bytes", m->path,
                         (unsigned long long)workspace);
    if (pthread_mutex_init(&m->lock, NULL) != 0)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: cannot create a mutex", m->path);
    m->has_lock = 1;
    return AOTC_OK;
}

/* Everything read_package checks, in its order; the library bytes are returned for loading. */
static aotc_status verify_package(aotc_model *m, zip_archive *z, json_doc *manifest_doc, uint8_t **library,
                                  size_t *library_size) {
    aotc_status st = read_manifest(z, manifest_doc, m->digest);
    if (st)
        return st;
    const json_node *manifest = manifest_doc->root;
    const char *kind = manifest_gpu_kind(manifest);
    if (kind)
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s holds %s GPU kernels (target '%s'), not a CPU library; the C runtime runs CPU packages "
                         "only (the Python runtime, aotc_runtime.load, runs GPU packages)",
                         m->path, kind, json_get(manifest, "target")->str);
    if ((st = check_member_list(z, manifest)))
        return st;
    const zip_member *lib = zip_find(z, LIBRARY_MEMBER), *weights = zip_find(z, WEIGHTS_MEMBER);
    if ((st = read_member(z, lib, listed_sha256(manifest, LIBRARY_MEMBER), 0, library)))
        return st;
    *library_size = (size_t)lib->size;
    if ((st = library_plan(*library, *library_size, manifest, m->path, &m->plan, &m->has_plan)))
        return st;
    if (weights->size != m->plan.weights_stored_nbytes)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s holds %llu bytes but the kernel library was compiled for %llu",
                         m->path, WEIGHTS_MEMBER, (unsigned long long)weights->size,
                         (unsigned long long)m->plan.weights_stored_nbytes);
    if ((st = host_check(&m->plan, m->path)))
        return st;
    if ((st = read_member(z, weights, listed_sha256(manifest, WEIGHTS_MEMBER), (size_t)m->plan.weights_nbytes,
                          &m->weights)))
        return st;
    /* bytes past weights.bin are zero until prepare derives them */
    memset(m->weights + weights->size, 0, (size_t)(m->plan.weights_nbytes - weights->size));
    if ((st = check_other_members(z, manifest)))
        return st;
    m->name = copy_string(json_get(manifest, "name")->str);
    m->target = copy_string(json_get(manifest, "target")->str);
    return m->name && m->target ? AOTC_OK : aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", m->path);
}

static aotc_status open_model(aotc_model *m) {
    zip_archive z;
    aotc_status st = zip_open(&z, m->path);
    if (st)
        return st;
    json_doc manifest = {0};
    uint8_t *library = NULL;
    size_t library_size = 0;
    st = verify_package(m, &z, &manifest, &library, &library_size);
    json_free(&manifest);
    zip_close(&z);
    if (!st)
        st = load_library(m, library, library_size);
    free(library);
    if (!st)
        st = bind_symbols(m);
    if (!st && m->plan.prepare)
        st = run_prepare(m);
    if (!st)
        st = allocate_buffers(m);
    return st;
}

aotc_status aotc_model_open(const char *path, const aotc_open_options *options, aotc_model **out) {
    if (!out)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "aotc_model_open: out is NULL");
    *out = NULL;
    if (!path)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "aotc_model_open: path is NULL");
    aotc_status st = check_signature_policy(options);
    if (!st && options)
        st = check_num_threads(options->num_threads);
    if (st)
        return st;
    aotc_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = copy_string(path))) {
        free(m);
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    m->library_fd = -1;
    m->num_threads = options ? options->num_threads : 0;
    st = open_model(m);
    if (st) {
        aotc_model_close(m);
        return st;
    }
    *out = m;
    return AOTC_OK;
}

void aotc_model_close(aotc_model *m) {
    if (!m)
        return;
    if (m->library)
        dlclose(m->library); /* the package's thread pool joins its workers as it unloads */
    if (m->library_fd >= 0)
        close(m->library_fd);
    if (m->has_lock)
        pthread_mutex_destroy(&m->lock);
    if (m->has_plan)
        plan_free(&m->plan);
    free(m->entries);
    free(m->weights);
    free(m->workspace);
    free(m->in_argv);
    free(m->out_argv);
    free(m->name);
    free(m->target);
    free(m->path);
    free(m);
}

/* ---------------------------------------------------------------------------------------- queries */

static int check_model(const aotc_model *m, const char *what) {
    if (m)
        return 0;
    aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "%s: model is NULL", what);
    return -1;
}

static const plan_variant *variant_of(const aotc_model *m, int variant, const char *what) {
    if (check_model(m, what))
        return NULL;
    if (variant < 0 || variant >= m->plan.num_variants) {
        aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "%s: model '%s' has %d variant%s; variant %d does not exist", what,
                  m->name, m->plan.num_variants, m->plan.num_variants == 1 ? "" : "s", variant);
        return NULL;
    }
    return &m->plan.variants[variant];
}

const char *aotc_model_name(const aotc_model *m) { return check_model(m, "aotc_model_name") ? NULL : m->name; }
const char *aotc_model_target(const aotc_model *m) {
    return check_model(m, "aotc_model_target") ? NULL : m->target;
}
const char *aotc_model_digest(const aotc_model *m) {
    return check_model(m, "aotc_model_digest") ? NULL : m->digest;
}
int aotc_model_num_variants(const aotc_model *m) {
    return check_model(m, "aotc_model_num_variants") ? -1 : m->plan.num_variants;
}

int aotc_model_num_inputs(const aotc_model *m, int variant) {
    const plan_variant *v = variant_of(m, variant, "aotc_model_num_inputs");
    return v ? v->num_inputs : -1;
}

int aotc_model_num_outputs(const aotc_model *m, int variant) {
    const plan_variant *v = variant_of(m, variant, "aotc_model_num_outputs");
    return v ? v->num_outputs : -1;
}

static const aotc_tensor_info *tensor_of(const aotc_model *m, int variant, int index, int output) {
    const char *what = output ? "aotc_model_output" : "aotc_model_input";
    const plan_variant *v = variant_of(m, variant, what);
    if (!v)
        return NULL;
    int count = output ? v->num_outputs : v->num_inputs;
    if (index < 0 || index >= count) {
        aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "%s: model '%s' has %d %s; index %d does not exist", what, m->name,
                  count, output ? "outputs" : "inputs", index);
        return NULL;
    }
    return output ? &v->outputs[index] : &v->inputs[index];
}

const aotc_tensor_info *aotc_model_input(const aotc_model *m, int variant, int index) {
    return tensor_of(m, variant, index, 0);
}

const aotc_tensor_info *aotc_model_output(const aotc_model *m, int variant, int index) {
    return tensor_of(m, variant, index, 1);
}

aotc_status aotc_model_set_num_threads(aotc_model *m, int num_threads) {
    if (check_model(m, "aotc_model_set_num_threads"))
        return AOTC_ERR_INVALID_ARGUMENT;
    aotc_status st = check_num_threads(num_threads);
    if (!st) { /* under the lock that runs read it with: a call in flight keeps the team it started with */
        pthread_mutex_lock(&m->lock);
        m->num_threads = num_threads;
        pthread_mutex_unlock(&m->lock);
    }
    return st;
}

int aotc_model_num_threads(const aotc_model *m) {
    if (check_model(m, "aotc_model_num_threads"))
        return -1;
    pthread_mutex_lock((pthread_mutex_t *)&m->lock);
    int n = m->num_threads;
    pthread_mutex_unlock((pthread_mutex_t *)&m->lock);
    return n ? n : m->get_max_threads();
}

/* -------------------------------------------------------------------------------------------- run */

static void describe(const aotc_tensor_info *t, char *out, size_t size) {
    size_t used = (size_t)snprintf(out, size, "%s[", t->dtype);
    for (int d = 0; d < t->rank && used < size; d++)
        used += (size_t)snprintf(out + used, size - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (used < size)
        snprintf(out + used, size - used, "]");
}

static aotc_status check_buffer(const aotc_model *m, int variant, const char *role, const aotc_tensor_info *t,
                                const void *p, size_t nbytes) {
    char shape[256];
    describe(t, shape, sizeof shape);
    if (nbytes != t->nbytes)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT,
                         "%s '%s' of model '%s' (variant %d: %s) is %zu bytes, got %zu", role, t->name, m->name,
                         variant, shape, t->nbytes, nbytes);
    if (!p && t->nbytes)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "%s '%s' of model '%s' is NULL", role, t->name, m->name);
    if ((uintptr_t)p % t->itemsize)
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "%s '%s' of model '%s' at %p is not aligned to its %zu-byte %s",
                         role, t->name, m->name, p, t->itemsize, t->dtype);
    return AOTC_OK;
}

static int overlap(const void *p, size_t n, const void *q, size_t k) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return n && k && a < b + k && b < a + n;
}

/* Kernels assume distinct buffers never overlap: refuse outputs sharing memory with anything. */
static aotc_status check_disjoint(const aotc_model *m, const plan_variant *v, const void *const *inputs,
                                  void *const *outputs) {
    for (int i = 0; i < v->num_outputs; i++) {
        const aotc_tensor_info *t = &v->outputs[i];
        for (int j = i + 1; j < v->num_outputs; j++)
            if (overlap(outputs[i], t->nbytes, outputs[j], v->outputs[j].nbytes))
                return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "output '%s' of model '%s' overlaps output '%s' in memory",
                                 t->name, m->name, v->outputs[j].name);
        for (int j = 0; j < v->num_inputs; j++)
            if (overlap(outputs[i], t->nbytes, inputs[j], v->inputs[j].nbytes))
                return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "output '%s' of model '%s' overlaps input '%s' in memory",
                                 t->name, m->name, v->inputs[j].name);
    }
    return AOTC_OK;
}

aotc_status aotc_model_run(aotc_model *m, int variant, const void *const *inputs, const size_t *input_nbytes,
                           void *const *outputs, const size_t *output_nbytes) {
    const plan_variant *v = variant_of(m, variant, "aotc_model_run");
    if (!v)
        return AOTC_ERR_INVALID_ARGUMENT;
    if (v->num_inputs && (!inputs || !input_nbytes))
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "aotc_model_run: model '%s' takes %d inputs; inputs and "
                         "input_nbytes must not be NULL", m->name, v->num_inputs);
    if (v->num_outputs && (!outputs || !output_nbytes))
        return aotc_fail(AOTC_ERR_INVALID_ARGUMENT, "aotc_model_run: model '%s' has %d outputs; outputs and "
                         "output_nbytes must not be NULL", m->name, v->num_outputs);
    aotc_status st = AOTC_OK;
    for (int i = 0; i < v->num_inputs && !st; i++)
        st = check_buffer(m, variant, "input", &v->inputs[i], inputs[i], input_nbytes[i]);
    for (int i = 0; i < v->num_outputs && !st; i++)
        st = check_buffer(m, variant, "output", &v->outputs[i], outputs[i], output_nbytes[i]);
    if (st || (st = check_disjoint(m, v, inputs, outputs)))
        return st;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < v->num_inputs; i++)
        m->in_argv[i] = (void *)inputs[i]; /* the entry ABI takes void **; kernels only read inputs */
    for (int i = 0; i < v->num_outputs; i++)
        m->out_argv[i] = outputs[i];
    int threads = m->num_threads;
    if (threads)
        m->set_call_threads(threads); /* this thread's team in the library, reset after the call */
    int32_t status = m->entries[variant](m->in_argv, m->out_argv, m->weights, m->workspace);
    if (threads)
        m->set_call_threads(0);
    pthread_mutex_unlock(&m->lock);
    if (status)
        return aotc_fail(AOTC_ERR_KERNEL, "model '%s' (%s) failed with status %d (a kernel could not allocate memory)",
                         m->name, m->path, (int)status);
    return AOTC_OK;
}
