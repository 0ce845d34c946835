/* A strict JSON reader (RFC 8259, as Python's json.loads reads it, without NaN/Infinity) into a node
 * tree in an arena, and the canonical writer a plan is compared against. Nesting is bounded, every
 * string is checked UTF-8, a key may appear once per object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aotc_internal.h"

/* ----------------------------------------------------------------------------------------- arena */

struct json_chunk {
    json_chunk *next;
    size_t used, size;
    /* the chunk's memory follows, 8-aligned */
};

#define CHUNK_HEADER ((sizeof(json_chunk) + 7) & ~(size_t)7)
#define CHUNK_BYTES ((size_t)64 << 10)

void *json_alloc(json_doc *doc, size_t n) {
    n = (n + 7) & ~(size_t)7;
    json_chunk *c = doc->chunks;
    if (!c || c->size - c->used < n) {
        size_t size = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        c = malloc(CHUNK_HEADER + size);
        if (!c)
            return NULL;
        c->next = doc->chunks;
        c->used = 0;
        c->size = size;
        doc->chunks = c;
    }
    void *p = (char *)c + CHUNK_HEADER + c->used;
    c->used += n;
    return p;
}

void json_free(json_doc *doc) {
    for (json_chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    doc->chunks = NULL;
    doc->root = NULL;
}

/* ---------------------------------------------------------------------------------------- parser */

typedef struct parser {
    const char *p, *end, *start;
    json_doc *doc;
    aotc_reason *why;
} parser;

static int fail_at(parser *ps, const char *what) {
    return aotc_reason_set(ps->why, "%s at byte %zu", what, (size_t)(ps->p - ps->start));
}

static void skip_space(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static json_node *new_node(parser *ps, json_type type) {
    json_node *n = json_alloc(ps->doc, sizeof *n);
    if (n) {
        memset(n, 0, sizeof *n);
        n->type = type;
    }
    return n;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Writes code point `cp` as UTF-8; a lone surrogate (which Python's json accepts) as its 3 bytes. */
static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at p (a non-ASCII lead byte), or 0 if invalid. */
static size_t utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n;
    unsigned cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* Parses the string at ps->p (at its opening quote) into arena memory. */
static int parse_string(parser *ps, const char **out, size_t *out_len) {
    const char *p = ps->p + 1;
    /* the decoded text is never longer than the source */
    const char *close = p;
    while (close < ps->end && *close != '"') {
        if (*close == '\\' && close + 1 < ps->end)
            close++;
        close++;
    }
    if (close >= ps->end)
        return fail_at(ps, "unterminated string");
    char *buf = json_alloc(ps->doc, (size_t)(close - p) + 1);
    if (!buf)
        return aotc_reason_set(ps->why, "out of memory");
    size_t n = 0;
    while (p < close) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) {
            ps->p = p;
            return fail_at(ps, "control character in a string");
        }
        if (c >= 0x80) {
            size_t k = utf8_sequence((const unsigned char *)p, (const unsigned char *)close);
            if (!k) {
                ps->p = p;
                return fail_at(ps, "invalid UTF-8 in a string");
            }
            memcpy(buf + n, p, k);
            n += k;
            p += k;
            continue;
        }
        if (c != '\\') {
            buf[n++] = (char)c;
            p++;
            continue;
        }
        char e = p[1];
        p += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            buf[n++] = decoded[simple - "\"\\/bfnrt"];
            continue;
        }
        unsigned cp, low;
        if (e != 'u' || close - p < 4 || hex4(p, &cp)) {
            ps->p = p - 2;
            return fail_at(ps, "invalid escape in a string");
        }
        p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF && close - p >= 6 && p[0] == '\\' && p[1] == 'u' &&
            !hex4(p + 2, &low) && low >= 0xDC00 && low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            p += 6;
        }
        n += put_utf8(buf + n, cp); /* at most 4 bytes for 6 (or 12) source bytes */
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    ps->p = close + 1;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *ps, json_node *n) {
    const char *p = ps->p, *begin = p;
    int negative = 0, integral = 1;
    if (p < ps->end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= ps->end || !is_digit(*p))
        return fail_at(ps, "invalid number");
    if (*p == '0')
        p++;
    else
        while (p < ps->end && is_digit(*p))
            p++;
    if (p < ps->end && *p == '.') {
        integral = 0;
        p++;
        if (p >= ps->end || !is_digit(*p))
            return fail_at(ps, "invalid number");
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < ps->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= ps->end || !is_digit(*p))
            return fail_at(ps, "invalid number");
        while (p < ps->end && is_digit(*p))
            p++;
    }
    if (integral) {
        /* accumulate negatively so INT64_MIN fits; a larger integer never appears in a package */
        int64_t v = 0;
        for (const char *d = begin + negative; d < p; d++) {
            int digit = *d - '0';
            if (v < (INT64_MIN + digit) / 10)
                return fail_at(ps, "integer out of range");
            v = v * 10 - digit;
        }
        if (!negative) {
            if (v == INT64_MIN)
                return fail_at(ps, "integer out of range");
            v = -v;
        }
        n->type = JSON_INT;
        n->i = v;
    } else {
        /* a copy in the arena: callers free the text they parsed while the document lives on */
        size_t len = (size_t)(p - begin);
        char *text = json_alloc(ps->doc, len + 1);
        if (!text)
            return aotc_reason_set(ps->why, "out of memory");
        memcpy(text, begin, len);
        text[len] = '\0';
        n->type = JSON_FLOAT;
        n->str = text;
        n->len = len;
    }
    ps->p = p;
    return 0;
}

static int parse_value(parser *ps, json_node **out, int depth);

static int literal(parser *ps, const char *word, json_type type, json_node **out) {
    size_t k = strlen(word);
    if ((size_t)(ps->end - ps->p) < k || memcmp(ps->p, word, k) != 0)
        return fail_at(ps, "unexpected character");
    ps->p += k;
    *out = new_node(ps, type);
    return *out ? 0 : aotc_reason_set(ps->why, "out of memory");
}

static int key_order(const void *x, const void *y) {
    const json_node *a = *(const json_node *const *)x, *b = *(const json_node *const *)y;
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);
    if (c)
        return c;
    return a->key_len < b->key_len ? -1 : a->key_len > b->key_len;
}

/* Each key once: sorted, then neighbours compared, so that an object of millions of keys (a manifest may
 * be 64 MB) is checked in n log n steps, not n^2. */
static int unique_keys(parser *ps, const json_node *object) {
    if (object->count < 2)
        return 0;
    const json_node **sorted = malloc(object->count * sizeof *sorted);
    if (!sorted)
        return aotc_reason_set(ps->why, "out of memory");
    size_t k = 0;
    for (const json_node *c = object->first; c; c = c->next)
        sorted[k++] = c;
    qsort(sorted, k, sizeof *sorted, key_order);
    const json_node *twice = NULL;
    for (size_t i = 1; i < k && !twice; i++)
        if (key_order(&sorted[i - 1], &sorted[i]) == 0)
            twice = sorted[i];
    free(sorted);
    return twice ? aotc_reason_set(ps->why, "the key \"%.80s\" appears twice in an object", twice->key) : 0;
}

/* An array or object: children appended in order, their count kept. */
static int parse_container(parser *ps, json_node *n, int depth) {
    int object = n->type == JSON_OBJECT;
    char close = object ? '}' : ']';
    json_node **tail = &n->first;
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0;
        skip_space(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"')
                return fail_at(ps, "expected a key");
            if (parse_string(ps, &key, &key_len))
                return -1;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return fail_at(ps, "expected ':'");
            ps->p++;
        }
        json_node *child;
        if (parse_value(ps, &child, depth + 1))
            return -1;
        child->key = key;
        child->key_len = key_len;
        *tail = child;
        tail = &child->next;
        n->count++;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return object ? unique_keys(ps, n) : 0;
        }
        return fail_at(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *ps, json_node **out, int depth) {
    if (depth > JSON_MAX_DEPTH)
        return aotc_reason_set(ps->why, "values nested deeper than %d", JSON_MAX_DEPTH);
    skip_space(ps);
    if (ps->p >= ps->end)
        return fail_at(ps, "unexpected end");
    switch (*ps->p) {
    case 'n':
        return literal(ps, "null", JSON_NULL, out);
    case 't':
        return literal(ps, "true", JSON_TRUE, out);
    case 'f':
        return literal(ps, "false", JSON_FALSE, out);
    case '"': {
        json_node *n = new_node(ps, JSON_STRING);
        if (!n)
            return aotc_reason_set(ps->why, "out of memory");
        *out = n;
        return parse_string(ps, &n->str, &n->len);
    }
    case '[':
    case '{': {
        json_node *n = new_node(ps, *ps->p == '[' ? JSON_ARRAY : JSON_OBJECT);
        if (!n)
            return aotc_reason_set(ps->why, "out of memory");
        *out = n;
        return parse_container(ps, n, depth);
    }
    default: {
        json_node *n = new_node(ps, JSON_INT);
        if (!n)
            return aotc_reason_set(ps->why, "out of memory");
        *out = n;
        return parse_number(ps, n);
    }
    }
}

int json_parse(const char *text, size_t len, json_doc *doc, aotc_reason *why) {
    parser ps = {text, text + len, text, doc, why};
    doc->root = NULL;
    doc->chunks = NULL;
    json_node *root;
    if (parse_value(&ps, &root, 1) == 0) {
        skip_space(&ps);
        if (ps.p == ps.end) {
            doc->root = root;
            return 0;
        }
        fail_at(&ps, "extra data after the value");
    }
    json_free(doc);
    return -1;
}

/* ----------------------------------------------------------------------------------------- access */

const json_node *json_get(const json_node *object, const char *key) {
    if (!object || object->type != JSON_OBJECT)
        return NULL;
    size_t len = strlen(key);
    for (const json_node *c = object->first; c; c = c->next)
        if (c->key_len == len && memcmp(c->key, key, len) == 0)
            return c;
    return NULL;
}

const json_node *json_at(const json_node *array, size_t index) {
    if (!array || (array->type != JSON_ARRAY && array->type != JSON_OBJECT) || index >= array->count)
        return NULL;
    const json_node *c = array->first;
    while (index--)
        c = c->next;
    return c;
}

int json_is_string(const json_node *n, const char *s) {
    return n && n->type == JSON_STRING && n->len == strlen(s) && memcmp(n->str, s, n->len) == 0;
}

int json_equal(const json_node *a, const json_node *b) {
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case JSON_INT:
        return a->i == b->i;
    case JSON_FLOAT: /* compared as written: plans hold no floats */
    case JSON_STRING:
        return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
    case JSON_ARRAY:
        if (a->count != b->count)
            return 0;
        for (const json_node *x = a->first, *y = b->first; x; x = x->next, y = y->next)
            if (!json_equal(x, y))
                return 0;
        return 1;
    case JSON_OBJECT:
        if (a->count != b->count)
            return 0;
        for (const json_node *x = a->first; x; x = x->next) {
            const json_node *y = NULL;
            for (const json_node *c = b->first; c && !y; c = c->next)
                if (c->key_len == x->key_len && memcmp(c->key, x->key, x->key_len) == 0)
                    y = c;
            if (!y || !json_equal(x, y))
                return 0;
        }
        return 1;
    default:
        return 1;
    }
}

/* ---------------------------------------------------------------------------------------- writer */

static void put(json_buffer *b, const char *s, size_t n) {
    if (b->failed)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) {
            b->failed = 1;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void json_buffer_free(json_buffer *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* Decodes the (checked, or WTF-8 for a lone surrogate) UTF-8 sequence at s. */
static unsigned get_utf8(const unsigned char *s, size_t *k) {
    unsigned c = s[0];
    if (c < 0xE0) {
        *k = 2;
        return (c & 0x1F) << 6 | (s[1] & 0x3F);
    }
    if (c < 0xF0) {
        *k = 3;
        return (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    }
    *k = 4;
    return (c & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

/* A string as ensure_ascii writes it: \" \\ \n \r \t \b \f, other bytes outside ' '..'~' as \uXXXX
 * (lowercase hex, surrogate pairs above U+FFFF). */
static void put_string(json_buffer *b, const char *s, size_t n) {
    char esc[16];
    put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        const char *short_form = NULL;
        switch (c) {
        case '"': short_form = "\\\""; break;
        case '\\': short_form = "\\\\"; break;
        case '\n': short_form = "\\n"; break;
        case '\r': short_form = "\\r"; break;
        case '\t': short_form = "\\t"; break;
        case '\b': short_form = "\\b"; break;
        case '\f': short_form = "\\f"; break;
        default: break;
        }
        if (short_form) {
            put(b, short_form, 2);
            i++;
        } else if (c >= 0x20 && c < 0x7F) {
            put(b, s + i, 1);
            i++;
        } else {
            size_t k = 1;
            unsigned cp = c < 0x80 ? c : get_utf8((const unsigned char *)s + i, &k);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            put(b, esc, strlen(esc));
            i += k;
        }
    }
    put(b, "\"", 1);
}


static int encode(const json_node *n, json_buffer *out, int floats_as_text, aotc_reason *why) {
    char num[32];
    switch (n->type) {
    case JSON_NULL: put(out, "null", 4); return 0;
    case JSON_TRUE: put(out, "true", 4); return 0;
    case JSON_FALSE: put(out, "false", 5); return 0;
    case JSON_INT:
        snprintf(num, sizeof num, "%lld", (long long)n->i);
        put(out, num, strlen(num));
        return 0;
    case JSON_FLOAT:
        if (!floats_as_text)
            return aotc_reason_set(why, "it holds a number that is not an integer");
        put(out, n->str, n->len);
        return 0;
    case JSON_STRING: put_string(out, n->str, n->len); return 0;
    case JSON_ARRAY:
        put(out, "[", 1);
        for (const json_node *c = n->first; c; c = c->next) {
            if (c != n->first)
                put(out, ",", 1);
            if (encode(c, out, floats_as_text, why))
                return -1;
        }
        put(out, "]", 1);
        return 0;
    case JSON_OBJECT: {
        /* keys in code point order, which for UTF-8 is byte order */
        const json_node **sorted = malloc((n->count ? n->count : 1) * sizeof *sorted);
        if (!sorted)
            return aotc_reason_set(why, "out of memory");
        size_t k = 0;
        for (const json_node *c = n->first; c; c = c->next)
            sorted[k++] = c;
        qsort(sorted, k, sizeof *sorted, key_order);
        put(out, "{", 1);
        int rc = 0;
        for (size_t i = 0; i < k && !rc; i++) {
            if (i)
                put(out, ",", 1);
            put_string(out, sorted[i]->key, sorted[i]->key_len);
            put(out, ":", 1);
            rc = encode(sorted[i], out, floats_as_text, why);
        }
        free(sorted);
        put(out, "}", 1);
        return rc;
    }
    }
    return 0;
}

int json_encode(const json_node *n, json_buffer *out, int floats_as_text, aotc_reason *why) {
    if (encode(n, out, floats_as_text, why))
        return -1;
    if (out->failed)
        return aotc_reason_set(why, "out of memory");
    return 0;
}

void json_show(const json_node *n, char *out, size_t size) {
    json_buffer b = {0};
    aotc_reason why;
    if (!n)
        snprintf(out, size, "null");
    else if (json_encode(n, &b, 1, &why) || !b.data)
        snprintf(out, size, "?");
    else if (b.len > 200)
        snprintf(out, size, "%.200s...", b.data);
    else
        snprintf(out, size, "%s", b.data);
    json_buffer_free(&b);
}
