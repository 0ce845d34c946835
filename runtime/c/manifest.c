/* manifest.json: its format, version and schema, and its execution-critical fields against the kernel
 * library's plan, with the Python runtime's rules and messages (package.py `_load_manifest`,
 * plan.py `check_manifest_matches`). */
#include <stdio.h>
#include <string.h>

#include "aotc_internal.h"

#define FORMAT_VERSION 2

static const json_node *get_n(const json_node *object, const char *key, size_t len) {
    for (const json_node *c = object && object->type == JSON_OBJECT ? object->first : NULL; c; c = c->next)
        if (c->key_len == len && memcmp(c->key, key, len) == 0)
            return c;
    return NULL;
}

static int is_count(const json_node *v) { return v && v->type == JSON_INT && v->i >= 0; }
static int is_text(const json_node *v) { return v && v->type == JSON_STRING && strlen(v->str) == v->len; }

/* ---------------------------------------------------------------------------------------- schema */

static const struct {
    const char *key;
    json_type type;
    const char *type_name;
} FIELDS[] = {
    {"name", JSON_STRING, "str"},        {"target", JSON_STRING, "str"},     {"triple", JSON_STRING, "str"},
    {"entry", JSON_STRING, "str"},       {"requires", JSON_ARRAY, "list"},   {"inputs", JSON_ARRAY, "list"},
    {"outputs", JSON_ARRAY, "list"},     {"kernels", JSON_ARRAY, "list"},    {"execution_plan", JSON_ARRAY, "list"},
    {"memory_plan", JSON_OBJECT, "dict"}, {"weights", JSON_OBJECT, "dict"}, {"members", JSON_OBJECT, "dict"},
    {"provenance", JSON_OBJECT, "dict"},
};

static aotc_status check_tensors(const json_node *list, const char *group, const char *path) {
    int i = 0;
    for (const json_node *t = list->first; t; t = t->next, i++) {
        const json_node *name = json_get(t, "name"), *shape = json_get(t, "shape"), *dtype = json_get(t, "dtype");
        int ok = t->type == JSON_OBJECT && name && name->type == JSON_STRING && shape &&
                 shape->type == JSON_ARRAY && dtype && dtype->type == JSON_STRING;
        for (const json_node *d = ok ? shape->first : NULL; d; d = d->next)
            ok = ok && is_count(d);
        if (!ok)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json %s[%d] must have a name, a shape of ints and a dtype",
                             path, group, i);
        if (!is_text(dtype) || !dtype_size(dtype->str))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json %s[%d] has an unknown dtype \"%.40s\"", path,
                             group, i, dtype->str);
    }
    return AOTC_OK;
}

/* The weights table `aotc inspect` shows: names, dtypes, shapes and places inside the blob. */
static aotc_status check_weight_tensors(const json_node *weights, const char *path) {
    const json_node *tensors = json_get(weights, "tensors"), *nbytes = json_get(weights, "nbytes");
    if ((tensors && tensors->type != JSON_ARRAY) || !is_count(nbytes))
        return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json weights must have a byte count and a list of tensors",
                         path);
    int i = 0;
    for (const json_node *t = tensors ? tensors->first : NULL; t; t = t->next, i++) {
        const json_node *name = json_get(t, "name"), *dtype = json_get(t, "dtype"), *shape = json_get(t, "shape");
        const json_node *offset = json_get(t, "offset"), *size = json_get(t, "nbytes");
        int ok = name && name->type == JSON_STRING && dtype && dtype->type == JSON_STRING && shape &&
                 shape->type == JSON_ARRAY && is_count(offset) && is_count(size) &&
                 size->i <= nbytes->i && offset->i <= nbytes->i - size->i;
        if (!ok)
            return aotc_fail(AOTC_ERR_FORMAT,
                             "%s: manifest.json weights.tensors[%d] must have a name, dtype, shape, and an offset "
                             "and nbytes inside the weights blob",
                             path, i);
    }
    return AOTC_OK;
}

/* A member name is a plain relative path: no leading '/', no '\\', no empty, '.' or '..' part. */
static int plain_member_name(const char *name, size_t len) {
    if (len == 0 || name[0] == '/' || memchr(name, '\\', len) || memchr(name, '\0', len))
        return 0;
    const char *part = name, *end = name + len;
    while (part <= end) {
        const char *slash = memchr(part, '/', (size_t)(end - part));
        size_t n = (size_t)((slash ? slash : end) - part);
        if (n == 0 || (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.'))
            return 0;
        if (!slash)
            break;
        part = slash + 1;
    }
    return 1;
}

static int is_sha256_hex(const json_node *v) {
    if (!v || v->type != JSON_STRING || v->len != 64)
        return 0;
    for (size_t i = 0; i < 64; i++)
        if (!((v->str[i] >= '0' && v->str[i] <= '9') || (v->str[i] >= 'a' && v->str[i] <= 'f')))
            return 0;
    return 1;
}

static aotc_status check_members(const json_node *manifest, const char *path) {
    const json_node *members = json_get(manifest, "members");
    static const char *const cpu_members[] = {LIBRARY_MEMBER, WEIGHTS_MEMBER};
    static const char *const gpu_members[] = {GPU_PLAN_MEMBER, WEIGHTS_MEMBER};
    const char *const *required = manifest_gpu_kind(manifest) ? gpu_members : cpu_members;
    for (int i = 0; i < 2; i++)
        if (!json_get(members, required[i]))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json does not list the member %s", path, required[i]);
    for (const json_node *m = members->first; m; m = m->next) {
        if (!plain_member_name(m->key, m->key_len))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: member name \"%.100s\" is not a plain relative path", path, m->key);
        if (strcmp(m->key, MANIFEST_MEMBER) == 0 || strcmp(m->key, SIGNATURE_MEMBER) == 0)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json must not list %s among its members", path, m->key);
        if (m->type != JSON_OBJECT || !is_sha256_hex(json_get(m, "sha256")) || !is_count(json_get(m, "size")))
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json needs the sha256 and size of member %.100s", path,
                             m->key);
    }
    return AOTC_OK;
}

static aotc_status check_version(const json_node *version, const char *path) {
    if (!version || version->type != JSON_INT || version->i < 1) {
        char shown[240];
        json_show(version, shown, sizeof shown);
        return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json has an invalid format_version %s", path, shown);
    }
    if (version->i > FORMAT_VERSION)
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s: package format version %lld is newer than this runtime supports (%d); upgrade the "
                         "aotc C runtime",
                         path, (long long)version->i, FORMAT_VERSION);
    if (version->i < FORMAT_VERSION)
        return aotc_fail(AOTC_ERR_FORMAT, "%s: package format %lld predates plan checks; rebuild it with a current aotc",
                         path, (long long)version->i);
    return AOTC_OK;
}

aotc_status manifest_check(const json_node *manifest, const char *path) {
    const json_node *format = json_get(manifest, "format");
    if (!json_is_string(format, PACKAGE_FORMAT)) {
        char shown[240];
        json_show(format, shown, sizeof shown);
        return aotc_fail(AOTC_ERR_FORMAT,
                         "%s is not an aotc package (foreign file: manifest.json has format %s, expected \"%s\")",
                         path, shown, PACKAGE_FORMAT);
    }
    aotc_status st = check_version(json_get(manifest, "format_version"), path);
    if (st)
        return st;
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++) {
        const json_node *v = json_get(manifest, FIELDS[i].key);
        if (!v || v->type != FIELDS[i].type)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json lacks '%s' (or it is not a %s)", path,
                             FIELDS[i].key, FIELDS[i].type_name);
    }
    if ((st = check_tensors(json_get(manifest, "inputs"), "inputs", path)) ||
        (st = check_tensors(json_get(manifest, "outputs"), "outputs", path)))
        return st;
    for (const json_node *f = json_get(manifest, "requires")->first; f; f = f->next)
        if (f->type != JSON_STRING)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json requires must list CPU feature names", path);
    const json_node *workspace = json_get(json_get(manifest, "memory_plan"), "workspace_bytes");
    if (!is_count(workspace)) {
        char shown[240];
        json_show(workspace, shown, sizeof shown);
        return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json memory_plan.workspace_bytes is %s", path, shown);
    }
    int i = 0;
    for (const json_node *k = json_get(manifest, "kernels")->first; k; k = k->next, i++)
        if (k->type != JSON_OBJECT || !json_get(k, "symbol") || json_get(k, "symbol")->type != JSON_STRING)
            return aotc_fail(AOTC_ERR_FORMAT, "%s: manifest.json kernels[%d] has no symbol", path, i);
    if ((st = check_weight_tensors(json_get(manifest, "weights"), path)))
        return st;
    return check_members(manifest, path);
}

const char *manifest_gpu_kind(const json_node *manifest) {
    const json_node *target = json_get(manifest, "target");
    if (target && target->type == JSON_STRING) {
        size_t word = strcspn(target->str, " ");
        if (word == 6 && strncmp(target->str, "opencl", 6) == 0)
            return "opencl";
        if (word == 4 && strncmp(target->str, "cuda", 4) == 0)
            return "cuda";
    }
    const json_node *members = json_get(manifest, "members");
    if (json_get(members, GPU_PLAN_MEMBER) && !json_get(members, LIBRARY_MEMBER))
        return "GPU";
    return NULL;
}

/* --------------------------------------------------------------------------------- against plan */

static int differ(const json_node *got, const json_node *want, const char *where, aotc_reason *why) {
    char shown_got[240], shown_want[240];
    json_show(got, shown_got, sizeof shown_got);
    json_show(want, shown_want, sizeof shown_want);
    return aotc_reason_set(why, "manifest.json %s is %s but the kernel library was compiled for %s", where,
                           shown_got, shown_want);
}

static int holds_containers(const json_node *list) {
    for (const json_node *c = list->first; c; c = c->next)
        if (c->type == JSON_ARRAY || c->type == JSON_OBJECT)
            return 1;
    return 0;
}

/* Python's `_same`: `want`'s keys must be in `got` with equal values (extra keys in `got` are
 * informational), lists of lists or objects entry by entry, anything else equal with its type. */
static int same(const json_node *got, const json_node *want, const char *where, aotc_reason *why) {
    char at[256];
    if (want->type == JSON_OBJECT) {
        if (!got || got->type != JSON_OBJECT)
            return differ(got, want, where, why);
        for (const json_node *w = want->first; w; w = w->next) {
            const json_node *g = get_n(got, w->key, w->key_len);
            if (!g) {
                char shown[240];
                json_show(w, shown, sizeof shown);
                return aotc_reason_set(why, "manifest.json %s lacks '%s' (the kernel library has %s)", where,
                                       w->key, shown);
            }
            snprintf(at, sizeof at, "%s.%s", where, w->key);
            if (same(g, w, at, why))
                return -1;
        }
        return 0;
    }
    if (want->type == JSON_ARRAY && holds_containers(want)) {
        if (!got || got->type != JSON_ARRAY)
            return differ(got, want, where, why);
        if (got->count != want->count)
            return aotc_reason_set(why, "manifest.json %s has %zu entries but the kernel library was compiled for %zu",
                                   where, got->count, want->count);
        size_t i = 0;
        for (const json_node *g = got->first, *w = want->first; w; g = g->next, w = w->next, i++) {
            snprintf(at, sizeof at, "%s[%zu]", where, i);
            if (same(g, w, at, why))
                return -1;
        }
        return 0;
    }
    return got && json_equal(got, want) ? 0 : differ(got, want, where, why);
}

/* A manifest param's shape in bytes at the plan's dtype; -1 if the shape is not a list of counts. */
static int64_t shape_nbytes(const json_node *shape, size_t itemsize) {
    if (!shape || shape->type != JSON_ARRAY)
        return -1;
    uint64_t n = itemsize;
    for (const json_node *d = shape->first; d; d = d->next) {
        if (!is_count(d))
            return -1;
        if (d->i && n > PLAN_MAX_BYTES / (uint64_t)d->i)
            return (int64_t)PLAN_MAX_BYTES + 1; /* larger than any kernel's param */
        n *= (uint64_t)d->i;
    }
    return (int64_t)n;
}

/* Each manifest kernel's symbol, and its params' dtypes and sizes (from their shapes). */
static int same_kernels(const json_node *kernels, const json_node *want, aotc_reason *why) {
    if (!kernels || kernels->type != JSON_ARRAY || kernels->count != want->count)
        return same(kernels, want, "kernels", why);
    size_t i = 0;
    for (const json_node *got = kernels->first, *k = want->first; k; got = got->next, k = k->next, i++) {
        char where[64], at[128];
        snprintf(where, sizeof where, "kernels[%zu]", i);
        if (got->type != JSON_OBJECT)
            return same(got, k, where, why);
        snprintf(at, sizeof at, "%s.symbol", where);
        if (same(json_get(got, "symbol"), json_get(k, "symbol"), at, why))
            return -1;
        const json_node *params = json_get(got, "params"), *wanted = json_get(k, "params");
        snprintf(at, sizeof at, "%s.params", where);
        if (!params || params->type != JSON_ARRAY || params->count != wanted->count)
            return same(params, wanted, at, why);
        size_t j = 0;
        for (const json_node *p = params->first, *q = wanted->first; q; p = p->next, q = q->next, j++) {
            snprintf(at, sizeof at, "%s.params[%zu]", where, j);
            if (p->type != JSON_OBJECT)
                return same(p, q, at, why);
            char field[160];
            snprintf(field, sizeof field, "%s.dtype", at);
            const json_node *dtype = json_get(q, "dtype"), *nbytes = json_get(q, "nbytes");
            if (same(json_get(p, "dtype"), dtype, field, why))
                return -1;
            if (shape_nbytes(json_get(p, "shape"), dtype_size(dtype->str)) != nbytes->i) {
                char shown[240];
                json_show(json_get(p, "shape"), shown, sizeof shown);
                return aotc_reason_set(why, "manifest.json %s.shape is %s but the kernel library was compiled for "
                                       "%lld bytes", at, shown, (long long)nbytes->i);
            }
        }
    }
    return 0;
}

int manifest_matches_plan(const json_node *manifest, const model_plan *plan, aotc_reason *why) {
    const json_node *doc = plan->doc.root, *first = doc;
    if (plan->version == 2) {
        const json_node *variants = json_get(doc, "variants");
        first = variants->first;
        if (same(json_get(manifest, "variants"), variants, "variants", why))
            return -1;
    } else if (json_get(manifest, "variants")) {
        return aotc_reason_set(why, "manifest.json has variants but the kernel library was compiled for one set "
                               "of input shapes");
    }
    const json_node *memory_plan = json_get(manifest, "memory_plan"), *weights = json_get(manifest, "weights");
    if (same(json_get(manifest, "entry"), json_get(first, "entry"), "entry", why) ||
        same(json_get(manifest, "target"), json_get(doc, "target"), "target", why) ||
        same(json_get(manifest, "triple"), json_get(doc, "triple"), "triple", why) ||
        same(json_get(manifest, "requires"), json_get(doc, "requires"), "requires", why) ||
        same(json_get(manifest, "inputs"), json_get(first, "inputs"), "inputs", why) ||
        same(json_get(manifest, "outputs"), json_get(first, "outputs"), "outputs", why) ||
        same(json_get(memory_plan, "workspace_bytes"), json_get(first, "workspace_bytes"),
             "memory_plan.workspace_bytes", why) ||
        same(json_get(weights, "nbytes"), json_get(doc, "weights_nbytes"), "weights.nbytes", why) ||
        same(json_get(manifest, "execution_plan"), json_get(first, "execution_plan"), "execution_plan", why))
        return -1;
    return same_kernels(json_get(manifest, "kernels"), json_get(doc, "kernels"), why);
}
