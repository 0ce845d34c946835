/* This host against a package: the same architecture, and every CPU feature the plan's `requires` names
 * present. Features are LLVM's names, mapped as the Python runtime's CPU_FLAGS table maps them
 * (aotc_runtime/package.py): on x86_64 to the `flags` of /proc/cpuinfo; on aarch64 to the kernel's
 * HWCAP bits from getauxval, since under qemu-user /proc/cpuinfo describes the emulating host. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "aotc_internal.h"

typedef struct cpu_feature {
    const char *arch;
    const char *llvm;  /* the name `requires` lists */
    const char *flag; /* the /proc/cpuinfo flag */
    int hwcap;         /* aarch64: 1 for AT_HWCAP, 2 for AT_HWCAP2 */
    uint64_t bit;
} cpu_feature;

#define BIT(n) ((uint64_t)1 << (n))

static const cpu_feature FEATURES[] = {
    {"x86_64", "sse3", "pni", 0, 0},
    {"x86_64", "ssse3", "ssse3", 0, 0},
    {"x86_64", "sse4.1", "sse4_1", 0, 0},
    {"x86_64", "sse4.2", "sse4_2", 0, 0},
    {"x86_64", "sse4a", "sse4a", 0, 0},
    {"x86_64", "popcnt", "popcnt", 0, 0},
    {"x86_64", "lzcnt", "abm", 0, 0},
    {"x86_64", "bmi", "bmi1", 0, 0},
    {"x86_64", "bmi2", "bmi2", 0, 0},
    {"x86_64", "tbm", "tbm", 0, 0},
    {"x86_64", "movbe", "movbe", 0, 0},
    {"x86_64", "f16c", "f16c", 0, 0},
    {"x86_64", "fma", "fma", 0, 0},
    {"x86_64", "fma4", "fma4", 0, 0},
    {"x86_64", "xop", "xop", 0, 0},
    {"x86_64", "avx", "avx", 0, 0},
    {"x86_64", "avx2", "avx2", 0, 0},
    {"x86_64", "avxvnni", "avx_vnni", 0, 0},
    {"x86_64", "avxifma", "avx_ifma", 0, 0},
    {"x86_64", "avxvnniint8", "avx_vnni_int8", 0, 0},
    {"x86_64", "avxneconvert", "avx_ne_convert", 0, 0},
    {"x86_64", "gfni", "gfni", 0, 0},
    {"x86_64", "avx512f", "avx512f", 0, 0},
    {"x86_64", "avx512bw", "avx512bw", 0, 0},
    {"x86_64", "avx512cd", "avx512cd", 0, 0},
    {"x86_64", "avx512dq", "avx512dq", 0, 0},
    {"x86_64", "avx512vl", "avx512vl", 0, 0},
    {"x86_64", "avx512vnni", "avx512_vnni", 0, 0},
    {"x86_64", "avx512bf16", "avx512_bf16", 0, 0},
    {"x86_64", "avx512fp16", "avx512_fp16", 0, 0},
    {"x86_64", "avx512ifma", "avx512ifma", 0, 0},
    {"x86_64", "avx512vbmi", "avx512vbmi", 0, 0},
    {"x86_64", "avx512vbmi2", "avx512_vbmi2", 0, 0},
    {"x86_64", "avx512bitalg", "avx512_bitalg", 0, 0},
    {"x86_64", "avx512vpopcntdq", "avx512_vpopcntdq", 0, 0},
    /* arch/arm64/include/uapi/asm/hwcap.h */
    {"aarch64", "fp-armv8", "fp", 1, BIT(0)},
    {"aarch64", "neon", "asimd", 1, BIT(1)},
    {"aarch64", "lse", "atomics", 1, BIT(8)},
    {"aarch64", "rcpc", "lrcpc", 1, BIT(15)},
    {"aarch64", "fullfp16", "asimdhp", 1, BIT(10)},
    {"aarch64", "fp16fml", "asimdfhm", 1, BIT(23)},
    {"aarch64", "dotprod", "asimddp", 1, BIT(20)},
    {"aarch64", "i8mm", "i8mm", 2, BIT(13)},
    {"aarch64", "bf16", "bf16", 2, BIT(14)},
    {"aarch64", "cssc", "cssc", 2, BIT(34)},
    {"aarch64", "mops", "mops", 2, BIT(43)},
    {"aarch64", "sve", "sve", 1, BIT(22)},
    {"aarch64", "sve2", "sve2", 2, BIT(1)},
};

const char *host_arch(void) {
#if defined(__x86_64__)
    return "x86_64";
#elif defined(__aarch64__)
    return "aarch64";
#else
    return "unknown";
#endif
}

/* The architecture part of a triple as the Python runtime normalises it (amd64 -> x86_64, ...). */
void triple_arch(const char *triple, char *out, size_t size) {
    size_t n = strcspn(triple, "-");
    if (n >= size)
        n = size - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)tolower((unsigned char)triple[i]);
    out[n] = '\0';
    if (strcmp(out, "amd64") == 0 || strcmp(out, "x64") == 0)
        snprintf(out, size, "x86_64");
    else if (strcmp(out, "arm64") == 0)
        snprintf(out, size, "aarch64");
    else if (strncmp(out, "arm", 3) == 0 || strncmp(out, "thumb", 5) == 0)
        snprintf(out, size, "arm");
}

static const cpu_feature *find_feature(const char *arch, const char *llvm) {
    for (size_t i = 0; i < sizeof FEATURES / sizeof FEATURES[0]; i++)
        if (strcmp(FEATURES[i].arch, arch) == 0 && strcmp(FEATURES[i].llvm, llvm) == 0)
            return &FEATURES[i];
    return NULL;
}

/* The `flags` line of /proc/cpuinfo (malloc'd, the caller frees), or NULL when it cannot be read. */
static char *cpuinfo_flags(void) {
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (!f)
        return NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *key = line;
        while (*key == ' ' || *key == '\t')
            key++;
        size_t len = (size_t)(colon - key);
        while (len && (key[len - 1] == ' ' || key[len - 1] == '\t'))
            len--;
        if (len == 5 && (strncmp(key, "flags", 5) == 0)) {
            fclose(f);
            memmove(line, colon + 1, strlen(colon + 1) + 1);
            return line;
        }
    }
    free(line);
    fclose(f);
    return calloc(1, 1); /* readable, but no flags line: no features */
}

static int has_flag(const char *flags, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = flags; (p = strstr(p, flag)) != NULL; p += n) {
        int starts = p == flags || isspace((unsigned char)p[-1]);
        int ends = p[n] == '\0' || isspace((unsigned char)p[n]);
        if (starts && ends)
            return 1;
    }
    return 0;
}

/* Whether this host has the feature; -1 when it cannot tell (x86_64 without /proc/cpuinfo). */
static int host_has(const cpu_feature *f, const char *flags) {
    if (f->hwcap) {
#if defined(__aarch64__)
        uint64_t bits = f->hwcap == 1 ? (uint64_t)getauxval(AT_HWCAP) : (uint64_t)getauxval(AT_HWCAP2);
        return (bits & f->bit) != 0;
#else
        return 0;
#endif
    }
    return flags ? has_flag(flags, f->flag) : -1;
}

static void append(char *list, size_t size, const char *name) {
    size_t used = strlen(list);
    snprintf(list + used, size - used, "%s%s", used ? ", " : "", name);
}

aotc_status host_check(const model_plan *plan, const char *path) {
    char arch[32];
    triple_arch(plan->triple, arch, sizeof arch);
    if (strcmp(arch, host_arch()) != 0)
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s was compiled for %s (%s) but this host is %s; rebuild it with a target for this "
                         "machine",
                         path, arch, plan->triple, host_arch());
    char unknown[512] = "", missing[512] = "";
    for (const json_node *r = plan->requires->first; r; r = r->next)
        if (!find_feature(arch, r->str))
            append(unknown, sizeof unknown, r->str);
    if (unknown[0])
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s requires CPU features this runtime does not know for %s: %s (target '%s'; built by a "
                         "newer aotc? upgrade the aotc C runtime)",
                         path, arch, unknown, plan->target);
    if (!plan->requires->count)
        return AOTC_OK;
    char *flags = strcmp(arch, "x86_64") == 0 ? cpuinfo_flags() : NULL;
    int unreadable = 0;
    for (const json_node *r = plan->requires->first; r; r = r->next) {
        int has = host_has(find_feature(arch, r->str), flags);
        unreadable |= has < 0;
        if (has == 0)
            append(missing, sizeof missing, r->str);
    }
    free(flags);
    if (unreadable)
        return aotc_fail(AOTC_ERR_UNSUPPORTED,
                         "%s requires CPU features (target '%s') and this host's cannot be read (/proc/cpuinfo)",
                         path, plan->target);
    if (missing[0])
        return aotc_fail(AOTC_ERR_UNSUPPORTED, "%s needs CPU features this host lacks: %s (target '%s')", path,
                         missing, plan->target);
    return AOTC_OK;
}
