/* A bounds-checked reader of the kernel library's ELF file: its machine, its sections and the functions
 * its dynamic symbol table exports. It reads the bytes before anything loads them, as the Python
 * runtime's elf.py does; the packages this runtime runs are 64-bit little-endian (x86_64, aarch64). */
#include <stdlib.h>
#include <string.h>

#include "aotc_internal.h"

#define SHT_NOBITS 8
#define SHT_DYNSYM 11
#define SHF_EXECINSTR 0x4
#define SHN_UNDEF 0
#define SHN_LORESERVE 0xFF00
#define SHN_XINDEX 0xFFFF
#define STT_FUNC 2
#define STB_GLOBAL 1
#define STB_WEAK 2
#define STV_DEFAULT 0
#define EHDR_BYTES 64
#define SHDR_BYTES 64
#define SYM_BYTES 24
#define MAX_NAME 4096 /* bytes of a section or symbol name; aotc's are C identifiers */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

typedef struct section {
    uint32_t name, type, link;
    uint64_t flags, offset, size, entsize;
} section;

static section section_at(const elf_image *elf, uint64_t i) {
    const uint8_t *h = elf->data + elf->shoff + i * SHDR_BYTES;
    section s = {le32(h), le32(h + 4), le32(h + 40), le64(h + 8), le64(h + 24), le64(h + 32), le64(h + 56)};
    return s;
}

static int inside(const elf_image *elf, uint64_t offset, uint64_t size) {
    return offset <= elf->size && size <= elf->size - offset;
}

/* The NUL-terminated ASCII string at `offset` of a string table, or NULL when it runs outside the table,
 * holds a byte outside ASCII or is longer than MAX_NAME bytes. The bound keeps the scans linear: every
 * section or symbol may name the same offset of a table of megabytes without a NUL (hours of reading). */
static const char *cstring(const uint8_t *table, uint64_t table_size, uint64_t offset) {
    if (offset >= table_size)
        return NULL;
    uint64_t span = table_size - offset < MAX_NAME + 1 ? table_size - offset : MAX_NAME + 1;
    const uint8_t *end = memchr(table + offset, 0, (size_t)span);
    if (!end)
        return NULL;
    for (const uint8_t *p = table + offset; p < end; p++)
        if (*p >= 0x80)
            return NULL;
    return (const char *)table + offset;
}

int elf_parse(const uint8_t *data, size_t size, elf_image *elf, aotc_reason *why) {
    memset(elf, 0, sizeof *elf);
    elf->data = data;
    elf->size = size;
    if (size < 16 || memcmp(data, "\177ELF", 4) != 0)
        return aotc_reason_set(why, "it is not an ELF file (bad magic)");
    if (data[4] != 2)
        return aotc_reason_set(why, "it is %s ELF code; the C runtime reads 64-bit libraries",
                               data[4] == 1 ? "32-bit" : "an unknown class of");
    if (data[5] != 1)
        return aotc_reason_set(why, "it is big-endian ELF code; the C runtime reads little-endian libraries");
    if (size < EHDR_BYTES)
        return aotc_reason_set(why, "its ELF header is truncated");
    elf->machine = le16(data + 18);
    uint64_t shoff = le64(data + 0x28);
    uint16_t shentsize = le16(data + 0x3A), shnum = le16(data + 0x3C), shstrndx = le16(data + 0x3E);
    if (shoff == 0)
        return aotc_reason_set(why, "it has no section headers");
    if (shentsize != SHDR_BYTES)
        return aotc_reason_set(why, "its section headers are %u bytes, expected %d", shentsize, SHDR_BYTES);
    if (!inside(elf, shoff, SHDR_BYTES))
        return aotc_reason_set(why, "section header 0 lies beyond the end of the file");
    elf->shoff = shoff;
    section first = section_at(elf, 0);
    /* more than SHN_LORESERVE sections: the count lives in section 0's size, the index in its link */
    uint64_t count = shnum ? shnum : first.size;
    if (count > (size - shoff) / SHDR_BYTES)
        return aotc_reason_set(why, "its %llu section headers do not fit in the file", (unsigned long long)count);
    elf->shnum = count;
    uint64_t strndx = shstrndx == SHN_XINDEX ? first.link : shstrndx;
    if (strndx == 0 || strndx >= count)
        return aotc_reason_set(why, "its section name table index %llu is out of range",
                               (unsigned long long)strndx);
    section names = section_at(elf, strndx);
    if (names.type == SHT_NOBITS || !inside(elf, names.offset, names.size))
        return aotc_reason_set(why, "its section name table lies beyond the end of the file");
    elf->shstr_offset = names.offset;
    elf->shstr_size = names.size;
    for (uint64_t i = 1; i < count; i++) {
        section s = section_at(elf, i);
        if (s.type != SHT_NOBITS && !inside(elf, s.offset, s.size))
            return aotc_reason_set(why, "section %llu lies beyond the end of the file", (unsigned long long)i);
        if (!cstring(data + names.offset, names.size, s.name))
            return aotc_reason_set(why,
                                   "the name of section %llu is not an ASCII string of at most %d bytes in its "
                                   "string table",
                                   (unsigned long long)i, MAX_NAME);
    }
    return 0;
}

int elf_section(const elf_image *elf, const char *name, const uint8_t **bytes, size_t *size, aotc_reason *why) {
    int found = 0;
    for (uint64_t i = 1; i < elf->shnum; i++) {
        section s = section_at(elf, i);
        const char *label = cstring(elf->data + elf->shstr_offset, elf->shstr_size, s.name);
        if (!label || strcmp(label, name) != 0)
            continue;
        if (found++)
            return aotc_reason_set(why, "it has more than one section named %s", name);
        *bytes = s.type == SHT_NOBITS ? elf->data : elf->data + s.offset;
        *size = s.type == SHT_NOBITS ? 0 : (size_t)s.size;
    }
    return found;
}

/* The names looked for, sorted, each with its place in the caller's list: a scan of the symbol tables
 * finds each exported function's name in log n steps (a plan may name millions of kernels and a library
 * export as many functions; comparing every pair would take hours). */
typedef struct wanted {
    const char *name;
    size_t index;
} wanted;

static int wanted_order(const void *x, const void *y) {
    return strcmp(((const wanted *)x)->name, ((const wanted *)y)->name);
}

/* Marks every entry of `names` (sorted) called `label`: a name may be listed more than once. */
static void mark(const wanted *names, size_t n, const char *label, unsigned char *found) {
    wanted key = {label, 0};
    const wanted *hit = bsearch(&key, names, n, sizeof *names, wanted_order);
    if (!hit)
        return;
    size_t at = (size_t)(hit - names), first = at, last = at;
    while (first > 0 && strcmp(names[first - 1].name, label) == 0)
        first--;
    while (last + 1 < n && strcmp(names[last + 1].name, label) == 0)
        last++;
    for (size_t i = first; i <= last; i++)
        found[names[i].index] = 1;
}

/* Scans one dynamic symbol table, checking it, and marks the `names` it exports as functions. */
static int dynsym_scan(const elf_image *elf, section symtab, const wanted *names, size_t n, unsigned char *found,
                       aotc_reason *why) {
    if (symtab.entsize != SYM_BYTES || symtab.size % SYM_BYTES)
        return aotc_reason_set(why, "its dynamic symbol table has entries of %llu bytes, expected %d",
                               (unsigned long long)symtab.entsize, SYM_BYTES);
    if (symtab.link == 0 || symtab.link >= elf->shnum)
        return aotc_reason_set(why, "its dynamic symbol table names no string table");
    section strtab = section_at(elf, symtab.link);
    const uint8_t *strings = elf->data + strtab.offset;
    uint64_t strings_size = strtab.type == SHT_NOBITS ? 0 : strtab.size;
    for (uint64_t pos = 0; pos < symtab.size; pos += SYM_BYTES) {
        const uint8_t *sym = elf->data + symtab.offset + pos;
        uint8_t info = sym[4], other = sym[5];
        uint16_t shndx = le16(sym + 6);
        if (shndx == SHN_UNDEF || shndx >= SHN_LORESERVE || shndx >= elf->shnum)
            continue;
        if ((info & 0xF) != STT_FUNC || ((info >> 4) != STB_GLOBAL && (info >> 4) != STB_WEAK))
            continue;
        if ((other & 3) != STV_DEFAULT || !(section_at(elf, shndx).flags & SHF_EXECINSTR))
            continue;
        const char *label = cstring(strings, strings_size, le32(sym));
        if (!label)
            return aotc_reason_set(why,
                                   "a dynamic symbol name is not an ASCII string of at most %d bytes in its string "
                                   "table",
                                   MAX_NAME);
        if (n)
            mark(names, n, label, found);
    }
    return 0;
}

static int scan_symbols(const elf_image *elf, const wanted *names, size_t n, unsigned char *found, aotc_reason *why) {
    for (uint64_t i = 1; i < elf->shnum; i++) {
        section s = section_at(elf, i);
        if (s.type == SHT_DYNSYM && dynsym_scan(elf, s, names, n, found, why) < 0)
            return -1;
    }
    return 0;
}

int elf_check_symbols(const elf_image *elf, aotc_reason *why) { return scan_symbols(elf, NULL, 0, NULL, why); }

int elf_find_functions(const elf_image *elf, const char *const *names, size_t n, unsigned char *found,
                       aotc_reason *why) {
    wanted *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted)
        return aotc_reason_set(why, "out of memory");
    for (size_t i = 0; i < n; i++) {
        sorted[i].name = names[i];
        sorted[i].index = i;
        found[i] = 0;
    }
    qsort(sorted, n, sizeof *sorted, wanted_order);
    int rc = scan_symbols(elf, sorted, n, found, why);
    free(sorted);
    return rc;
}

const char *elf_machine_arch(uint16_t machine) {
    switch (machine) {
    case 3: return "i386";
    case 40: return "arm";
    case ELF_MACHINE_X86_64: return "x86_64";
    case ELF_MACHINE_AARCH64: return "aarch64";
    case 243: return "riscv64";
    default: return NULL;
    }
}
