/* A zip reader for packages: the central directory (zip64 included) and stored members, every size and
 * offset checked against the file's size before it is used. aotc writes every member stored, so there
 * is no inflate: a compressed member is refused, naming it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aotc_internal.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOCATOR64 0x07064b50u
#define END_BYTES 22
#define LOCATOR64_BYTES 20
#define END64_BYTES 56
#define CENTRAL_BYTES 46
#define LOCAL_BYTES 30
#define MAX_COMMENT 65535
#define MAX_DIRECTORY_BYTES ((uint64_t)64 << 20)
#define READ_CHUNK ((size_t)1 << 20)

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* n bytes at `offset`, which the caller checked lie inside the file; a short read means the file
 * shrank meanwhile. */
static aotc_status read_at(const zip_archive *z, void *buf, size_t n, uint64_t offset) {
    uint8_t *p = buf;
    while (n) {
        ssize_t got = pread(z->fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return aotc_fail(AOTC_ERR_IO, "%s: cannot read (%s)", z->path, strerror(errno));
        if (got == 0)
            return aotc_fail(AOTC_ERR_FORMAT, "%s is truncated (it shrank while being read)", z->path);
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return AOTC_OK;
}

static aotc_status not_a_zip(const zip_archive *z) {
    uint8_t head[4] = {0};
    if (z->file_size >= 4 && read_at(z, head, 4, 0) == AOTC_OK && le32(head) == SIG_LOCAL)
        return aotc_fail(AOTC_ERR_FORMAT, "%s is truncated or damaged (its zip directory is missing)",
                         z->path);
    return aotc_fail(AOTC_ERR_FORMAT, "%s is not an aotc package (not a zip file)", z->path);
}

/* Where the central directory lies and how many entries it has, from the end record (and the zip64
 * end record when a locator precedes it). */
typedef struct directory {
    uint64_t offset, size, entries, end; /* `end`: where the records after it begin */
} directory;

static aotc_status find_directory(const zip_archive *z, directory *dir) {
    size_t tail = z->file_size < END_BYTES + MAX_COMMENT ? (size_t)z->file_size : END_BYTES + MAX_COMMENT;
    if (tail < END_BYTES)
        return not_a_zip(z);
    uint8_t *buf = malloc(tail);
    if (!buf)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", z->path);
    uint64_t base = z->file_size - tail;
    aotc_status st = read_at(z, buf, tail, base);
    if (st) {
        free(buf);
        return st;
    }
    size_t at = tail - END_BYTES + 1;
    int found = 0;
    while (at-- > 0) {
        if (le32(buf + at) == SIG_END && at + END_BYTES + le16(buf + at + 20) <= tail) {
            found = 1;
            break;
        }
    }
    if (!found) {
        free(buf);
        return not_a_zip(z);
    }
    const uint8_t *end = buf + at;
    uint64_t end_offset = base + at;
    if (le16(end + 4) != 0 || le16(end + 6) != 0) {
        free(buf);
        return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (a zip spanning several disks)", z->path);
    }
    dir->entries = le16(end + 10);
    dir->size = le32(end + 12);
    dir->offset = le32(end + 16);
    dir->end = end_offset;
    free(buf);
    if (end_offset >= LOCATOR64_BYTES) {
        uint8_t locator[LOCATOR64_BYTES], end64[END64_BYTES];
        if ((st = read_at(z, locator, sizeof locator, end_offset - LOCATOR64_BYTES)))
            return st;
        if (le32(locator) == SIG_LOCATOR64) {
            uint64_t at64 = le64(locator + 8);
            if (at64 > end_offset - LOCATOR64_BYTES || end_offset - LOCATOR64_BYTES - at64 < END64_BYTES)
                return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (its zip64 end record lies outside the file)",
                                 z->path);
            if ((st = read_at(z, end64, sizeof end64, at64)))
                return st;
            if (le32(end64) != SIG_END64)
                return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (bad zip64 end record)", z->path);
            dir->entries = le64(end64 + 32);
            dir->size = le64(end64 + 40);
            dir->offset = le64(end64 + 48);
            dir->end = at64;
        }
    }
    if (dir->offset > dir->end || dir->size > dir->end - dir->offset)
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s is truncated or damaged (its zip directory lies outside the file)", z->path);
    if (dir->entries > ZIP_MAX_MEMBERS || dir->size > MAX_DIRECTORY_BYTES)
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s is not an aotc package (a zip of %llu members; a package holds a handful)",
                         z->path, (unsigned long long)dir->entries);
    return AOTC_OK;
}

/* The zip64 extra field (id 1) holds, in this order, each of the sizes and the offset whose 32-bit
 * field is 0xFFFFFFFF. */
static int read_zip64_extra(const uint8_t *extra, size_t len, zip_member *m) {
    while (len >= 4) {
        uint16_t id = le16(extra), size = le16(extra + 2);
        if ((size_t)size > len - 4)
            return -1;
        if (id == 1) {
            const uint8_t *p = extra + 4, *stop = p + size;
            uint64_t *fields[3] = {&m->size, &m->compressed_size, &m->header_offset};
            for (int i = 0; i < 3; i++) {
                if (*fields[i] != 0xFFFFFFFFu)
                    continue;
                if (stop - p < 8)
                    return -1;
                *fields[i] = le64(p);
                p += 8;
            }
            return 0;
        }
        extra += 4 + size;
        len -= 4 + (size_t)size;
    }
    return 0;
}

static aotc_status read_entry(zip_archive *z, const uint8_t *cd, size_t cd_size, size_t *pos, zip_member *m) {
    const uint8_t *e = cd + *pos;
    if (cd_size - *pos < CENTRAL_BYTES || le32(e) != SIG_CENTRAL)
        return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (bad zip directory entry)", z->path);
    size_t name_len = le16(e + 28), extra_len = le16(e + 30), comment_len = le16(e + 32);
    if (cd_size - *pos - CENTRAL_BYTES < name_len + extra_len + comment_len)
        return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (bad zip directory entry)", z->path);
    m->version_needed = e[6];
    m->flags = le16(e + 8);
    m->method = le16(e + 10);
    m->crc32 = le32(e + 16);
    m->compressed_size = le32(e + 20);
    m->size = le32(e + 24);
    m->header_offset = le32(e + 42);
    const uint8_t *name = e + CENTRAL_BYTES;
    if (read_zip64_extra(name + name_len, extra_len, m))
        return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (bad zip64 field of a member)", z->path);
    if (memchr(name, 0, name_len))
        return aotc_fail(AOTC_ERR_FORMAT, "%s is damaged (a member name holds a NUL byte)", z->path);
    m->name = malloc(name_len + 1);
    if (!m->name)
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", z->path);
    memcpy(m->name, name, name_len);
    m->name[name_len] = '\0';
    *pos += CENTRAL_BYTES + name_len + extra_len + comment_len;
    return AOTC_OK;
}

static aotc_status read_directory(zip_archive *z, const directory *dir) {
    uint8_t *cd = malloc(dir->size ? (size_t)dir->size : 1);
    z->members = calloc(dir->entries ? (size_t)dir->entries : 1, sizeof *z->members);
    if (!cd || !z->members) {
        free(cd);
        return aotc_fail(AOTC_ERR_NO_MEMORY, "%s: out of memory", z->path);
    }
    aotc_status st = read_at(z, cd, (size_t)dir->size, dir->offset);
    size_t pos = 0;
    for (uint64_t i = 0; i < dir->entries && !st; i++) {
        st = read_entry(z, cd, (size_t)dir->size, &pos, &z->members[i]);
        if (!st)
            z->count++;
    }
    free(cd);
    return st;
}

aotc_status zip_open(zip_archive *z, const char *path) {
    memset(z, 0, sizeof *z);
    z->path = path;
    z->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (z->fd < 0)
        return aotc_fail(AOTC_ERR_IO, "cannot open %s (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(z->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        zip_close(z);
        return aotc_fail(AOTC_ERR_IO, "%s is not a regular file", path);
    }
    z->file_size = (uint64_t)st.st_size;
    directory dir = {0, 0, 0, 0};
    aotc_status status = find_directory(z, &dir);
    if (!status)
        status = read_directory(z, &dir);
    if (status)
        zip_close(z);
    return status;
}

void zip_close(zip_archive *z) {
    for (size_t i = 0; i < z->count; i++)
        free(z->members[i].name);
    free(z->members);
    z->members = NULL;
    z->count = 0;
    if (z->fd >= 0)
        close(z->fd);
    z->fd = -1;
}

const zip_member *zip_find(const zip_archive *z, const char *name) {
    for (size_t i = 0; i < z->count; i++)
        if (strcmp(z->members[i].name, name) == 0)
            return &z->members[i];
    return NULL;
}

/* Where the member's bytes begin: after its local header, whose name must be the directory's. */
static aotc_status data_offset(const zip_archive *z, const zip_member *m, uint64_t *offset) {
    uint8_t local[LOCAL_BYTES];
    if (m->header_offset > z->file_size || z->file_size - m->header_offset < LOCAL_BYTES)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is truncated", z->path, m->name);
    aotc_status st = read_at(z, local, sizeof local, m->header_offset);
    if (st)
        return st;
    if (le32(local) != SIG_LOCAL)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is damaged (bad local header)", z->path, m->name);
    size_t name_len = le16(local + 26), extra_len = le16(local + 28);
    uint64_t start = m->header_offset + LOCAL_BYTES + name_len + extra_len;
    if (start > z->file_size || z->file_size - start < m->compressed_size)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is truncated", z->path, m->name);
    char *name = name_len == strlen(m->name) ? malloc(name_len + 1) : NULL;
    if (name && !(st = read_at(z, name, name_len, m->header_offset + LOCAL_BYTES)) &&
        memcmp(name, m->name, name_len) == 0) {
        free(name);
        *offset = start;
        return AOTC_OK;
    }
    free(name);
    return st ? st
              : aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is damaged (its local header names another)",
                          z->path, m->name);
}

#define MAX_VERSION_NEEDED 63       /* zip 6.3, as Python's zipfile */
#define FLAGS_ENCRYPTED 0x0001
#define FLAGS_PATCHED 0x0020          /* compressed patched data */
#define FLAGS_STRONG_ENCRYPTION 0x0040

aotc_status zip_read(const zip_archive *z, const zip_member *m, void *out, uint8_t sha256[32]) {
    if (m->version_needed > MAX_VERSION_NEEDED)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s needs zip version %u.%u to extract", z->path, m->name,
                         m->version_needed / 10, m->version_needed % 10);
    if (m->flags & (FLAGS_ENCRYPTED | FLAGS_STRONG_ENCRYPTION))
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is encrypted", z->path, m->name);
    if (m->flags & FLAGS_PATCHED)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s holds compressed patched data", z->path, m->name);
    if (m->method == 8)
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s: member %s is compressed (deflate); the C runtime reads stored members only: "
                         "rebuild the package with a current aotc",
                         z->path, m->name);
    if (m->method != 0)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s uses zip compression method %u", z->path, m->name,
                         m->method);
    if (m->compressed_size != m->size)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: member %s is damaged (implausible size %llu)", z->path,
                         m->name, (unsigned long long)m->size);
    uint64_t offset = 0;
    aotc_status st = data_offset(z, m, &offset);
    if (st)
        return st;
    aotc_sha256 h;
    aotc_sha256_init(&h);
    uint32_t crc = 0;
    uint8_t *p = out;
    for (uint64_t done = 0; done < m->size;) {
        size_t n = m->size - done < READ_CHUNK ? (size_t)(m->size - done) : READ_CHUNK;
        if ((st = read_at(z, p + done, n, offset + done)))
            return st;
        aotc_sha256_update(&h, p + done, n);
        crc = aotc_crc32(crc, p + done, n);
        done += n;
    }
    aotc_sha256_final(&h, sha256);
    if (crc != m->crc32)
        return aotc_fail(AOTC_ERR_CHECKSUM, "%s: member %s is corrupted (zip CRC mismatch)", z->path, m->name);
    return AOTC_OK;
}
