/* Tests of the runtime's own pieces, linked against the static library (tests/test_c_runtime.py runs it):
 *
 *   aotc_selftest                  SHA-256 and CRC-32 against published vectors, JSON accept/reject cases
 *   aotc_selftest sha256 FILE      print the file's sha256 (compared with hashlib)
 *   aotc_selftest canonical FILE   print the file's JSON in canonical form (compared with Python's json),
 *                                  or "error: why" and exit 1 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aotc_internal.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static void sha256_hex(const void *data, size_t n, char out[65]) {
    aotc_sha256 h;
    uint8_t digest[32];
    aotc_sha256_init(&h);
    aotc_sha256_update(&h, data, n);
    aotc_sha256_final(&h, digest);
    aotc_hex(digest, 32, out);
}

/* FIPS 180-4 examples and the NIST long-message vector */
static void test_sha256(void) {
    char hex[65];
    sha256_hex("", 0, hex);
    expect(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "sha256('')");
    sha256_hex("abc", 3, hex);
    expect(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "sha256('abc')");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha256_hex(two_blocks, strlen(two_blocks), hex);
    expect(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "sha256(448 bits)");
    /* a million 'a', fed in uneven pieces to cross block boundaries */
    static char a[1000];
    memset(a, 'a', sizeof a);
    aotc_sha256 h;
    uint8_t digest[32];
    aotc_sha256_init(&h);
    for (size_t done = 0, step = 1; done < 1000000; done += step, step = step % 997 + 1)
        aotc_sha256_update(&h, a, done + step > 1000000 ? 1000000 - done : step);
    aotc_sha256_final(&h, digest);
    aotc_hex(digest, 32, hex);
    expect(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "sha256(a * 10^6)");
}

static void test_crc32(void) {
    expect(aotc_crc32(0, "123456789", 9) == 0xCBF43926u, "crc32('123456789')");
    expect(aotc_crc32(aotc_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u, "crc32 in two pieces");
    expect(aotc_crc32(0, "", 0) == 0, "crc32('')");
}

static int parses(const char *text) {
    json_doc doc;
    aotc_reason why;
    if (json_parse(text, strlen(text), &doc, &why))
        return 0;
    json_free(&doc);
    return 1;
}

static void test_json(void) {
    static const char *const good[] = {
        "{}", "[]", "0", "-0", "1.5e3", "\"\\u00e9\\ud83d\\ude00\\n\"", "[true,false,null]",
        "{\"a\":{\"b\":[1,2,{\"c\":\"d\"}]}}", " \t\n{ \"x\" : 9223372036854775807 } ", "-9223372036854775808",
        "\"\\ud800\"", "\"caf\xc3\xa9\"", "{\"b\":1,\"a\":{\"b\":0},\"ab\":2,\"\":3}",
    };
    static const char *const bad[] = {
        "", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "01", "1.", ".5", "1e", "+1", "NaN", "Infinity", "tru",
        "\"abc", "\"\\x\"", "\"\\u12\"", "\"a\nb\"", "{\"a\":1,\"a\":2}", "9223372036854775808", "[1] 2",
        "\"\xff\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "{1:2}", "{\"b\":1,\"a\":{\"a\":0},\"ab\":2,\"b\":3}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        expect(parses(good[i]), good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect(!parses(bad[i]), bad[i]);
    char deep[200] = "", deeper[200] = "";
    for (int i = 0; i < JSON_MAX_DEPTH; i++)
        strcat(deep, "[");
    for (int i = 0; i < JSON_MAX_DEPTH; i++)
        strcat(deep, "]");
    strcpy(deeper, "[");
    strcat(deeper, deep);
    strcat(deeper, "]");
    expect(parses(deep), "nesting at the limit");
    expect(!parses(deeper), "nesting past the limit");
    json_doc doc;
    aotc_reason why;
    const char *text = "{\"b\":[1,{\"z\":true,\"a\":null}],\"a\":\"\\u00e9\\t\"}";
    expect(!json_parse(text, strlen(text), &doc, &why), "parse for encoding");
    json_buffer out = {0};
    expect(!json_encode(doc.root, &out, 0, &why), "encode");
    expect(out.data && !strcmp(out.data, "{\"a\":\"\\u00e9\\t\",\"b\":[1,{\"a\":null,\"z\":true}]}"), "canonical form");
    json_buffer_free(&out);
    expect(json_get(doc.root, "b") && json_at(json_get(doc.root, "b"), 0)->i == 1, "json_get / json_at");
    json_free(&doc);
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    *size = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc == 3) {
        size_t size;
        char *data = slurp(argv[2], &size);
        if (!data) {
            perror(argv[2]);
            return 2;
        }
        int rc = 0;
        if (!strcmp(argv[1], "sha256")) {
            char hex[65];
            sha256_hex(data, size, hex);
            printf("%s\n", hex);
        } else {
            json_doc doc;
            json_buffer out = {0};
            aotc_reason why;
            if (json_parse(data, size, &doc, &why) == 0) {
                if (json_encode(doc.root, &out, 0, &why) == 0)
                    printf("%s\n", out.data);
                else
                    rc = 1;
                json_free(&doc);
            } else {
                rc = 1;
            }
            if (rc)
                printf("error: %s\n", why.text);
            json_buffer_free(&out);
        }
        free(data);
        return rc;
    }
    test_sha256();
    test_crc32();
    test_json();
    if (failures)
        return 1;
    printf("selftest passed\n");
    return 0;
}
